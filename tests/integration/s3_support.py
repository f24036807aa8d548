"""What the S3 source tests share: a cycle context for an S3 (moto) or folder source, an oracle that reads
the objects itself, and the collection's rows."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

from reclock import cycle
from reclock.config import parse_source
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.shards import shard_info
from reclock.read import read_updates

from ingest_support import Clock

SCHEMA = "n BIGINT, s STRING"


def make_ctx(db: str, spark, tmp_path: Path, url: str, settings=None, name: str = "ev", s3: dict | None = None,
             clock=None, **extra) -> cycle.CycleContext:
    raw = {"s3": {"url": url, **(s3 or {})}, "format": {"type": "json", "schema": SCHEMA},
           "include": ["key", "offset"], **extra}
    return cycle.CycleContext(spec=parse_source(name, raw), dsn=db, blob=LocalBlobStore(tmp_path / "blobs"),
                              spark_factory=lambda: spark, clock=clock or Clock(), upstream=settings)


def new_bucket(s3) -> str:
    name = f"s{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return name


def body(ns, gz: bool = False) -> bytes:
    data = b"".join(json.dumps({"n": n, "s": f"v{n} ü"}).encode() + b"\n" for n in ns)
    return gzip.compress(data) if gz else data


def oracle_s3(s3, bucket: str, prefix: str) -> list[int]:
    """Every record the bucket holds under ``prefix``, read from S3 itself (not through Reclock)."""
    c = s3.client()
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", ()):
            data = c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            if o["Key"].endswith(".gz"):
                data = gzip.decompress(data)
            out += [json.loads(line)["n"] for line in data.splitlines() if line.strip()]
    return sorted(out)


def collection(ctx: cycle.CycleContext, shard: str | None = None) -> list[dict]:
    with connect(ctx.dsn) as conn:
        t = read_updates(conn, ctx.blob, shard or ctx.spec.data_shard)
    return [] if t is None else t.to_pylist()


def upper(ctx: cycle.CycleContext) -> int:
    with connect(ctx.dsn) as conn:
        return shard_info(conn, ctx.spec.data_shard).upper
