"""Publications as they are (issue 33 part 1), against a real upstream Postgres 15: row filters, column lists,
``publish`` lists, partitioned tables with and without ``publish_via_partition_root``, ``FOR TABLES IN
SCHEMA``, ``FOR ALL TABLES`` and inheritance children either land exactly what the publication publishes,
snapshot included (the collection AS OF each binding equals the published view of the table at that
binding), or are refused at the first cycle with what to change."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest
from pg_support import bindings, contents, make_ctx, source_name, upstream_database, writer

from reclock import cycle, failpoints
from reclock.errors import (PublicationMissing, PublicationRedefined, PublicationUnsupported, ReplicaIdentityMissing,
                            TableSchemaChanged)
from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.persist.status import latest_status


@pytest.fixture
def upstream(postgres):
    with upstream_database(postgres) as dsn:
        yield dsn


def run(dsn: str, *statements: str) -> None:
    with writer(dsn) as conn:
        for s in statements:
            conn.execute(s)


def published(dsn: str, query: str) -> dict:
    """``{id: row}`` of ``query`` upstream (the view the publication publishes), values as the collection
    holds them."""
    with writer(dsn) as conn:
        cur = conn.execute(query)
        names = [d.name for d in cur.description]
        return {r[0]: dict(zip(names, r)) for r in cur.fetchall()}


def landed(ctx, shard: str, t: int | None = None) -> dict:
    return contents(ctx, shard, bindings(ctx)[-1][0] if t is None else t)


def test_a_row_filter_lands_exactly_the_rows_it_passes_snapshot_included(db, upstream, tmp_path):
    """The issue's steps: the snapshot lands the even ids only; an insert of an odd and an even id, updates
    of an odd and an even row, deletes of an odd and an even row; then updates that move rows into the
    filter (an insert for the collection) and out of it (a delete), in one transaction."""
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v text, w int)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 20) g",
        "CREATE PUBLICATION pub FOR TABLE t WHERE (id % 2 = 0)")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"])
    shard = f"{ctx.spec.name}__t"
    view = "SELECT * FROM t WHERE id % 2 = 0"
    cycle.run_cycle(ctx)
    first = bindings(ctx)[-1][0]
    assert landed(ctx, shard) == published(upstream, view) and len(published(upstream, view)) == 10

    run(upstream, "INSERT INTO t VALUES (21, 'odd', 21), (22, 'even', 22)",
        "UPDATE t SET v = 'changed' WHERE id IN (1, 2)", "DELETE FROM t WHERE id IN (3, 4)")
    cycle.run_cycle(ctx)
    second = bindings(ctx)[-1][0]
    got = landed(ctx, shard)
    assert got == published(upstream, view)
    assert 22 in got and 21 not in got and got[2]["v"] == "changed" and 4 not in got

    with writer(upstream) as conn, conn.transaction():
        conn.execute("UPDATE t SET id = id + 100 WHERE id IN (5, 7)")  # odd -> odd: nothing
        conn.execute("UPDATE t SET id = 31 WHERE id = 6")  # out of the filter: a delete
        conn.execute("UPDATE t SET id = 50, v = 'in' WHERE id = 9")  # into the filter: an insert
    cycle.run_cycle(ctx)
    got = landed(ctx, shard)
    assert got == published(upstream, view) and got[50]["v"] == "in" and 6 not in got
    assert len(landed(ctx, shard, first)) == 10 and 22 in landed(ctx, shard, second), "history stays"


PLAIN = ("CREATE TABLE t (id int PRIMARY KEY, v int, p int)", "ALTER TABLE t REPLICA IDENTITY FULL")
TREE = ("CREATE TABLE t (id int, v int, p int, PRIMARY KEY (id, p)) PARTITION BY LIST (p)",
        *(f"CREATE TABLE t{i} PARTITION OF t FOR VALUES IN ({i})" for i in range(3)),
        *(f"ALTER TABLE {t} REPLICA IDENTITY FULL" for t in ("t", "t0", "t1", "t2")))
SETUPS = {  # name: (DDL, publication, tables taken, {collection suffix: the published view})
    "row filter": (PLAIN, "FOR TABLE t WHERE (v % 3 = 0)", ["t"], {"t": "SELECT * FROM t WHERE v % 3 = 0"}),
    "root with a row filter": (TREE, "FOR TABLE t WHERE (v % 3 = 0) WITH (publish_via_partition_root = true)",
                               ["t"], {"t": "SELECT * FROM t WHERE v % 3 = 0"}),
    "partitions": (TREE, "FOR TABLE t", None, {f"t{i}": f"SELECT * FROM t{i}" for i in range(3)}),
    "tables in schema": (PLAIN, "FOR TABLES IN SCHEMA public", None, {"t": "SELECT * FROM t"}),
}


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_publications_hold_across_the_seam_while_writers_write_and_cycles_crash(db, upstream, tmp_path, setup):
    """Writers update rows (into and out of a row filter), move them between partitions, insert and delete,
    while the first cycle takes its snapshot and while the next ones stream, and every other cycle crashes
    at a random step boundary first: at the end, each collection is its published view; at every binding,
    a set of rows (none twice) that the view could hold."""
    ddl, publication, tables, views = SETUPS[setup]
    run(upstream, *ddl, "INSERT INTO t SELECT g, g, g % 3 FROM generate_series(1, 2000) g",
        f"CREATE PUBLICATION pub {publication}")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), tables, max_records=97)
    stop, errors, committed = threading.Event(), [], []

    def transaction(conn: psycopg.Connection, rng: random.Random, fresh: int) -> int:
        """One writer transaction of 1-5 random operations; returns the last fresh key used."""
        with conn.transaction():
            for _ in range(rng.randint(1, 5)):
                k = rng.randint(1, 2000)
                op = rng.choice(["update", "update", "move", "insert", "delete"])
                if op == "update":
                    conn.execute("UPDATE t SET v = v + 1 WHERE id = %s", (k,))
                elif op == "move":  # another partition, where there are partitions
                    conn.execute("UPDATE t SET p = (p + 1) %% 3 WHERE id = %s", (k,))
                elif op == "insert":
                    fresh += 1
                    conn.execute("INSERT INTO t VALUES (%s, %s, %s)", (fresh, rng.randint(0, 99), fresh % 3))
                else:
                    conn.execute("DELETE FROM t WHERE id = %s", (k,))
        return fresh

    def write(seed: int) -> None:
        rng = random.Random(seed)
        fresh = (seed + 1) * 100_000
        try:
            with writer(upstream) as conn:
                while not stop.is_set():
                    try:
                        fresh = transaction(conn, rng, fresh)
                    except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
                        # The two writers touch the same rows: a row moved to another partition under the
                        # other's update, or two rows locked in opposite orders. Postgres rolled the whole
                        # transaction back (none of it is published); a client would retry, so go on.
                        continue
                    committed.append(seed)
                    time.sleep(0.002)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(2)]
    for th in threads:
        th.start()
    points = ["mint:after_binding", "write_batches:before_job", "write_batches:after_slice", "append:in_transaction",
              "resume:after_commit"]
    rng = random.Random(33)
    try:
        for i in range(6):  # a crash at a random step boundary every other cycle, the first one's snapshot too
            if i % 2 == 0:
                with failpoints.enabled(rng.choice(points)), pytest.raises(failpoints.FailpointHit):
                    cycle.run_cycle(ctx)
            cycle.run_cycle(ctx)
    finally:
        stop.set()
        for th in threads:
            th.join()
    assert not errors, errors
    assert len(committed) > 50, "the writers wrote while the cycles ran"
    cycle.run_cycle(ctx)
    for suffix, view in views.items():
        shard = f"{ctx.spec.name}__{suffix}"
        assert landed(ctx, shard) == published(upstream, view), suffix
        for t, _ in bindings(ctx):  # every binding: a set (no row twice), of rows the filter passes
            rows = landed(ctx, shard, t).values()
            assert "WHERE" not in view or all(r["v"] % 3 == 0 for r in rows), (suffix, t)
            assert suffix == "t" or all(r["p"] == int(suffix[1]) for r in rows), (suffix, t)


def test_a_column_list_lands_only_its_columns(db, upstream, tmp_path):
    """``FOR TABLE t (v, id)``: the collection has the listed columns, snapshot and stream alike; no
    stall. (With ``REPLICA IDENTITY FULL`` Postgres 15 itself refuses updates and deletes of a table with a
    column list, "does not cover the replica identity", even one listing every column: such a table is
    insert-only until the default identity is supported.)"""
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v text, w int)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, 'v' || g, g FROM generate_series(1, 5) g",
        "CREATE PUBLICATION pub FOR TABLE t (v, id)")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"])
    name = ctx.spec.name
    cycle.run_cycle(ctx)
    assert landed(ctx, f"{name}__t") == published(upstream, "SELECT id, v FROM t")
    run(upstream, "INSERT INTO t VALUES (6, 'six', 6)", "INSERT INTO t VALUES (7, NULL, 7)")
    cycle.run_cycle(ctx)
    got = landed(ctx, f"{name}__t")
    assert got == published(upstream, "SELECT id, v FROM t") and list(got[6]) == ["id", "v"]
    # a column added to the table (not to the list) changes nothing for the collection
    run(upstream, "ALTER TABLE t ADD COLUMN z int", "INSERT INTO t VALUES (8, 'eight', 8, 8)")
    cycle.run_cycle(ctx)
    assert landed(ctx, f"{name}__t") == published(upstream, "SELECT id, v FROM t")


@pytest.mark.parametrize("publish", ["insert", "insert, update, delete", "insert, update"])
def test_a_publish_list_leaving_an_operation_out_is_refused_at_the_first_cycle(db, upstream, tmp_path, publish):
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v text)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t VALUES (1, 'a')", f"CREATE PUBLICATION pub FOR TABLE t WITH (publish = '{publish}')")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"])
    with pytest.raises(PublicationUnsupported, match=rf"publication pub publishes {publish}, not .*: the collections "
                       r"would keep rows the tables no longer hold.*run: ALTER PUBLICATION \"pub\" SET \(publish = "
                       r"'insert, update, delete, truncate'\);"):
        cycle.run_cycle(ctx)
    assert bindings(ctx) == []
    run(upstream, "ALTER PUBLICATION pub SET (publish = 'insert, update, delete, truncate')")
    cycle.run_cycle(ctx)
    assert set(landed(ctx, f"{ctx.spec.name}__t")) == {1}
    # narrowed again later: the next cycle stalls, nothing appended
    run(upstream, "ALTER PUBLICATION pub SET (publish = 'insert')", "DELETE FROM t")
    with connect(db) as conn:
        uppers = {s: shard_info(conn, s).upper for s in ctx.shards()}
    with pytest.raises(PublicationUnsupported):
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        assert {s: shard_info(conn, s).upper for s in ctx.shards()} == uppers
        assert latest_status(conn, ctx.spec.name).status == "stalled"


def test_a_row_filter_changed_after_the_snapshot_stalls_until_resnapshot(db, upstream, tmp_path):
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v text)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 10) g",
        "CREATE PUBLICATION pub FOR TABLE t WHERE (id > 5)")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"])
    shard = f"{ctx.spec.name}__t"
    cycle.run_cycle(ctx)
    assert set(landed(ctx, shard)) == {6, 7, 8, 9, 10}
    run(upstream, "ALTER PUBLICATION pub SET TABLE t WHERE (id <= 5)", "INSERT INTO t VALUES (0, 'zero')")
    with connect(db) as conn:
        uppers = {s: shard_info(conn, s).upper for s in ctx.shards()}
    for _ in range(2):
        with pytest.raises(PublicationRedefined, match=r"table public\.t: in publication pub, its row filter changed "
                           r"from \(id > 5\) to \(id <= 5\) since the source took its snapshot.*reclock resnapshot"):
            cycle.run_cycle(ctx)
    with connect(db) as conn:
        assert {s: shard_info(conn, s).upper for s in ctx.shards()} == uppers, "nothing appended past it"
    cycle.resnapshot(ctx)
    cycle.run_cycle(ctx)
    run(upstream, "INSERT INTO t VALUES (-1, 'minus'), (11, 'eleven')")
    cycle.run_cycle(ctx)
    assert landed(ctx, shard) == published(upstream, "SELECT * FROM t WHERE id <= 5")


def test_a_column_list_changed_after_the_snapshot_stalls_until_resnapshot(db, upstream, tmp_path):
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v text, w int)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "INSERT INTO t VALUES (1, 'a', 1)", "CREATE PUBLICATION pub FOR TABLE t (id, v)")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"])
    cycle.run_cycle(ctx)
    run(upstream, "ALTER PUBLICATION pub SET TABLE t (id, v, w)", "INSERT INTO t VALUES (2, 'b', 2)")
    with pytest.raises((PublicationRedefined, TableSchemaChanged), match=r"table public\.t"):
        cycle.run_cycle(ctx)
    cycle.resnapshot(ctx)
    cycle.run_cycle(ctx)
    assert landed(ctx, f"{ctx.spec.name}__t") == published(upstream, "SELECT * FROM t")


@pytest.mark.parametrize("via_root", [False, True])
def test_a_partitioned_table_lands_as_its_partitions_or_through_its_root(db, upstream, tmp_path, via_root):
    """Without ``publish_via_partition_root`` each partition is a table of the publication (a collection
    each); with it, the root is (one collection of the whole tree). Rows moving between partitions, a row
    filter through the root (Postgres allows none on a partitioned table published as its partitions), and
    a partition that is not FULL (refused naming it and the ALTER)."""
    row_filter, kept = ("WHERE (id % 2 = 1) ", " WHERE id % 2 = 1") if via_root else ("", "")
    run(upstream, "CREATE TABLE m (id int, v text) PARTITION BY RANGE (id)",
        "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100)",
        "CREATE TABLE m2 PARTITION OF m FOR VALUES FROM (100) TO (200)",
        "ALTER TABLE m REPLICA IDENTITY FULL", "ALTER TABLE m1 REPLICA IDENTITY FULL",
        "INSERT INTO m SELECT g, 'v' || g FROM generate_series(1, 150, 7) g",
        f"CREATE PUBLICATION pub FOR TABLE m {row_filter}WITH (publish_via_partition_root = {via_root})")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), None)
    with pytest.raises(ReplicaIdentityMissing, match=r'public\.m2: replica identity is DEFAULT.*ALTER TABLE "public"'
                       r'\."m2" REPLICA IDENTITY FULL;'):
        cycle.run_cycle(ctx)
    run(upstream, "ALTER TABLE m2 REPLICA IDENTITY FULL")
    cycle.run_cycle(ctx)
    name = ctx.spec.name
    if via_root:
        assert ctx.shards() == (f"{name}__m", f"{name}_errors")
        views = {f"{name}__m": f"SELECT * FROM m{kept}"}
    else:
        assert ctx.shards() == (f"{name}__m1", f"{name}__m2", f"{name}_errors")
        views = {f"{name}__m{i}": f"SELECT * FROM m{i}{kept}" for i in (1, 2)}
    for shard, view in views.items():
        assert landed(ctx, shard) == published(upstream, view) != {}
    with writer(upstream) as conn, conn.transaction():
        conn.execute("UPDATE m SET id = id + 100 WHERE id < 30")  # m1 -> m2 (odd stays odd)
        conn.execute("UPDATE m SET id = id + 1 WHERE id BETWEEN 50 AND 60")  # out of / into the filter
        conn.execute("DELETE FROM m WHERE id > 140")
        conn.execute("INSERT INTO m VALUES (3, 'three'), (103, 'hundred and three')")
    cycle.run_cycle(ctx)
    for shard, view in views.items():
        assert landed(ctx, shard) == published(upstream, view), shard


def test_a_partitioned_table_listed_while_its_partitions_are_published_says_what_to_choose(db, upstream, tmp_path):
    run(upstream, "CREATE TABLE m (id int, v text) PARTITION BY RANGE (id)",
        "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100)", "ALTER TABLE m1 REPLICA IDENTITY FULL",
        "CREATE PUBLICATION pub FOR TABLE m")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["m"])
    with pytest.raises(PublicationMissing, match=r"table public\.m: is partitioned, and publication pub publishes "
                       r"its partitions as tables of their own \(public\.m1\).*publish_via_partition_root = true"):
        cycle.run_cycle(ctx)


@pytest.mark.parametrize("ddl", ["ALTER TABLE m ATTACH PARTITION m3 FOR VALUES FROM (200) TO (300)",
                                 "ALTER TABLE m DETACH PARTITION m1"])
def test_a_partition_attached_or_detached_under_a_root_stalls_until_resnapshot(db, upstream, tmp_path, ddl):
    """Attaching a table with rows as a partition (or detaching one) moves rows into (out of) the root with
    no change in the WAL: landing on would silently differ from the table, so the source stalls, and the
    re-snapshot lands the tree as it is."""
    run(upstream, "CREATE TABLE m (id int, v text) PARTITION BY RANGE (id)",
        "CREATE TABLE m1 PARTITION OF m FOR VALUES FROM (0) TO (100)", "CREATE TABLE m3 (id int, v text)",
        "ALTER TABLE m REPLICA IDENTITY FULL", "ALTER TABLE m1 REPLICA IDENTITY FULL",
        "ALTER TABLE m3 REPLICA IDENTITY FULL", "INSERT INTO m VALUES (1, 'one')", "INSERT INTO m3 VALUES (201, 'x')",
        "CREATE PUBLICATION pub FOR TABLE m WITH (publish_via_partition_root = true)")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["m"])
    shard = f"{ctx.spec.name}__m"
    cycle.run_cycle(ctx)
    assert set(landed(ctx, shard)) == {1}
    run(upstream, ddl)
    for _ in range(2):
        with pytest.raises(PublicationRedefined, match=r"table public\.m: in publication pub, its partitions changed "
                           r"\(1 (attached|detached): their rows came or went"):
            cycle.run_cycle(ctx)
    cycle.resnapshot(ctx)
    cycle.run_cycle(ctx)
    assert landed(ctx, shard) == published(upstream, "SELECT * FROM m")


@pytest.mark.parametrize("how", ["FOR TABLES IN SCHEMA s", "FOR ALL TABLES"])
def test_schema_and_all_tables_publications_land_every_table(db, upstream, tmp_path, how):
    run(upstream, "CREATE SCHEMA s", "CREATE TABLE s.a (id int PRIMARY KEY, v text)",
        "CREATE TABLE s.b (id int PRIMARY KEY, v text)", "ALTER TABLE s.a REPLICA IDENTITY FULL",
        "ALTER TABLE s.b REPLICA IDENTITY FULL", "INSERT INTO s.a VALUES (1, 'a1'), (2, 'a2')",
        f"CREATE PUBLICATION pub {how}")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), None)
    name = ctx.spec.name
    cycle.run_cycle(ctx)
    assert ctx.shards() == (f"{name}__s__a", f"{name}__s__b", f"{name}_errors")
    run(upstream, "UPDATE s.a SET v = 'x' WHERE id = 1", "DELETE FROM s.a WHERE id = 2",
        "INSERT INTO s.b VALUES (9, 'b')")
    cycle.run_cycle(ctx)
    for t in ("a", "b"):
        assert landed(ctx, f"{name}__s__{t}") == published(upstream, f"SELECT * FROM s.{t}")


def test_an_inheritance_child_is_a_table_of_its_own_not_in_its_parents_snapshot(db, upstream, tmp_path):
    """A publication of a table takes its inheritance children as tables of their own: the parent's
    snapshot reads ``ONLY`` the parent (else a child's rows would land twice)."""
    run(upstream, "CREATE TABLE p (id int PRIMARY KEY, v text)", "CREATE TABLE c () INHERITS (p)",
        "ALTER TABLE p REPLICA IDENTITY FULL", "ALTER TABLE c REPLICA IDENTITY FULL",
        "INSERT INTO p VALUES (1, 'parent')", "INSERT INTO c VALUES (2, 'child')", "CREATE PUBLICATION pub FOR TABLE p")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), None)
    name = ctx.spec.name
    cycle.run_cycle(ctx)
    assert set(landed(ctx, f"{name}__p")) == {1} and set(landed(ctx, f"{name}__c")) == {2}
    run(upstream, "INSERT INTO c VALUES (3, 'child')", "UPDATE p SET v = 'both'")
    cycle.run_cycle(ctx)
    assert landed(ctx, f"{name}__p") == published(upstream, "SELECT * FROM ONLY p")
    assert landed(ctx, f"{name}__c") == published(upstream, "SELECT * FROM c")


def test_a_row_filter_holds_for_a_snapshot_taken_on_spark(db, upstream, tmp_path, spark):
    """A table snapshotted by Spark in page ranges reads the rows the filter passes, and proves its parts
    against ``count(*)`` under the same filter; a child's rows stay out of its parent's snapshot."""
    run(upstream, "CREATE TABLE t (id int PRIMARY KEY, v text)", "ALTER TABLE t REPLICA IDENTITY FULL",
        "CREATE TABLE tc () INHERITS (t)", "ALTER TABLE tc REPLICA IDENTITY FULL",
        "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 3000) g", "INSERT INTO tc VALUES (4000, 'child')",
        "CREATE PUBLICATION pub FOR TABLE ONLY t WHERE (id % 3 = 0)")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"], spark=spark, spark_snapshot_min_bytes=0)
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'write_batches'",
                             (ctx.spec.name,)).fetchone()[0]
    assert stats["snapshot_on_spark"] == [f"{ctx.spec.name}__t"] and stats["snapshot_rows"] == 1000
    run(upstream, "UPDATE t SET id = id + 10000 WHERE id < 10")
    cycle.run_cycle(ctx)
    assert landed(ctx, f"{ctx.spec.name}__t") == published(upstream, "SELECT * FROM ONLY t WHERE id % 3 = 0")
