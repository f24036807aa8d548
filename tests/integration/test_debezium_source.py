"""``envelope: debezium`` against real Debezium: Kafka Connect 4.1.1 with Debezium's Postgres connector
(``reclock.dev.connect.LocalConnect``) writes a table of the session's Postgres to the session's Kafka; the
worker is killed (no offset flush) and restarted mid-stream, so it writes again what it wrote since its last
flush. The collection AS OF every binding is the table as it was after some change, every row once, and
the redelivered events are applied once. A source over two tables' topics with Debezium's transaction topic
(``transaction_topic``) binds whole upstream transactions: its collections AS OF every binding are the tables
as one commit left them; what it cannot place stalls its mint, named."""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from dataclasses import replace

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from connect_support import end_offset, running, wait_flushed, wait_written
from ingest_support import make_ctx

from reclock import cycle
from reclock.config import parse_source
from reclock.debezium import KeyState, parse_key
from reclock.errors import ConfigError, TransactionMetadataInvalid
from reclock.dev.connect import LocalConnect
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.read import read_as_of, read_updates
from reclock.sinks.kafka import read_all
from reclock.sources.kafka.topics import slot
from reclock.sources.kafka.transactions import probe, tx_id
from reclock.sources.kafka.upstream import KafkaUpstream, UpstreamUnavailable
from reclock.time import PartitionedFrontier

SCHEMA = "id INT, v STRING, n BIGINT"
TX_TABLES = ("acct", "ledger")  # written by multi-table transactions (test_transaction_topic_*)
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
    """A database with table ``items`` (six rows before the connector starts: its snapshot), tables ``acct`` and
    ``ledger`` (four rows each; ``ledger`` with REPLICA IDENTITY FULL: a delete's ``before`` holds the whole
    row) written together by the transaction topic's test, and a Connect worker running Debezium on them with
    the transaction topic (started once for the module: ~20 s)."""
    name = f"dbz_up_{os.getpid()}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = postgres.dsn(name)
    table = Table(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n bigint)")  # REPLICA IDENTITY DEFAULT
        conn.execute("INSERT INTO items SELECT i, 'v' || i, i * 10 FROM generate_series(1, 6) i")
        table.states.append(table.rows(conn))
        for t in TX_TABLES:
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n bigint)")
            conn.execute(f"INSERT INTO {t} SELECT i, 's' || i, i FROM generate_series(1, 4) i")
        conn.execute("ALTER TABLE ledger REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE tick (n bigint)")  # not published: orders the writers' commits
        conn.execute("INSERT INTO tick VALUES (0)")
    table.created.update(table.states[0])
    table.events = 6
    worker = LocalConnect(stack_state, kafka.bootstrap, dsn, ("public.items", *(f"public.{t}" for t in TX_TABLES)),
                          prefix=f"dbz{os.getpid()}", transactions=True, flush_ms=FLUSH_MS)
    with running(worker, postgres):
        yield table, worker


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
    # the worker flushed this change's offset: its next flush is FLUSH_MS away
    wait_flushed(worker, t, 3 * FLUSH_MS / 1000)
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


class Writers:
    """Threads writing transactions over TX_TABLES until stopped: each takes the lock of the unpublished row
    ``tick`` first (so commits follow the tick's order), writes 1-4 changes (rows it inserts or updates get
    ``v = t<tick>``), and records both tables as its commit leaves them: ``states[tick]``."""

    def __init__(self, dsn: str, threads: int = 2) -> None:
        self.dsn, self.stop = dsn, threading.Event()
        with psycopg.connect(dsn) as conn:
            [(tick,)] = conn.execute("SELECT n FROM tick").fetchall()
            self.states = {tick: self.tables(conn)}
        self.failed: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    @staticmethod
    def tables(conn) -> tuple[frozenset, ...]:
        return tuple(frozenset(conn.execute(f"SELECT id, v, n FROM {t}").fetchall()) for t in TX_TABLES)

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                while not self.stop.is_set():
                    with conn.transaction():
                        [(tick,)] = conn.execute("UPDATE tick SET n = n + 1 RETURNING n").fetchall()
                        for _ in range(rng.randint(1, 4)):
                            t, k = rng.choice(TX_TABLES), rng.randint(1, 10)
                            if conn.execute(f"SELECT 1 FROM {t} WHERE id = %s", (k,)).fetchone() is None:
                                conn.execute(f"INSERT INTO {t} VALUES (%s, %s, %s)", (k, f"t{tick}", tick))
                            elif rng.random() < 0.25:
                                conn.execute(f"DELETE FROM {t} WHERE id = %s", (k,))
                            else:
                                conn.execute(f"UPDATE {t} SET v = %s, n = n + 1 WHERE id = %s", (f"t{tick}", k))
                        self.states[tick] = self.tables(conn)
                    time.sleep(rng.uniform(0.02, 0.1))
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.failed.append(e)

    def finish(self) -> tuple[frozenset, ...]:
        """Stop the writers; both tables as the last commit left them."""
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.failed, self.failed
        return self.states[max(self.states)]


def bank_source(kafka, worker, name="bank", **extra):
    topics = [{"topic": worker.topic(f"public.{t}"), "collection": t, "schema": SCHEMA} for t in TX_TABLES]
    return parse_source(name, {"kafka": {"bootstrap": kafka.bootstrap}, "envelope": "debezium", "topics": topics,
                               "budget": {"max_records": 100_000}, **extra})


def collections(conn, ctx, ts=None) -> tuple[frozenset, ...]:
    out = []
    for t in TX_TABLES:
        snap = read_as_of(conn, ctx.blob, f"{ctx.spec.name}__{t}", ts).to_pylist()
        assert all(r["diff"] == 1 for r in snap), f"{t} AS OF {ts}: a row more than once"
        out.append(frozenset((r["id"], r["v"], r["n"]) for r in snap))
    return tuple(out)


def test_transaction_topic_binds_whole_transactions(db, kafka, spark, tmp_path, upstream):
    """``topics:`` with ``transaction_topic``: writers run transactions over two tables while the source cycles,
    and the connector is killed (after a flush, with transactions written since) and restarted: both
    collections AS OF every binding are the two tables as one commit left them, every row version a
    transaction wrote has that transaction's one timestamp in both tables, the redelivered transactions are
    passed over; both collections have one upper (one append), and the tables' keys of the same values never
    meet in the upsert state. The same topics without the transaction topic give the same tables."""
    items, worker = upstream
    tx_topic = worker.transaction_topic
    spec = bank_source(kafka, worker, transaction_topic=tx_topic)
    ctx = make_ctx(db, kafka, spark, tmp_path, "unused", name="bank", envelope="debezium", include=[],
                   format={"type": "json", "schema": SCHEMA})
    ctx = replace(ctx, spec=spec, retain_history_ms=10**12)
    for t in TX_TABLES:
        wait_written(kafka, worker.topic(f"public.{t}"), 4)  # the connector's snapshot
    writers = Writers(items.dsn)
    try:
        wait_written(kafka, tx_topic, 1)
        cycle.run_cycle(ctx)
        t = time.time()
        wait_flushed(worker, t, 3 * FLUSH_MS / 1000)
        wait_written(kafka, tx_topic, end_offset(kafka, tx_topic) + 6)  # 3 transactions past the flush
        worker.kill()
        cycle.run_cycle(ctx)  # what the connector wrote before it died (maybe part of a transaction)
        worker.start()
    finally:
        last = writers.finish()
    for _ in range(10):  # until the last commit is bound
        cycle.run_cycle(ctx)
        with connect(db) as conn:
            if collections(conn, ctx) == last:
                break
        time.sleep(0.5)

    ends = Counter(json.loads(r.value())["id"] for r in read_all(kafka.bootstrap, tx_topic, "check")
                   if json.loads(r.value())["status"] == "END")
    redelivered = sum(n - 1 for n in ends.values())
    assert redelivered > 0, "the restart wrote no transaction again"
    boundaries = set(writers.states.values())
    with connect(db) as conn:
        rc = load_remap(conn, "bank")
        assert len(rc.bindings) >= 3
        # all topics bind together: every collection has the one upper
        uppers = dict(conn.execute("SELECT id, upper FROM reclock.shards WHERE source = 'bank'").fetchall())
        assert set(uppers) == {s for t in TX_TABLES for s in (f"bank__{t}", f"bank__{t}_errors")}
        assert set(uppers.values()) == {rc.upper}, (uppers, rc.upper)
        for b in rc.bindings:
            got = collections(conn, ctx, b.ts)
            assert got in boundaries, f"AS OF {b.ts}: not the tables as one commit left them: {got}"
        assert collections(conn, ctx) == last
        stamps: dict[str, set] = {}
        for t in TX_TABLES:
            for u in read_updates(conn, ctx.blob, f"bank__{t}").to_pylist():
                if u["diff"] > 0 and u["v"].startswith("t"):
                    stamps.setdefault(u["v"], set()).add(u["ts"])
            errors = read_updates(conn, ctx.blob, f"bank__{t}_errors")
            assert errors is None or errors.num_rows == 0
        split = {tag: ts for tag, ts in stamps.items() if len(ts) > 1}
        assert not split, f"transactions with more than one timestamp: {split}"
        # both tables have keys {"id": 1}..: each under its collection's name in the upsert state
        keys = [bytes(k) for (k,) in conn.execute("SELECT key FROM reclock.upsert_state WHERE source = 'bank'")]
        assert {b'bank__acct\0{"id":1}', b'bank__ledger\0{"id":1}'} & set(keys)
        assert {k.split(b"\0")[0] for k in keys} <= {b"bank__acct", b"bank__ledger"}
        [waited] = conn.execute("SELECT count(*) FROM reclock.statistics WHERE name = 'bank' AND step = 'mint' "
                                "AND metrics->>'tx_waiting' IS NOT NULL").fetchone()
    print(f"transactions {len(writers.states) - 1}, bindings {len(rc.bindings)}, redelivered ENDs {redelivered}, "
          f"mints that waited {waited}")

    # the choice on the real topics cut inside a multi-table transaction T (its last ledger event not there
    # yet): every topic stops before T, and the wait names it (bindings of the run above rarely fall inside one)
    tx_records = [(r.offset(), json.loads(r.value())) for r in read_all(kafka.bootstrap, tx_topic, "check-t")]
    ids = Counter(tx_id(v["id"]) for _, v in tx_records if v["status"] == "END")
    both = [(o, tx_id(v["id"])) for o, v in tx_records if v["status"] == "END" and ids[tx_id(v["id"])] == 1
            and {c["data_collection"] for c in v["data_collections"]} == {f"public.{t}" for t in TX_TABLES}]
    end_at, cut = both[len(both) // 2]
    own = {}
    for i, t in enumerate(TX_TABLES):
        own[t] = [r.offset() for r in read_all(kafka.bootstrap, worker.topic(f"public.{t}"), "check-t")
                  if r.value() is not None and (json.loads(r.value())["transaction"] or {}).get("id", "").split(":")[0]
                  == cut]
    full = KafkaUpstream("bank", kafka.bootstrap, "", topics=spec.upstream.topics).probe_upper()
    short = PartitionedFrontier.of({**full.as_dict(), slot(1, 0): own["ledger"][-1]})
    chosen = probe("bank", kafka.bootstrap, [worker.topic(f"public.{t}") for t in TX_TABLES], tx_topic,
                   PartitionedFrontier.of({}), short)
    assert chosen.waiting.startswith(f"transaction {cut} (END at offset {end_at}): its events are not all there "
                                     f"yet (public.ledger {len(own['ledger']) - 1} of {len(own['ledger'])})"), chosen
    assert cut not in chosen.upper.covered and chosen.frontier.get(slot(2, 0)) <= end_at
    assert [chosen.frontier.get(slot(i, 0)) <= own[t][0] for i, t in enumerate(TX_TABLES)] == [True, True]
    whole = probe("bank", kafka.bootstrap, [worker.topic(f"public.{t}") for t in TX_TABLES], tx_topic,
                  PartitionedFrontier.of({}), full)
    assert whole.waiting is None and whole.frontier == full and cut in whole.upper.covered

    # the transaction topic cannot be dropped from a source bound with it (nor added to one bound without)
    with pytest.raises(ConfigError, match="a topic may be added at the end only"):
        cycle.mint(replace(ctx, spec=bank_source(kafka, worker)))
    # the same topics without the transaction topic: bound at the last stable offsets, the same tables at the end
    plain = replace(ctx, spec=bank_source(kafka, worker, "plain"))
    cycle.run_cycle(plain)
    with connect(db) as conn:
        assert collections(conn, plain) == last
    with pytest.raises(ConfigError, match="`transaction_topic: .*` is new, and the source has bound its topics"):
        cycle.mint(replace(plain, spec=bank_source(kafka, worker, "plain", transaction_topic=tx_topic)))


def test_transaction_topic_bad_cases(db, kafka, spark, tmp_path):
    """What a source with a transaction topic cannot place stalls its mint, named, binding nothing: a
    transaction topic that does not exist, a streamed change without its ``transaction`` block (a connector
    without provide.transaction.metadata), an event of another table in a table's topic, a transaction
    topic record that is no BEGIN or END."""
    from confluent_kafka.admin import NewTopic
    from ingest_support import produce

    prefix = f"bad{os.getpid()}"
    a, tx = f"{prefix}.public.a", f"{prefix}.transaction"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for fut in admin.create_topics([NewTopic(t, 1, 1) for t in (a, tx)]).values():
        fut.result(30)

    def ctx_for(name, transaction_topic=tx, topic=a):
        spec = parse_source(name, {"kafka": {"bootstrap": kafka.bootstrap}, "envelope": "debezium",
                                   "topics": [{"topic": topic, "schema": SCHEMA}], "transaction_topic": transaction_topic})
        return replace(make_ctx(db, kafka, spark, tmp_path, "unused", name=name), spec=spec)

    def event(op, txn, table="a"):
        return json.dumps({"before": None, "after": {"id": 1, "v": "x", "n": 1}, "op": op,
                           "source": {"schema": "public", "table": table, "lsn": 1, "sequence": "[null,\"1\"]"},
                           "transaction": txn}).encode()

    try:
        with pytest.raises(UpstreamUnavailable, match=f"topic '{prefix}.nope' does not exist .* fix "
                                                      "`transaction_topic`"):
            cycle.mint(ctx_for("nope", f"{prefix}.nope"))
        good = {"id": "7:70", "total_order": 1, "data_collection_order": 1}
        produce(kafka, tx, [(0, None, json.dumps({"status": "BEGIN", "id": "7:70"}).encode()),
                            (0, None, json.dumps({"status": "END", "id": "7:70", "event_count": 1, "data_collections": [
                                {"data_collection": "public.a", "event_count": 1}]}).encode())])
        produce(kafka, a, [(0, b'{"id":1}', event("c", good)), (0, b'{"id":1}', event("u", None))])
        with pytest.raises(TransactionMetadataInvalid, match=f"topic {a} partition 0 offset 1: a change event "
                                                             "\\(op 'u'\\) without a `transaction` block.*"
                                                             "provide.transaction.metadata=true"):
            cycle.mint(ctx_for("untagged"))
        with connect(db) as conn:  # nothing bound
            assert conn.execute("SELECT count(*) FROM reclock.remap_bindings WHERE source = 'untagged'").fetchone() \
                == (0,)
        b, c = f"{prefix}.public.b", f"{prefix}.public.c"
        for fut in admin.create_topics([NewTopic(b, 1, 1), NewTopic(c, 1, 1)]).values():
            fut.result(30)
        produce(kafka, b, [(0, b'{"id":1}', event("c", good, table="a"))])
        with pytest.raises(TransactionMetadataInvalid, match=f"topic {b} partition 0 offset 0: the event is of "
                                                             "table public.a, the topic's name says public.b"):
            cycle.mint(ctx_for("other", topic=b))
        produce(kafka, tx, [(0, None, b'{"status": "COMMIT", "id": "8:80"}')])
        with pytest.raises(TransactionMetadataInvalid, match=f"topic {tx} partition 0 offset 2: a transaction "
                                                             "record needs status BEGIN or END"):
            cycle.mint(ctx_for("badtx", topic=c))
    finally:
        for fut in admin.delete_topics([a, tx, f"{prefix}.public.b", f"{prefix}.public.c"]).values():
            try:
                fut.result(30)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass
