"""An S3 source's config: its ``s3:`` section (:class:`S3Spec`: the objects under an ``s3://`` prefix or in a
local folder, how they are discovered, what overwrites do) and the keys beside it that an S3 source takes:
``format`` (lines: json, csv, text; whole objects: parquet, avro), ``include``, ``budget`` (``max_bytes``,
``max_objects``), ``on_decode_error`` and the schedule's (``interval``, ``upstream``). docs/s3.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from reclock.errors import ConfigError
from reclock.specs import (SCHEDULE_KEYS, SourceSpec, choice, parse_duration, parse_format, parse_include,
                           parse_on_decode_error, parse_schedule, refuse_unknown, require)

FORMATS = ("json", "csv", "text", "parquet", "avro")
"""An S3 source's formats: lines (JSON lines, CSV, text; also gzip'd) or whole objects (Parquet, Avro files)."""
METADATA = ("key", "offset", "last_modified")
"""An S3 source's metadata columns (``include:``): ``_key``, ``_offset``, ``_last_modified``."""
DISCOVERIES = ("listing", "notifications")
KEY_ORDERS = ("any", "increasing")
OVERWRITES = ("stall", "collect", "reingest")
COMPRESSIONS = ("auto", "gzip", "none")
SCHEDULES = ("interval", "upstream")


@dataclass(frozen=True)
class S3Spec:
    """An S3 source's upstream: the objects under ``url`` (``s3://bucket/prefix/`` on the S3 API its
    ``connection`` reaches, or a local folder), how they are discovered, and what overwrites do
    (``reclock.sources.s3``; docs/s3.md)."""

    kind: ClassVar[str] = "s3"
    url: str
    connection: str | None = "reclock_s3"  # an Airflow connection of type aws (None: a local folder)
    connection_named: bool = False  # the config names `connection:` (its keys are then never passed over)
    discovery: str = "listing"  # listing | notifications (S3 event notifications through SQS `queue`)
    keys: str = "any"  # listing: any (every cycle lists everything) | increasing (after a key frontier)
    lookback_s: float = 3600.0  # keys increasing: how late a key may arrive after greater ones
    queue: str | None = None  # notifications: the SQS queue URL the bucket's events go to
    dedupe_s: float | None = None  # notifications: how long an object is remembered (None: queue retention)
    backfill: bool = True  # notifications: the first cycle also lists what is there already
    settle_s: float = 30.0  # a local file unchanged this long is complete (S3 objects: on sight)
    on_overwrite: str = "stall"  # stall | collect | reingest
    compression: str = "auto"  # auto (.gz keys are gzip) | gzip | none
    max_objects_per_cycle: int = 100_000  # new objects one binding takes (the rest: the next cycles)
    max_bytes: int = 1 << 30  # bytes one Spark job reads
    max_objects: int = 100_000  # objects one Spark job reads

    @property
    def is_folder(self) -> bool:
        return not self.url.startswith(("s3://", "s3a://"))

    def shards(self, source: SourceSpec) -> tuple[str, ...]:
        """The source's collection (output 0) and its error collection."""
        return (source.data_shard, source.errors_shard)


def parse_size(value: Any, what: str) -> int:
    """A byte count: an int, or text like 512MB / 1GiB / 64k."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.match(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", str(value).lower())
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"{what}: {value!r} is not a size like 134217728, 128MB or 1GiB")
    return int(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_")


def _positive_count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{what}: a positive number of objects, got {value!r}")
    return value


def parse_s3_source(name: str, d: dict, base: Path | None) -> SourceSpec:
    """The source ``name``'s mapping ``d`` (it has an ``s3:`` section), validated."""
    what = f"source {name}"
    refuse_unknown(d, {"s3", "format", "include", "budget", "on_decode_error", *SCHEDULE_KEYS}, what)
    s = require(d["s3"], f"{what}.s3")
    refuse_unknown(s, {"connection", "url", "discovery", "keys", "lookback", "queue", "dedupe", "backfill", "settle",
                       "on_overwrite", "compression", "max_objects_per_cycle"}, f"{what}.s3")
    url = s.get("url")
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{what}.s3: `url` is required: s3://bucket/prefix/ or a local folder (/path, file:///path)")
    is_s3 = url.startswith(("s3://", "s3a://"))
    if is_s3:
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        if not bucket:
            raise ConfigError(f"{what}.s3: url {url!r} names no bucket (s3://bucket/prefix/)")
    elif not (url.startswith("file://") or url.startswith("/")):
        raise ConfigError(f"{what}.s3: url {url!r} is neither s3://bucket/prefix/ nor an absolute folder path")
    if not is_s3 and "connection" in s:
        raise ConfigError(f"{what}.s3: `connection:` is for an s3:// url; {url} is a local folder")
    connection = str(s.get("connection", "reclock_s3")) if is_s3 else None
    discovery = choice(s.get("discovery", "listing"), DISCOVERIES, f"{what}.s3.discovery")
    keys = choice(s.get("keys", "any"), KEY_ORDERS, f"{what}.s3.keys")
    if discovery == "notifications":
        if not is_s3:
            raise ConfigError(f"{what}.s3: `discovery: notifications` needs an s3:// url (a folder is listed)")
        if not isinstance(s.get("queue"), str) or not s["queue"]:
            raise ConfigError(f"{what}.s3: `discovery: notifications` needs `queue:`, the SQS queue the bucket's event "
                              "notifications go to: its URL (https://sqs.<region>.amazonaws.com/<account>/<name>) or "
                              "its name (in the connection's region)")
        for key in ("keys", "lookback"):
            if key in s:
                raise ConfigError(f"{what}.s3: `{key}:` is for `discovery: listing`")
    else:
        for key in ("queue", "dedupe", "backfill"):
            if key in s:
                raise ConfigError(f"{what}.s3: `{key}:` is for `discovery: notifications`")
        if "lookback" in s and keys != "increasing":
            raise ConfigError(f"{what}.s3: `lookback:` is for `keys: increasing` (a listing that starts after a key "
                              "frontier)")
    if "settle" in s and is_s3:
        raise ConfigError(f"{what}.s3: `settle:` is for a local folder (S3 objects are complete when they appear)")
    backfill = s.get("backfill", True)
    if not isinstance(backfill, bool):
        raise ConfigError(f"{what}.s3.backfill: true or false")
    max_new = _positive_count(s.get("max_objects_per_cycle", 100_000), f"{what}.s3.max_objects_per_cycle")
    fmt = parse_format(d.get("format", {"type": "json"}), f"{what}.format", base, FORMATS, wires=())
    compression = choice(s.get("compression", "auto"), COMPRESSIONS, f"{what}.s3.compression")
    if fmt.type in ("parquet", "avro") and compression == "gzip":
        raise ConfigError(f"{what}.s3: {fmt.type} files compress inside; `compression: gzip` is for line formats")
    include = parse_include(d, METADATA, what)
    b = require(d.get("budget", {}) or {}, f"{what}.budget")
    refuse_unknown(b, {"max_bytes", "max_objects"}, f"{what}.budget")
    max_bytes = parse_size(b.get("max_bytes", S3Spec.max_bytes), f"{what}.budget.max_bytes")
    max_objects = _positive_count(b.get("max_objects", S3Spec.max_objects), f"{what}.budget.max_objects")
    on_err = parse_on_decode_error(d, what)
    dedupe = s.get("dedupe")
    spec = S3Spec(url=url, connection=connection, connection_named="connection" in s, discovery=discovery, keys=keys,
                  lookback_s=parse_duration(s.get("lookback", "1h"), f"{what}.s3.lookback"),
                  queue=s.get("queue"), dedupe_s=None if dedupe is None else parse_duration(dedupe, f"{what}.s3.dedupe"),
                  backfill=backfill, settle_s=parse_duration(s.get("settle", "30s"), f"{what}.s3.settle"),
                  on_overwrite=choice(s.get("on_overwrite", "stall"), OVERWRITES, f"{what}.s3.on_overwrite"),
                  compression=compression, max_objects_per_cycle=max_new, max_bytes=max_bytes, max_objects=max_objects)
    sched = parse_schedule(d, what, SCHEDULES)
    return SourceSpec(name=name, upstream=spec, format=fmt, include=include, on_decode_error=on_err, **sched)
