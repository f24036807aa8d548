-- A Kinesis source's own state beside its remap collection (reclock.sources.kinesis.store): the stream it
-- reads (a stream deleted and created again under the same name has a new creation time), when its last
-- scan of every readable shard began (the retention check), how many records it bound from shards since
-- dropped from its frontier; and the record counts its scans established between sequence-number positions
-- (numeric: sequence numbers are decimals of up to 129 digits).
CREATE TABLE reclock.kinesis_streams (
    source           text PRIMARY KEY REFERENCES reclock.sources(name) ON DELETE CASCADE,
    stream_arn       text NOT NULL,
    created_ms       bigint NOT NULL,
    scanned_ms       bigint,
    dropped_records  bigint NOT NULL DEFAULT 0 CHECK (dropped_records >= 0)
);

CREATE TABLE reclock.kinesis_segments (
    source   text NOT NULL REFERENCES reclock.sources(name) ON DELETE CASCADE,
    shard    bigint NOT NULL CHECK (shard >= 0),
    start    numeric NOT NULL CHECK (start >= 0),
    stop     numeric NOT NULL,
    records  bigint NOT NULL CHECK (records >= 0),
    PRIMARY KEY (source, shard, start, stop),
    CHECK (start < stop)
);

-- The upsert state keeps where each key's current record is as the kind's record shape says (Kafka:
-- partition and offset, Kinesis: shard id and a sequence number of up to 129 digits): as text, typed back
-- by the shape (reclock.persist.upsert_state).
ALTER TABLE reclock.upsert_state ALTER COLUMN partition TYPE text USING partition::text,
                                 ALTER COLUMN "offset" TYPE text USING "offset"::text;
