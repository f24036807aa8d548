"""Upsert, Avro, compacted topics and failures inside a step, against real Kafka, Postgres and Spark."""

from __future__ import annotations

import io
import json
import time
import zlib
from dataclasses import replace

import pytest
from ingest_support import check_invariants, make_ctx, produce

from reclock import cycle
from reclock.config import parse_source
from reclock.failpoints import FailpointHit, enabled
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.persist.status import latest_statistics
from reclock.persist.upsert_state import state_size
from reclock.read import read_as_of, read_updates
from reclock.sinks.kafka import read_all
from reclock.sources.kafka.upstream import KafkaUpstream

PARTITIONS = 3


def keyed(key: str, value: dict | None) -> tuple[int, bytes, bytes | None]:
    """A record on the partition the key hashes to (a key's records stay in order in one partition)."""
    return zlib.crc32(key.encode()) % PARTITIONS, key.encode(), None if value is None else json.dumps(value).encode()


def consume_all(kafka, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """``(partition, offset, key, value)`` of every record a read_committed consumer sees now."""
    return [(m.partition(), m.offset(), m.key(), m.value()) for m in read_all(kafka.bootstrap, topic, "check")]


def test_upsert_consolidates_to_the_latest_value_per_key_at_every_binding(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=PARTITIONS)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="upserts", envelope="upsert",
                   include=["key", "partition", "offset"], budget={"max_records": 7})
    ctx = replace(ctx, retain_history_ms=10**12)
    history: list[tuple[int, bytes, bytes | None]] = []

    def wave(records):
        produce(kafka, name, records)
        history.extend(records)

    # wave 1: ten keys, several versions each, some deleted (a null value), some deleted and back again;
    # a record without a key and one that does not parse go to the error collection
    wave([keyed(f"k{i % 10}", {"id": i, "name": f"v{i}"}) for i in range(40)])
    wave([keyed("k3", None), keyed("k4", None), keyed("k4", {"id": 99, "name": "back"}), keyed("k5", None)])
    produce(kafka, name, [(0, None, b'{"id": 1}'), keyed("k6", {"id": 7})[:2] + (b"{oops",)])
    for _ in range(3):
        cycle.run_cycle(ctx)
    # wave 2 lands in several cycles (budget 7, one description per upsert cycle)
    wave([keyed(f"k{i % 13}", {"id": 100 + i, "name": f"w{i}"}) for i in range(30)])
    wave([keyed("k0", None), keyed("k12", None)])
    for _ in range(12):
        cycle.run_cycle(ctx)
    # a replayed write + append of an applied description changes nothing (state included)
    with connect(db) as conn:
        rc = load_remap(conn, ctx.spec.name)
        keys_before = state_size(conn, ctx.spec.name)
    replay = cycle.write_batches(ctx, cycle.BatchDescription(0, rc.bindings[0].ts + 1))
    assert [o.status for o in cycle.append(ctx, replay)] == ["already_present", "already_present"]

    with connect(db) as conn:
        rc = load_remap(conn, ctx.spec.name)
        assert len(rc.bindings) >= 2
        offsets_of = {(p, o): (k, v) for p, o, k, v in consume_all(kafka, name)}
        for b in rc.bindings:
            # the latest value per key among the offsets the binding covers
            latest: dict[bytes, tuple] = {}
            for (p, o), (k, v) in sorted(offsets_of.items(), key=lambda x: x[0][1]):
                if k is not None and o < b.frontier.get(p) and (v is None or _parses(v)):
                    latest[k] = (p, o, v)
            want = sorted((json.loads(v)["id"], json.loads(v).get("name"), k, p, o)
                          for k, (p, o, v) in latest.items() if v is not None)
            snap = read_as_of(conn, ctx.blob, ctx.spec.name, b.ts).to_pylist()
            got = sorted((r["id"], r["name"], r["_key"], r["_partition"], r["_offset"]) for r in snap)
            assert got == want, f"AS OF binding {b.ts}"
            assert all(r["diff"] == 1 for r in snap)
        assert state_size(conn, ctx.spec.name) == keys_before == len(want)
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
        assert sorted(e["reason"].split(" (")[0] for e in errors) == [
            "an upsert record needs a key", "value does not parse as JSON of the declared schema"]
        # a cycle reads the state of the keys it touches only: the cost follows the cycle's data
        writes = [st.metrics for st in latest_statistics(conn, ctx.spec.name, "write_batches", limit=100)
                  if "keys" in st.metrics]
        assert writes and all(w["prior_keys"] <= w["keys"] <= w["offsets"] for w in writes)


def _parses(v: bytes) -> bool:
    try:
        return isinstance(json.loads(v), dict)
    except ValueError:
        return False


def test_upsert_rebuild_gives_identical_updates(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=PARTITIONS)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="upsert_rb", envelope="upsert",
                   include=["key"], budget={"max_records": 10})
    produce(kafka, name, [keyed(f"k{i % 4}", {"id": i, "name": "x"}) for i in range(25)] + [keyed("k1", None)])
    for _ in range(4):
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        before = read_updates(conn, ctx.blob, ctx.spec.name).to_pylist()
    cycle.rebuild(ctx)
    with connect(db) as conn:
        since = load_remap(conn, ctx.spec.name).since
        after = read_updates(conn, ctx.blob, ctx.spec.name).to_pylist()
    # the rebuild binds offsets where the remap collection binds them now: idle cycles advanced its since (the
    # bindings at or below it are one), so the original updates are compared forwarded to it
    assert _forwarded(after, since) == _forwarded(before, since)


def _forwarded(updates: list[dict], since: int) -> list[str]:
    """``updates`` with their times advanced to ``since`` and their diffs summed per (row, time)."""
    summed: dict[str, int] = {}
    for u in updates:
        row = {k: v for k, v in u.items() if k != "diff"} | {"ts": max(u["ts"], since)}
        summed[str(row)] = summed.get(str(row), 0) + u["diff"]
    return sorted(f"{k} {d}" for k, d in summed.items() if d)


AVRO_SCHEMA = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": "double"}]}


@pytest.mark.parametrize("wire", ["plain", "confluent"])
def test_avro_with_a_schema_file(db, kafka, topic, spark, tmp_path, wire):
    import fastavro

    (tmp_path / "order.avsc").write_text(json.dumps(AVRO_SCHEMA))
    parsed = fastavro.parse_schema(AVRO_SCHEMA)

    def encode(r: dict) -> bytes:
        b = io.BytesIO()
        if wire == "confluent":
            b.write(b"\x00\x00\x00\x00\x2a")  # magic byte, schema id 42
        fastavro.schemaless_writer(b, parsed, r)
        return b.getvalue()

    name = topic(partitions=2)
    spec = parse_source(f"avro_{wire}", {"kafka": {"topic": name, "bootstrap": kafka.bootstrap},
                                         "format": {"type": "avro", "schema_file": "order.avsc", "wire": wire},
                                         "include": ["partition", "offset"]}, base=tmp_path)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name), spec=spec)
    rows = [{"id": i, "name": None if i % 3 == 0 else f"n{i}", "amount": i / 4} for i in range(20)]
    produce(kafka, name, [(i % 2, None, encode(r)) for i, r in enumerate(rows)] + [(1, None, b"\x07garbage")])
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        got = read_as_of(conn, ctx.blob, ctx.spec.name).to_pylist()
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
    assert sorted((r["id"], r["name"], r["amount"]) for r in got) == [(r["id"], r["name"], r["amount"]) for r in rows]
    assert [(e["partition"], e["raw"]) for e in errors] == [(1, b"\x07garbage")]
    assert "Avro" in errors[0]["reason"] or "Confluent" in errors[0]["reason"]


def test_avro_schema_file_errors_name_the_source(tmp_path):
    from reclock.errors import ConfigError

    base = {"kafka": {"topic": "t"}, "format": {"type": "avro", "schema_file": "missing.avsc"}}
    with pytest.raises(ConfigError, match=r"source s\.format: cannot read the Avro schema file .*missing\.avsc"):
        parse_source("s", base, base=tmp_path)
    (tmp_path / "bad.avsc").write_text('{"type": "record", "name": "x"')
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_source("s", {**base, "format": {"type": "avro", "schema_file": "bad.avsc"}}, base=tmp_path)


def test_compacted_topic_reads_across_offset_gaps(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=2, **{"cleanup.policy": "compact", "segment.ms": "100",
                                  "min.cleanable.dirty.ratio": "0.001", "delete.retention.ms": "100"})
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="compacted", budget={"max_records": 1000})
    # several segments (a segment rolls on the first append after segment.ms), the same keys again and
    # again, and every tenth record a key of its own (it survives compaction: gaps open between them)
    n = 0
    for _ in range(6):
        produce(kafka, name, [(i % 2, (f"u{n + i}" if i % 10 == 0 else f"k{i % 5}").encode(),
                               json.dumps({"id": n + i, "name": "x"}).encode()) for i in range(40)])
        n += 40
        time.sleep(0.3)
    # wait for the log cleaner: offsets disappear, so reads see gaps; then for it to settle
    deadline, seen = time.monotonic() + 90, None
    while time.monotonic() < deadline:
        now = consume_all(kafka, name)
        if len(now) < n and now == seen:
            break
        seen = now
        time.sleep(2)
    assert seen is not None and len(seen) < n, "the log cleaner compacted the topic"
    cycle.run_cycle(ctx)
    expected = {json.loads(v)["id"] for _, _, _, v in consume_all(kafka, name)}
    state = check_invariants(ctx, expected)
    offsets = sorted((r["_partition"], r["_offset"]) for r in state["rows"])
    assert any(b[1] - a[1] > 1 for a, b in zip(offsets, offsets[1:]) if a[0] == b[0]), "the read crossed gaps"


FAILPOINTS = ["mint:after_binding", "write_batches:before_job", "write_batches:after_slice",
              "append:in_transaction", "resume:after_commit"]


@pytest.mark.parametrize("envelope", ["none", "upsert"])
def test_failure_inside_each_step_then_rerun_matches_a_run_without_failure(db, kafka, topic, spark, tmp_path,
                                                                           envelope):
    name = topic(partitions=PARTITIONS)
    now = [1_800_000_000_000]
    ctxs = {}
    for point in [None, *FAILPOINTS]:
        label = "reference" if point is None else point.replace(":", "_")
        ctx = make_ctx(db, kafka, spark, tmp_path, name, name=f"fp_{label}"[:40], envelope=envelope,
                       include=["key", "partition", "offset"], budget={"max_records": 40})
        ctxs[point] = replace(ctx, clock=lambda: now[0], retain_history_ms=10**12)

    def cycle_all():
        for point, ctx in ctxs.items():
            if point is not None:
                with enabled(point), pytest.raises(FailpointHit):
                    cycle.run_cycle(ctx)
            cycle.run_cycle(ctx)  # the rerun
            if envelope == "upsert":
                cycle.run_cycle(ctx)  # one description per upsert cycle: finish the backlog

    produce(kafka, name, [keyed(f"k{i % 9}", {"id": i, "name": "a"}) for i in range(100)])
    cycle_all()
    now[0] += 5000
    produce(kafka, name, [keyed(f"k{i % 11}", None if i % 5 == 0 else {"id": i, "name": "b"})
                          for i in range(100, 150)])
    cycle_all()

    def contents(ctx):
        with connect(db) as conn:
            ups = read_updates(conn, ctx.blob, ctx.spec.name).to_pylist()
            rc = load_remap(conn, ctx.spec.name)
        committed = KafkaUpstream(ctx.spec.name, ctx.upstream, name).committed(ctx.spec.consumer_group)
        return sorted(map(str, ups)), [(b.ts, b.frontier.as_dict()) for b in rc.bindings], committed

    reference = contents(ctxs[None])
    assert reference[0] and len(reference[1]) == 2
    for point, ctx in ctxs.items():
        assert contents(ctx) == reference, f"after a failure at {point}"
