"""A consensus failover: Reclock's Postgres with a streaming standby (``reclock.dev.postgres.LocalStandby``),
the primary crashed (``pg_ctl stop -m immediate``) and the standby promoted; Reclock reaches whichever
accepts writes through one DSN naming both (``failover_dsn``).

- **Synchronous** replication: the primary crashes while cycles and the sink run back to back; after the
  promotion they carry on on the new primary, and nothing acknowledged is lost: every record once, at the
  timestamp of its binding, the bindings never rewritten, the sink's topic once.
- **Asynchronous**: the standby stops receiving, cycles of a Kafka and a Postgres source and the sink go on
  (acknowledging their progress upstream: the consumer group, the slot, the progress topic), the primary
  crashes and the standby, which lacks those commits, is promoted. Each of them stops with
  ``AcknowledgedStateLost`` naming what went back, and mints nothing.

``make test`` runs the synchronous failover short (one sink step before the crash, one after, 100 records a
wave); ``make test-deployment`` the long one (two before, three after, 200 a wave). The asynchronous test is
short already and runs in both.
"""

from __future__ import annotations

import collections
import itertools
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import psycopg
import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer
from ingest_support import check_invariants, make_ctx
from pg_support import upstream_database, writer

from reclock import cycle
from reclock.config import parse_sink, parse_source
from reclock.dev.postgres import LocalPostgres, LocalStandby, crash, failover_dsn
from reclock.dev.state import StackState
from reclock.errors import AcknowledgedStateLost
from reclock.persist import connect
from reclock.persist.migrate import migrate
from reclock.persist.remap_store import load_remap
from reclock.read import read_updates
from reclock.sinks.encode import encode_updates
from reclock.sinks.kafka import TS_HEADER, KafkaSink, SinkContext, consolidate, read_all, read_progress

_pairs = itertools.count()


@pytest.fixture
def pair(stack_state):
    """A primary and, once the test starts it, its standby, in a state folder of their own."""
    state = StackState(Path(stack_state.root) / f"failover-{next(_pairs)}")
    primary = LocalPostgres(state, fast=True)
    primary.start()
    migrate(primary.dsn())
    yield primary, state
    for server in (LocalStandby(state, primary), primary):
        try:
            crash(server)
        except Exception:  # noqa: BLE001 - not running
            pass


def _produce(kafka, topic: str, ids: range) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "log_level": 0})
    for i in ids:
        p.produce(topic, value=json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=i % 2)
    assert p.flush(30) == 0


def _sink_ctx(dsn: str, kafka, ctx, topic: str) -> SinkContext:
    spec = parse_sink(f"{topic}_out", {"from": ctx.spec.name, "format": "debezium", "key": ["_partition", "_offset"],
                                       "kafka": {"topic": f"{topic}_out", "bootstrap": kafka.bootstrap},
                                       "progress_topic": f"_progress_{topic}", "transaction_timeout": "20s"},
                      {ctx.spec.name: ctx.spec})
    return SinkContext(spec=spec, dsn=dsn, kafka=kafka.bootstrap, blob=ctx.blob)


def _check_sink(sink_ctx: SinkContext, ctx) -> None:
    """The sink's topic holds the collection's updates once; its progress is at the shard's upper."""
    with connect(ctx.dsn) as conn:
        ups = read_updates(conn, ctx.blob, ctx.spec.name)
        (upper,) = conn.execute("SELECT upper FROM reclock.shards WHERE id = %s", (ctx.spec.name,)).fetchone()
    got = [(int(dict(m.headers())[TS_HEADER]), m.key(), m.value())
           for m in read_all(sink_ctx.kafka.bootstrap, sink_ctx.spec.kafka.topic, "failover-oracle")]
    first = min(t for t, _, _ in got)
    ups = ups.set_column(ups.schema.get_field_index("ts"), "ts", pc.max_element_wise(ups["ts"], first))
    assert collections.Counter(got) == collections.Counter(encode_updates(sink_ctx.spec, consolidate(ups)))
    assert read_progress(sink_ctx.kafka.bootstrap, sink_ctx.spec.progress_topic, sink_ctx.spec.name).frontier == upper


@pytest.mark.parametrize("shape", [(100, 1, 1), pytest.param((200, 2, 3), marks=pytest.mark.deployment)],
                         ids=["short", "long"])
def test_synchronous_standby_promoted_mid_cycle_loses_nothing_acknowledged(pair, kafka, topic, spark, tmp_path,
                                                                           shape):
    """``shape``: (records a wave, sink steps before the crash, sink steps after the promotion)."""
    wave, before, after_steps = shape
    primary, state = pair
    standby = LocalStandby(state, primary, synchronous=True)
    standby.start()
    dsn = failover_dsn(primary, standby)
    name = topic(partitions=2)
    ctx = replace(make_ctx(dsn, kafka, spark, tmp_path, name, name="fo_sync"), retain_history_ms=10**12)
    sink_ctx = _sink_ctx(dsn, kafka, ctx, name)
    stop, errors, done = threading.Event(), [], collections.Counter()

    def loop() -> None:  # cycles and sink steps back to back, each failure rerun (the operator's rerun)
        sink = None
        while not stop.is_set():
            try:
                cycle.run_cycle(ctx)
                done["cycle"] += 1
                if sink is None:
                    sink = KafkaSink(sink_ctx)
                    sink.start()
                sink.step()
                done["sink"] += 1
            except Exception as e:  # noqa: BLE001 - judged by the oracle at the end
                errors.append(e)
                sink = None
                time.sleep(0.2)

    _produce(kafka, name, range(0, wave))
    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 300
        while done["sink"] < before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done["sink"] >= before, f"no cycles before the failover: {errors[-3:]}"
        _produce(kafka, name, range(wave, 2 * wave))  # a cycle is under way on them when the primary crashes
        time.sleep(0.3)
        with connect(primary.dsn()) as conn:
            acked = load_remap(conn, "fo_sync").bindings
        crash(primary)
        standby.promote()
        after = dict(done)
        _produce(kafka, name, range(2 * wave, 3 * wave))
        deadline = time.monotonic() + 300
        while done["sink"] < after["sink"] + after_steps and time.monotonic() < deadline:
            time.sleep(0.2)
        assert done["sink"] >= after["sink"] + after_steps, \
            f"cycles did not carry on after the promotion: {errors[-3:]}"
    finally:
        stop.set()
        worker.join(300)
    assert not any(isinstance(e, AcknowledgedStateLost) for e in errors), errors
    with connect(dsn) as conn:
        assert conn.execute("SELECT inet_server_port()").fetchone()[0] == standby.port  # the promoted one
        now = load_remap(conn, "fo_sync").bindings
    assert now[:len(acked)] == acked, "a binding acknowledged before the crash was lost or rewritten"
    while cycle.run_cycle(ctx)["minted"] is not None:
        pass
    sink = KafkaSink(sink_ctx)
    sink.start()
    sink.step()
    check_invariants(ctx, set(range(3 * wave)))  # every record once at its binding's ts; group offsets = resumption
    _check_sink(sink_ctx, ctx)


def test_asynchronous_standby_that_lacks_acknowledged_commits_stops_every_source_and_sink(
        pair, kafka, topic, spark, postgres, tmp_path):
    primary, state = pair
    standby = LocalStandby(state, primary, synchronous=False)
    standby.start()
    dsn = failover_dsn(primary, standby)
    name = topic(partitions=2)
    ctx = replace(make_ctx(dsn, kafka, spark, tmp_path, name, name="fo_async"), retain_history_ms=10**12)
    sink_ctx = _sink_ctx(dsn, kafka, ctx, name)
    with upstream_database(postgres) as up_dsn:
        with writer(up_dsn) as w:
            w.execute("CREATE TABLE t (id int8 PRIMARY KEY, v text)")
            w.execute("ALTER TABLE t REPLICA IDENTITY FULL")
            w.execute("CREATE PUBLICATION pub FOR TABLE t")
            w.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 20) g")
        pg = cycle.CycleContext(spec=parse_source("fo_pg", {"postgres": {"dsn_env": "UNUSED", "publication": "pub"}}),
                                dsn=dsn, blob=ctx.blob, upstream=up_dsn, retain_history_ms=10**12)
        sink = KafkaSink(sink_ctx)

        def everything() -> None:
            cycle.run_cycle(ctx)
            cycle.run_cycle(pg)
            if sink.begin is None:
                sink.start()
            sink.step()

        _produce(kafka, name, range(0, 100))
        everything()
        _wait_replayed(primary, standby)
        standby.stop()  # from here on the standby receives nothing: what follows is acknowledged on the primary only
        _produce(kafka, name, range(100, 200))
        with writer(up_dsn) as w:
            w.execute("INSERT INTO t SELECT g, 'b' FROM generate_series(21, 40) g")
        everything()
        with connect(primary.dsn()) as conn:
            lost = {s: load_remap(conn, s).bindings for s in ("fo_async", "fo_pg")}
        crash(primary)
        standby.start_server()
        standby.promote()
        with connect(dsn) as conn:
            kept = {s: load_remap(conn, s).bindings for s in ("fo_async", "fo_pg")}
        assert all(len(kept[s]) < len(lost[s]) for s in kept), "the standby was expected to lack the last bindings"

        _produce(kafka, name, range(200, 300))
        with pytest.raises(AcknowledgedStateLost, match=r"source fo_async: acknowledged state went back: consumer "
                                                        r"group reclock-fo_async has committed offsets"):
            cycle.run_cycle(ctx)
        with pytest.raises(AcknowledgedStateLost, match=r"source fo_pg: acknowledged state went back: replication "
                                                        r"slot reclock_fo_pg is confirmed at"):
            cycle.run_cycle(pg)
        fresh = KafkaSink(sink_ctx)
        fresh.start()
        with pytest.raises(AcknowledgedStateLost, match=rf"sink {sink_ctx.spec.name}: acknowledged state went back: "
                                                        r"its progress record says frontier"):
            fresh.step()
        with connect(dsn) as conn:
            assert {s: load_remap(conn, s).bindings for s in kept} == kept, "a binding was minted anyway"
            status = conn.execute("SELECT status, error FROM reclock.status_history WHERE name = 'fo_async' "
                                  "ORDER BY id DESC LIMIT 1").fetchone()
        # the status keeps the error's first lines (explain.summary); the whole text, remedy included, is raised
        assert status[0] == "stalled" and "acknowledged state went back" in status[1]


def _wait_replayed(primary: LocalPostgres, standby: LocalStandby, timeout: float = 60) -> None:
    with psycopg.connect(primary.dsn("postgres"), autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_flush_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout
    with psycopg.connect(standby.dsn("postgres"), autocommit=True) as conn:
        while conn.execute("SELECT pg_last_wal_replay_lsn() >= %s", (target,)).fetchone()[0] is not True:
            assert time.monotonic() < deadline, "the standby did not replay the primary's WAL"
            time.sleep(0.1)
