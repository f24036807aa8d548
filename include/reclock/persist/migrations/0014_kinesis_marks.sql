-- A Kinesis source's marks (reclock.sources.kinesis.marks): for a position it bound in a shard, the record
-- just below it as the scan read it (its ApproximateArrivalTimestamp in ms and a digest of its partition key
-- and data; its sequence number is position - 1). The next scan reads that record again before it reads past
-- the position: another record there is a stream deleted and created again (StreamReplaced), even one created
-- within the second of the first. Compaction keeps those at or above the source's frontier.
CREATE TABLE reclock.kinesis_marks (
    source      text NOT NULL REFERENCES reclock.sources(name) ON DELETE CASCADE,
    shard       bigint NOT NULL CHECK (shard >= 0),
    position    numeric NOT NULL CHECK (position > 0),
    arrival_ms  bigint NOT NULL,
    digest      text NOT NULL,
    PRIMARY KEY (source, shard, position)
);
