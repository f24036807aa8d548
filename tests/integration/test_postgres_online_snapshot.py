"""A table snapshotted on its own while the source's other tables stream (issue 33 part 3), against a real
upstream Postgres with a writer running: a table that joins the publication of a source of every table, and
``reclock resnapshot <source> --table <t>``, each of key identity (its primary key) and ``FULL``, cycles
crashing at random step boundaries and one SIGKILLed in a subprocess. Every binding's contents equal the tables
as of its LSN: the streaming table at every binding, the snapshotted one from the first binding past its
snapshot's LSN (before its snapshot's binding, what it held; a table new to the source: nothing)."""

from __future__ import annotations

import json
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


def _snapshots(ctx) -> tuple[int, int | None]:
    """The LSNs of the source's first snapshot and of c's own, as the consensus database registered them (None:
    c's was read online in chunks, a key table's)."""
    with connect(ctx.dsn) as conn:
        first = registration.snapshot_lsn(conn, ctx.spec.name)
        own = registration.table_snapshot_lsns(conn, ctx.spec.name).get("public.c")
        chunked = "public.c" in registration.chunked_done(conn, ctx.spec.name)
        assert not registration.table_snapshots(conn, ctx.spec.name), "no snapshot still pending"
        assert not registration.chunked_snapshots(conn, ctx.spec.name), "no chunked snapshot still under way"
    assert first is not None and (own is not None or chunked), "both snapshots appended, with their LSNs"
    return first, None if chunked else own


def _chunked(ctx, w: Writer, upstream: str, new: bool) -> int:
    """c read online in chunks: AS OF every binding, its keys up to the last one its chunks had read by then
    equal the table's as of the binding's LSN (and a table new to the source holds no other key); from the
    binding of its last chunk on, the whole table. The number of bindings checked whole."""
    lsns, name = _commit_lsns(upstream), ctx.spec.name
    with connect(ctx.dsn) as conn:
        landed = registration.chunked_done(conn, name)["public.c"]["landed"]
    whole = 0
    for ts, lsn in bindings(ctx):
        reached = [last for at, last in landed if at <= ts]
        got = {i: (r["v"], r["txid"]) for i, r in contents(ctx, f"{name}__c", ts).items()}
        if not reached:
            assert not new or got == {}, f"c AS OF {ts}: nothing before its first chunk"
            continue
        want = _at(w, lsns, lsn)["c"]
        if reached[-1] is None:
            whole += 1
            assert got == want, f"c AS OF {ts} (LSN {lsn:X}), past its last chunk"
            continue
        upto = reached[-1][0]
        assert {k: v for k, v in got.items() if k <= upto} == {k: v for k, v in want.items() if k <= upto}, \
            f"c AS OF {ts} (LSN {lsn:X}), its keys up to {upto}"
        assert not new or all(k <= upto for k in got), f"c AS OF {ts}: a key past {upto}, not read yet"
    return whole


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
        if own is None:
            continue  # read in chunks: below
        if lsn <= empty_upto:
            assert contents(ctx, f"{name}__c", ts) == {}, f"c AS OF {ts}: nothing before it joined"
        elif lsn >= own:
            past += 1
            got = {i: (r["v"], r["txid"]) for i, r in contents(ctx, f"{name}__c", ts).items()}
            assert got == _at(w, lsns, lsn)["c"], f"c AS OF {ts} (LSN {lsn:X}), past its snapshot's {own:X}"
    return past if own is not None else _chunked(ctx, w, upstream, new=empty_upto > 0)


KILLER = """
import json, sys, time
sys.path[:0] = sys.argv[1].split("|")
from pg_support import make_ctx
from pathlib import Path
from reclock import cycle
ctx = make_ctx(sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5], None, max_records=50,
               postgres=json.loads(sys.argv[6]))
print("ready", flush=True)
while True:
    try:
        cycle.run_cycle(ctx)
    except Exception as e:
        print(type(e).__name__, e, flush=True)
"""


def _killed_midway(db: str, upstream: str, tmp_path: Path, name: str, seconds: float,
                   postgres: dict | None = None) -> None:
    """A subprocess running cycles of the source back to back, SIGKILLed ``seconds`` after it is ready
    (``postgres``: more of the source's settings)."""
    here = Path(__file__).parent
    paths = "|".join([str(here), str(here.parent.parent / "include")])
    p = subprocess.Popen([sys.executable, "-c", KILLER, paths, db, upstream, str(tmp_path), name,
                          json.dumps(postgres or {})],
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


def _until_done(ctx, most: int = 40) -> int:
    """Cycles until no chunked snapshot is under way; how many ran."""
    for n in range(1, most + 1):
        cycle.run_cycle(ctx)
        with connect(ctx.dsn) as conn:
            if not registration.chunked_snapshots(conn, ctx.spec.name):
                return n
    raise AssertionError(f"the chunked snapshot did not end in {most} cycles")


CHUNKS = {"snapshot_chunk_rows": 40, "snapshot_cycle_rows": 80}  # two chunks a cycle


def test_a_table_joining_is_read_in_chunks_across_cycles_and_crashes_while_writers_run(db, upstream, tmp_path):
    """A key table joins the publication holding 400 rows, writers changing it and a: its snapshot is read 40
    rows a chunk, two chunks a cycle, cycles dying while a chunk is read, after the write, in the append's
    transaction and SIGKILLed; every binding equals the table on the keys read by then, and the whole table
    from the last chunk's on; ``reclock status`` shows the progress midway."""
    from reclock import status_report as sr

    _setup(upstream, "key", ("a",))
    stop = threading.Event()
    w = Writer(upstream, stop, seed=37)
    with writer(upstream) as conn:
        w.transaction(conn, inserts=400)
    name = source_name("chk")
    ctx = make_ctx(db, upstream, tmp_path, name, None, max_records=50, postgres=CHUNKS)
    cycle.run_cycle(ctx)
    w.start()
    try:
        with writer(upstream) as conn:
            conn.execute("ALTER PUBLICATION pub ADD TABLE c")
        cycle.run_cycle(ctx)  # c registered, its first two chunks read and appended
        with connect(ctx.dsn) as conn:
            progress = registration.chunked_snapshots(conn, name)["public.c"]
            lines = sr.report_lines(sr.overview(conn, only=name))
        assert progress["chunks"] == 2 and progress["rows"] == 80 and progress["total"] >= 10, progress
        assert any(f"online snapshot of public.c: 2 of ~{progress['total']} chunks, 80 rows" in x for x in lines), lines
        for point in ("mint:after_chunk", "write_batches:after_slice", "append:in_transaction"):
            with failpoints.enabled(point), pytest.raises(failpoints.FailpointHit):
                cycle.run_cycle(ctx)
            cycle.run_cycle(ctx)
        _killed_midway(db, upstream, tmp_path, name, 0.8, CHUNKS)
        ctx = make_ctx(db, upstream, tmp_path, name, None, max_records=50, postgres=CHUNKS)
        _until_done(ctx)
    finally:
        stop.set()
        w.join(60)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    with connect(ctx.dsn) as conn:
        done = registration.chunked_done(conn, name)["public.c"]
    assert done["chunks"] >= 6 and len(done["landed"]) >= 3, done  # chunks spanned cycles
    assert _check(ctx, w, upstream, 1, "key") >= 1  # c new to the source: no key before its chunk


def test_resnapshot_of_one_table_is_read_in_chunks(db, upstream, tmp_path):
    """``reclock resnapshot <source> --table c`` of a key table that streams: read in chunks over cycles while
    writers run (one cycle dies after its write), its keys read so far equal the table's at every binding, the
    rest hold what they held, and the whole table from the last chunk's binding on."""
    _setup(upstream, "key", ("a", "c"))
    stop = threading.Event()
    w = Writer(upstream, stop, seed=38)
    with writer(upstream) as conn:
        w.transaction(conn, inserts=200)
    name = source_name("chr")
    ctx = make_ctx(db, upstream, tmp_path, name, ["a", "c"], max_records=50, postgres=CHUNKS)
    w.start()
    try:
        cycle.run_cycle(ctx)
        cycle.run_cycle(ctx)
        assert cycle.resnapshot(ctx, "c")["table"] == "public.c"
        cycle.run_cycle(ctx)
        with failpoints.enabled("write_batches:after_slice"), pytest.raises(failpoints.FailpointHit):
            cycle.run_cycle(ctx)
        _until_done(ctx)
    finally:
        stop.set()
        w.join(60)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    with connect(ctx.dsn) as conn:
        assert len(registration.chunked_done(conn, name)["public.c"]["landed"]) >= 2  # chunks spanned cycles
    assert _check(ctx, w, upstream, 0, "key") >= 1
