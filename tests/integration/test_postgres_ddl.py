"""Schema changes that flow (issue 33 part 3), against a real upstream Postgres 15 with a writer running
through the DDL: ``ADD COLUMN`` (with and without a default) and type changes that keep every value (``int`` to ``bigint``,
``varchar(n)`` to ``text``, a wider ``numeric``) change the collection's schema at the timestamp of the
table's first change under the new relation, and every binding's contents equal the table as of its LSN,
with cycles crashing at random step boundaries, for a table of identity FULL and one of a primary key (whose retractions of rows written before the change
must match them as readers project them); a column added with a non-volatile ``DEFAULT`` retracts the rows the
table held and adds them again with it. ``DROP COLUMN`` flows too (reads after it have no such column, reads
before keep it; DuckDB agrees), and a column added again under a dropped one's name is another
column. A rename, a narrowing, ``text`` to ``integer`` and a column added with a volatile ``DEFAULT`` stall
naming the table, the column, the types and ``reclock resnapshot <source>``, which resolves them; so does a
dropped key column, naming the identity to give the table.

The oracle is the upstream itself: each of the writer's transactions reads its tables before it commits
(``SELECT *``: the rows and the columns they have then), and an observer slot gives each transaction's
commit LSN."""

from __future__ import annotations

import queue
import random
import threading
import time

import psycopg
import pytest
from pg_support import (WriterThread, bindings, commit_lsns, contents, make_ctx, source_name, upstream_database,
                        writer)

from reclock import cycle, failpoints
from reclock.errors import ReplicaIdentityMissing, TableSchemaChanged
from reclock.persist import connect
from reclock.persist.schemas import load_history
from reclock.persist.shards import shard_info
from reclock.sources.postgres import pgoutput as po


@pytest.fixture
def upstream(postgres):
    with upstream_database(postgres) as dsn:
        yield dsn


TABLES = ("f", "k")  # f: REPLICA IDENTITY FULL; k: its primary key
SETUP = tuple(s for t in TABLES for s in (
    f"CREATE TABLE {t} (id int8 PRIMARY KEY, v varchar(10), c int4, n int8, amount numeric(8,2), w text)",
    f"INSERT INTO {t} SELECT g, 'v' || g, g, g * 1000, g + 0.25, 'w' || g FROM generate_series(1, 20) g")) + (
    "ALTER TABLE f REPLICA IDENTITY FULL", "CREATE PUBLICATION pub FOR TABLE f, k",
    "SELECT pg_create_logical_replication_slot('observer', 'pgoutput')")


class DdlWriter(WriterThread):
    """Inserts, updates and deletes on both tables (only columns no DDL of the tests drops or narrows:
    ``id``, ``v``, ``c``, ``amount``; ``z`` once added), each transaction logging its xid and the tables as it
    leaves them; the statements put on :attr:`ddl` run at the start of the next transaction."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, threading.Event(), random.Random(33))
        self.ddl = queue.Queue()
        self.log: list[tuple[int, dict]] = []
        self.next_id, self.z = 100, False

    def step(self, conn, n: int) -> None:
        self.transaction(conn)

    def run_ddl(self, *statements: str) -> None:
        """Run ``statements`` in the writer's next transaction, among its changes; wait until it committed."""
        done = threading.Event()
        self.ddl.put((statements, done))
        assert done.wait(30), "the writer ran the DDL"

    def transaction(self, conn) -> None:
        rng = self.rng
        done = None
        with conn.transaction():
            xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
            try:
                statements, done = self.ddl.get_nowait()
            except queue.Empty:
                statements = ()
            for t in TABLES:
                ids = [i for (i,) in conn.execute(f"SELECT id FROM {t}").fetchall()]
                for _ in range(rng.randint(1, 4)):
                    op = rng.choice(["insert", "update", "update", "delete"] if len(ids) > 5 else ["insert"])
                    if op == "insert":
                        self.next_id += 1
                        conn.execute(f"INSERT INTO {t} (id, v, c, amount) VALUES (%s, %s, %s, %s)",
                                     (self.next_id, f"i{rng.randint(0, 99)}", rng.randint(0, 9), rng.randint(0, 9999) / 100))
                        ids.append(self.next_id)
                        continue
                    i = rng.choice(ids)
                    if op == "delete":
                        conn.execute(f"DELETE FROM {t} WHERE id = %s", (i,))
                        ids.remove(i)
                    elif self.z and rng.random() < 0.5:
                        conn.execute(f"UPDATE {t} SET z = %s, c = c + 1 WHERE id = %s", (rng.randint(0, 9), i))
                    else:
                        conn.execute(f"UPDATE {t} SET v = %s, amount = %s WHERE id = %s",
                                     (f"u{rng.randint(0, 99)}", rng.randint(0, 9999) / 100, i))
                if t == "f":  # the DDL between the two tables' changes, in the same transaction
                    for s in statements:
                        conn.execute(s)
                    self.z = self.z or any("ADD COLUMN z" in s for s in statements)
            self.log.append((xid, {t: _rows(conn, t) for t in TABLES}))
        if done is not None:
            done.set()


def _rows(conn, table: str) -> dict:
    cur = conn.execute(f"SELECT * FROM {table}")
    names = [d.name for d in cur.description]
    return {r[0]: dict(zip(names, r)) for r in cur.fetchall()}


def _snapshot_lsn(ctx) -> int:
    with connect(ctx.dsn) as conn:
        (lsns,) = conn.execute("SELECT array_agg(DISTINCT (metrics ->> 'snapshot_lsn')::int8) FROM reclock.statistics "
                               "WHERE name = %s AND metrics ? 'snapshot_lsn'", (ctx.spec.name,)).fetchone()
    return max(lsns)


def _equal_as_of_every_binding(ctx, w: DdlWriter, initial: dict, since: int = 0) -> int:
    """Each binding from ``since`` (ts) on: the collections AS OF it equal the tables as the writer's log
    has them at its LSN (a key table's bindings below the snapshot's LSN: at that LSN); the bindings checked."""
    lsns, snap = commit_lsns(ctx.upstream), _snapshot_lsn(ctx)
    with connect(ctx.dsn) as conn:
        upper = min(shard_info(conn, f"{ctx.spec.name}__{t}").upper for t in TABLES)
    checked = 0
    for ts, lsn in bindings(ctx):
        if ts < since or ts >= upper:  # a stalled cycle's binding has no data appended
            continue
        for t in TABLES:  # a FULL table is exact at every binding; a key table from its snapshot's LSN on
            at, want = (lsn if t == "f" else max(lsn, snap)), initial
            for xid, tables in w.log:
                if lsns[xid] < at:
                    want = tables
            got = contents(ctx, f"{ctx.spec.name}__{t}", ts)
            assert got == want[t], f"{t} AS OF {ts} (LSN {lsn:X})"
        checked += 1
    return checked


def _start(db, upstream, tmp_path):
    with writer(upstream) as conn:
        for s in SETUP:
            conn.execute(s)
        initial = {t: _rows(conn, t) for t in TABLES}
    ctx = make_ctx(db, upstream, tmp_path, source_name("ddl"), list(TABLES), max_records=50)
    w = DdlWriter(upstream)
    w.start()
    time.sleep(0.1)
    cycle.run_cycle(ctx)  # the snapshot, while the writer writes
    return ctx, w, initial


POINTS = ("mint:after_binding", "write_batches:before_job", "write_batches:after_slice", "append:in_transaction",
          "resume:after_commit")


def _crash_then_cycle(ctx, rng: random.Random) -> None:
    """A cycle that crashes at a random step boundary (the registration and the schema versions go with the
    append or not at all), then one that runs."""
    with failpoints.enabled(rng.choice(POINTS)), pytest.raises(failpoints.FailpointHit):
        cycle.run_cycle(ctx)
    cycle.run_cycle(ctx)


def test_added_columns_and_widened_types_flow_and_every_binding_equals_the_tables(db, upstream, tmp_path):
    ctx, w, initial = _start(db, upstream, tmp_path)
    rng = random.Random(5)
    try:
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
        w.run_ddl("ALTER TABLE f ADD COLUMN z int", "ALTER TABLE k ADD COLUMN z int")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
        w.run_ddl("ALTER TABLE f ALTER COLUMN c TYPE bigint", "ALTER TABLE k ALTER COLUMN c TYPE bigint",
                  "ALTER TABLE f ALTER COLUMN v TYPE text")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
        w.run_ddl("ALTER TABLE k ALTER COLUMN amount TYPE numeric(12,4)", "ALTER TABLE k ALTER COLUMN v TYPE text",
                  "ALTER TABLE f ALTER COLUMN amount TYPE numeric(12,4)")
        time.sleep(0.2)  # this DDL and the changes after it in one write with the changes before it
        w.run_ddl("ALTER TABLE f ADD COLUMN y text")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
        # a non-volatile DEFAULT: the rows the tables held hold it from then on, without a change in the WAL
        w.run_ddl("ALTER TABLE f ADD COLUMN e text DEFAULT 'a, \"b\" {c}'", "ALTER TABLE k ADD COLUMN d numeric(6,2) "
                  "DEFAULT 7.5")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
    finally:
        w.stop.set()
        w.join(30)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    assert len(w.log) > 30
    assert _equal_as_of_every_binding(ctx, w, initial) >= 6
    name = ctx.spec.name
    with connect(ctx.dsn) as conn:
        f, k = load_history(conn, f"{name}__f"), load_history(conn, f"{name}__k")
    assert [c.type for c in f.latest().columns] == ["bigint", "string", "bigint", "bigint", "decimal(12,4)", "string",
                                                    "int", "string", "string"]
    assert f.latest().names[-3:] == ("z", "y", "e") and k.latest().names[-2:] == ("z", "d")
    assert f.versions[0].schema.column("c").type == "int" and f.versions[0].schema.column("z") is None
    assert any("ADD COLUMN z" in v.cause for v in f.versions)


def _duckdb_equal(ctx, w: DdlWriter, initial: dict) -> int:
    """DuckDB (``duckdb_as_of``, its own projection SQL) reads each collection AS OF each binding as the tables
    were at its LSN (as :func:`_equal_as_of_every_binding` has them); the bindings checked. (Spark's
    projection of the same histories: ``test_evolving_reads.py``, where its session is already warm.)"""
    import duckdb

    from reclock.tables import duckdb_as_of

    lsns, snap = commit_lsns(ctx.upstream), _snapshot_lsn(ctx)
    with connect(ctx.dsn) as conn:
        upper = min(shard_info(conn, f"{ctx.spec.name}__{t}").upper for t in TABLES)
    checked = [(ts, lsn) for ts, lsn in bindings(ctx) if ts < upper]
    con = duckdb.connect()
    for ts, lsn in checked:
        for t in TABLES:
            at, want = (lsn if t == "f" else max(lsn, snap)), initial
            for xid, tables in w.log:
                if lsns[xid] < at:
                    want = tables
            rows = duckdb_as_of(con, f"{ctx.spec.name}__{t}", ts, dsn=ctx.dsn, blob=ctx.blob).to_arrow_table().to_pylist()
            got = {r["id"]: r for r in rows}
            assert len(got) == len(rows) and got == want[t], f"duckdb: {t} AS OF {ts} (LSN {lsn:X})"
    con.close()
    return len(checked)


def test_dropped_columns_flow_and_a_column_added_again_under_a_dropped_name_is_another(db, upstream, tmp_path):
    """``DROP COLUMN`` flows: AS OF a binding before it the column is there, from the first change under the
    new relation on it is not, and the rows written before and updated or deleted after it retract exactly
    (FULL: the WAL's old row without it; the key table: its current row read again without it). A column
    added again under a dropped one's name (another type; with a ``DEFAULT`` for the key table) is another
    column: the rows the table held read null (or the default) there, never the dropped column's values."""
    ctx, w, initial = _start(db, upstream, tmp_path)
    rng = random.Random(7)
    try:
        time.sleep(0.2)
        cycle.run_cycle(ctx)
        w.run_ddl("ALTER TABLE f DROP COLUMN w", "ALTER TABLE k DROP COLUMN w", "ALTER TABLE k DROP COLUMN n")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
        w.run_ddl("ALTER TABLE f ADD COLUMN w int", "ALTER TABLE k ADD COLUMN n text DEFAULT 'again'")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
        w.run_ddl("ALTER TABLE f DROP COLUMN n", "ALTER TABLE k DROP COLUMN n")
        time.sleep(0.2)
        cycle.run_cycle(ctx)
    finally:
        w.stop.set()
        w.join(30)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    assert _equal_as_of_every_binding(ctx, w, initial) >= 4
    assert _duckdb_equal(ctx, w, initial) >= 4
    name = ctx.spec.name
    with connect(ctx.dsn) as conn:
        f, k = load_history(conn, f"{name}__f"), load_history(conn, f"{name}__k")
    assert f.versions[0].schema.column("w").type == "string" and f.latest().column("w").type == "int"
    assert f.latest().names == ("id", "v", "c", "amount", "w") and k.latest().names == ("id", "v", "c", "amount")
    assert any(v.schema.column("w") is None for v in f.versions) and "DROP COLUMN w" in f.versions[1].cause


def test_renamed_columns_flow_and_a_column_added_under_a_renamed_ones_old_name_is_another(db, upstream, tmp_path):
    """``RENAME COLUMN`` flows (told from a ``DROP`` and an ``ADD`` by column number): AS OF a binding before it
    the column has its old name, from the table's first change under the new relation its new one, with the
    values it had (parts keep their names; readers take them under the new one), and the rows written before
    and updated or deleted after retract exactly (FULL: the WAL's old row; the key table: its current row read
    again under the new name). A column added under the old name in a later binding is another column (null
    in the rows the table held); a rename back to an earlier name, with a widening, flows. A rename and an
    ``ADD`` of the old name in one binding stall naming ``reclock resnapshot`` (one timestamp cannot hold
    both columns' values under one name)."""
    ctx, w, initial = _start(db, upstream, tmp_path)
    rng = random.Random(11)
    try:
        time.sleep(0.2)
        cycle.run_cycle(ctx)
        w.run_ddl("ALTER TABLE f RENAME COLUMN w TO w2", "ALTER TABLE k RENAME COLUMN n TO n2")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
        w.run_ddl("ALTER TABLE f ADD COLUMN w int", "ALTER TABLE k RENAME COLUMN n2 TO n",
                  "ALTER TABLE k ALTER COLUMN n TYPE numeric(20,0)")
        time.sleep(0.2)
        _crash_then_cycle(ctx, rng)
    finally:
        w.stop.set()
        w.join(30)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    assert _equal_as_of_every_binding(ctx, w, initial) >= 3
    assert _duckdb_equal(ctx, w, initial) >= 3
    name = ctx.spec.name
    with connect(ctx.dsn) as conn:
        f, k = load_history(conn, f"{name}__f"), load_history(conn, f"{name}__k")
    assert f.latest().names == ("id", "v", "c", "n", "amount", "w2", "w") and f.latest().column("w").type == "int"
    assert any("RENAME COLUMN w TO w2" in v.cause for v in f.versions)
    assert k.latest().names == ("id", "v", "c", "n", "amount", "w") and k.latest().column("n").type == "decimal(20,0)"
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE f RENAME COLUMN n TO n5")  # no change of the table between
        conn.execute("ALTER TABLE f ADD COLUMN n int")
        conn.execute("INSERT INTO f (id, v) VALUES (99999, 'x')")
    with pytest.raises(TableSchemaChanged, match=rf"source {name}: table public\.f: DDL dropped or renamed column\(s\) "
                       r"n and added a column of that name again within one timestamp .*" + RESNAPSHOT.format(name=name)):
        cycle.run_cycle(ctx)


def test_dropping_a_column_of_the_key_stalls_with_the_command_that_resolves_it(db, upstream, tmp_path):
    """The key table's key column dropped: its updates and deletes can no longer name their rows. The cycle
    stalls naming the command (the catalog's check at the cycle's start sees the table without a key; the
    stream's Relation message, if the key came back meanwhile, says the column went); the identity set and a
    re-snapshot resolve it."""
    with writer(upstream) as conn:
        for s in SETUP:
            conn.execute(s)
    ctx = make_ctx(db, upstream, tmp_path, source_name("ddl"), list(TABLES), max_records=50)
    name = ctx.spec.name
    cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE k DROP COLUMN id")
        conn.execute("INSERT INTO k (v) VALUES ('no key')")
    with pytest.raises((ReplicaIdentityMissing, TableSchemaChanged),
                       match=rf"source {name}: table public\.k: .*REPLICA IDENTITY FULL"):
        cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE k REPLICA IDENTITY FULL")
        conn.execute("UPDATE k SET v = 'after' WHERE c = 1")
        want = {r["c"]: r for r in _rows(conn, "k").values()}
    cycle.resnapshot(ctx)
    cycle.run_cycle(ctx)
    assert contents(ctx, f"{name}__k", bindings(ctx)[-1][0], key="c") == want


RESNAPSHOT = r"run `reclock resnapshot {name}` to take the table as it is now"
RENAME_FIRST = r"run ALTER TABLE public\.{t} RENAME COLUMN {c} TO <a new name>; then `reclock resnapshot {name}`"


@pytest.mark.parametrize("ddl,match,fix", [
    ("ALTER TABLE {t} ALTER COLUMN n TYPE int4", r"column n changed type from bigint to integer.*" + RENAME_FIRST,
     "ALTER TABLE {t} RENAME COLUMN n TO n4"),
    ("ALTER TABLE {t} ALTER COLUMN w TYPE int4 USING length(w)", r"column w changed type from text to integer.*"
     + RENAME_FIRST, "ALTER TABLE {t} RENAME COLUMN w TO w_length"),
    ("ALTER TABLE {t} ADD COLUMN d float8 DEFAULT random()", r"DDL added column\(s\) d, .* a volatile DEFAULT.*"
     + RESNAPSHOT, None),
], ids=["narrowed", "text_to_int", "add_with_volatile_default"])
@pytest.mark.parametrize("t", TABLES)
def test_changes_that_do_not_flow_stall_naming_the_column_and_resnapshot_resolves_them(db, upstream, tmp_path, ddl,
                                                                                       match, fix, t):
    ctx, w, initial = _start(db, upstream, tmp_path)
    name = ctx.spec.name
    try:
        time.sleep(0.1)
        cycle.run_cycle(ctx)
        w.run_ddl(ddl.format(t=t))
        time.sleep(0.2)
    finally:
        w.stop.set()
        w.join(30)
    assert w.error is None, w.error
    with pytest.raises(TableSchemaChanged, match=rf"source {name}: table public\.{t}: .*"
                       + match.format(name=name, t=t, c=ddl.split()[5])):
        cycle.run_cycle(ctx)
    assert _equal_as_of_every_binding(ctx, w, initial) >= 2, "what landed before the stall stays exact"
    with pytest.raises(TableSchemaChanged):  # stalled: nothing past it is appended
        cycle.run_cycle(ctx)
    if fix is not None:  # a re-snapshot alone refuses: the collection cannot read its old values as the new type
        with pytest.raises(TableSchemaChanged, match=r"a re-snapshot cannot take it: column"):
            cycle.resnapshot(ctx)
        with writer(upstream) as conn:
            conn.execute(fix.format(t=t))
    out = cycle.resnapshot(ctx)
    cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        conn.execute(f"UPDATE {t} SET v = 'after' WHERE id = 1")
        tables = {x: _rows(conn, x) for x in TABLES}
    cycle.run_cycle(ctx)
    last = bindings(ctx)[-1][0]
    assert last > out["ts"]
    for x in TABLES:
        assert contents(ctx, f"{name}__{x}", last) == tables[x], f"{x} after the re-snapshot"


REPLACED = (r"source {name}: table public\.t: column c was dropped and added again where no Relation message showed "
            r"it \(its column number is 4 in the catalog at this binding's upper, 3 when it was registered\)")


def _small(db, upstream, tmp_path, prefix: str):
    """A FULL table ``t`` of 5 rows ``(id, v, c int4)`` and a table ``o`` published beside it, snapshotted."""
    with writer(upstream) as conn:
        for s in ("CREATE TABLE t (id int PRIMARY KEY, v text, c int4)", "ALTER TABLE t REPLICA IDENTITY FULL",
                  "INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 5) g",
                  "CREATE TABLE o (id int PRIMARY KEY, v text)", "ALTER TABLE o REPLICA IDENTITY FULL",
                  "CREATE PUBLICATION pub FOR TABLE t, o"):
            conn.execute(s)
    ctx = make_ctx(db, upstream, tmp_path, source_name(prefix), ["public.t", "public.o"])
    cycle.run_cycle(ctx)
    return ctx


def _upper(ctx, shard: str) -> int:
    with connect(ctx.dsn) as conn:
        return shard_info(conn, f"{ctx.spec.name}__{shard}").upper


@pytest.mark.parametrize("between", ["nothing", "dml_on_another_table"])
def test_a_column_dropped_and_added_again_where_no_relation_shows_it_stalls(db, upstream, tmp_path, between):
    """``ALTER TABLE t DROP COLUMN c, ADD COLUMN c int4`` gives a Relation message like the one before (it
    carries no column numbers); the catalog as of the binding's upper holds c at another number: the write
    stalls naming ``reclock resnapshot`` and appends nothing (before, the collection kept every row's old c and
    held (1, 'v1', 1) and (1, 'v1', null) at -1), again at the next cycle; the re-snapshot resolves it. Run
    with the writer's ``synchronous_commit = off`` too: the upper covers a commit not flushed yet."""
    ctx = _small(db, upstream, tmp_path, "replaced")
    name, before = ctx.spec.name, _upper(ctx, "t")
    with writer(upstream) as conn:
        conn.execute("SET synchronous_commit = off")
        if between == "nothing":
            conn.execute("ALTER TABLE t DROP COLUMN c, ADD COLUMN c int4")
        else:
            conn.execute("ALTER TABLE t DROP COLUMN c")
            conn.execute("INSERT INTO o VALUES (1, 'between')")
            conn.execute("ALTER TABLE t ADD COLUMN c int4")
        conn.execute("UPDATE t SET v = 'x' WHERE id = 1")
        (written,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    for _ in range(2):
        with pytest.raises(TableSchemaChanged, match=REPLACED.format(name=name) + r".*reclock resnapshot " + name):
            cycle.run_cycle(ctx)
        assert _upper(ctx, "t") == before and _upper(ctx, "o") == before, "nothing appended"
    assert bindings(ctx)[-1][1] >= po.lsn_to_int(written), "the upper covers the unflushed commit"
    cycle.resnapshot(ctx)
    cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        want = _rows(conn, "t")
    assert contents(ctx, f"{name}__t", bindings(ctx)[-1][0]) == want
    assert all(r["c"] is None for r in want.values())


def test_a_column_dropped_and_added_again_after_the_upper_lands_the_binding_and_stalls_the_next(db, upstream,
                                                                                               tmp_path):
    """The DROP + ADD committed between the mint and the write (above the binding's upper): the write decodes up
    to the upper and checks against the catalog as of it (the mint's), so the binding lands exactly; the next
    cycle's binding holds the DROP + ADD and stalls. Before it, a DROP and a change, then an ADD and a change
    (the Relation messages show both) flow with no stall, with the re-added column's rows null there."""
    ctx = _small(db, upstream, tmp_path, "after")
    name = ctx.spec.name
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE t DROP COLUMN v")
        conn.execute("UPDATE t SET c = 10 WHERE id = 1")
    cycle.run_cycle(ctx)  # (a column dropped and added again within one binding stalls: one timestamp)
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE t ADD COLUMN v text")
        conn.execute("UPDATE t SET c = 20 WHERE id = 2")
        flowed = _rows(conn, "t")
    cycle.run_cycle(ctx)
    assert contents(ctx, f"{name}__t", bindings(ctx)[-1][0]) == flowed
    with writer(upstream) as conn:
        conn.execute("UPDATE t SET c = 30 WHERE id = 3")
        want = _rows(conn, "t")
    minted = cycle.mint(ctx)
    with writer(upstream) as conn:
        conn.execute("ALTER TABLE t DROP COLUMN v, ADD COLUMN v text")  # v is last since it was added again
        conn.execute("UPDATE t SET c = 40 WHERE id = 4")
    for desc in minted.descriptions:
        cycle.append(ctx, cycle.write_batches(ctx, desc))
    assert contents(ctx, f"{name}__t", minted.binding.ts) == want
    with pytest.raises(TableSchemaChanged, match=r"column v was dropped and added again where no Relation message "
                       r"showed it \(its column number is 5 in the catalog at this binding's upper, 4 when"):
        cycle.run_cycle(ctx)
