"""The persist layer against a real Postgres: migrations, the remap store, shards, holds, GC, blobs,
and a race of threads and processes on compare_and_append."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time


from reclock.persist import connect
import pytest

from reclock import remap
from reclock.batch import BatchDescription, Part
from reclock.errors import RemapUpperMismatch, ShardModified, SinceViolation, UpperMismatch
from reclock.persist import migrate as migrations
from reclock.persist.blob import FsspecBlobStore, LocalBlobStore, blob_store_from_url, new_part_path
from reclock.persist.gc import collect_garbage
from reclock.persist.remap_store import append_binding, compact_remap, load_remap, register_source
from reclock.persist.shards import (Append, acquire_read_hold, advance_since, batches, compare_and_append,
                                    downgrade_read_hold, register_shard, release_read_hold, shard_info)
from reclock.remap import Binding
from reclock.time import PartitionedFrontier as F


@pytest.fixture
def db(fresh_db: str) -> str:
    migrations.migrate(fresh_db)
    return fresh_db


def part(path: str, rows: int = 1) -> Part:
    return Part(path, rows, rows * 10, None, None)


def test_migrations_are_versioned_idempotent_and_safe_concurrently(fresh_db):
    results: list[list[int]] = []
    threads = [threading.Thread(target=lambda: results.append(migrations.migrate(fresh_db))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    applied = [r for r in results if r]
    assert len(applied) == 1 and applied[0] == [v for v, _, _ in migrations.available()]
    assert migrations.migrate(fresh_db) == []
    with connect(fresh_db) as conn:
        conn.execute("UPDATE reclock.schema_migrations SET checksum = 'x' WHERE version = 1")
        conn.commit()
    with pytest.raises(migrations.MigrationError, match="changed after it was applied"):
        migrations.migrate(fresh_db)


def test_remap_store_cas_progress_view_and_compaction(db):
    with connect(db) as conn:
        register_source(conn, "orders")
        register_source(conn, "orders")  # idempotent
        rc = append_binding(conn, "orders", 0, Binding(100, F.of({0: 5, 1: 3})))
        assert rc.upper == 101
        with pytest.raises(RemapUpperMismatch) as e:
            append_binding(conn, "orders", 0, Binding(150, F.of({0: 9})))
        assert e.value.actual == 101
        rc = append_binding(conn, "orders", 101, Binding(200, F.of({0: 9, 1: 3, 2: 1})))
        with pytest.raises(ValueError):  # a frontier going backwards is refused
            append_binding(conn, "orders", 201, Binding(300, F.of({0: 1})))
        assert load_remap(conn, "orders") == rc
        rows = conn.execute('SELECT ts, partition, "offset" FROM reclock.orders_progress ORDER BY 1, 2').fetchall()
        assert rows == remap.progress_rows(rc)
        as_of = conn.execute("SELECT * FROM reclock.progress_as_of('orders', 150)").fetchall()
        assert as_of == [(0, 5), (1, 3)]
        c = compact_remap(conn, "orders", 150)
        assert c == remap.compact(rc, 150)
        assert conn.execute("SELECT * FROM reclock.progress_as_of('orders', 199)").fetchall() == [(0, 5), (1, 3)]
        assert compact_remap(conn, "orders", 120) == c  # never backwards


def _setup_shards(conn, ids=("a", "b", "c")):
    for s in ids:
        register_shard(conn, s)


def test_compare_and_append_cases_over_several_shards(db):
    with connect(db) as conn:
        _setup_shards(conn)
        d1 = BatchDescription(0, 10)
        out = compare_and_append(conn, [Append("a", d1, (part("a/1"),)), Append("b", d1, (part("b/1"),)),
                                        Append("c", d1)])
        assert [o.status for o in out] == ["appended"] * 3
        # a retried append of the same description and parts is a no-op
        out = compare_and_append(conn, [Append("a", d1, (part("a/1"),)), Append("b", d1, (part("b/1"),))])
        assert [o.status for o in out] == ["already_present"] * 2
        assert len(batches(conn, "a")) == 1
        # one shard conflicting (partial overlap) -> nothing changes in any shard
        with pytest.raises(UpperMismatch) as e:
            compare_and_append(conn, [Append("a", BatchDescription(10, 20), (part("a/2"),)),
                                      Append("b", BatchDescription(5, 20), (part("b/2"),))])
        assert (e.value.shard, e.value.expected, e.value.actual) == ("b", 5, 10)
        assert "shard b: upper is 10, append expected 5" in str(e.value)
        assert [shard_info(conn, s).upper for s in "abc"] == [10, 10, 10]
        assert len(batches(conn, "a")) == 1
        # shard behind the description: modified under us
        with pytest.raises(ShardModified):
            compare_and_append(conn, [Append("c", BatchDescription(15, 20))])
        assert shard_info(conn, "c").upper == 10


def test_read_holds_bound_since(db):
    with connect(db) as conn:
        _setup_shards(conn, ("s",))
        compare_and_append(conn, [Append("s", BatchDescription(0, 100))])
        acquire_read_hold(conn, "s", "sink1", 40)
        assert advance_since(conn, "s", 90) == 40
        downgrade_read_hold(conn, "s", "sink1", 30)  # never backwards
        assert advance_since(conn, "s", 90) == 40
        downgrade_read_hold(conn, "s", "sink1", 60)
        assert advance_since(conn, "s", 90) == 60
        with pytest.raises(SinceViolation):
            acquire_read_hold(conn, "s", "late", 10)
        release_read_hold(conn, "s", "sink1")
        assert advance_since(conn, "s", 500) == 100  # never beyond upper
        with pytest.raises(SinceViolation):
            batches(conn, "s", as_of=50)


def test_gc_keeps_referenced_and_young_parts(db, tmp_path):
    blob = LocalBlobStore(tmp_path / "blobs")
    with connect(db) as conn:
        _setup_shards(conn, ("s",))
        desc = BatchDescription(0, 10)
        kept, orphan_old, orphan_young = (new_part_path("s", desc) for _ in range(3))
        for p in (kept, orphan_old, orphan_young):
            blob.put_bytes(p, b"x" * 100)
        compare_and_append(conn, [Append("s", desc, (part(kept),))])
        old = time.time() - 3600
        os.utime(blob.url(orphan_old), (old, old))
        os.utime(blob.url(kept), (old, old))
        report = collect_garbage(conn, blob, "s", grace_seconds=600)
    assert (report.deleted, report.kept_young, report.referenced) == (1, 1, 1)
    assert blob.exists(kept) and blob.exists(orphan_young) and not blob.exists(orphan_old)


def test_blob_stores(tmp_path):
    for store in (LocalBlobStore(tmp_path / "b"), FsspecBlobStore("memory://reclock-test"),
                  blob_store_from_url(f"file://{tmp_path / 'c'}")):
        store.put_bytes("x/y/z.parquet", b"abc")
        assert store.get_bytes("x/y/z.parquet") == b"abc" and store.exists("x/y/z.parquet")
        assert [b.path for b in store.list("x")] == ["x/y/z.parquet"]
        with store.open("x/y/z.parquet") as f:
            assert f.read() == b"abc"
        store.delete("x/y/z.parquet")
        assert not store.exists("x/y/z.parquet")
        for bad in ("../etc", "/abs", "a//b"):
            with pytest.raises(ValueError):
                store.url(bad)


# ---------------------------------------------------------------------------------------------------
# the race: many contenders, the same shards, the same lower; exactly one wins each round

SHARDS = ("r0", "r1", "r2")
ROUNDS = 25


def _contend(dsn: str, me: int, barrier, results) -> None:
    """Each round: read the common upper, wait for everyone, try [upper, upper + 1 + me) on all shards."""
    with connect(dsn) as conn:
        for rnd in range(ROUNDS):
            lower = shard_info(conn, SHARDS[0]).upper
            desc = BatchDescription(lower, lower + 1 + me)
            appends = [Append(s, desc, (part(f"{s}/{rnd}/{me}"),)) for s in SHARDS]
            barrier.wait()
            try:
                out = compare_and_append(conn, appends)
                results.append((rnd, me, out[0].status, lower, desc.upper))
            except UpperMismatch as e:
                results.append((rnd, me, "mismatch", lower, e.actual))
            barrier.wait()


def _check_race(dsn: str, results, contenders: int) -> None:
    with connect(dsn) as conn:
        uppers = [shard_info(conn, s).upper for s in SHARDS]
        rows = {s: batches(conn, s) for s in SHARDS}
    by_round: dict[int, list] = {}
    for r in results:
        by_round.setdefault(r[0], []).append(r)
    assert len(by_round) == ROUNDS
    last_upper = 0
    for rnd in range(ROUNDS):
        rs = by_round[rnd]
        assert len(rs) == contenders
        winners = [r for r in rs if r[2] == "appended"]
        assert len(winners) == 1, rs  # exactly one wins each round
        _, w, _, lower, upper = winners[0]
        assert lower == last_upper
        for _, me, status, _, seen in rs:
            if me == w:
                continue
            # a loser asking for less than the winner wrote sees it as already present; more: a mismatch
            assert status == ("already_present" if 1 + me <= 1 + w else "mismatch")
        for s in SHARDS:  # no batch lost or doubled: the winner's part, once, in every shard
            assert [b.path for b in rows[s] if b.lower == lower] == [f"{s}/{rnd}/{w}"]
        last_upper = upper
    assert uppers == [last_upper] * 3  # all shards agree with the last winner
    assert all(len(rows[s]) == ROUNDS for s in SHARDS)


def test_race_threads(db):
    with connect(db) as conn:
        _setup_shards(conn, SHARDS)
    n = 6
    barrier = threading.Barrier(n)
    results: list = []
    threads = [threading.Thread(target=_contend, args=(db, i, barrier, results)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _check_race(db, results, n)


def test_race_processes(db):
    with connect(db) as conn:
        _setup_shards(conn, SHARDS)
    n = 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as mgr:
        barrier = mgr.Barrier(n)
        results = mgr.list()
        procs = [ctx.Process(target=_contend, args=(db, i, barrier, results)) for i in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
            assert p.exitcode == 0
        _check_race(db, list(results), n)
