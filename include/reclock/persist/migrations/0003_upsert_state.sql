-- The upsert envelope's state: per source and Kafka key, the key's current record (deleted keys have no
-- row). It moves with the source's data shard: append writes a description's changes in the same
-- transaction as the shard's new upper, so the state is always "as of the data shard's upper".
CREATE TABLE reclock.upsert_state (
    source        text NOT NULL REFERENCES reclock.sources(name) ON DELETE CASCADE,
    key           bytea NOT NULL,
    value         bytea NOT NULL,
    partition     integer NOT NULL,
    "offset"      bigint NOT NULL,
    timestamp_us  bigint,
    PRIMARY KEY (source, key)
);
