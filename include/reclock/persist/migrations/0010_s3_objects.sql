-- The S3 source kind's catalog (reclock.sources.s3.catalog): per S3 source, the object versions it
-- discovered and still needs to know (dense id from 1 -> key, identity, size, and where its bytes are in
-- the source's FromTime: from `base` in the log, partition 0, or in partition `id` when `own`;
-- reclock.sources.s3.log), and where its listing resumes. Keys compare as S3 orders them (COLLATE "C").
CREATE TABLE reclock.s3_objects (
    source         text NOT NULL REFERENCES reclock.sources(name) ON DELETE CASCADE,
    id             integer NOT NULL CHECK (id >= 1),
    key            text COLLATE "C" NOT NULL,
    etag           text NOT NULL,
    version        text,
    size           bigint NOT NULL CHECK (size >= 0),
    complete       bigint NOT NULL DEFAULT 0 CHECK (complete >= 0),
    modified_ms    bigint NOT NULL,
    seen_ms        bigint NOT NULL,
    state          text NOT NULL CHECK (state IN ('open', 'sealed', 'overwrite')),
    previous_etag  text,
    base           bigint CHECK (base >= 0),
    own            boolean NOT NULL DEFAULT false,
    PRIMARY KEY (source, id)
);
CREATE INDEX s3_objects_by_key ON reclock.s3_objects (source, key);
CREATE INDEX s3_objects_by_base ON reclock.s3_objects (source, base);

-- one row per S3 source: the next id and log position, the key its listing starts after (keys: increasing),
-- whether a notification source listed what was there before its first event, and what it has
-- forgotten (objects dropped from the catalog once no description reads them and no listing or
-- notification can name them again): how many, their bytes, and a digest of their (key, ETag, size)
CREATE TABLE reclock.s3_sources (
    source            text PRIMARY KEY REFERENCES reclock.sources(name) ON DELETE CASCADE,
    next_id           integer NOT NULL DEFAULT 1,
    next_base         bigint NOT NULL DEFAULT 0,
    start_after       text COLLATE "C",
    backfilled        boolean NOT NULL DEFAULT false,
    forgotten         bigint NOT NULL DEFAULT 0,
    forgotten_bytes   bigint NOT NULL DEFAULT 0,
    forgotten_digest  bigint NOT NULL DEFAULT 0,
    forgotten_upto    text COLLATE "C"
);
