"""The Postgres CDC source against a real upstream Postgres (wal_level=logical): snapshot, stream, one
timestamp per transaction, the slot following the resumption frontier, and every bad case stalling."""

from __future__ import annotations

import decimal
import random
import threading
import time

import psycopg
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pg_support import (WriterThread, bindings, contents, make_ctx, slot_confirmed, source_name, upstream_database,
                        writer)

from reclock import cycle, failpoints
from reclock import status_report as sr
from reclock.config import Config
from reclock.cli import main
from reclock.errors import (ConfigError, PublicationMissing, ReplicaIdentityChanged, ReplicaIdentityMissing, SlotBusy,
                            SlotLost,
                            TableSchemaChanged, UpperMismatch, UpstreamDataLost)
from reclock.sources.postgres.cdc import reclock_lsn
from reclock.persist import connect
from reclock.persist.shards import batches, shard_info
from reclock.persist.status import latest_status
from reclock.read import read_updates
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import slot_name
from reclock.sources.postgres import spark_snapshot as spark_snapshot


@pytest.fixture
def upstream(postgres):
    with upstream_database(postgres) as dsn:
        yield dsn


def _setup(dsn: str, tables=("a", "b", "c")) -> None:
    with writer(dsn) as conn:
        for t in tables:
            conn.execute(f"CREATE TABLE {t} (id int8 PRIMARY KEY, v text, n numeric(10,2), txid int8)")
            conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        conn.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(tables)}")


def test_snapshot_then_stream(db, upstream, tmp_path, monkeypatch):
    _setup(upstream)
    with writer(upstream) as up:
        up.execute("INSERT INTO a SELECT g, 'a' || g, g / 4.0, 0 FROM generate_series(1, 50) g")
        up.execute("INSERT INTO b VALUES (1, 'b1', 1, 0)")
    name = source_name()
    ctx = make_ctx(db, upstream, tmp_path, name, ["a", "public.b", "c"], max_records=7)
    out = cycle.run_cycle(ctx)
    assert out["descriptions"] == 1
    (t1, l1), = bindings(ctx)
    assert set(contents(ctx, f"{name}__a", t1)) == set(range(1, 51))
    assert contents(ctx, f"{name}__b", t1)[1]["v"] == "b1"
    assert contents(ctx, f"{name}__c", t1) == {}
    assert slot_confirmed(upstream, name) == l1

    with writer(upstream) as up:
        with up.transaction():
            up.execute("UPDATE a SET v = 'changed' WHERE id <= 10")
            up.execute("DELETE FROM b WHERE id = 1")
            up.execute("INSERT INTO c VALUES (5, 'c5', 2.5, 0)")
        up.execute("DELETE FROM a WHERE id > 40")
    cycle.run_cycle(ctx)
    bs = bindings(ctx)
    t2 = bs[-1][0]
    a = contents(ctx, f"{name}__a", t2)
    assert set(a) == set(range(1, 41)) and all(a[i]["v"] == "changed" for i in range(1, 11))
    assert contents(ctx, f"{name}__b", t2) == {}
    assert contents(ctx, f"{name}__c", t2)[5]["v"] == "c5"
    assert set(contents(ctx, f"{name}__a", t1)) == set(range(1, 51))  # AS OF the first binding: unchanged
    assert slot_confirmed(upstream, name) == bs[-1][1]

    # the progress relation is (ts, lsn), in SQL and on the command line
    with connect(db) as conn:
        progress = conn.execute(f'SELECT ts, lsn::text FROM reclock."{name}_progress" ORDER BY ts').fetchall()
    assert progress == [(ts, po.lsn_to_str(lsn)) for ts, lsn in bs]
    out = CliRunner().invoke(main, ["progress", name, "--dsn", db], catch_exceptions=False).output
    assert out.splitlines()[:3] == ["ts               lsn", *(f"{ts:<16d} {po.lsn_to_str(lsn)}" for ts, lsn in bs)]
    assert f"shard {name}__a: upper {bs[-1][0] + 1}, since " in out
    cfg = Config(sources={name: ctx.spec})
    with connect(db) as conn:  # the lag in the kind's terms: WAL bytes beyond the slot, positions as LSNs
        monkeypatch.setenv("UNUSED", upstream)  # the probe finds the upstream as a task does (its dsn_env)
        detail = sr.source_detail(conn, name, cfg, sr.lag_probe(cfg))
    text = "\n".join(sr.detail_lines(detail))
    assert detail.source.lag.unit == "bytes" and detail.source.lag.value is not None, detail.source.lag
    assert "retains" in detail.source.lag.detail and "confirmed " in detail.source.lag.detail
    assert detail.columns == ("ts", "lsn") and detail.bindings[0].cells == (po.lsn_to_str(bs[-1][1]),)
    assert name in text and f"bindings (newest first): ts, lsn" in text and po.lsn_to_str(bs[-1][1]) in text


class Writer(WriterThread):
    """Runs transactions over the tables in its own key space and logs each: its xid and its changes."""

    pause = 0.02

    def __init__(self, dsn: str, index: int, stop: threading.Event, big_at: int | None = None) -> None:
        super().__init__(dsn, stop, random.Random(index))
        self.index, self.big_at = index, big_at
        self.log: list[tuple[int, list[tuple]]] = []  # (xid, [(table, op, key, row)])
        self.live: dict[str, dict[int, tuple]] = {t: {} for t in TABLES}
        self.next_key = index * 1_000_000

    def step(self, conn, n: int) -> None:
        self.transaction(conn, big=(n == self.big_at))

    def transaction(self, conn, big: bool) -> None:
        ops: list[tuple] = []
        with conn.transaction():
            xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
            count = 2500 if big else self.rng.randint(1, 6)
            for _ in range(count):
                table = "b" if big else self.rng.choice(TABLES)
                live = self.live[table]
                kind = "insert" if big or len(live) < 5 else self.rng.choice(["insert", "update", "delete"])
                if kind == "insert":
                    self.next_key += 1
                    key = self.next_key
                    row = (f"v{self.rng.randint(0, 10**6)}", decimal.Decimal(self.rng.randint(-10**6, 10**6)) / 100, xid)
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s)", (key, *row))
                else:
                    key = self.rng.choice(sorted(live))
                    if kind == "update":
                        row = (f"u{self.rng.randint(0, 10**6)}", live[key][1], xid)
                        conn.execute(f"UPDATE {table} SET v = %s, txid = %s WHERE id = %s", (row[0], xid, key))
                    else:
                        row = None
                        conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                ops.append((table, kind, key, row))
                if row is None:
                    live.pop(key)
                else:
                    live[key] = row
        self.log.append((xid, ops))


TABLES = ("a", "b", "c")


def _commit_lsns(dsn: str, slot: str, publication: str = "pub") -> dict[int, int]:
    """xid -> commit LSN, from the Begin messages of an observer slot made before any write."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', "
                            "'1', 'publication_names', %s) WHERE get_byte(data, 0) = 66",
                            (slot, publication)).fetchall()
    out = {}
    for (data,) in rows:
        m = po.decode(data)
        out[m.xid] = m.final_lsn
    return out


def _expected(writers: list[Writer], lsns: dict[int, int], upto: int) -> dict[str, dict[int, tuple]]:
    state: dict[str, dict[int, tuple]] = {t: {} for t in TABLES}
    for w in writers:
        for xid, ops in w.log:
            if lsns[xid] >= upto:
                break  # a writer's transactions commit in order: the rest are later still
            for table, kind, key, row in ops:
                if row is None:
                    state[table].pop(key)
                else:
                    state[table][key] = row
    return state


def test_concurrent_writers_every_binding_and_one_timestamp_per_transaction(db, upstream, tmp_path):
    _setup(upstream)
    name = source_name()
    with writer(upstream) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"observer_{name}",))
    ctx = make_ctx(db, upstream, tmp_path, name, list(TABLES), max_records=400)
    stop = threading.Event()
    writers = [Writer(upstream, i, stop, big_at=15 if i == 0 else None) for i in range(3)]
    for w in writers:
        w.start()
    time.sleep(0.3)
    for _ in range(5):  # the first cycle's snapshot runs while they write
        cycle.run_cycle(ctx)
        time.sleep(0.2)
    stop.set()
    for w in writers:
        w.join(60)
        assert w.error is None, w.error
    cycle.run_cycle(ctx)
    cycle.run_cycle(ctx)
    lsns = _commit_lsns(upstream, f"observer_{name}")
    bs = bindings(ctx)
    assert len(bs) >= 5 and all(w.log for w in writers)
    assert any(len(ops) == 2500 for _, ops in writers[0].log), "the large transaction ran"
    t1, l1 = bs[0]
    for ts, lsn in bs:
        want = _expected(writers, lsns, lsn)
        for table in TABLES:
            got = {k: (r["v"], r["n"], r["txid"]) for k, r in contents(ctx, f"{name}__{table}", ts).items()}
            assert got == want[table], f"{table} AS OF {ts} (LSN {lsn:X})"
    assert sum(len(ops) for w in writers for _, ops in w.log) > 2500
    final = _expected(writers, lsns, 2**64)
    assert {t: len(v) for t, v in final.items()} == {t: len(v) for t, v in _expected(writers, lsns, bs[-1][1]).items()}

    # every row a transaction wrote carries the timestamp of the binding that covers its commit LSN
    stamped: dict[int, set[int]] = {}
    with connect(ctx.dsn) as conn:
        for table in TABLES:
            for r in read_updates(conn, ctx.blob, f"{name}__{table}").to_pylist():
                if r["diff"] == 1 and r["ts"] > t1:
                    stamped.setdefault(r["txid"], set()).add(r["ts"])
        parts_b = [b for b in batches(conn, f"{name}__b") if b.rows]
    for xid, tss in stamped.items():
        assert tss == {reclock_lsn(bs, lsns[xid])}, f"transaction {xid}: timestamps {tss}"
    big = next(xid for xid, ops in writers[0].log if len(ops) == 2500)
    assert big in stamped or lsns[big] < l1
    assert max(b.rows for b in parts_b) <= 400, "parts are bounded by the budget, whatever a transaction's size"
    assert slot_confirmed(upstream, name) == bs[-1][1]


def test_a_row_filter_every_binding_equals_the_filtered_tables_while_writers_write(db, upstream, tmp_path):
    """``FOR TABLE a WHERE (v LIKE 'u%')``: the writers insert rows outside the filter (``v...``) and update
    them into it (``u...``: an insert for the collection), delete rows in and out of it, while the first
    cycle takes its snapshot and the next ones stream. AS OF every binding, ``a``'s collection is exactly
    the rows of ``a`` the filter passes at that binding's LSN (the writers' own logs, the commit LSNs from
    an observer slot of an unfiltered publication); ``b`` and ``c`` are whole."""
    with writer(upstream) as conn:
        for t in TABLES:
            conn.execute(f"CREATE TABLE {t} (id int8 PRIMARY KEY, v text, n numeric(10,2), txid int8)")
            conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION pub FOR TABLE a WHERE (v LIKE 'u%'), b, c")
        conn.execute("CREATE PUBLICATION everything FOR TABLE a, b, c")
    name = source_name()
    observer = _observer(upstream, name)
    ctx = make_ctx(db, upstream, tmp_path, name, list(TABLES), max_records=50)
    stop = threading.Event()
    writers = [Writer(upstream, i, stop) for i in range(2)]
    for w in writers:
        w.start()
    time.sleep(0.3)
    for _ in range(4):
        cycle.run_cycle(ctx)
        time.sleep(0.2)
    stop.set()
    for w in writers:
        w.join(60)
        assert w.error is None, w.error
    cycle.run_cycle(ctx)
    lsns = _commit_lsns(upstream, observer, "everything")
    moved = 0
    for ts, lsn in bindings(ctx):
        want = _expected(writers, lsns, lsn)
        want["a"] = {k: r for k, r in want["a"].items() if r[0].startswith("u")}
        moved = max(moved, len(want["a"]))
        for table in TABLES:
            got = {k: (r["v"], r["n"], r["txid"]) for k, r in contents(ctx, f"{name}__{table}", ts).items()}
            assert got == want[table], f"{table} AS OF {ts} (LSN {lsn:X})"
    assert moved > 0, "rows moved into the filter"


def _check(ctx, writers, lsns) -> list[tuple[int, int]]:
    """Every binding's contents equal the tables as of its LSN; every transaction's rows carry one ts."""
    bs = bindings(ctx)
    name = ctx.spec.name
    for ts, lsn in bs:
        want = _expected(writers, lsns, lsn)
        for table in TABLES:
            got = {k: (r["v"], r["n"], r["txid"]) for k, r in contents(ctx, f"{name}__{table}", ts).items()}
            assert got == want[table], f"{table} AS OF {ts} (LSN {lsn:X})"
    with connect(ctx.dsn) as conn:
        for table in TABLES:
            ups = read_updates(conn, ctx.blob, f"{name}__{table}")
            for r in (ups.to_pylist() if ups is not None else []):
                # at the first binding a row may come back as the rewind of a later change (+1 of its old
                # row): the contents there are checked above; after it, a row is at its own transaction's ts
                if r["diff"] == 1 and r["ts"] > bs[0][0]:
                    assert r["ts"] == reclock_lsn(bs, lsns[r["txid"]]), r
    return bs


def _observer(dsn: str, name: str) -> str:
    slot = f"observer_{name}"
    with writer(dsn) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    return slot


def test_the_seam_rows_written_between_mint_and_snapshot_appear_once(db, upstream, tmp_path):
    _setup(upstream)
    name = source_name()
    observer = _observer(upstream, name)
    w = Writer(upstream, 0, threading.Event())
    with writer(upstream) as conn:
        for _ in range(10):
            w.transaction(conn, big=False)
    ctx = make_ctx(db, upstream, tmp_path, name, list(TABLES), max_records=5)
    minted = cycle.mint(ctx)
    with writer(upstream) as conn:  # committed after the first binding's LSN, before the snapshot
        for _ in range(10):
            w.transaction(conn, big=False)
    for d in minted.descriptions:
        cycle.append(ctx, cycle.write_batches(ctx, d))
    cycle.resume(ctx)
    with connect(ctx.dsn) as conn:
        stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'write_batches'",
                             (name,)).fetchone()[0]
    assert stats["snapshot_lsn"] > stats["first_lsn"], "the snapshot is past the first binding: it was rewound"
    cycle.run_cycle(ctx)
    lsns = _commit_lsns(upstream, observer)
    bs = _check(ctx, [w], lsns)
    assert len(bs) == 2
    last = _expected([w], lsns, 2**64)
    assert {t: len(v) for t, v in _expected([w], lsns, bs[-1][1]).items()} == {t: len(v) for t, v in last.items()}


@pytest.mark.parametrize("point", ["mint:after_binding", "write_batches:before_job", "write_batches:after_slice",
                                   "append:in_transaction", "resume:after_commit"])
def test_a_crash_at_each_step_boundary_changes_nothing(db, upstream, tmp_path, point):
    _setup(upstream)
    name = source_name()
    observer = _observer(upstream, name)
    w = Writer(upstream, 0, threading.Event())
    ctx = make_ctx(db, upstream, tmp_path, name, list(TABLES), max_records=4)
    with writer(upstream) as conn:
        for round_ in range(3):
            for _ in range(5):
                w.transaction(conn, big=False)
            before = slot_confirmed(upstream, name)
            with failpoints.enabled(point), pytest.raises(failpoints.FailpointHit):
                cycle.run_cycle(ctx)
            if point != "resume:after_commit" and before is not None:
                assert slot_confirmed(upstream, name) == before, "no append, no slot advance"
            cycle.run_cycle(ctx)
    lsns = _commit_lsns(upstream, observer)
    bs = _check(ctx, [w], lsns)
    assert slot_confirmed(upstream, name) == bs[-1][1]


def _stalls(ctx, error, match):
    with connect(ctx.dsn) as conn:
        uppers = {s: shard_info(conn, s).upper for s in ctx.shards()}
    for _ in range(2):  # it stays stalled
        with pytest.raises(error, match=match):
            cycle.run_cycle(ctx)
    with connect(ctx.dsn) as conn:
        assert {s: shard_info(conn, s).upper for s in ctx.shards()} == uppers, "nothing appended past it"
        assert latest_status(conn, ctx.spec.name).status == "stalled"


def test_a_table_without_an_identity_is_refused_and_one_whose_identity_changes_stalls(db, upstream, tmp_path):
    _setup(upstream)
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE b REPLICA IDENTITY NOTHING")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), list(TABLES))
    with pytest.raises(ReplicaIdentityMissing, match=r'table public\.b: .*run: ALTER TABLE "public"\."b" REPLICA '
                                                     r"IDENTITY FULL;"):
        cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        conn.execute('ALTER TABLE "public"."b" REPLICA IDENTITY DEFAULT')  # its primary key
        conn.execute("INSERT INTO b VALUES (1, 'x', 1, 0)")
    cycle.run_cycle(ctx)
    assert set(contents(ctx, f"{ctx.spec.name}__b", bindings(ctx)[-1][0])) == {1}
    with writer(upstream) as conn:  # changed later: the next cycle stalls until it is set back
        conn.execute("ALTER TABLE b REPLICA IDENTITY FULL")
    _stalls(ctx, ReplicaIdentityChanged, r"table public\.b: its replica identity is FULL, not DEFAULT \(primary key "
            r"\(id\)\) as when the source took its snapshot")
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE b REPLICA IDENTITY DEFAULT")
        conn.execute("UPDATE b SET v = 'y' WHERE id = 1")
    cycle.run_cycle(ctx)
    assert contents(ctx, f"{ctx.spec.name}__b", bindings(ctx)[-1][0])[1]["v"] == "y"


@pytest.mark.parametrize("change,error,match", [
    ("ALTER TABLE a ADD COLUMN r float8 DEFAULT random(); INSERT INTO a VALUES (99, 'z', 1, 0)", TableSchemaChanged,
     r"table public\.a: DDL added column\(s\) r, and what the rows the table held then hold there cannot be told.*"
     "`reclock resnapshot "),
    ("ALTER TABLE a ALTER COLUMN v TYPE varchar(20); INSERT INTO a VALUES (98, 'y', 1, 0)", TableSchemaChanged,
     r"column v changed type"),
    ("SELECT pg_drop_replication_slot('{slot}')", SlotLost, "does not exist"),
    ("DROP PUBLICATION pub", PublicationMissing, "publication pub does not exist"),
    ("DROP TABLE c", PublicationMissing, r"table public\.c: not in publication pub"),
    ("SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())", SlotLost, r"past .* where the shards "
     "need changes from"),
])
def test_bad_changes_stall_the_source_naming_the_table(db, upstream, tmp_path, change, error, match):
    _setup(upstream)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), list(TABLES))
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a VALUES (1, 'one', 1, 0)")
    cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a VALUES (2, 'two', 2, 0)")  # before the bad change, in the same binding
        for stmt in change.format(slot=slot_name(ctx.spec.name)).split("; "):
            conn.execute(stmt)
    _stalls(ctx, error, match)
    assert issubclass(SlotLost, UpstreamDataLost)


def test_a_stall_early_in_a_long_read_stops_the_read_ahead_and_the_source_goes_on_after_resnapshot(db, upstream,
                                                                                                   tmp_path):
    """The slot's blocks are fetched on a helper thread ahead of the decoding: a stall in the first block
    leaves no helper thread, no active slot and nothing appended, with a hundred blocks still to read."""
    _setup(upstream)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), list(TABLES), max_records=50)  # blocks of 50 messages
    name = ctx.spec.name
    cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE a ADD COLUMN r float8 DEFAULT random()")
        conn.execute("INSERT INTO a VALUES (1, 'one', 1, 0)")
        conn.execute("INSERT INTO b SELECT g, 'b' || g, 1, 0 FROM generate_series(1, 5000) g")
    _stalls(ctx, TableSchemaChanged, r"table public\.a: DDL added column")
    assert not [t.name for t in threading.enumerate() if t.name.startswith("reclock-peek-")]
    with writer(upstream) as conn:
        active = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                              (slot_name(name),)).fetchone()[0]
    assert active is False
    cycle.resnapshot(ctx)
    cycle.run_cycle(ctx)
    assert set(contents(ctx, f"{name}__b", bindings(ctx)[-1][0])) == set(range(1, 5001))


def test_a_read_left_early_closes_its_cursor_and_cancels_a_fetch_still_running(upstream, monkeypatch):
    """``read_blocks``: the caller leaving after a block leaves the session usable, with no helper thread;
    a server call still running on it (a slow fetch) is cancelled, not waited for."""
    from reclock.sources.postgres.upstream import PostgresUpstream

    _setup(upstream)
    with writer(upstream) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('reclock_early', 'pgoutput')")
        conn.execute("INSERT INTO a SELECT g, 'a', 1, 0 FROM generate_series(1, 3000) g")
        upto = po.lsn_to_int(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    up = PostgresUpstream("early", upstream, "pub")
    with up.session() as conn:
        with conn.transaction(force_rollback=True):
            blocks = up.read_blocks(conn, upto, batch=10, ahead=1)
            first = next(blocks)
            assert len(first) == 10 and first[0][:1] == b"B"
            blocks.close()
        assert not [t for t in threading.enumerate() if t.name == "reclock-peek-early"]
        assert conn.execute("SELECT count(*) FROM pg_cursors").fetchone()[0] == 0
        with conn.transaction(force_rollback=True):  # the session reads the whole slot again
            assert sum(len(b) for b in up.read_blocks(conn, upto, batch=100)) == 3003  # Relation, B, 3000, C

    def slow(self, conn, upto, batch):
        yield [b"first"]
        conn.execute("SELECT pg_sleep(60)")  # what a fetch that runs long looks like from here
        yield [b"second"]

    monkeypatch.setattr(PostgresUpstream, "peek_blocks", slow)
    with up.session() as conn:
        blocks = up.read_blocks(conn, upto)
        assert next(blocks) == [b"first"]
        time.sleep(0.2)  # the helper is in pg_sleep now
        t0 = time.monotonic()
        blocks.close()
        assert time.monotonic() - t0 < 10, "cancelled, not waited for"
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_cycle_opens_one_upstream_session_and_one_consensus_connection(db, upstream, tmp_path, monkeypatch):
    """A connection costs ~6 ms (SCRAM): a cycle that ingests holds one of each for its four steps; a step
    run on its own (an Airflow task) holds its own."""
    from reclock.sources.postgres.upstream import PostgresUpstream

    _setup(upstream)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), list(TABLES))
    cycle.run_cycle(ctx)  # the snapshot's cycle
    opened = {"upstream": 0, "consensus": 0}
    up_connect, cons_connect = PostgresUpstream.connect, cycle.connect

    def count_up(self, *a, **k):
        opened["upstream"] += 1
        return up_connect(self, *a, **k)

    def count_cons(*a, **k):
        opened["consensus"] += 1
        return cons_connect(*a, **k)

    monkeypatch.setattr(PostgresUpstream, "connect", count_up)
    monkeypatch.setattr(cycle, "connect", count_cons)
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a VALUES (1, 'one', 1, 0)")
    assert cycle.run_cycle(ctx)["descriptions"] == 1
    assert opened == {"upstream": 1, "consensus": 1}
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a VALUES (2, 'two', 2, 0)")
    opened.update(upstream=0, consensus=0)
    minted = cycle.mint(ctx)  # as the mint_write task runs it: mint, then its write
    cycle.append(ctx, cycle.write_batches(ctx, minted.descriptions[0]))
    cycle.resume(ctx)
    assert opened == {"upstream": 3, "consensus": 4}  # one per step; append reads nothing upstream
    assert set(contents(ctx, f"{ctx.spec.name}__a", bindings(ctx)[-1][0])) == {1, 2}
    assert slot_confirmed(upstream, ctx.spec.name) == bindings(ctx)[-1][1]


def test_an_idle_source_follows_the_wal_and_pins_none(db, upstream, postgres, tmp_path):
    _setup(upstream)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), list(TABLES))
    cycle.run_cycle(ctx)
    slot = slot_name(ctx.spec.name)

    def restart_lsn() -> int:
        with writer(upstream) as conn:
            return po.lsn_to_int(conn.execute("SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                              (slot,)).fetchone()[0])

    first = restart_lsn()
    with writer(postgres.dsn("postgres")) as other:  # WAL from elsewhere: no published table changes
        other.execute("CREATE TABLE IF NOT EXISTS idle_noise (x text)")
        other.execute("INSERT INTO idle_noise SELECT repeat('x', 100) FROM generate_series(1, 20000)")
        other.execute("DROP TABLE idle_noise")
    out = cycle.run_cycle(ctx)
    assert out["minted"] is not None  # the flush LSN moved: a binding, and the slot follows it
    bs = bindings(ctx)
    assert slot_confirmed(upstream, ctx.spec.name) == bs[-1][1] > bs[-2][1]
    assert restart_lsn() > first, "the slot let go of the WAL it no longer needs"
    assert all(contents(ctx, s, bs[-1][0]) == {} for s in ctx.shards()[:-1])


@pytest.mark.parametrize("snapshot_on,identity", [("task", "FULL"), ("spark", "FULL"), ("task", "DEFAULT"),
                                                  ("spark", "DEFAULT")])
def test_every_type_reads_the_same_from_the_snapshot_and_the_stream_and_toast_is_filled(db, upstream, tmp_path,
                                                                                       snapshot_on, identity, request):
    """Every type, read by the snapshot (in the task or on Spark) and by the stream, lands the same values;
    an update leaving a TOASTed value alone (``u``) takes it from the old row: sent whole under FULL, the
    collection's own under DEFAULT (whose update carries no old row), taken back bit for bit."""
    cols = ("b bool, s int2, i int4, n numeric(12,2), f4 float4, f8 float8, txt text, vc varchar(20), "
            "tsp timestamp, tz timestamptz, d date, j jsonb, js json, u uuid, by bytea, big text, nul text, "
            "word text, empty varchar(3), un numeric, o oid, bf bool, f4x float4, f8x float8, l int8, iv interval, "
            "arr int4[], ch char(3)")
    values = ("true, -5, 7, -1234.50, 1.5, 'NaN', E'h\\u00e9,\"l\"\\nlo', 'v', '2024-01-02 03:04:05.123456', "
              "'2024-01-02 03:04:05+02', '2024-02-29', '{\"a\": [1]}', '{\"b\":2}', "
              "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff', repeat('x', 100000), NULL, 'NULL', '', "
              "-98765.4321, 4294967295, false, '3.4028235e+38', '-Infinity', -9223372036854775808, "
              "'1 day 02:03:04.5', '{1,NULL,3}', 'ab'")
    nulls = ", ".join(["NULL"] * (cols.count(",") + 1 - cols.count("(12,2)")))
    with writer(upstream) as conn:
        conn.execute(f"CREATE TABLE t (id int8 PRIMARY KEY, {cols})")
        conn.execute(f"ALTER TABLE t REPLICA IDENTITY {identity}")
        conn.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute(f"INSERT INTO t VALUES (1, {values}), (3, {nulls})")
    spark = request.getfixturevalue("spark") if snapshot_on == "spark" else None
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"], spark=spark)
    cycle.run_cycle(ctx)
    with connect(ctx.dsn) as conn:
        stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'write_batches'",
                             (ctx.spec.name,)).fetchone()[0]
    assert stats["snapshot_on_spark"] == ([f"{ctx.spec.name}__t"] if spark else [])
    with writer(upstream) as conn:
        conn.execute(f"INSERT INTO t VALUES (2, {values}), (4, {nulls})")
        conn.execute("UPDATE t SET i = 8 WHERE id = 1")  # big is unchanged: sent as 'u', taken from the old row
        conn.execute("UPDATE t SET i = 9 WHERE id = 3")
        conn.execute("UPDATE t SET i = NULL WHERE id = 3")  # and back: the old row's retraction cancels the first
    cycle.run_cycle(ctx)
    with connect(ctx.dsn) as conn:  # the snapshot's parts and the stream's hold the same types
        types = {tuple((f.name, f.type) for f in pq.read_schema(ctx.blob.url(b.path)))
                 for b in batches(conn, f"{ctx.spec.name}__t") if b.rows}
    assert len(types) == 1, types
    rows = contents(ctx, f"{ctx.spec.name}__t", bindings(ctx)[-1][0])
    assert rows[3] | {"id": 4} == rows[4] and all(v is None for k, v in rows[3].items() if k != "id")
    one, two = rows[1], rows[2]
    assert one.pop("i") == 8 and two.pop("i") == 7
    assert one.pop("id") == 1 and two.pop("id") == 2
    nan1, nan2 = one.pop("f8"), two.pop("f8")
    assert nan1 != nan1 and nan2 != nan2
    assert one == two
    assert one["big"] == "x" * 100000 and one["by"] == b"\x00\xff" and str(one["n"]) == "-1234.50"
    assert one["tz"].isoformat() == "2024-01-02T01:04:05+00:00"
    assert (one["txt"], one["nul"], one["word"], one["empty"]) == ('hé,"l"\nlo', None, "NULL", "")


def test_a_column_named_like_the_collections_own_is_refused(db, upstream, tmp_path):
    with writer(upstream) as conn:
        conn.execute("CREATE TABLE t (id int8 PRIMARY KEY, ts timestamp)")
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), None)  # every table of the publication
    with pytest.raises(ConfigError, match=r"table public\.t has column\(s\) ts"):
        cycle.run_cycle(ctx)


def test_a_truncate_lands_as_the_retraction_of_every_row_at_its_transaction(db, upstream, tmp_path):
    """A ``TRUNCATE`` retracts every row its collection holds at that point, at its transaction's timestamp:
    the rows landed by earlier cycles and the ones this cycle wrote before it (in parts already written:
    ``max_records`` 3), with changes after it in the same transaction on top; history before stays."""
    _setup(upstream)
    name = source_name()
    ctx = make_ctx(db, upstream, tmp_path, name, list(TABLES), max_records=3)
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a SELECT g, 'a' || g, g, 0 FROM generate_series(1, 10) g")
        conn.execute("INSERT INTO b VALUES (1, 'b1', 1, 0)")
    cycle.run_cycle(ctx)
    first = bindings(ctx)[-1][0]
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a VALUES (11, 'eleven', 11, 0)")
        conn.execute("UPDATE a SET v = 'changed' WHERE id <= 5")
        with conn.transaction():
            conn.execute("INSERT INTO a VALUES (12, 'twelve', 12, 0)")
            conn.execute("TRUNCATE a, b")
            conn.execute("INSERT INTO a VALUES (13, 'after', 13, 0), (1, 'again', 1, 0)")
        conn.execute("INSERT INTO b VALUES (2, 'b2', 2, 0)")
        conn.execute("TRUNCATE c")  # nothing to retract
    cycle.run_cycle(ctx)
    last = bindings(ctx)[-1][0]
    with writer(upstream) as conn:
        for t in TABLES:
            want = {r[0]: r for r in conn.execute(f"SELECT * FROM {t}").fetchall()}
            got = contents(ctx, f"{name}__{t}", last)
            assert {k: tuple(r.values()) for k, r in got.items()} == want, t
    assert set(contents(ctx, f"{name}__a", first)) == set(range(1, 11)), "history before the truncate stays"
    with connect(db) as conn:  # every update at its transaction's one timestamp: nothing at a time of its own
        ts = {r["ts"] for r in read_updates(conn, ctx.blob, f"{name}__a").to_pylist()}
    assert ts <= {t for t, _ in bindings(ctx)}
    with writer(upstream) as conn:
        conn.execute("INSERT INTO c VALUES (1, 'c', 1, 0)")
    cycle.run_cycle(ctx)
    assert set(contents(ctx, f"{name}__c", bindings(ctx)[-1][0])) == {1}


@pytest.mark.parametrize("change,error", [
    ("ALTER TABLE a ADD COLUMN r float8 DEFAULT random(); UPDATE a SET v = 'x' WHERE id = 1", TableSchemaChanged),
    ("SELECT pg_drop_replication_slot('{slot}')", SlotLost),
])
def test_resnapshot_after_a_stall_starts_over_at_a_new_timestamp(db, upstream, tmp_path, change, error):
    _setup(upstream)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), list(TABLES))
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a VALUES (1, 'one', 1, 0), (2, 'two', 2, 0)")
        conn.execute("INSERT INTO b VALUES (1, 'b', 1, 0)")
    cycle.run_cycle(ctx)
    before = bindings(ctx)
    with writer(upstream) as conn:
        conn.execute("INSERT INTO b VALUES (2, 'b2', 2, 0)")
        for stmt in change.format(slot=slot_name(ctx.spec.name)).split("; "):
            conn.execute(stmt)
    with pytest.raises(error):
        cycle.run_cycle(ctx)
    out = cycle.resnapshot(ctx)
    assert out["ts"] > before[-1][0]
    with writer(upstream) as conn:
        conn.execute("INSERT INTO c VALUES (1, 'after', 1, 0)")
    cycle.run_cycle(ctx)
    cycle.run_cycle(ctx)
    bs = bindings(ctx)
    name = ctx.spec.name
    with writer(upstream) as conn:
        want = {t: {r[0]: r for r in conn.execute(f"SELECT * FROM {t}").fetchall()} for t in TABLES}
    for t in TABLES:
        got = contents(ctx, f"{name}__{t}", bs[-1][0])
        assert {k: tuple(r.values()) for k, r in got.items()} == want[t], t
    assert set(contents(ctx, f"{name}__a", before[-1][0])) == {1, 2}, "history before the stall stays as it was"
    assert set(contents(ctx, f"{name}__b", out["ts"])) == {1, 2}, "the re-snapshot holds what happened meanwhile"
    with connect(db) as conn:
        assert latest_status(conn, name).status == "running"


def test_a_slot_invalidated_by_max_slot_wal_keep_size_is_upstream_data_lost(db, upstream, postgres, tmp_path):
    _setup(upstream)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), list(TABLES))
    cycle.run_cycle(ctx)
    with writer(postgres.dsn("postgres")) as admin:
        admin.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        admin.execute("SELECT pg_reload_conf()")
        try:
            with writer(upstream) as conn:
                for _ in range(3):  # WAL the slot holds, well past what it may keep; then a checkpoint removes it
                    conn.execute("INSERT INTO a SELECT g, repeat('x', 200), 1, 0 FROM generate_series(1, 40000) g")
                    conn.execute("DELETE FROM a")
                    conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
                status = conn.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s",
                                      (slot_name(ctx.spec.name),)).fetchone()[0]
            assert status == "lost"
            with pytest.raises(SlotLost, match="was invalidated"):
                cycle.run_cycle(ctx)
        finally:
            admin.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
            admin.execute("SELECT pg_reload_conf()")


def test_two_cycles_at_once_give_the_same_contents_and_timestamps(db, upstream, tmp_path):
    _setup(upstream)
    name = source_name()
    observer = _observer(upstream, name)
    w = Writer(upstream, 0, threading.Event())
    ctxs = [make_ctx(db, upstream, tmp_path, name, list(TABLES), max_records=50) for _ in range(2)]
    for c in ctxs[1:]:
        c.clock = ctxs[0].clock
    failures: list[BaseException] = []

    def run(ctx) -> None:
        try:
            cycle.run_cycle(ctx)
        except (UpperMismatch, SlotBusy) as e:  # the loser of a race fails loudly and changes nothing
            failures.append(e)

    with writer(upstream) as conn:
        for _ in range(6):
            for _ in range(4):
                w.transaction(conn, big=False)
            threads = [threading.Thread(target=run, args=(c,)) for c in ctxs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
    cycle.run_cycle(ctxs[0])
    bs = _check(ctxs[0], [w], _commit_lsns(upstream, observer))
    assert slot_confirmed(upstream, name) == bs[-1][1]
    assert _expected([w], _commit_lsns(upstream, observer), bs[-1][1]) == _expected([w], _commit_lsns(upstream, observer), 2**64)


def test_a_table_joining_the_publication_is_taken_by_a_source_of_every_table_without_a_resnapshot(db, upstream,
                                                                                                  tmp_path):
    _setup(upstream, tables=("a", "b"))
    ctx = make_ctx(db, upstream, tmp_path, source_name(), None)  # every table of the publication
    name = ctx.spec.name
    with writer(upstream) as conn:
        conn.execute("INSERT INTO a VALUES (1, 'one', 1, 0)")
    cycle.run_cycle(ctx)
    assert ctx.shards() == (f"{name}__a", f"{name}__b", f"{name}_errors")
    first = bindings(ctx)[-1][0]
    with writer(upstream) as conn:
        conn.execute("CREATE TABLE c (id int8 PRIMARY KEY, v text, n numeric(10,2), txid int8)")
        conn.execute("ALTER TABLE c REPLICA IDENTITY FULL")
        conn.execute("ALTER PUBLICATION pub ADD TABLE c")
        conn.execute("INSERT INTO c VALUES (1, 'c1', 1, 0)")
    cycle.run_cycle(ctx)  # registers c and snapshots it on its own (test_postgres_online_snapshot.py)
    assert ctx.shards() == (f"{name}__a", f"{name}__b", f"{name}__c", f"{name}_errors")
    last = bindings(ctx)[-1][0]
    assert set(contents(ctx, f"{name}__c", last)) == {1}
    assert contents(ctx, f"{name}__c", first) == {}, "the new table's collection is empty before its snapshot"
    assert set(contents(ctx, f"{name}__a", first)) == set(contents(ctx, f"{name}__a", last)) == {1}


def test_a_large_table_is_snapshotted_on_spark_in_page_ranges_while_writers_write(db, upstream, tmp_path, spark,
                                                                                monkeypatch):
    monkeypatch.setattr(spark_snapshot, "SPLIT_BYTES", 64 << 10)  # 8 pages a partition: many ranges
    _setup(upstream)
    name = source_name()
    observer = _observer(upstream, name)
    stop = threading.Event()
    writers = [Writer(upstream, i, stop) for i in range(2)]
    with writer(upstream) as conn:
        for _ in range(4):  # 10,000 rows of b, over 60 pages
            writers[0].transaction(conn, big=True)
    ctx = make_ctx(db, upstream, tmp_path, name, list(TABLES), max_records=500, spark=spark,
                   spark_snapshot_min_bytes=256 << 10)  # b on Spark, a and c (small) in the task
    for w in writers:
        w.start()
    time.sleep(0.2)
    for _ in range(3):  # the snapshot runs while they write
        cycle.run_cycle(ctx)
    stop.set()
    for w in writers:
        w.join(60)
        assert w.error is None, w.error
    cycle.run_cycle(ctx)
    with connect(ctx.dsn) as conn:
        stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'write_batches' "
                             "AND metrics ? 'snapshot_rows'", (name,)).fetchone()[0]
        on_spark = [b for b in batches(conn, f"{name}__b") if b.rows and f"/{name}__b/snapshot/" in b.path]
    assert stats["snapshot_on_spark"] == [f"{name}__b"]
    assert len(on_spark) > 4, "Spark read the table in several page ranges"
    assert sum(b.rows for b in on_spark) >= 10_000 and {b.max_ts for b in on_spark} == {bindings(ctx)[0][0]}
    lsns = _commit_lsns(upstream, observer)
    bs = _check(ctx, writers, lsns)
    assert slot_confirmed(upstream, name) == bs[-1][1]


def test_a_value_spark_cannot_hold_fails_the_snapshot_naming_the_column_and_appends_nothing(db, upstream, tmp_path,
                                                                                          spark):
    with writer(upstream) as conn:
        conn.execute("CREATE TABLE t (id int8 PRIMARY KEY, amount numeric)")
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("INSERT INTO t VALUES (1, 1.5), (2, 0.12345678901)")  # 11 digits: beyond decimal(38, 10)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"], spark=spark)
    with pytest.raises(Exception, match=r"column amount: 0\.12345678901 does not fit decimal128\(38, 10\)"):
        cycle.run_cycle(ctx)
    with connect(ctx.dsn) as conn:
        assert shard_info(conn, f"{ctx.spec.name}__t").upper == 0
