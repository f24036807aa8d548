"""``envelope: debezium`` against real Debezium: Kafka Connect 4.1.1 with Debezium's Postgres connector
(``reclock.dev.connect.LocalConnect``) writes a table of the session's Postgres to the session's Kafka; the
worker is killed (no offset flush) and restarted mid-stream, so it writes again what it wrote since its last
flush. The collection AS OF every binding is the table as it was after some change, every row once, and
the redelivered events are applied once."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from ingest_support import make_ctx

from reclock import cycle
from reclock.config import parse_source
from reclock.debezium import KeyState, parse_key
from reclock.dev.connect import LocalConnect
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.read import read_as_of, read_updates
from reclock.sinks.kafka import read_all
from reclock.sources.kafka.upstream import KafkaUpstream

SCHEMA = "id INT, v STRING, n BIGINT"
FLUSH_MS = 3000


class Table:
    """An upstream table (columns id, v, n), and every state it went through (after each change, in commit
    order)."""

    def __init__(self, dsn: str, name: str = "items") -> None:
        self.dsn, self.name = dsn, name
        self.states: list[frozenset] = []
        self.created: Counter = Counter()  # row versions written (snapshot rows, inserts, updates)
        self.events = 0  # records Debezium writes for them (a delete: the delete and its tombstone)

    def rows(self, conn) -> frozenset:
        return frozenset(conn.execute(f"SELECT id, v, n FROM {self.name}").fetchall())

    def run(self, conn, s: str) -> None:
        """One single-row statement in ``conn``'s transaction (one state of the table)."""
        if s.startswith("DELETE"):
            assert conn.execute(s).rowcount == 1
            self.events += 2  # the delete and its tombstone
        else:
            [row] = conn.execute(s + " RETURNING id, v, n").fetchall()
            self.created[row] += 1
            self.events += 1
        self.states.append(self.rows(conn))  # the change Debezium writes next

    def txn(self, *statements: str) -> None:
        """One transaction of single-row statements (each one state of the table)."""
        with psycopg.connect(self.dsn) as conn:
            for s in statements:
                self.run(conn, s)


@pytest.fixture(scope="module")
def upstream(postgres, kafka, stack_state):
    """A database with table ``items`` (six rows before the connector starts: its snapshot) and a Connect
    worker running Debezium on it (started once for the module: ~20 s)."""
    name = f"dbz_up_{os.getpid()}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = postgres.dsn(name)
    table = Table(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n bigint)")  # REPLICA IDENTITY DEFAULT
        conn.execute("INSERT INTO items SELECT i, 'v' || i, i * 10 FROM generate_series(1, 6) i")
        table.states.append(table.rows(conn))
        # a second table for the source over several topics (REPLICA IDENTITY FULL: a delete's `before`
        # holds the whole row)
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, v text, n bigint)")
        conn.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO orders SELECT i, 'o' || i, i FROM generate_series(1, 3) i")
    table.created.update(table.states[0])
    table.events = 6
    orders = Table(dsn, "orders")
    with psycopg.connect(dsn) as conn:
        orders.states.append(orders.rows(conn))
    orders.created.update(orders.states[0])
    orders.events = 3
    worker = LocalConnect(stack_state, kafka.bootstrap, dsn, ("public.items", "public.orders"),
                          prefix=f"dbz{os.getpid()}", transactions=True, flush_ms=FLUSH_MS)
    worker.start()
    table.orders = orders
    try:
        yield table, worker
    finally:
        worker.stop()
        with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s", (worker.slot,))


def end_offset(kafka, topic: str) -> int:
    return sum(o for _, o in KafkaUpstream("t", kafka.bootstrap, topic).probe_upper())


def wait_written(kafka, topic: str, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            n = end_offset(kafka, topic)
        except Exception:  # the topic is created with the connector's first record
            n = 0
        if n >= at_least:
            return n
        assert time.monotonic() < deadline, f"Debezium wrote {n} records to {topic}, expected {at_least}"
        time.sleep(0.05)


def wait_flushed(worker: LocalConnect, since: float, timeout: float = 3 * FLUSH_MS / 1000) -> None:
    """Until the worker flushed its source offsets after ``since`` (it rewrites the file when it has new
    offsets, on a timer every FLUSH_MS)."""
    path = Path(worker.home) / "offsets.dat"
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_mtime > since):
        assert time.monotonic() < deadline, "the Connect worker did not flush its offsets"
        time.sleep(0.05)


def test_debezium_topic_with_a_connector_restart(db, kafka, spark, tmp_path, upstream):
    table, worker = upstream
    topic = worker.topic("public.items")
    ctx = make_ctx(db, kafka, spark, tmp_path, topic, name="items", envelope="debezium", include=[],
                   format={"type": "json", "schema": SCHEMA}, budget={"max_records": 1000})
    ctx = replace(ctx, retain_history_ms=10**12)  # every binding stays readable AS OF
    wait_written(kafka, topic, table.events)

    # batch A: inserts, updates, deletes (delete's `before` holds only the key), several per transaction
    table.txn("INSERT INTO items VALUES (7, 'a7', 70)", "INSERT INTO items VALUES (8, 'a8', 80)",
              "UPDATE items SET v = 'u1' WHERE id = 1")
    table.txn("DELETE FROM items WHERE id = 2", "UPDATE items SET n = n + 1 WHERE id = 3",
              "UPDATE items SET n = n + 1 WHERE id = 7")
    table.txn("DELETE FROM items WHERE id = 8", "INSERT INTO items VALUES (8, 'again', 81)")
    wait_written(kafka, topic, table.events)
    cycle.run_cycle(ctx)

    # batch B, written by Debezium and then the worker killed before it flushed its offsets: a restart
    # writes batch B again
    t = time.time()
    table.txn("UPDATE items SET n = n + 1 WHERE id = 4")
    wait_flushed(worker, t)  # the worker flushed this change's offset: its next flush is FLUSH_MS away
    table.txn("UPDATE items SET v = 'b1' WHERE id = 1", "UPDATE items SET v = 'b3' WHERE id = 3",
              "DELETE FROM items WHERE id = 5")
    table.txn("INSERT INTO items VALUES (9, 'b9', 90)", "UPDATE items SET n = 0 WHERE id = 9")
    before_kill = wait_written(kafka, topic, table.events)
    worker.kill()
    cycle.run_cycle(ctx)  # binds batch B's first copy

    t0 = time.monotonic()
    worker.start()
    restart_s = time.monotonic() - t0
    table.txn("UPDATE items SET v = 'c1' WHERE id = 1", "DELETE FROM items WHERE id = 9")
    table.txn("INSERT INTO items VALUES (10, 'c10', 100)")
    # the restart rewrote batch B (at least its last change), then batch C
    wait_written(kafka, topic, table.events + 1)
    cycle.run_cycle(ctx)
    for _ in range(6):  # until the last change is bound (Debezium writes the redelivery, then batch C)
        cycle.run_cycle(ctx)
        with connect(db) as conn:
            latest = read_as_of(conn, ctx.blob, ctx.spec.name).to_pylist()
        if frozenset((r["id"], r["v"], r["n"]) for r in latest) == table.states[-1]:
            break
        time.sleep(0.5)

    records = list(read_all(kafka.bootstrap, topic, "check"))
    positions = Counter((r.key(), json.loads(r.value())["source"]["lsn"]) for r in records if r.value() is not None)
    redelivered = sum(n - 1 for n in positions.values())
    assert len(records) > table.events and redelivered > 0, (len(records), table.events, before_kill)

    with connect(db) as conn:
        rc = load_remap(conn, ctx.spec.name)
        assert len(rc.bindings) >= 3
        for b in rc.bindings:
            snap = read_as_of(conn, ctx.blob, ctx.spec.name, b.ts).to_pylist()
            assert all(r["diff"] == 1 for r in snap), f"AS OF {b.ts}: a row more than once"
            got = frozenset((r["id"], r["v"], r["n"]) for r in snap)
            assert got in table.states, f"AS OF {b.ts}: not a state the table went through: {sorted(got)}"
        assert got == table.states[-1]
        # no row version was added more often than upstream wrote it: a redelivered event applied again
        # would add its (older) row again, and retract the newer one, at a later binding
        added = Counter()
        for u in read_updates(conn, ctx.blob, ctx.spec.name).to_pylist():
            if u["diff"] > 0:
                added[(u["id"], u["v"], u["n"])] += u["diff"]
        assert all(n <= table.created[row] for row, n in added.items()), (added, table.created)
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard)
        assert errors is None or errors.num_rows == 0
        # the redelivery was recognised as one, by its source position: a key whose last event in the topic
        # is a second copy has that event skipped (its state says so); the others' last event was applied
        states = {bytes(k): KeyState.decode(bytes(v)) for k, v in conn.execute(
            "SELECT key, value FROM reclock.upsert_state WHERE source = %s", (ctx.spec.name,))}
    copies: Counter = Counter()
    last_is_copy = {}
    for r in records:
        if r.value() is not None:  # a tombstone goes with its delete
            k = parse_key(r.key())
            copies[(k, json.loads(r.value())["source"]["lsn"])] += 1
            last_is_copy[k] = copies[(k, json.loads(r.value())["source"]["lsn"])] > 1
    assert any(last_is_copy.values())
    assert {k: s.redelivered for k, s in states.items()} == last_is_copy
    print(f"records {len(records)}, redelivered {redelivered}, restart {restart_s:.1f}s, "
          f"bindings {len(rc.bindings)}")


def test_one_source_over_two_topics(db, kafka, spark, tmp_path, upstream):
    """``topics:``: one source over the connector's two tables' topics, each into its own collection, appended
    together (one binding covers both topics: both collections have one upper); each collection AS OF every
    binding is a state its table went through; the two tables' keys are of the same values and never meet
    in the upsert state."""
    items, worker = upstream
    orders = items.orders
    topics = [{"topic": worker.topic("public.items"), "schema": SCHEMA},
              {"topic": worker.topic("public.orders"), "collection": "orders", "schema": SCHEMA}]
    ctx = make_ctx(db, kafka, spark, tmp_path, "unused", name="shop", envelope="debezium", include=[],
                   format={"type": "json", "schema": SCHEMA}, budget={"max_records": 1000})
    spec = parse_source("shop", {"kafka": {"bootstrap": kafka.bootstrap}, "envelope": "debezium", "topics": topics,
                                 "budget": {"max_records": 1000}})
    ctx = replace(ctx, spec=spec, retain_history_ms=10**12)
    with psycopg.connect(items.dsn) as conn:  # one upstream transaction over both tables
        items.run(conn, "UPDATE items SET v = 'x1' WHERE id = 1")
        orders.run(conn, "UPDATE orders SET v = 'x1' WHERE id = 1")
        orders.run(conn, "DELETE FROM orders WHERE id = 2")
        orders.run(conn, "INSERT INTO orders VALUES (4, 'o4', 4)")
    wait_written(kafka, worker.topic("public.orders"), orders.events)
    cycle.run_cycle(ctx)
    with psycopg.connect(items.dsn) as conn:
        orders.run(conn, "UPDATE orders SET n = 40 WHERE id = 4")
        items.run(conn, "INSERT INTO items VALUES (1000, 'big', 1)")
    with psycopg.connect(items.dsn) as conn:
        orders.run(conn, "UPDATE orders SET n = 41 WHERE id = 4")
    wait_written(kafka, worker.topic("public.orders"), orders.events)
    for _ in range(6):  # until the last changes are bound
        cycle.run_cycle(ctx)
        with connect(db) as conn:
            got = {t: frozenset((r["id"], r["v"], r["n"]) for r in read_as_of(conn, ctx.blob, f"shop__{t}").to_pylist())
                   for t in ("items", "orders")}
        if got == {"items": items.states[-1], "orders": orders.states[-1]}:
            break
        time.sleep(0.5)
    with connect(db) as conn:
        rc = load_remap(conn, "shop")
        uppers = dict(conn.execute("SELECT id, upper FROM reclock.shards WHERE source = 'shop'").fetchall())
        assert set(uppers) == {"shop__items", "shop__items_errors", "shop__orders", "shop__orders_errors"}
        assert len(set(uppers.values())) == 1 and rc.upper == uppers["shop__items"], (uppers, rc.upper)
        for b in rc.bindings:
            for t, table in (("items", items), ("orders", orders)):
                snap = read_as_of(conn, ctx.blob, f"shop__{t}", b.ts).to_pylist()
                assert all(r["diff"] == 1 for r in snap), f"{t} AS OF {b.ts}: a row more than once"
                now = frozenset((r["id"], r["v"], r["n"]) for r in snap)
                assert now in table.states, f"{t} AS OF {b.ts}: not a state the table went through: {sorted(now)}"
        assert got == {"items": items.states[-1], "orders": orders.states[-1]}
        for t in ("items", "orders"):
            errors = read_updates(conn, ctx.blob, f"shop__{t}_errors")
            assert errors is None or errors.num_rows == 0
        keys = [bytes(k) for (k,) in conn.execute("SELECT key FROM reclock.upsert_state WHERE source = 'shop'")]
    # both tables have a key {"id": 1}: each under its collection's name
    assert {k.split(b"\0")[0] for k in keys} == {b"shop__items", b"shop__orders"}
    assert {b'shop__items\0{"id":1}', b'shop__orders\0{"id":1}'} <= set(keys)
