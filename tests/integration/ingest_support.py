"""What the ingestion tests share: a controllable clock, a source context, a producer, invariant checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

from confluent_kafka import IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from reclock import cycle, remap
from reclock.config import parse_source
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import shard_info
from reclock.read import read_updates
from reclock.sources.kafka.upstream import KafkaUpstream


class Clock:
    """A controllable wall clock in ms (bindings must still never go backwards)."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.t = start

    def __call__(self) -> int:
        self.t += 1000
        return self.t


def make_ctx(db: str, kafka, spark, tmp_path: Path, topic: str, name: str = "orders", **extra) -> cycle.CycleContext:
    raw = {"kafka": {"topic": topic, "bootstrap": kafka.bootstrap},
           "format": {"type": "json", "schema": "id BIGINT, name STRING"},
           "include": ["partition", "offset", "key"], "budget": {"max_records": 50}, **extra}
    return cycle.CycleContext(spec=parse_source(name, raw), dsn=db, upstream=kafka.bootstrap,
                              blob=LocalBlobStore(tmp_path / "blobs"), spark_factory=lambda: spark,
                              clock=Clock())


def produce(kafka, topic: str, records: list[tuple[int, bytes | None, bytes | None]],
            transactional: str | None = None, abort: bool = False) -> None:
    conf = {"bootstrap.servers": kafka.bootstrap}
    if transactional:
        conf["transactional.id"] = transactional
    p = Producer(conf)
    if transactional:
        p.init_transactions(30)
        p.begin_transaction()
    for part, key, value in records:
        p.produce(topic, value=value, key=key, partition=part)
    assert p.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
    if transactional:
        (p.abort_transaction if abort else p.commit_transaction)(30)
        wait_stable(kafka, topic, {part for part, _, _ in records})


def wait_stable(kafka, topic: str, partitions: set[int], timeout: float = 30.0) -> None:
    """Wait until the transaction markers are written: the coordinator writes them after commit/abort returns,
    so until then a partition's last stable offset stays below records produced later, and a cycle minted in
    between would rightly leave those out."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    deadline = time.monotonic() + timeout
    while True:
        ends = {}
        for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
            futs = admin.list_offsets({TopicPartition(topic, q): OffsetSpec.latest() for q in partitions},
                                      isolation_level=level, request_timeout=10)
            ends[level] = {tp.partition: f.result().offset for tp, f in futs.items()}
        if ends[IsolationLevel.READ_COMMITTED] == ends[IsolationLevel.READ_UNCOMMITTED]:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: transaction markers not written after {timeout}s: {ends}")
        time.sleep(0.05)


def rec(i: int, part: int) -> tuple[int, bytes, bytes]:
    return part, f"k{i % 7}".encode(), json.dumps({"id": i, "name": f"n{i}"}).encode()


def check_invariants(ctx: cycle.CycleContext, expected_ids: set[int]) -> dict:
    with connect(ctx.dsn) as conn:
        rc = load_remap(conn, ctx.spec.name)
        info = shard_info(conn, ctx.spec.name)
        ups = read_updates(conn, ctx.blob, ctx.spec.name)
    rows = ups.to_pylist() if ups is not None else []
    ids = [r["id"] for r in rows if r["id"] is not None]
    assert sorted(ids) == sorted(expected_ids), "every committed record exactly once, aborted ones never"
    for r in rows:
        # the binding that covers the offset gave the ts (compaction may since have advanced it to since)
        assert max(r["ts"], rc.since) == remap.reclock(rc, r["_partition"], r["_offset"])
        assert r["diff"] == 1
    committed = KafkaUpstream(ctx.spec.name, ctx.upstream, ctx.spec.upstream.topic).committed(ctx.spec.consumer_group)
    assert committed == remap.source_upper_at(rc, min(rc.upper, info.upper)), "group offsets = resumption frontier"
    return {"rc": rc, "info": info, "rows": rows}
