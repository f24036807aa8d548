"""What the Kinesis source tests share: a cycle context over a stream of the local endpoint, and the check
of a source's collection against an oracle that reads every shard itself from TRIM_HORIZON."""

from __future__ import annotations

import json
from pathlib import Path

from reclock import cycle
from reclock.config import parse_source
from reclock.dev.kinesis import read_stream
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import shard_info
from reclock.read import read_as_of, read_updates
from reclock.sources.kinesis.kind import KINESIS, effective
from reclock.sources.kinesis.sequence import shard_number

from ingest_support import Clock


def kinesis_raw(stream: str, endpoint: str, region: str = "us-east-1", **extra) -> dict:
    section = {"stream": stream, "region": region, "endpoint_url": endpoint, "count_every": 20, "task_records": 60,
               **extra.pop("kinesis", {})}
    return {"kinesis": section, "format": {"type": "json", "schema": "id BIGINT, key STRING, note STRING"},
            "include": ["shard_id", "sequence_number", "partition_key"], "budget": {"max_records": 150}, **extra}


def kinesis_ctx(db: str, endpoint: str, spark, tmp_path: Path, stream: str, name: str = "clicks",
                **extra) -> cycle.CycleContext:
    spec = parse_source(name, kinesis_raw(stream, endpoint, **extra))
    return cycle.CycleContext(spec=spec, dsn=db, blob=LocalBlobStore(tmp_path / "blobs"),
                              upstream=KINESIS.find_upstream(spec), spark_factory=lambda: spark, clock=Clock())


def expected_ts(bindings: list[tuple[int, dict[int, int]]], shard: int, seq: int, since: int) -> int | None:
    """The ts a record gets: the first binding whose position for its shard is beyond it (at least since)."""
    for ts, positions in bindings:
        if seq < positions.get(shard, 0):
            return max(ts, since)
    return None


def check_exactly_once(ctx: cycle.CycleContext, client, stream: str) -> dict:
    """The collection holds each record the oracle reads from the stream that the bindings cover, once, at
    the ts of the binding that covers it; and nothing else. Returns what it saw."""
    truth = read_stream(client, stream)
    with connect(ctx.dsn) as conn:
        rc = load_remap(conn, ctx.spec.name)
        info = shard_info(conn, ctx.spec.name)
        ups = read_updates(conn, ctx.blob, ctx.spec.name)
    listing = ctx.source().upstream().shards()
    bindings = [(b.ts, effective(listing, dict(b.frontier))) for b in rc.bindings]
    rows = ups.to_pylist() if ups is not None else []
    # a part keeps the ts it was written with; compaction may since have advanced the collection's since
    got = sorted((r["_shard_id"], int(r["_sequence_number"]), r["id"], max(r["ts"], rc.since), r["diff"])
                 for r in rows)
    want = []
    for sid, recs in truth.items():
        for r in recs:
            ts = expected_ts(bindings, shard_number(sid), int(r["SequenceNumber"]), rc.since)
            if ts is not None and ts < info.upper:
                want.append((sid, int(r["SequenceNumber"]), json.loads(r["Data"])["id"], ts, 1))
    want.sort()
    assert len(got) == len(set((g[0], g[1]) for g in got)), "a record appears twice"
    missing = sorted(set(want) - set(got))[:5]
    extra = sorted(set(got) - set(want))[:5]
    assert got == want, f"collection != oracle: missing {missing}, extra {extra}"
    return {"rc": rc, "info": info, "rows": rows, "truth": truth, "bound": len(want)}


def check_as_of_every_binding(ctx: cycle.CycleContext, client, stream: str) -> int:
    """AS OF each binding's ts at or after since: the collection's ids equal the oracle's records covered by
    the bindings up to it. Returns how many bindings were checked."""
    truth = read_stream(client, stream)
    listing = ctx.source().upstream().shards()
    with connect(ctx.dsn) as conn:
        rc = load_remap(conn, ctx.spec.name)
        upper = shard_info(conn, ctx.spec.name).upper
        bindings = [(b.ts, effective(listing, dict(b.frontier))) for b in rc.bindings]
        n = 0
        for ts, positions in bindings:
            if not rc.since <= ts < upper:
                continue
            table = read_as_of(conn, ctx.blob, ctx.spec.name, ts)
            got = sorted(table.column("id").to_pylist())
            want = sorted(json.loads(r["Data"])["id"] for sid, recs in truth.items() for r in recs
                          if int(r["SequenceNumber"]) < positions.get(shard_number(sid), 0))
            assert got == want, f"AS OF {ts}: {len(got)} rows, the oracle {len(want)}"
            n += 1
    return n
