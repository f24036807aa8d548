"""A Kinesis source's decode formats, envelopes, error collection, rebuild, KCL checkpoints, trigger probe and
lag, as for Kafka sources, against the local endpoint."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

import pytest

from reclock import cycle
from reclock.dev.kinesis import BackgroundProducer, read_stream
from reclock.errors import DecodeError
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.read import read_as_of, read_updates
from reclock.sources.kinesis.checkpoints import read_checkpoints
from reclock.sources.kinesis.kind import effective
from reclock.sources.kinesis.lineage import kcl_checkpoint
from reclock.sources.kinesis.probe import moved, stream_lag
from reclock.sources.kinesis.sequence import shard_id

from kinesis_support import check_exactly_once, kinesis_ctx


def put_bad(c, stream: str, n: int) -> None:
    c.put_records(StreamName=stream, Records=[{"Data": b"{not json", "PartitionKey": f"bad{i}"} for i in range(n)])


def test_upsert_by_partition_key_across_a_split_with_bad_records_collected(db, kinesis, stream, spark, tmp_path):
    name = stream(1)
    c = kinesis.client()
    ctx = kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name, envelope="upsert")
    producer = BackgroundProducer(c, name, keys=12)
    producer.put(60)
    put_bad(c, name, 3)
    cycle.run_cycle(ctx)
    producer.put(30)
    c.split_shard(StreamName=name, ShardToSplit=shard_id(0), NewStartingHashKey=str(2 ** 127))
    kinesis.wait_active(name)
    producer.put(60)  # the same keys, now in the children: their values must win over the parent's
    for _ in range(4):
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        now = read_as_of(conn, ctx.blob, "clicks").to_pylist()
        errors = read_as_of(conn, ctx.blob, "clicks_errors").to_pylist()
    latest = {}
    for i in sorted(producer.acked):
        latest[f"k{i % 12}"] = i
    assert sorted((r["key"], r["id"]) for r in now) == sorted(latest.items())
    assert len(errors) == 3 and all(e["reason"].startswith("value does not parse as JSON") for e in errors)
    truth = {(sid, r["SequenceNumber"]) for sid, recs in read_stream(c, name).items() for r in recs
             if r["Data"] == b"{not json"}
    assert {(e["shard_id"], e["sequence_number"]) for e in errors} == truth
    assert {e["key"] for e in errors} == {b"bad0", b"bad1", b"bad2"}


def test_stall_names_the_shard_and_sequence_number(db, kinesis, stream, spark, tmp_path):
    name = stream(1)
    c = kinesis.client()
    ctx = kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name, on_decode_error="stall")
    BackgroundProducer(c, name).put(5)
    put_bad(c, name, 1)
    seq = read_stream(c, name)[shard_id(0)][-1]["SequenceNumber"]
    with pytest.raises(DecodeError, match=f"source clicks: record at shard {shard_id(0)} sequence number {seq}: "
                                          "value does not parse as JSON"):
        cycle.run_cycle(ctx)


def test_rebuild_gives_the_same_updates_after_reshards_and_compaction(db, kinesis, stream, spark, tmp_path):
    name = stream(2)
    c = kinesis.client()
    ctx = kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name)
    producer = BackgroundProducer(c, name, keys=20)
    for i in range(3):
        producer.put(40)
        # open shards by hash range: a merge takes two whose ranges touch
        opened = [s["ShardId"] for s in sorted((s for s in c.list_shards(StreamName=name)["Shards"]
                                                if "EndingSequenceNumber" not in s["SequenceNumberRange"]),
                                               key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))]
        if i < 2:
            c.merge_shards(StreamName=name, ShardToMerge=opened[0], AdjacentShardToMerge=opened[1]) if i else \
                c.split_shard(StreamName=name, ShardToSplit=opened[0], NewStartingHashKey=str(2 ** 126))
            kinesis.wait_active(name)
        for _ in range(3):
            cycle.run_cycle(ctx)
    with connect(db) as conn:
        before = read_updates(conn, ctx.blob, "clicks").to_pylist()
        rc = load_remap(conn, "clicks")
        (dropped,) = conn.execute("SELECT dropped_records FROM reclock.kinesis_streams").fetchone()
    assert dropped > 0, "the test means a rebuild over shards compaction dropped"
    cycle.rebuild(ctx)
    with connect(db) as conn:
        after = read_updates(conn, ctx.blob, "clicks").to_pylist()
    # compaction may have advanced times to since: compare as a reader at or after since sees them
    def norm(rows):
        return sorted(tuple(sorted({**r, "ts": max(r["ts"], rc.since)}.items())) for r in rows)
    assert norm(after) == norm(before) and len(after) == 120
    assert check_exactly_once(ctx, c, name)["bound"] == 120


def test_checkpoints_match_the_resumption_frontier_and_the_probes_see_the_tip(db, kinesis, stream, spark,
                                                                               tmp_path, s3, monkeypatch):
    name = stream(2)
    c = kinesis.client()
    table = f"kcl-{uuid.uuid4().hex[:8]}"
    ctx = kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name,
                      kinesis={"checkpoints": {"table": table, "endpoint_url": s3.endpoint_url}})
    producer = BackgroundProducer(c, name, keys=20)
    producer.put(50)
    cycle.run_cycle(ctx)
    c.split_shard(StreamName=name, ShardToSplit=shard_id(0), NewStartingHashKey=str(2 ** 126))
    kinesis.wait_active(name)
    producer.put(50)
    for _ in range(3):
        cycle.run_cycle(ctx)
    up = ctx.source().upstream()
    listing = up.shards()
    with connect(db) as conn:
        rc = load_remap(conn, "clicks")
    positions = effective(listing, dict(rc.bindings[-1].frontier))
    want = {shard_id(s.number): kcl_checkpoint(s, positions.get(s.number, 0)) for s in listing}
    assert read_checkpoints(ctx.spec.upstream.checkpoints) == want
    assert want[shard_id(0)] == "SHARD_END" and want[shard_id(1)] not in ("TRIM_HORIZON", "SHARD_END")

    assert moved(up, dict(rc.bindings[-1].frontier)) == (False, "no readable shard has anything beyond the newest "
                                                                "binding")
    assert stream_lag(up, positions).records == 0
    producer.put(7)
    assert moved(up, dict(rc.bindings[-1].frontier))[0]
    lag = stream_lag(up, positions)
    assert lag.records == 7 and lag.millis >= 0
    monkeypatch.setenv("RECLOCK_DSN", db)
    status = ctx.kind.lag(ctx.spec, ctx.upstream, 5.0)
    assert status.records == 7 and "7 records" in status.detail
