"""A table snapshotted on its own while the source's other tables stream (issue 33 part 3), against a real
upstream Postgres with a writer running: a table that joins the publication of a source of every table, and
``reclock resnapshot <source> --table <t>``, each of key identity (its primary key) and ``FULL``, cycles
crashing at random step boundaries and one SIGKILLed in a subprocess. Every binding's contents equal the tables
as of its LSN: the streaming table at every binding, the snapshotted one from the first binding past its
snapshot's LSN (before its snapshot's binding, what it held; a table new to the source: nothing)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from pg_support import WriterThread, bindings, contents, make_ctx, source_name, upstream_database, writer

from reclock import cycle, failpoints
from reclock.persist import connect
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres import registration


@pytest.fixture
def upstream(postgres):
    with upstream_database(postgres) as dsn:
        yield dsn


class Writer(WriterThread):
    """Every transaction changes ``a`` (so every one has a Begin in the observer slot) and ``c``: inserts,
    updates (of the key too) and deletes; it logs each transaction's xid and both tables after it."""

    def __init__(self, dsn: str, stop: threading.Event, seed: int) -> None:
        super().__init__(dsn, stop, random.Random(seed))
        self.live: dict[str, dict] = {"a": {}, "c": {}}
        self.log: list[tuple[int, dict]] = []
        self.fresh = 0

    def step(self, conn, n: int) -> None:
        self.transaction(conn)

    def transaction(self, conn, inserts: int = 0) -> None:
        rng = self.rng
        with conn.transaction():
            xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
            for t in ("a", "c"):
                rows = self.live[t]
                for _ in range(inserts or rng.randint(1, 4)):
                    op = rng.choice(["insert", "update", "rekey", "delete"]) if len(rows) > 5 and not inserts \
                        else "insert"
                    if op == "insert":
                        self.fresh += 1
                        rows[self.fresh] = (f"{t}{rng.randint(0, 999)}", xid)
                        conn.execute(f"INSERT INTO {t} VALUES (%s, %s, %s)", (self.fresh, *rows[self.fresh]))
                        continue
                    key = rng.choice(sorted(rows))
                    rows.pop(key)
                    if op == "delete":
                        conn.execute(f"DELETE FROM {t} WHERE id = %s", (key,))
                        continue
                    new = key
                    if op == "rekey":
                        self.fresh += 1
                        new = self.fresh
                    rows[new] = (f"u{rng.randint(0, 999)}", xid)
                    conn.execute(f"UPDATE {t} SET id = %s, v = %s, txid = %s WHERE id = %s", (new, *rows[new], key))
        self.log.append((xid, {t: dict(r) for t, r in self.live.items()}))


def _setup(dsn: str, identity: str, in_publication: tuple[str, ...]) -> None:
    with writer(dsn) as conn:
        for t in ("a", "c"):
            conn.execute(f"CREATE TABLE {t} (id int8 PRIMARY KEY, v text, txid int8)")
            if identity == "full":
                conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        conn.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(in_publication)}")
        conn.execute("CREATE PUBLICATION everything FOR TABLE a, c")  # the observer's: c's changes from the start
        conn.execute("SELECT pg_create_logical_replication_slot('observer', 'pgoutput')")


def _commit_lsns(dsn: str) -> dict[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT data FROM pg_logical_slot_peek_binary_changes('observer', NULL, NULL, "
                            "'proto_version', '1', 'publication_names', 'everything') WHERE get_byte(data, 0) = 66"
                            ).fetchall()
    return {m.xid: m.final_lsn for m in (po.decode(d) for (d,) in rows)}


def _at(w: Writer, lsns: dict[int, int], lsn: int) -> dict:
    state: dict = {"a": {}, "c": {}}
    for xid, after in w.log:
        if lsns[xid] < lsn:
            state = after
    return state


def _snapshots(ctx) -> tuple[int, int]:
    """The LSNs of the source's first snapshot and of c's own, as the consensus database registered them."""
    with connect(ctx.dsn) as conn:
        first = registration.snapshot_lsn(conn, ctx.spec.name)
        own = registration.table_snapshot_lsns(conn, ctx.spec.name).get("public.c")
        assert not registration.table_snapshots(conn, ctx.spec.name), "no snapshot still pending"
    assert first is not None and own is not None, "both snapshots appended, with their LSNs"
    return first, own


def _check(ctx, w: Writer, upstream: str, empty_upto: int, identity: str) -> int:
    """Every binding: ``a`` equals the table (a key table's past the first snapshot's seam), ``c`` from the first binding past
    its own snapshot's LSN, and nothing at a binding whose LSN is at most ``empty_upto`` (before it joined); the
    number of bindings checked past c's snapshot."""
    lsns, name = _commit_lsns(upstream), ctx.spec.name
    first, own = _snapshots(ctx)
    past = 0
    for ts, lsn in bindings(ctx):
        want = _at(w, lsns, lsn if identity == "full" else max(lsn, first))
        got = {i: (r["v"], r["txid"]) for i, r in contents(ctx, f"{name}__a", ts).items()}
        assert got == want["a"], f"a AS OF {ts} (LSN {lsn:X})"
        if lsn <= empty_upto:
            assert contents(ctx, f"{name}__c", ts) == {}, f"c AS OF {ts}: nothing before it joined"
        elif lsn >= own:
            past += 1
            got = {i: (r["v"], r["txid"]) for i, r in contents(ctx, f"{name}__c", ts).items()}
            assert got == _at(w, lsns, lsn)["c"], f"c AS OF {ts} (LSN {lsn:X}), past its snapshot's {own:X}"
    return past


KILLER = """
import sys, time
sys.path[:0] = sys.argv[1].split("|")
from pg_support import make_ctx
from pathlib import Path
from reclock import cycle
ctx = make_ctx(sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5], None, max_records=50)
print("ready", flush=True)
while True:
    try:
        cycle.run_cycle(ctx)
    except Exception as e:
        print(type(e).__name__, e, flush=True)
"""


def _killed_midway(db: str, upstream: str, tmp_path: Path, name: str, seconds: float) -> None:
    """A subprocess running cycles of the source back to back, SIGKILLed ``seconds`` after it is ready."""
    here = Path(__file__).parent
    paths = "|".join([str(here), str(here.parent.parent / "include")])
    p = subprocess.Popen([sys.executable, "-c", KILLER, paths, db, upstream, str(tmp_path), name],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(seconds)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)


POINTS = ["mint:after_binding", "write_batches:before_job", "write_batches:after_slice", "append:in_transaction",
          "resume:after_commit"]


@pytest.mark.parametrize("identity", ["key", "full"])
def test_a_table_joining_the_publication_is_snapshotted_online_while_the_others_stream(db, upstream, tmp_path,
                                                                                       identity):
    _setup(upstream, identity, ("a",))
    stop = threading.Event()
    w = Writer(upstream, stop, seed=33 if identity == "key" else 34)
    with writer(upstream) as conn:
        w.transaction(conn, inserts=300)  # c holds rows before it joins: its snapshot has something to read
    name = source_name("onl")
    ctx = make_ctx(db, upstream, tmp_path, name, None, max_records=50)  # every table of the publication
    w.start()
    rng = random.Random(identity)
    try:
        cycle.run_cycle(ctx)
        cycle.run_cycle(ctx)
        assert ctx.shards() == (f"{name}__a", f"{name}_errors")
        with writer(upstream) as conn:
            conn.execute("ALTER PUBLICATION pub ADD TABLE c")
            joined = po.lsn_to_int(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
        with failpoints.enabled("write_batches:after_table_snapshot"), pytest.raises(failpoints.FailpointHit):
            cycle.run_cycle(ctx)  # c registered, its snapshot read, and the cycle dies before the append
        _killed_midway(db, upstream, tmp_path, name, rng.uniform(0.3, 1.5))  # wherever it is
        for i in range(4):
            if i % 2 == 0:
                with failpoints.enabled(rng.choice(POINTS)), pytest.raises(failpoints.FailpointHit):
                    cycle.run_cycle(ctx)
            cycle.run_cycle(ctx)
            time.sleep(0.05)
    finally:
        stop.set()
        w.join(60)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    ctx = make_ctx(db, upstream, tmp_path, name, None, max_records=50)
    assert ctx.shards() == (f"{name}__a", f"{name}__c", f"{name}_errors")
    assert _check(ctx, w, upstream, joined, identity) >= 2
    assert any(lsn > joined for _, lsn in bindings(ctx))
    with writer(upstream) as conn:  # the last binding is the table itself
        assert {r[0]: r[1:] for r in conn.execute("SELECT * FROM c").fetchall()} == \
            {i: (r["v"], r["txid"]) for i, r in contents(ctx, f"{name}__c", bindings(ctx)[-1][0]).items()}


@pytest.mark.parametrize("identity", ["key", "full"])
def test_resnapshot_of_one_table_takes_it_alone_while_the_other_streams(db, upstream, tmp_path, identity):
    _setup(upstream, identity, ("a", "c"))
    stop = threading.Event()
    w = Writer(upstream, stop, seed=35 if identity == "key" else 36)
    with writer(upstream) as conn:
        w.transaction(conn, inserts=200)
    name = source_name("onr")
    ctx = make_ctx(db, upstream, tmp_path, name, ["a", "c"], max_records=50)
    w.start()
    try:
        cycle.run_cycle(ctx)
        cycle.run_cycle(ctx)
        out = cycle.resnapshot(ctx, "c")
        assert out["table"] == "public.c" and out["tables"] == ["public.a", "public.c"]
        for point in ("write_batches:after_table_snapshot", "append:in_transaction"):
            with failpoints.enabled(point), pytest.raises(failpoints.FailpointHit):
                cycle.run_cycle(ctx)
        for _ in range(3):
            cycle.run_cycle(ctx)
            time.sleep(0.05)
    finally:
        stop.set()
        w.join(60)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    assert _check(ctx, w, upstream, 0, identity) >= 2
    with connect(ctx.dsn) as conn:
        whole = conn.execute("SELECT count(*) FROM reclock.statistics WHERE name = %s AND metrics ? 'snapshot_rows'",
                             (ctx.spec.name,)).fetchone()[0]
    assert whole == 1, "one snapshot of the whole source (the first); c's own took the slot as it was"
