-- A collection's schema over time (reclock.schema_evolution.SchemaHistory): from since_ts on (until the next
-- row's), its user columns are `columns` ([[name, Spark type, nullable], ...]). Written in
-- compare_and_append's transaction with the parts that hold the first update carrying it, so a read at a time
-- finds the schema of every update it reads. `upstream`: what the source kind decodes that version with (an
-- Avro reader schema and its writers' ids, a declared DDL); `cause`: why it began, for people.
-- A collection without rows here has no recorded schema: its parts' own columns are read as they are.
CREATE TABLE reclock.collection_schemas (
    shard        text NOT NULL REFERENCES reclock.shards(id) ON DELETE CASCADE,
    since_ts     bigint NOT NULL CHECK (since_ts >= 0),
    columns      jsonb NOT NULL,
    upstream     jsonb NOT NULL DEFAULT '{}'::jsonb,
    cause        text NOT NULL DEFAULT '',
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard, since_ts)
);
