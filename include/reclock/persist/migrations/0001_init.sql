-- Reclock's consensus schema: sources and their remap collections, shards and their batches,
-- read holds, statistics and status history.
CREATE SCHEMA IF NOT EXISTS reclock;

CREATE TABLE reclock.sources (
    name        text PRIMARY KEY,
    kind        text NOT NULL,
    config      jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- one remap collection per source: its upper (least ts without a binding) and since
CREATE TABLE reclock.remap_collections (
    source  text PRIMARY KEY REFERENCES reclock.sources(name) ON DELETE CASCADE,
    upper   bigint NOT NULL DEFAULT 0 CHECK (upper >= 0),
    since   bigint NOT NULL DEFAULT 0 CHECK (since >= 0),
    CHECK (since <= upper)
);

-- a binding: "at ts the source frontier was F"; F's partitions (absolute next offsets) in remap_offsets
CREATE TABLE reclock.remap_bindings (
    source  text NOT NULL REFERENCES reclock.remap_collections(source) ON DELETE CASCADE,
    ts      bigint NOT NULL,
    PRIMARY KEY (source, ts)
);

CREATE TABLE reclock.remap_offsets (
    source     text NOT NULL,
    ts         bigint NOT NULL,
    partition  integer NOT NULL CHECK (partition >= 0),
    "offset"   bigint NOT NULL CHECK ("offset" > 0),
    PRIMARY KEY (source, ts, partition),
    FOREIGN KEY (source, ts) REFERENCES reclock.remap_bindings(source, ts) ON DELETE CASCADE
);

CREATE TABLE reclock.shards (
    id          text PRIMARY KEY,
    source      text REFERENCES reclock.sources(name) ON DELETE SET NULL,
    output      integer NOT NULL DEFAULT 0,
    upper       bigint NOT NULL DEFAULT 0 CHECK (upper >= 0),
    since       bigint NOT NULL DEFAULT 0 CHECK (since >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (since <= upper)
);

-- one row per immutable Parquet part; a description [lower, upper) may have many parts (or none)
CREATE TABLE reclock.shard_batches (
    id          bigserial PRIMARY KEY,
    shard       text NOT NULL REFERENCES reclock.shards(id) ON DELETE CASCADE,
    lower       bigint NOT NULL,
    upper       bigint NOT NULL,
    path        text NOT NULL UNIQUE,
    rows        bigint NOT NULL CHECK (rows >= 0),
    bytes       bigint NOT NULL CHECK (bytes >= 0),
    min_ts      bigint,
    max_ts      bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (lower < upper)
);
CREATE INDEX shard_batches_shard_lower ON reclock.shard_batches (shard, lower);

CREATE TABLE reclock.read_holds (
    shard       text NOT NULL REFERENCES reclock.shards(id) ON DELETE CASCADE,
    holder      text NOT NULL,
    ts          bigint NOT NULL CHECK (ts >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard, holder)
);

CREATE TABLE reclock.statistics (
    id       bigserial PRIMARY KEY,
    name     text NOT NULL,
    step     text NOT NULL,
    metrics  jsonb NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX statistics_name ON reclock.statistics (name, id DESC);

CREATE TABLE reclock.status_history (
    id      bigserial PRIMARY KEY,
    name    text NOT NULL,
    status  text NOT NULL CHECK (status IN ('starting', 'running', 'stalled', 'failed', 'paused')),
    error   text,
    at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX status_history_name ON reclock.status_history (name, id DESC);

-- the AS OF form of a source's progress relation: its frontier for data at ts <= t
CREATE FUNCTION reclock.progress_as_of(src text, t bigint)
RETURNS TABLE (partition integer, "offset" bigint)
LANGUAGE sql STABLE AS $$
    SELECT o.partition, o."offset"
    FROM reclock.remap_offsets o
    WHERE o.source = src
      AND o.ts = (SELECT max(b.ts) FROM reclock.remap_bindings b WHERE b.source = src AND b.ts <= t)
    ORDER BY o.partition
$$;
