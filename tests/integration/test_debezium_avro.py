"""``envelope: debezium`` over Avro through the registry, against real Debezium: Kafka Connect 4.1.1 with
Debezium's Postgres connector and Apicurio's Avro converter (``reclock.dev.connect.LocalConnect(registry=...)``)
writes a table of every awkward type to the session's Kafka, its writer schemas registered in the session's
registry (Apicurio, Confluent-compatible API). The worker is killed (no offset flush) and restarted
mid-stream: the collection AS OF every binding is a state the table went through, each value bit for bit
as Postgres holds it (-0.0, NaN, the infinities, decimals, bytes, timestamps), nothing applied twice. The bad
records (no magic byte, an id the registry does not hold, a body that does not decode) go to the errors
collection, or stall the source; a registry that does not answer stalls the cycle, also one lost after the
driver's plan (the job's tasks ask no registry)."""

from __future__ import annotations

import io
import json
import math
import os
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import replace
from decimal import Decimal
from urllib.parse import urlsplit

import fastavro
import psycopg
import pytest
from connect_support import end_offset, running, wait_flushed, wait_written
from ingest_support import make_ctx, produce

from reclock import cycle
from reclock.config import parse_source
from reclock.dev.connect import LocalConnect
from reclock.errors import DecodeError, RegistryUnavailable
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.persist.schemas import load_history
from reclock.sources.kafka.topics import slot
from reclock.sources.kafka.transactions import probe, tx_id
from reclock.sources.kafka.upstream import KafkaUpstream
from reclock.time import PartitionedFrontier
from reclock.read import read_as_of, read_updates
from reclock.registry_plan import schema_text
from reclock.schema_registry import RegistryClient
from reclock.sinks.kafka import read_all
from reclock.spark import decode

SCHEMA = "id INT, f4 FLOAT, f8 DOUBLE, d DECIMAL(12,3), b BINARY, at BIGINT, day INT, t STRING"
COLUMNS = ("id", "f4", "f8", "d", "b", "at", "day", "t")
FLUSH_MS = 3000
TX_TABLES = ("orders", "lines")
TX_SCHEMA = "id INT, v STRING, n BIGINT"
INF = float("inf")


def bits(row: tuple) -> tuple:
    """A row with its floats as their bits (so -0.0 differs from 0.0 and NaN equals NaN)."""
    id_, f4, f8, *rest = row
    return (id_, None if f4 is None else struct.pack("<f", f4), None if f8 is None else struct.pack("<d", f8),
            *rest)


class Table:
    """Table ``kinds`` upstream, and every state it went through (rows as the collection holds them)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.states: list[frozenset] = []

    def rows(self, conn) -> frozenset:
        got = conn.execute("SELECT id, f4, f8, d, b, (extract(epoch FROM at) * 1000)::bigint, "
                           "(day - date '1970-01-01'), t FROM kinds").fetchall()
        return frozenset(bits((i, f4, f8, d, None if b is None else bytes(b), at, day, t))
                         for i, f4, f8, d, b, at, day, t in got)

    def txn(self, *statements: str) -> None:
        with psycopg.connect(self.dsn) as conn:
            for s in statements:
                conn.execute(s)
                self.states.append(self.rows(conn))


def collection(conn, ctx, ts: int | None = None) -> frozenset:
    snap = read_as_of(conn, ctx.blob, ctx.spec.name, ts).to_pylist()
    assert all(r["diff"] == 1 for r in snap), "a row more than once"
    return frozenset(bits(tuple(r[c] for c in COLUMNS)) for r in snap)


@pytest.fixture(scope="module")
def avro_upstream(postgres, kafka, stack_state, registry):
    """A database with table ``kinds`` (four rows before the connector starts: its snapshot), tables
    ``grows``, ``orders`` and ``lines`` (two rows each), and a Connect worker writing them as Avro through the registry,
    with the transaction topic (started once for the module)."""
    name = f"dbz_avro_{os.getpid()}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = postgres.dsn(name)
    table = Table(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE grows (id int PRIMARY KEY, v text)")  # test_debezium_avro_schema_evolves
        conn.execute("INSERT INTO grows VALUES (1, 'a'), (2, 'b')")
        for t in TX_TABLES:  # written together by test_debezium_avro_transaction_topic
            conn.execute(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, n bigint)")
            conn.execute(f"INSERT INTO {t} VALUES (1, 's1', 1), (2, 's2', 2)")
        conn.execute("CREATE TABLE kinds (id int PRIMARY KEY, f4 real, f8 double precision, d numeric(12,3), "
                     "b bytea, at timestamp, day date, t text)")
        conn.execute("""INSERT INTO kinds VALUES
            (1, '-0', '-0', -0.001, '\\x00ff80', '2024-02-29 23:59:59.999', '1969-12-31', 'snapshot ü'),
            (2, 'NaN', 'NaN', 123456789.123, '', '1900-01-01 00:00:00', '2100-12-31', ''),
            (3, 'Infinity', '-Infinity', 0, NULL, NULL, NULL, NULL),
            (4, 3.4028235e38, 4.9e-324, 999999999.999, '\\xdeadbeef', '1970-01-01 00:00:00.001',
             '1970-01-01', 'x')""")
        table.states.append(table.rows(conn))
    worker = LocalConnect(stack_state, kafka.bootstrap, dsn, ("public.kinds", "public.grows",
                                                          *(f"public.{t}" for t in TX_TABLES)),
                          prefix=f"dbzavro{os.getpid()}", transactions=True, flush_ms=FLUSH_MS, registry=registry,
                          extra={"decimal.handling.mode": "precise"})
    with running(worker, postgres):
        yield table, worker


@pytest.fixture
def registry_env(registry, monkeypatch) -> RegistryClient:
    """The registry as the Airflow connection ``reclock_registry`` (its user and password), and a client."""
    s = registry.settings()
    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_REGISTRY", json.dumps(
        {"conn_type": "http", "login": s.username, "password": s.password, "extra": {"url": s.url}}))
    return RegistryClient(s)


def decoded(client: RegistryClient, record: bytes) -> dict:
    """A wire-format Avro record decoded by fastavro (not by Reclock's decoder) with its writer schema."""
    assert record[0] == 0
    writer = client.schema(int.from_bytes(record[1:5], "big"))
    schema = fastavro.parse_schema(json.loads(schema_text("avro", writer)))  # its references inlined
    return fastavro.schemaless_reader(io.BytesIO(record[5:]), schema)


def kinds_ctx(db, kafka, spark, tmp_path, topic: str, name: str):
    ctx = make_ctx(db, kafka, spark, tmp_path, topic, name=name, envelope="debezium", include=[],
                   format={"type": "avro", "registry": {}, "schema": SCHEMA}, budget={"max_records": 1000})
    return replace(ctx, retain_history_ms=10**12)  # every binding stays readable AS OF


def bound_until_current(db, ctx, table: Table) -> None:
    for _ in range(8):  # until the last change is bound
        cycle.run_cycle(ctx)
        with connect(db) as conn:
            if collection(conn, ctx) == table.states[-1]:
                return
        time.sleep(0.5)


def check_bindings(db, ctx, table: Table) -> int:
    """Each binding AS OF is a state the table went through, the last the table now; no errors. Bindings."""
    with connect(db) as conn:
        rc = load_remap(conn, ctx.spec.name)
        for b in rc.bindings:
            got = collection(conn, ctx, b.ts)
            assert got in table.states, f"AS OF {b.ts}: not a state the table went through: {sorted(got)}"
        assert got == table.states[-1]
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard)
        assert errors is None or errors.num_rows == 0, errors.to_pylist()
    return len(rc.bindings)


def test_debezium_avro_bit_for_bit(db, kafka, spark, tmp_path, avro_upstream, registry_env):
    """The snapshot and a transaction of changes, as Debezium's Avro through the registry: the collection is the
    table, each value as Postgres holds it."""
    table, worker = avro_upstream
    topic = worker.topic("public.kinds")
    ctx = kinds_ctx(db, kafka, spark, tmp_path, topic, "kinds")
    wait_written(kafka, topic, 4)
    cycle.run_cycle(ctx)
    table.txn("INSERT INTO kinds VALUES (5, '1.1', '0.1', 0.5, '\\x01', '2000-01-01 12:00:00', '2000-01-01', 'five')",
              "UPDATE kinds SET f8 = '-0', t = 'one' WHERE id = 1", "DELETE FROM kinds WHERE id = 2",
              "UPDATE kinds SET f4 = '-Infinity' WHERE id = 3")
    wait_written(kafka, topic, 4 + 5)  # the insert, two updates, the delete and its tombstone
    bound_until_current(db, ctx, table)
    assert check_bindings(db, ctx, table) >= 2
    final = {r[0]: r for r in table.states[-1]}
    assert final[1][2] == struct.pack("<d", -0.0) and final[1][1] == struct.pack("<f", -0.0)
    assert final[3][1] == struct.pack("<f", -INF) and final[3][2] == struct.pack("<d", -INF)
    assert final[4][1] == b"\xff\xff\x7f\x7f" and final[4][3] == Decimal("999999999.999")
    assert {r.value()[0] for r in read_all(kafka.bootstrap, topic, "wire") if r.value() is not None} == {0}


@pytest.mark.deployment
def test_debezium_avro_through_a_connector_restart(db, kafka, spark, tmp_path, avro_upstream, registry_env):
    """The worker killed before its offset flush and restarted: it writes again what it wrote since; AS OF
    every binding a state the table went through, the redelivered events applied once (~60 s: behind
    ``--deployment``; the JSON path's restart runs in the default suite, test_debezium_source.py)."""
    table, worker = avro_upstream
    topic = worker.topic("public.kinds")
    ctx = kinds_ctx(db, kafka, spark, tmp_path, topic, "kinds_restart")
    wait_written(kafka, topic, 4)  # the snapshot (when this test runs alone)
    bound_until_current(db, ctx, table)
    n0 = end_offset(kafka, topic)
    t = time.time()
    table.txn("UPDATE kinds SET t = 'before kill' WHERE id = 3")
    wait_flushed(worker, t, 3 * FLUSH_MS / 1000)
    table.txn("UPDATE kinds SET d = -999999999.999, b = '\\x' WHERE id = 4",
              "INSERT INTO kinds VALUES (6, 'NaN', '1e308', 1, NULL, NULL, NULL, 'six')")
    written = wait_written(kafka, topic, n0 + 3)
    worker.kill()
    cycle.run_cycle(ctx)
    worker.start()
    table.txn("UPDATE kinds SET t = 'after restart' WHERE id = 6")
    wait_written(kafka, topic, written + 1)
    bound_until_current(db, ctx, table)
    records = list(read_all(kafka.bootstrap, topic, "check"))
    lsns = Counter((r.key(), decoded(registry_env, r.value())["source"]["lsn"]) for r in records
                   if r.value() is not None)
    assert sum(n - 1 for n in lsns.values()) > 0, "the restart redelivered nothing: the test proves nothing"
    assert check_bindings(db, ctx, table) >= 3
    final = {r[0]: r for r in table.states[-1]}
    assert math.isnan(struct.unpack("<f", final[6][1])[0]) and final[4][3] == Decimal("-999999999.999")


def test_debezium_avro_bad_records(db, kafka, spark, tmp_path, avro_upstream, registry_env, topic):
    """Records no Avro converter of this registry wrote: no magic byte, an id the registry does not hold, a
    body its writer schema does not read (cut short). ``on_decode_error: collect``: each in the errors
    collection with its reason and its bytes as they were, the good record beside them applied; ``stall``:
    the cycle stops naming the record and appends nothing; a registry that does not answer stalls the cycle."""
    _, worker = avro_upstream
    source = worker.topic("public.kinds")
    wait_written(kafka, source, 4)
    good = next(r for r in read_all(kafka.bootstrap, source, "bad-copy") if r.value() is not None)
    key, value = good.key(), good.value()
    name = topic(partitions=2)  # the good record in a partition of its own: each task folds what it read
    bad = [(0, key, b'{"op": "c"}'), (0, key, b"\0" + (987654).to_bytes(4, "big") + value[5:]),
           (0, key, value[:-3])]
    produce(kafka, name, bad + [(1, key, value)])
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="bad", envelope="debezium", include=[],
                   format={"type": "avro", "registry": {}, "schema": SCHEMA}, on_decode_error="collect")
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
        rows = read_as_of(conn, ctx.blob, ctx.spec.name).to_pylist()
    by_value = {bytes(e["raw"]): e["reason"] for e in errors}
    assert set(by_value) == {v for _, _, v in bad}, errors
    assert "not in the Confluent wire format" in by_value[bad[0][2]]
    assert "writer schema id 987654 is not in the registry" in by_value[bad[1][2]]
    assert "ends early" in by_value[bad[2][2]]
    assert [r["id"] for r in rows] == [decoded(registry_env, value)["after"]["id"]]

    stall = make_ctx(db, kafka, spark, tmp_path, name, name="stalled", envelope="debezium", include=[],
                     format={"type": "avro", "registry": {}, "schema": SCHEMA}, on_decode_error="stall")
    with pytest.raises(DecodeError, match="Confluent wire format"):
        cycle.run_cycle(stall)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens once closed
    down = make_ctx(db, kafka, spark, tmp_path, name, name="down", envelope="debezium", include=[],
                    format={"type": "avro", "registry": {"url": f"http://127.0.0.1:{port}/apis/ccompat/v7"},
                            "schema": SCHEMA})
    with pytest.raises(RegistryUnavailable, match="refused"):
        cycle.run_cycle(down)
    with connect(db) as conn:
        assert conn.execute("SELECT upper FROM reclock.shards WHERE id = 'down'").fetchone()[0] == 0
        assert conn.execute("SELECT upper FROM reclock.shards WHERE id = 'stalled'").fetchone()[0] == 0


class Forwarder:
    """A TCP forwarder from a loopback port to ``target`` (the registry's): stopped, its port refuses
    connections (the registry lost, to the source); started again, on the same port."""

    def __init__(self, target: int) -> None:
        self.target, self.port = target, 0
        self._stop = threading.Event()
        self.start()

    def start(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(16)
        s.settimeout(0.1)
        self.port = s.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, args=(s, self._stop), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        time.sleep(0.3)  # the accept loop has closed the port

    def _accept(self, s: socket.socket, stop: threading.Event) -> None:
        with s:
            while not stop.is_set():
                try:
                    c, _ = s.accept()
                except TimeoutError:
                    continue
                c.settimeout(None)
                u = socket.create_connection(("127.0.0.1", self.target))
                for a, b in ((c, u), (u, c)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def test_debezium_avro_registry_lost_after_the_plan(db, kafka, spark, tmp_path, avro_upstream, registry,
                                                    registry_env, topic, monkeypatch):
    """The writer schemas are asked of the registry in the driver's plan and handed to the job, whose tasks
    ask none. The registry lost after the plan, as the job starts, with a record of a writer the plan does
    not know (registered under another subject): ``RegistryUnavailable`` from the driver's second plan (not
    a failed Spark job), nothing appended; the registry back, the next cycle is exact."""
    table, worker = avro_upstream
    source = worker.topic("public.kinds")
    wait_written(kafka, source, 4)
    snap = [r for r in read_all(kafka.bootstrap, source, "lost-copy") if r.value() is not None][:2]
    (k1, v1), (k2, v2) = [(r.key(), r.value()) for r in snap]
    other = json.loads(schema_text("avro", registry_env.schema(int.from_bytes(v2[1:5], "big"))))
    other["doc"] = "the same writer under another id"  # a new id, the same encoding
    i2 = registry_env.register(f"lost{os.getpid()}-value", json.dumps(other))
    name = topic(partitions=1)
    produce(kafka, name, [(0, k1, v1)])
    s = registry.settings()
    proxy = Forwarder(urlsplit(s.url).port)
    url = s.url.replace(f":{urlsplit(s.url).port}/", f":{proxy.port}/")
    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_LOST", json.dumps(
        {"conn_type": "http", "login": s.username, "password": s.password, "extra": {"url": url}}))
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="lost", envelope="debezium", include=[],
                   format={"type": "avro", "registry": {"connection": "reclock_lost"}, "schema": SCHEMA})
    cycle.run_cycle(ctx)
    ids = [decoded(registry_env, v)["after"]["id"] for v in (v1, v2)]
    want = [frozenset(r for r in table.states[0] if r[0] in ids[:n]) for n in (1, 2)]
    with connect(db) as conn:
        assert collection(conn, ctx) == want[0]
        upper = conn.execute("SELECT upper FROM reclock.shards WHERE id = 'lost'").fetchone()[0]

    produce(kafka, name, [(0, k2, b"\0" + i2.to_bytes(4, "big") + v2[5:])])
    real = decode.parts_writer

    def lost_then_write(df, url):
        proxy.stop()  # after the driver's plan, before the job's tasks run
        return real(df, url)

    monkeypatch.setattr(decode, "parts_writer", lost_then_write)
    with pytest.raises(RegistryUnavailable, match="refused"):
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        assert conn.execute("SELECT upper FROM reclock.shards WHERE id = 'lost'").fetchone()[0] == upper
        assert collection(conn, ctx) == want[0]

    monkeypatch.setattr(decode, "parts_writer", real)
    proxy.start()
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        assert collection(conn, ctx) == want[1]
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard)
        assert errors is None or errors.num_rows == 0, errors.to_pylist()


def tx_rows(conn, ctx, ts: int | None = None) -> tuple[frozenset, ...]:
    return tuple(frozenset((r["id"], r["v"], r["n"]) for r in read_as_of(conn, ctx.blob, f"{ctx.spec.name}__{t}",
                                                                         ts).to_pylist()) for t in TX_TABLES)


def test_debezium_avro_transaction_topic(db, kafka, spark, tmp_path, avro_upstream, registry_env):
    """``topics:`` over two tables' Avro topics with Debezium's transaction topic (Avro too, through the
    registry): one upstream transaction over both tables has one timestamp in both collections, each binding
    is the tables as a commit left them; the mint's choice, on the real topics cut inside that transaction,
    waits for it."""
    table, worker = avro_upstream
    tx_topic, topics = worker.transaction_topic, [worker.topic(f"public.{t}") for t in TX_TABLES]
    spec = parse_source("avtx", {"kafka": {"bootstrap": kafka.bootstrap}, "envelope": "debezium",
                                 "format": {"type": "avro", "registry": {}}, "transaction_topic": tx_topic,
                                 "topics": [{"topic": tp, "collection": t, "schema": TX_SCHEMA}
                                            for tp, t in zip(topics, TX_TABLES)]})
    ctx = replace(kinds_ctx(db, kafka, spark, tmp_path, topics[0], "avtx_unused"), spec=spec)
    for tp in topics:
        wait_written(kafka, tp, 2)  # the snapshot
    with psycopg.connect(table.dsn) as conn:  # a transaction that changes nothing: the transaction topic exists
        conn.execute("UPDATE orders SET n = n WHERE id = 2")
    wait_written(kafka, tx_topic, 2)
    cycle.run_cycle(ctx)
    states = [(frozenset({(1, "s1", 1), (2, "s2", 2)}),) * 2]
    with psycopg.connect(table.dsn) as conn:  # one transaction over both tables
        conn.execute("UPDATE orders SET v = 't1' WHERE id = 1")
        conn.execute("INSERT INTO lines VALUES (3, 't1', 3)")
        conn.execute("DELETE FROM lines WHERE id = 2")
    states.append((frozenset({(1, "t1", 1), (2, "s2", 2)}), frozenset({(1, "s1", 1), (3, "t1", 3)})))
    with psycopg.connect(table.dsn) as conn:
        conn.execute("UPDATE lines SET v = 't2' WHERE id = 1")
    states.append((states[-1][0], frozenset({(1, "t2", 1), (3, "t1", 3)})))
    wait_written(kafka, topics[1], 2 + 4)  # the insert, the delete and its tombstone, the update
    for _ in range(8):
        cycle.run_cycle(ctx)
        with connect(db) as conn:
            if tx_rows(conn, ctx) == states[-1]:
                break
        time.sleep(0.5)
    values = [r.value() for r in read_all(kafka.bootstrap, tx_topic, "avtx-check")]
    assert values and {v[0] for v in values} == {0}, "the transaction topic is not Avro in the wire format"
    with connect(db) as conn:
        rc = load_remap(conn, "avtx")
        for b in rc.bindings:
            assert tx_rows(conn, ctx, b.ts) in states, f"AS OF {b.ts}: not the tables as a commit left them"
        assert tx_rows(conn, ctx) == states[-1]
        tx1 = {("orders", 1, "s1", -1), ("orders", 1, "t1", 1), ("lines", 3, "t1", 1), ("lines", 2, "s2", -1)}
        stamps = {(t, u["id"], u["v"], u["diff"]): u["ts"] for t in TX_TABLES
                  for u in read_updates(conn, ctx.blob, f"avtx__{t}").to_pylist()}
        assert tx1 <= set(stamps) and len({stamps[u] for u in tx1}) == 1, f"the transaction's updates: {stamps}"
        for t in TX_TABLES:
            errors = read_updates(conn, ctx.blob, f"avtx__{t}_errors")
            assert errors is None or errors.num_rows == 0, errors.to_pylist()

    # the choice on the real Avro topics cut before the last event of the transaction over both tables
    ends = [decoded(registry_env, v) for v in values]
    both = next(tx_id(e["id"]) for e in ends if e["status"] == "END" and len(e["data_collections"]) == 2)
    own = [r.offset() for r in read_all(kafka.bootstrap, topics[1], "avtx-check") if r.value() is not None
           and tx_id((decoded(registry_env, r.value())["transaction"] or {}).get("id", "")) == both]
    full = KafkaUpstream("avtx", kafka.bootstrap, "", topics=spec.upstream.topics).probe_upper()
    short = PartitionedFrontier.of({**full.as_dict(), slot(1, 0): own[-1]})
    source = ctx.source()
    chosen = probe("avtx", kafka.bootstrap, topics, tx_topic, PartitionedFrontier.of({}), short,
                   decode=source._avro_text())
    assert chosen.waiting.startswith(f"transaction {both} "), chosen
    assert both not in chosen.upper.covered
    whole = probe("avtx", kafka.bootstrap, topics, tx_topic, PartitionedFrontier.of({}), full,
                  decode=source._avro_text())
    assert whole.waiting is None and both in whole.upper.covered


@pytest.mark.deployment
def test_debezium_avro_schema_evolves(db, kafka, spark, tmp_path, avro_upstream, registry_env):
    """``schema: evolve``: ``ALTER TABLE ADD COLUMN`` upstream makes Debezium register a new writer schema; the
    collection gains the column from the timestamp of the first record carrying it (a new schema version,
    the machinery of a registry source's ``schema: evolve``); AS OF before it, the declared columns (160 s in
    its one run, on a machine at load ~90, cycling until Debezium's new writer was there: behind
    ``--deployment`` until it is measured on a quiet machine)."""
    table, worker = avro_upstream
    topic = worker.topic("public.grows")
    ctx = make_ctx(db, kafka, spark, tmp_path, topic, name="grows", envelope="debezium", include=[],
                   format={"type": "avro", "registry": {}, "schema": "id INT, v STRING"}, schema="evolve")
    ctx = replace(ctx, retain_history_ms=10**12)
    wait_written(kafka, topic, 2)
    cycle.run_cycle(ctx)
    with psycopg.connect(table.dsn) as conn:
        conn.execute("ALTER TABLE grows ADD COLUMN note text")
        conn.execute("INSERT INTO grows VALUES (3, 'c', 'new')")
        conn.execute("UPDATE grows SET note = '-0.0' WHERE id = 1")
    wait_written(kafka, topic, 4)
    want = [{"id": 1, "v": "a", "note": "-0.0"}, {"id": 2, "v": "b", "note": None},
            {"id": 3, "v": "c", "note": "new"}]
    for _ in range(8):
        cycle.run_cycle(ctx)
        with connect(db) as conn:
            got = sorted(read_as_of(conn, ctx.blob, "grows").to_pylist(), key=lambda r: r["id"])
        if [{k: r.get(k) for k in ("id", "v", "note")} for r in got] == want:
            break
        time.sleep(0.5)
    assert [{k: r.get(k) for k in ("id", "v", "note")} for r in got] == want
    with connect(db) as conn:
        versions = load_history(conn, "grows").versions
        assert [c.name for c in versions[0].schema.columns] == ["id", "v"]
        assert [(c.name, c.type) for c in versions[-1].schema.columns] == [("id", "int"), ("v", "string"),
                                                                           ("note", "string")]
        assert len(versions) == 2 and "adds note" in versions[-1].cause, versions
        since = versions[-1].since_ts
        first_note = min(u["ts"] for u in read_updates(conn, ctx.blob, "grows").to_pylist() if u.get("note"))
        assert since == first_note
        assert read_as_of(conn, ctx.blob, "grows", since - 1).column_names == ["id", "v", "diff"]
        errors = read_updates(conn, ctx.blob, "grows_errors")
        assert errors is None or errors.num_rows == 0, errors.to_pylist()
