"""``schedule: continuous`` for a Postgres source, against a real upstream Postgres 15: cycles back to back
(``reclock.continuous.run_cycles``) bind a published change as it commits and nothing while only WAL of other
tables is written (the flush LSN moves with any WAL), so every binding after the snapshot holds a published
transaction; every binding's contents equal the table as of its LSN while a writer writes; with WAL to
release (``IDLE_S``) a binding follows and the slot with it; a table that joins the publication is snapshotted
with no published change to carry it."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace

import psycopg
import pytest
from pg_support import WriterThread, bindings, commit_lsns, contents, make_ctx, slot_confirmed, source_name, writer

from reclock.continuous import run_cycles
from reclock.errors import UnknownShard, UnknownSource
from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres import upstream as pg_upstream


@pytest.fixture
def upstream(postgres):
    from pg_support import upstream_database

    with upstream_database(postgres) as dsn:
        yield dsn


class OrdersWriter(WriterThread):
    """Inserts, updates and deletes on ``orders`` (one to three a transaction, the xid in each row written), and
    a write to the unpublished ``other`` beside each; logs every transaction's xid and the rows it leaves."""

    pause = 0.05

    def __init__(self, dsn: str, stop: threading.Event, live: dict[int, tuple]) -> None:
        super().__init__(dsn, stop, random.Random(19))
        self.live = live
        self.log: list[tuple[int, dict[int, tuple]]] = []
        self.fresh = max(live, default=0)

    def step(self, conn, n: int) -> None:
        rng = self.rng
        with conn.transaction():
            xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
            for _ in range(rng.randint(1, 3)):
                op = rng.choice(["insert", "update", "delete"] if len(self.live) > 3 else ["insert"])
                if op == "insert":
                    self.fresh += 1
                    key, row = self.fresh, (f"v{rng.randint(0, 99)}", xid)
                elif op == "update":
                    key, row = rng.choice(sorted(self.live)), (f"u{rng.randint(0, 99)}", xid)
                else:
                    key = rng.choice(sorted(self.live))
                    conn.execute("DELETE FROM orders WHERE id = %s", (key,))
                    del self.live[key]
                    continue
                conn.execute("INSERT INTO orders VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v, "
                             "txid = excluded.txid", (key, *row))
                self.live[key] = row
        self.log.append((xid, dict(self.live)))
        conn.execute("INSERT INTO other VALUES (%s)", (n,))  # WAL, no published change


def _flush_lsn(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return po.lsn_to_int(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])


def _wait(what: str, done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)


def test_a_continuous_postgres_source_binds_published_changes_as_they_commit_and_nothing_else(db, upstream, tmp_path,
                                                                                            monkeypatch):
    with writer(upstream) as conn:
        conn.execute("CREATE TABLE orders (id int8 PRIMARY KEY, v text, txid int8)")
        conn.execute("CREATE TABLE other (n int8)")  # not published
        conn.execute("CREATE PUBLICATION pub FOR TABLE orders")
        conn.execute("SELECT pg_create_logical_replication_slot('observer', 'pgoutput')")
        conn.execute("INSERT INTO orders SELECT g, 'snap', 0 FROM generate_series(1, 10) g")
    initial = {i: ("snap", 0) for i in range(1, 11)}
    monkeypatch.setattr(pg_upstream, "IDLE_S", 3600.0)  # no binding for idle WAL until the last part
    name = source_name("cont")
    ctx = make_ctx(db, upstream, tmp_path, name, None)  # every table of the publication
    ctx = replace(ctx, spec=replace(ctx.spec, schedule="continuous", poll_s=0.05),
                  clock=lambda: int(time.time() * 1000))
    shard = f"{name}__orders"
    stop, failed, out = threading.Event(), [], {}

    def lease() -> None:
        try:
            out.update(run_cycles(ctx, 600, idle_s=0.05, resume_s=0.2, stop=stop))
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    def upper() -> int:
        with connect(db) as conn:
            try:
                return shard_info(conn, shard).upper
            except UnknownShard:  # not registered yet
                return 0

    def bound() -> list[tuple[int, int]]:
        """The bindings so far (none before the first mint registered the source)."""
        try:
            return bindings(ctx)
        except UnknownSource:
            return []

    def caught_up(since_ms: int) -> bool:
        """A cycle that started after ``since_ms`` appended (the idle advance moves the upper to the clock)."""
        assert not failed, failed
        return upper() > since_ms + 1000

    loop = threading.Thread(target=lease, daemon=True)
    loop.start()
    w = None
    try:
        _wait("the snapshot", lambda: not failed and bool(bound()) and upper() > bound()[0][0])
        (first,) = bindings(ctx)
        assert contents(ctx, shard, first[0]) == {i: {"id": i, "v": v, "txid": x} for i, (v, x) in initial.items()}

        # only other tables change: the flush LSN moves at every write, and no binding follows
        with writer(upstream) as conn:
            for n in range(30):
                conn.execute("INSERT INTO other VALUES (%s)", (n,))
        t = int(time.time() * 1000)
        _wait("two idle cycles after the writes", lambda: caught_up(t))
        assert bindings(ctx) == [first], "WAL of an unpublished table is no reason to bind"
        assert _flush_lsn(upstream) > first[1]

        # a writer writes published changes (and unpublished ones beside them) while the source cycles
        w = OrdersWriter(upstream, threading.Event(), dict(initial))
        w.start()
        time.sleep(3.0)
        w.stop.set()
        w.join(30)
        assert w.error is None, w.error
        lsns = commit_lsns(upstream)
        last = max(lsns.values())  # the writer's last published commit (WAL of `other` follows it, unbound)
        _wait("the writes bound and appended", lambda: bindings(ctx)[-1][1] > last and upper() > bindings(ctx)[-1][0])
        got = bindings(ctx)
        assert len(w.log) >= 10 and len(got) > 2
        for (_, prev), (ts, lsn) in zip(got, got[1:]):
            assert any(prev <= c < lsn for c in lsns.values()), \
                f"the binding at {ts} (LSN {po.lsn_to_str(lsn)}) holds no published transaction"
            want = initial
            for xid, after in w.log:
                if lsns[xid] < lsn:
                    want = after
            assert contents(ctx, shard, ts) == {i: {"id": i, "v": v, "txid": x} for i, (v, x) in want.items()}, ts
        assert contents(ctx, shard, got[-1][0]) == {i: {"id": i, "v": v, "txid": x} for i, (v, x) in w.live.items()}

        # idle WAL to release: a binding follows it, and resume moves the slot past it
        confirmed = slot_confirmed(upstream, name)
        with writer(upstream) as conn:
            conn.execute("INSERT INTO other VALUES (-1)")
        written = _flush_lsn(upstream)
        monkeypatch.setattr(pg_upstream, "IDLE_S", 0.0)
        _wait("the slot past the idle WAL", lambda: slot_confirmed(upstream, name) >= written)
        assert slot_confirmed(upstream, name) > confirmed
        assert bindings(ctx)[-1][1] >= written, "an idle binding at the flush LSN"

        # a table joins the publication, and nothing published changes: its snapshot is bound all the same
        monkeypatch.setattr(pg_upstream, "IDLE_S", 3600.0)
        with writer(upstream) as conn:
            conn.execute("CREATE TABLE joined (id int8, v text)")  # no key: one snapshot, not in chunks
            conn.execute("ALTER TABLE joined REPLICA IDENTITY FULL")
            conn.execute("INSERT INTO joined SELECT g, 'j' || g FROM generate_series(1, 5) g")
            conn.execute("ALTER PUBLICATION pub ADD TABLE joined")

        def joined() -> dict:
            with connect(db) as conn:
                try:
                    ts = shard_info(conn, f"{name}__joined").upper - 1
                except UnknownShard:
                    return {}
            return contents(ctx, f"{name}__joined", ts) if ts >= 0 else {}

        _wait("the joined table's snapshot", lambda: not failed and len(joined()) == 5)
        assert joined() == {i: {"id": i, "v": f"j{i}"} for i in range(1, 6)}
    finally:
        stop.set()
        loop.join(120)
        if w is not None:
            w.stop.set()
    assert not loop.is_alive() and not failed, failed
    assert out["cycles"] > out["with_data"], "the source idled between changes"
