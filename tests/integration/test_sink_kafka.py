"""The exactly-once Kafka sink against a real broker, with sink processes killed (SIGKILL, and a crash
inside an open transaction), fenced by a second instance, holding compaction back, and started late."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pyarrow.compute as pc
import pytest
import yaml
from confluent_kafka import Producer
from ingest_support import make_ctx

from reclock import cycle
from reclock.config import parse_config
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import read_holds, shard_info
from reclock.read import read_updates
from reclock.sinks.encode import encode_updates
from reclock.sinks.kafka import (TS_HEADER, SinkContext, SinkRefused, _fatal_cause, _fenced, read_all, consolidate,
                                 drop, ensure_topics, read_progress, run_once)

KEYS = 12


class Source:
    """An upsert source over a 3-partition topic whose cycles run in this process (Spark in-process)."""

    def __init__(self, db, kafka, topic, spark, tmp_path, name: str, retain_ms: int = 10**12) -> None:
        self.topic = topic(partitions=3)
        self.kafka = kafka
        self.producer = Producer({"bootstrap.servers": kafka.bootstrap})
        self.n = 0
        self.now = [1_800_000_000_000]
        ctx = make_ctx(db, kafka, spark, tmp_path, self.topic, name=name, envelope="upsert", include=["key"],
                       budget={"max_records": 10_000})
        self.ctx = replace(ctx, clock=self.tick, retain_history_ms=retain_ms)

    def tick(self) -> int:
        self.now[0] += 1000
        return self.now[0]

    def cycles(self, count: int, per: int = 40) -> None:
        """``count`` cycles, each after ``per`` new records (updates of KEYS keys, some deletes)."""
        for _ in range(count):
            for _ in range(per):
                i, self.n = self.n, self.n + 1
                key = f"k{(i * 7) % KEYS}".encode()
                value = None if i % 11 == 5 else json.dumps({"id": i, "name": f"v{i}"}).encode()
                self.producer.produce(self.topic, key=key, value=value, partition=zlib.crc32(key) % 3)
            assert self.producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
            cycle.run_cycle(self.ctx)


def sink_config(tmp_path: Path, source: Source, name: str, **sink) -> Path:
    """A config file with the source and one sink on it (what the sink processes load)."""
    raw = {"sources": {source.ctx.spec.name: {"kafka": {"topic": source.topic, "bootstrap": source.kafka.bootstrap},
                                              "format": {"type": "json", "schema": "id BIGINT, name STRING"},
                                              "envelope": "upsert", "include": ["key"]}},
           "sinks": {name: {"from": source.ctx.spec.name, "format": "debezium", "key": ["_key"],
                            "kafka": {"topic": f"{source.topic}_{name}", "bootstrap": source.kafka.bootstrap},
                            "progress_topic": f"_progress_{source.topic}", "budget": {"max_messages": 25},
                            "transaction_timeout": "20s", **sink}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def spec_of(config: Path, name: str):
    return parse_config(yaml.safe_load(config.read_text())).sinks[name]


def sink_ctx(source: Source, config: Path, name: str) -> SinkContext:
    return SinkContext(spec=spec_of(config, name), dsn=source.ctx.dsn, kafka=source.kafka.bootstrap,
                       blob=source.ctx.blob)


def sink_process(source: Source, config: Path, name: str, *args: str, failpoints: str = "") -> subprocess.Popen:
    """``reclock sink run NAME ...`` in a process of its own; its output goes to ``p.log`` (read with
    ``output(p)``), never to a pipe that could fill up and block it."""
    env = {**os.environ, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": source.ctx.dsn,
           "RECLOCK_BLOB_URL": str(source.ctx.blob.root), "RECLOCK_FAILPOINTS": failpoints}
    log = config.parent / f"{name}-{time.monotonic_ns()}.log"
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "reclock.cli", "sink", "run", name, *args], env=env,
                             stdout=f, stderr=subprocess.STDOUT, text=True)
    p.log = log
    return p


def output(p: subprocess.Popen) -> str:
    return p.log.read_text()


def topic_messages(kafka, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """``(ts, key, value)`` of every committed message, in the topic's order (one partition)."""
    return [(int(dict(m.headers())[TS_HEADER]), m.key(), m.value()) for m in read_all(kafka.bootstrap, topic, "v")]


def expected_messages(source: Source, spec, start: int) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a sink that started at ``start`` must write: the collection AS OF ``start`` (its snapshot, at
    ``start``), then the consolidated updates of every later ts, in order, encoded."""
    with connect(source.ctx.dsn) as conn:
        ups = read_updates(conn, source.ctx.blob, spec.collection)
    ups = ups.set_column(ups.schema.get_field_index("ts"), "ts", pc.max_element_wise(ups["ts"], start))
    return encode_updates(spec, consolidate(ups))


def collection_after(messages) -> dict:
    """The collection (key -> row) that debezium messages add up to."""
    state: dict = {}
    for _, key, value in messages:
        after = json.loads(value)["after"]
        if after is None:
            state.pop(key, None)
        else:
            state[key] = after
    return state


def check_exactly_once(source: Source, config: Path, name: str) -> None:
    """Every update the shard holds, written exactly once, in timestamp order. At or below the shard's since,
    part compaction may have advanced the updates' times (to at most since) and consolidated them, so the
    shard no longer tells the messages there one by one: they are checked by the collection they add up to
    (and one message per key and timestamp); above since, message by message."""
    spec = spec_of(config, name)
    got = topic_messages(source.kafka, spec.kafka.topic)
    assert got, "the sink wrote something"
    with connect(source.ctx.dsn) as conn:
        info = shard_info(conn, spec.collection)
    expected = expected_messages(source, spec, got[0][0])
    above = [m for m in got if m[0] > info.since]
    assert above == [m for m in expected if m[0] > info.since], "every update exactly once, in timestamp order"
    assert collection_after(m for m in got if m[0] <= info.since) == \
        collection_after(m for m in expected if m[0] <= info.since), "the collection AS OF since"
    assert [m[0] for m in got] == sorted(m[0] for m in got) and len({m[:2] for m in got}) == len(got)
    assert read_progress(source.kafka.bootstrap, spec.progress_topic, name).frontier == info.upper


@pytest.mark.parametrize("rounds", [pytest.param(6, id="short"),
                                    pytest.param(12, id="long", marks=pytest.mark.deployment)])
def test_sigkill_at_random_moments_and_inside_transactions_is_exactly_once(db, kafka, topic, spark, tmp_path,
                                                                           rounds):
    """``rounds`` sink processes: every third ends inside its open transaction (a fail point), the others are
    SIGKILLed at a random moment; the suite runs 6 (2 fail points, 4 kills), ``--deployment`` 12."""
    source = Source(db, kafka, topic, spark, tmp_path, "killed")
    source.cycles(8)
    config = sink_config(tmp_path, source, "out")
    rng = random.Random(7)
    crashed_inside = killed = 0
    for i in range(rounds):
        if i % 3 == 0:
            # a crash inside an open transaction: messages produced, the progress record not committed
            source.cycles(1)
            p = sink_process(source, config, "out", "--follow", "0.1", failpoints="sink:in_transaction=exit")
            assert p.wait(60) == 86, output(p)
            crashed_inside += 1
        else:
            p = sink_process(source, config, "out", "--follow", "0.1")
            time.sleep(rng.uniform(0.3, 3.0))
            p.send_signal(signal.SIGKILL)
            p.wait(30)
            killed += 1
        if i % 4 == 1:
            source.cycles(2)  # the collection grows while the sink is down
    final = sink_process(source, config, "out")
    assert final.wait(120) == 0, output(final)
    assert (crashed_inside, killed) == ((rounds + 2) // 3, rounds - (rounds + 2) // 3)
    check_exactly_once(source, config, "out")


def test_two_instances_one_is_fenced_output_still_exactly_once(db, kafka, topic, spark, tmp_path):
    source = Source(db, kafka, topic, spark, tmp_path, "fenced")
    source.cycles(3)
    config = sink_config(tmp_path, source, "dup")
    a = sink_process(source, config, "dup", "--follow", "0.1")
    deadline = time.monotonic() + 60
    while "transactions" not in output(a):
        assert time.monotonic() < deadline and a.poll() is None, output(a)
        time.sleep(0.2)
    b = sink_process(source, config, "dup", "--follow", "0.1")  # its init_transactions fences a
    while "started" not in output(b):
        assert time.monotonic() < deadline and b.poll() is None, output(b)
        time.sleep(0.2)
    source.cycles(2)  # new data: both try to write it; the fenced one fails at its first transaction
    while a.poll() is None:
        assert time.monotonic() < deadline + 60, "the first instance was not fenced"
        time.sleep(0.2)
    assert a.returncode != 0 and "fenced by a newer instance" in output(a), output(a)
    assert b.poll() is None, output(b)
    winner = b
    winner.send_signal(signal.SIGKILL)
    winner.wait(30)
    final = sink_process(source, config, "dup")
    assert final.wait(120) == 0, output(final)
    check_exactly_once(source, config, "dup")


def test_a_fenced_producer_s_fatal_error_is_named_as_fencing(kafka, topic):
    """A producer fenced while it writes may learn it from a broker's answer in the background: its next
    ``produce`` raises only ``_FATAL`` ("Local: Fatal error"), and the sink names the cause (CI saw the bare
    ``_FATAL`` in the test above, where the fenced instance must say it was fenced)."""
    from confluent_kafka import KafkaError, KafkaException

    name = topic(partitions=2)
    conf = {"bootstrap.servers": kafka.bootstrap, "transactional.id": f"fatal-{name}"}
    old = Producer(conf)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(name, b"before", partition=0)
    assert old.flush(30) == 0
    new = Producer(conf)
    new.init_transactions(30)  # bumps the epoch: `old` is fenced
    deadline = time.monotonic() + 30
    fatal = None
    while fatal is None:  # no poll: the cause stays queued, as when produce outruns the callbacks
        assert time.monotonic() < deadline, "the fenced producer never failed"
        try:
            old.produce(name, b"after", partition=1)
        except KafkaException as e:
            fatal = e
        time.sleep(0.05)
    assert fatal.args[0].code() == KafkaError._FATAL, fatal
    assert not _fenced(fatal)
    cause = _fatal_cause(old, fatal)
    assert cause is not fatal and cause.args[0].fatal() and _fenced(cause), cause
    other = KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert _fatal_cause(old, other) is other and _fatal_cause(None, fatal) is fatal


def test_read_hold_stops_compaction_and_drop_releases_it(db, kafka, topic, spark, tmp_path):
    source = Source(db, kafka, topic, spark, tmp_path, "held", retain_ms=0)  # compact as far as allowed
    source.cycles(3)
    config = sink_config(tmp_path, source, "holder")
    ctx = sink_ctx(source, config, "holder")
    result = run_once(ctx)
    source.cycles(4)  # the sink does not run: its hold must stop compaction at its frontier - 1
    with connect(db) as conn:
        holds = {h.holder: h.ts for h in read_holds(conn, "held")}
        assert holds == {"sink:holder": result.frontier - 1}
        assert shard_info(conn, "held").since <= result.frontier - 1
        assert load_remap(conn, "held").since <= result.frontier - 1
    run_once(ctx)  # still resumable, and exactly once
    check_exactly_once(source, config, "holder")
    assert drop(ctx)
    source.cycles(2)
    with connect(db) as conn:
        since = shard_info(conn, "held").since
    assert since > read_progress(kafka.bootstrap, ctx.spec.progress_topic, "holder").frontier
    with pytest.raises(SinkRefused, match="compacted past it"):
        run_once(ctx)


def test_refuses_a_topic_with_data_but_no_progress_unless_fresh(db, kafka, topic, spark, tmp_path):
    source = Source(db, kafka, topic, spark, tmp_path, "guarded")
    source.cycles(2)
    config = sink_config(tmp_path, source, "guard")
    ctx = sink_ctx(source, config, "guard")
    ensure_topics(ctx)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    p.produce(ctx.spec.kafka.topic, value=b"someone else's data")
    assert p.flush(30) == 0
    with pytest.raises(SinkRefused, match="already holds data"):
        run_once(ctx)
    assert run_once(ctx, fresh=True).messages > 0


def test_a_sink_created_late_replays_from_since_like_one_that_ran_from_the_start(db, kafka, topic, spark, tmp_path):
    source = Source(db, kafka, topic, spark, tmp_path, "late", retain_ms=0)
    early_cfg = sink_config(tmp_path, source, "early")
    early = sink_ctx(source, early_cfg, "early")
    cycle.ensure_registered(source.ctx)
    run_once(early)  # created before any data: it holds since at 0 and will write every update
    for _ in range(4):
        source.cycles(2)
        run_once(early)
    late_cfg = sink_config(tmp_path, source, "late_sink")
    late = sink_ctx(source, late_cfg, "late_sink")
    with connect(db) as conn:
        since = shard_info(conn, "late").since
    assert since > 0, "compaction moved since up to the early sink's hold"
    run_once(late)
    source.cycles(3)
    run_once(early)
    run_once(late)

    def states(messages):
        """The collection per key after each timestamp, rebuilt from before/after messages."""
        state: dict[bytes, dict] = {}
        out = {}
        for ts, key, value in messages:
            msg = json.loads(value)
            if msg["after"] is None:
                state.pop(key, None)
            else:
                state[key] = msg["after"]
            out[ts] = dict(state)
        return out

    a = states(topic_messages(kafka, early.spec.kafka.topic))
    b = states(topic_messages(kafka, late.spec.kafka.topic))
    assert min(b) == since  # the late sink began with the snapshot AS OF since
    assert b and all(a[ts] == b[ts] for ts in b if ts in a)
    assert a[max(a)] == b[max(b)] and max(a) == max(b)
    check_exactly_once(source, early_cfg, "early")


def test_a_ts_read_in_two_tables_is_never_cut_between_transactions(db, kafka, topic, tmp_path):
    """An unkeyed sink streams a ts whose updates sit in two parts as two tables; the budget is reached
    between them, yet the transaction is cut only at the next ts: no progress record ever claims a ts
    whose messages are only partly written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reclock.batch import BatchDescription, Part
    from reclock.config import KafkaSpec, SinkBudget, SinkSpec
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.shards import Append, compare_and_append, register_shard

    blob = LocalBlobStore(tmp_path / "blobs")
    (blob.root / "c").mkdir()

    def part(name: str, ids: range, ts: int) -> Part:
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array([ts] * len(ids), pa.int64()),
                                 "diff": pa.array([1] * len(ids), pa.int64())}), blob.url(f"c/{name}"))
        return Part(f"c/{name}", len(ids), (blob.root / "c" / name).stat().st_size, ts, ts)

    with connect(db) as conn:
        register_shard(conn, "c")
        compare_and_append(conn, [Append("c", BatchDescription(0, 6), (part("a", range(0, 3), 5),
                                                                      part("b", range(3, 6), 5)))])
        compare_and_append(conn, [Append("c", BatchDescription(6, 9), (part("c", range(6, 8), 7),))])
    out = topic(partitions=1)
    spec = SinkSpec(name="split", collection="c", kafka=KafkaSpec(topic=out, bootstrap=kafka.bootstrap),
                    progress_topic=f"_progress_{out}", budget=SinkBudget(max_messages=2))
    result = run_once(SinkContext(spec=spec, dsn=db, kafka=kafka.bootstrap, blob=blob))

    assert (result.messages, result.transactions, result.frontier) == (8, 2, 9)
    frontiers = [json.loads(m.value())["frontier"] for m in read_all(kafka.bootstrap, spec.progress_topic, "p")]
    assert frontiers == [[7], [9]]  # not [5]: ts 5 went out whole in the first transaction
    got = topic_messages(kafka, out)
    assert [(ts, json.loads(v)["after"]["id"]) for ts, _, v in got] == [(5, i) for i in range(6)] + [(7, 6), (7, 7)]


def test_messages_carry_the_columns_of_their_time_through_a_drop_and_a_rename(db, kafka, topic, tmp_path):
    """A collection whose ``x`` is dropped and whose ``w`` is renamed ``w2`` at 30 (a Postgres ``DROP COLUMN``
    and ``RENAME COLUMN``): the messages before 30 carry ``id, w, x``; from 30 on ``id, w2``, the retraction at
    30 of a row written before with the value it was written with (read under the new name)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reclock.batch import BatchDescription, Part
    from reclock.config import KafkaSpec, SinkSpec
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.shards import Append, compare_and_append, register_shard
    from reclock.schema_evolution import CollectionSchema, Column, SchemaVersion

    blob = LocalBlobStore(tmp_path / "blobs")
    (blob.root / "d").mkdir()

    def part(name: str, cols: dict, ts: list[int], diff: list[int]) -> Part:
        table = pa.table({**cols, "ts": pa.array(ts, pa.int64()), "diff": pa.array(diff, pa.int64())})
        pq.write_table(table, blob.url(f"d/{name}"))
        return Part(f"d/{name}", len(ts), (blob.root / "d" / name).stat().st_size, min(ts), max(ts))

    v0 = CollectionSchema((Column("id", "bigint"), Column("w", "string"), Column("x", "string")))
    v1 = CollectionSchema((Column("id", "bigint"), Column("w2", "string", renamed_from="w")))
    with connect(db) as conn:
        register_shard(conn, "d")
        compare_and_append(conn, [Append("d", BatchDescription(0, 21), (part(
            "a", {"id": pa.array([1, 2], pa.int64()), "w": ["a", "b"], "x": ["x1", "x2"]}, [10, 20], [1, 1]),),
            (SchemaVersion(0, v0),))])
        compare_and_append(conn, [Append("d", BatchDescription(21, 41), (part(
            "b", {"id": pa.array([1, 3], pa.int64()), "w2": ["a", "c"]}, [30, 40], [-1, 1]),),
            (SchemaVersion(30, v1),))])
    out = topic(partitions=1)
    spec = SinkSpec(name="evolving", collection="d", kafka=KafkaSpec(topic=out, bootstrap=kafka.bootstrap),
                    progress_topic=f"_progress_{out}")
    assert run_once(SinkContext(spec=spec, dsn=db, kafka=kafka.bootstrap, blob=blob)).frontier == 41
    got = [(ts, json.loads(v)) for ts, _, v in topic_messages(kafka, out)]
    rows = [(ts, m.get("after") or m.get("before"), "after" in m and m["after"] is not None) for ts, m in got]
    assert rows == [(10, {"id": 1, "w": "a", "x": "x1"}, True), (20, {"id": 2, "w": "b", "x": "x2"}, True),
                    (30, {"id": 1, "w2": "a"}, False), (40, {"id": 3, "w2": "c"}, True)]
