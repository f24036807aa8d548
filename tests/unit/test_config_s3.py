"""An S3 source's config: every key checked, and each mistake an error naming the source and the key."""

from __future__ import annotations

import pytest

from reclock.config import parse_source
from reclock.errors import ConfigError
from reclock.sources.s3.spec import S3Spec

S3 = {"s3": {"url": "s3://landing/events/"}, "format": {"type": "json", "schema": "n BIGINT"}}


def s3(**keys):
    return {**S3, "s3": {**S3["s3"], **keys}}


def test_defaults_and_a_local_folder():
    spec = parse_source("ev", S3)
    assert spec.kind == "s3" and isinstance(spec.upstream, S3Spec)
    s = spec.upstream
    assert (s.connection, s.discovery, s.keys, s.on_overwrite, s.compression) == (
        "reclock_s3", "listing", "any", "stall", "auto")
    assert (s.lookback_s, s.max_objects_per_cycle, s.backfill) == (3600, 100_000, True)
    assert spec.schedule == "interval" and spec.shards == ("ev", "ev_errors")
    folder = parse_source("ev", {**S3, "s3": {"url": "/data/landing", "settle": "5s"}})
    assert folder.upstream.connection is None and folder.upstream.settle_s == 5
    notified = parse_source("ev", s3(discovery="notifications", queue="landing-events", dedupe="2d", backfill=False))
    assert (notified.upstream.queue, notified.upstream.dedupe_s, notified.upstream.backfill) == ("landing-events", 2 * 86400, False)
    sized = parse_source("ev", {**S3, "budget": {"max_bytes": "64MB", "max_objects": 10}})
    assert (sized.upstream.max_bytes, sized.upstream.max_objects) == (64 * 1024 * 1024, 10)


@pytest.mark.parametrize("raw,match", [
    ({"s3": {}}, r"source ev\.s3: `url` is required"),
    ({"s3": {"url": "s3:///events/"}}, "names no bucket"),
    ({"s3": {"url": "landing/events"}}, "neither s3://bucket/prefix/ nor an absolute folder"),
    ({"s3": {"url": "https://landing.upstream.amazonaws.com/e/"}}, "neither s3://"),
    ({"s3": {"url": "/data/landing", "connection": "reclock_s3"}}, "`connection:` is for an s3:// url"),
    ({**S3, "kafka": {"topic": "t"}}, "a source is of one kind; it has `kafka:` and `s3:`"),
    ({**S3, "tables": ["a"]}, r"source ev: unknown key\(s\) tables"),
    (s3(bucket="landing"), r"source ev\.s3: unknown key\(s\) bucket"),
    (s3(discovery="events"), r"source ev\.s3\.discovery: 'events' is not one of listing, notifications"),
    (s3(discovery="notifications"), "needs `queue:`"),
    (s3(discovery="notifications", queue=""), "needs `queue:`"),
    ({"s3": {"url": "/data/landing", "discovery": "notifications", "queue": "q"}}, "needs an s3:// url"),
    (s3(discovery="notifications", queue="q", keys="increasing"), "`keys:` is for `discovery: listing`"),
    (s3(discovery="notifications", queue="q", lookback="1h"), "`lookback:` is for `discovery: listing`"),
    (s3(queue="q"), "`queue:` is for `discovery: notifications`"),
    (s3(dedupe="4d"), "`dedupe:` is for `discovery: notifications`"),
    (s3(backfill=True), "`backfill:` is for `discovery: notifications`"),
    (s3(discovery="notifications", queue="q", backfill="yes"), r"backfill: true or false"),
    (s3(lookback="1h"), "`lookback:` is for `keys: increasing`"),
    (s3(keys="sorted"), r"keys: 'sorted' is not one of any, increasing"),
    (s3(keys="increasing", lookback="soon"), r"source ev\.s3\.lookback"),
    (s3(settle="30s"), "`settle:` is for a local folder"),
    (s3(on_overwrite="ignore"), r"on_overwrite: 'ignore' is not one of stall, collect, reingest"),
    (s3(compression="zstd"), r"compression: 'zstd' is not one of auto, gzip, none"),
    (s3(max_objects_per_cycle=0), "max_objects_per_cycle: a positive number"),
    (s3(max_objects_per_cycle=True), "max_objects_per_cycle: a positive number"),
    ({**S3, "format": {"type": "orc"}}, r"source ev\.format: type 'orc' is not one of json, csv, text, parquet, avro"),
    ({**S3, "format": {"type": "json"}}, "type json needs a `schema`"),
    ({**S3, "format": {"type": "parquet"}}, "type parquet needs a `schema`"),
    ({**S3, "format": {"type": "json", "schema": "n BIGINT", "header": True}}, "`header:` is for csv"),
    ({**S3, "format": {"type": "json", "schema": "n BIGINT", "wire": "confluent"}}, r"unknown key\(s\) wire"),
    ({**s3(compression="gzip"), "format": {"type": "parquet", "schema": "n BIGINT"}}, "compress inside"),
    ({**S3, "include": ["partition"]}, r"include \['partition'\] not among key, offset, last_modified"),
    ({**S3, "budget": {"max_records": 10}}, r"budget: unknown key\(s\) max_records"),
    ({**S3, "budget": {"max_bytes": "lots"}}, r"budget\.max_bytes"),
    ({**S3, "budget": {"max_objects": -1}}, "max_objects: a positive number"),
    ({**S3, "on_decode_error": "skip"}, r"on_decode_error: 'skip' is not one of collect, stall"),
    ({**S3, "schedule": "continuous"}, r"schedule 'continuous' is not one of interval, upstream"),
    ({**S3, "group": "g"}, "`group:` is for `schedule: continuous`"),
    ({**S3, "envelope": "upsert"}, r"unknown key\(s\) envelope"),
])
def test_each_mistake_is_an_error_naming_the_source_and_the_key(raw, match):
    with pytest.raises(ConfigError, match=match):
        parse_source("ev", raw)
