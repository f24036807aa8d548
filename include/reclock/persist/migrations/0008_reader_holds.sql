-- A reader's hold (reclock.tables: a Spark or DuckDB read of a collection) is a lease: it lapses at
-- expires_at unless renewed, so a reader that died pins neither since nor the parts it listed for long.
-- A hold without expiry (a sink's) stays until it is released.
ALTER TABLE reclock.read_holds ADD COLUMN expires_at timestamptz;
