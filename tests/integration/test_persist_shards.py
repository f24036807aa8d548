"""Shards: ``compare_and_append`` over several shards in one transaction (the four cases of DESIGN.md's
append table), reads AS OF t, and read holds bounding ``since``."""

from __future__ import annotations

import threading
import time

import pytest

from reclock.batch import BatchDescription as D, Part
from reclock.errors import (BeyondUpper, ConfigError, PartAlreadyReferenced, ShardModified, SinceViolation,
                            UnknownReadHold, UnknownShard, UnknownSource, UpperMismatch)
from reclock.persist import connect
from reclock.persist.remap_store import register_source
from reclock.persist.shards import (Append, ShardInfo, acquire_read_hold, advance_since, batches,
                                    compare_and_append, downgrade_read_hold, read_holds, register_shard,
                                    release_read_hold, shard_info)


def part(path: str, rows: int = 1, min_ts: int | None = None, max_ts: int | None = None) -> Part:
    return Part(path, rows, rows * 10, min_ts, max_ts)


def state(conn, shards=("a", "b", "c")) -> dict[str, tuple[int, list[str]]]:
    """Each shard's upper and batch paths: what must not change when an append fails."""
    return {s: (shard_info(conn, s).upper, [b.path for b in batches(conn, s)]) for s in shards}


@pytest.fixture
def abc(conn):
    for s in ("a", "b", "c"):
        register_shard(conn, s)
    return conn


def test_register_shard(conn):
    assert register_shard(conn, "a") == ShardInfo("a", 0, 0, None, 0)
    assert register_shard(conn, "a") == ShardInfo("a", 0, 0, None, 0)  # idempotent
    register_source(conn, "orders")
    assert register_shard(conn, "orders_errors", source="orders", output=1, kind="errors") == \
        ShardInfo("orders_errors", 0, 0, "orders", 1, "errors")
    with pytest.raises(ConfigError, match="already registered as the errors output 1 of source orders"):
        register_shard(conn, "orders_errors", source="orders", output=0, kind="errors")
    with pytest.raises(ConfigError, match="not the data output 1"):
        register_shard(conn, "orders_errors", source="orders", output=1)
    with pytest.raises(ValueError, match="kind must be one of data, errors"):
        register_shard(conn, "y", kind="error")
    with pytest.raises(UnknownSource):
        register_shard(conn, "x", source="nope")
    for bad in ("A", "9a", "a-b", 'a"b', "a" * 62):
        with pytest.raises(ConfigError, match="shard id"):
            register_shard(conn, bad)
    with pytest.raises(UnknownShard, match="shard zz: not registered"):
        shard_info(conn, "zz")


def test_upper_equal_to_lower_appends_every_shard(abc):
    conn = abc
    d = D(0, 10)
    out = compare_and_append(conn, [Append("b", d, (part("b/1", 3, 0, 9), part("b/2"))), Append("a", d, (part("a/1"),)),
                                    Append("c", d)])  # zero parts: just advances the upper
    assert [(o.shard, o.status, o.upper) for o in out] == [("b", "appended", 10), ("a", "appended", 10),
                                                          ("c", "appended", 10)]
    assert state(conn) == {"a": (10, ["a/1"]), "b": (10, ["b/1", "b/2"]), "c": (10, [])}
    row = batches(conn, "b")[0]
    assert (row.shard, row.lower, row.upper, row.path, row.rows, row.bytes, row.min_ts, row.max_ts) == \
        ("b", 0, 10, "b/1", 3, 30, 0, 9)


def test_upper_at_or_beyond_the_description_is_a_no_op(abc):
    conn = abc
    d = D(0, 10)
    appends = [Append("a", d, (part("a/1"),)), Append("b", d, (part("b/1"),))]
    compare_and_append(conn, appends)
    before = state(conn)
    out = compare_and_append(conn, appends)  # the same append, retried
    assert [(o.status, o.upper) for o in out] == [("already_present", 10)] * 2
    out = compare_and_append(conn, [Append("a", D(0, 7), (part("a/other"),))])  # a shorter replay
    assert [(o.status, o.upper) for o in out] == [("already_present", 10)]
    assert state(conn) == before


def test_upper_inside_the_description_fails_and_changes_no_shard(abc):
    conn = abc
    compare_and_append(conn, [Append(s, D(0, 10), (part(f"{s}/1"),)) for s in "abc"])
    before = state(conn)
    with pytest.raises(UpperMismatch) as e:
        compare_and_append(conn, [Append("a", D(10, 20), (part("a/2"),)),  # fine on its own ...
                                  Append("b", D(5, 20), (part("b/2"),)),  # ... but b moved part of the way
                                  Append("c", D(10, 20))])
    assert type(e.value) is UpperMismatch
    assert (e.value.shard, e.value.expected, e.value.actual) == ("b", 5, 10)
    assert str(e.value).startswith("shard b: upper is 10, append expected 5 (another writer advanced it")
    assert state(conn) == before  # nothing changed in any shard
    out = compare_and_append(conn, [Append("a", D(10, 20), (part("a/2"),))])  # the connection is fine
    assert out[0].status == "appended"


def test_upper_behind_the_description_fails_loudly_and_changes_no_shard(abc):
    conn = abc
    before = state(conn)
    with pytest.raises(ShardModified) as e:
        compare_and_append(conn, [Append("a", D(0, 10), (part("a/1"),)), Append("c", D(15, 20))])
    assert (e.value.shard, e.value.expected, e.value.actual) == ("c", 15, 0)
    assert "modified under us" in str(e.value)
    assert state(conn) == before


def test_several_appends_to_one_shard_chain_in_order(abc):
    conn = abc
    out = compare_and_append(conn, [Append("a", D(0, 5), (part("a/1"),)), Append("a", D(5, 9), (part("a/2"),))])
    assert [o.status for o in out] == ["appended", "appended"]
    assert state(conn, "a") == {"a": (9, ["a/1", "a/2"])}


def test_a_part_belongs_to_one_batch(abc):
    conn = abc
    compare_and_append(conn, [Append("a", D(0, 10), (part("x/1"),))])
    before = state(conn)
    with pytest.raises(PartAlreadyReferenced, match="part x/1 is already referenced by a batch of shard a") as e:
        compare_and_append(conn, [Append("c", D(0, 10)), Append("b", D(0, 10), (part("x/1"),))])
    assert (e.value.shard, e.value.path, e.value.referenced_by) == ("b", "x/1", "a")
    with pytest.raises(PartAlreadyReferenced, match="another part of the same append"):
        compare_and_append(conn, [Append("b", D(0, 10), (part("x/2"),)), Append("c", D(0, 10), (part("x/2"),))])
    assert state(conn) == before


def test_parts_are_checked_before_anything_happens(abc):
    conn = abc
    for bad in (part("a/1", 1, 10, 10), part("a/1", 1, None, 12), part("a/1", 1, 5, 3), part("/abs"),
                part("../up"), Part("a/1", -1, 0)):
        with pytest.raises(ValueError):
            compare_and_append(conn, [Append("a", D(0, 10), (bad,))])
    with pytest.raises(UnknownShard):
        compare_and_append(conn, [Append("a", D(0, 10)), Append("zz", D(0, 10))])
    assert compare_and_append(conn, []) == []
    assert state(conn) == {s: (0, []) for s in "abc"}


def test_batches_as_of(abc):
    conn = abc
    compare_and_append(conn, [Append("a", D(0, 10), (part("a/1"), part("a/0")))])
    compare_and_append(conn, [Append("a", D(10, 20), (part("a/2"),))])
    compare_and_append(conn, [Append("a", D(20, 21))])
    assert [b.path for b in batches(conn, "a")] == ["a/0", "a/1", "a/2"]
    assert [b.path for b in batches(conn, "a", as_of=0)] == ["a/0", "a/1"]
    assert [b.path for b in batches(conn, "a", as_of=9)] == ["a/0", "a/1"]
    assert [b.path for b in batches(conn, "a", as_of=10)] == ["a/0", "a/1", "a/2"]
    assert [b.path for b in batches(conn, "a", as_of=20)] == ["a/0", "a/1", "a/2"]
    with pytest.raises(BeyondUpper, match="time 21 is not complete yet \\(upper is 21\\)"):
        batches(conn, "a", as_of=21)
    advance_since(conn, "a", 10)
    with pytest.raises(SinceViolation) as e:
        batches(conn, "a", as_of=9)
    assert (e.value.name, e.value.requested, e.value.since) == ("a", 9, 10)
    assert batches(conn, "b") == []
    with pytest.raises(BeyondUpper):
        batches(conn, "b", as_of=0)  # nothing is complete yet
    with pytest.raises(UnknownShard):
        batches(conn, "zz")


def test_read_holds_bound_since(abc):
    conn = abc
    compare_and_append(conn, [Append("a", D(0, 100))])
    h = acquire_read_hold(conn, "a", "sink_1", 40)
    assert (h.shard, h.holder, h.ts) == ("a", "sink_1", 40)
    acquire_read_hold(conn, "a", "query", 70)
    assert [(x.holder, x.ts) for x in read_holds(conn, "a")] == [("query", 70), ("sink_1", 40)]
    assert advance_since(conn, "a", 90) == 40  # the oldest hold wins
    assert downgrade_read_hold(conn, "a", "sink_1", 30).ts == 40  # a hold only moves forward
    assert advance_since(conn, "a", 90) == 40
    assert downgrade_read_hold(conn, "a", "sink_1", 80).ts == 80
    assert advance_since(conn, "a", 90) == 70
    assert advance_since(conn, "a", 20) == 70  # since never goes backwards
    with pytest.raises(SinceViolation) as e:
        acquire_read_hold(conn, "a", "late", 69)
    assert (e.value.requested, e.value.since) == (69, 70)
    assert release_read_hold(conn, "a", "query") and release_read_hold(conn, "a", "sink_1")
    assert not release_read_hold(conn, "a", "sink_1")
    with pytest.raises(UnknownReadHold):
        downgrade_read_hold(conn, "a", "sink_1", 99)
    assert advance_since(conn, "a", 500) == 100  # never beyond the upper
    assert shard_info(conn, "a") == ShardInfo("a", 100, 100, None, 0)
    assert read_holds(conn, "b") == []
    with pytest.raises(UnknownShard):
        advance_since(conn, "zz", 1)


def test_appends_inside_a_callers_transaction(abc):
    """With a caller's transaction around them, appends nest (savepoints) and commit together."""
    conn = abc
    with conn.transaction():
        compare_and_append(conn, [Append("a", D(0, 10))])
        with pytest.raises(UpperMismatch):
            compare_and_append(conn, [Append("b", D(0, 10)), Append("a", D(5, 15))])
        compare_and_append(conn, [Append("b", D(0, 10))])
    assert [shard_info(conn, s).upper for s in "abc"] == [10, 10, 0]


def test_the_unique_index_backs_up_the_part_check_under_concurrency(abc, db):
    """Two appends race with the same path: the second cannot see the first's uncommitted row in its
    check, so it waits on the unique index and then fails, typed, changing nothing."""
    conn = abc
    errors: list[BaseException] = []

    def ours() -> None:
        try:
            compare_and_append(conn, [Append("b", D(0, 10), (part("x/1"),))])
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    with connect(db) as other, other.transaction():
        compare_and_append(other, [Append("a", D(0, 10), (part("x/1"),))])
        t = threading.Thread(target=ours)
        t.start()
        t.join(0.5)  # blocked on the index until the other transaction commits
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], PartAlreadyReferenced), errors
    assert "x/1 is already referenced by a batch that a concurrent append just committed" in str(errors[0])
    assert state(conn) == {"a": (10, ["x/1"]), "b": (0, []), "c": (0, [])}


def test_a_read_at_a_wrong_time_or_of_an_unknown_collection_says_what_is_wrong(conn, tmp_path):
    """Typed errors a user can act on, never a bare ValueError or a raw SQL error."""
    from reclock.errors import NothingComplete, UnknownShard
    from reclock.persist.blob import LocalBlobStore
    from reclock.read import read_as_of

    store = LocalBlobStore(tmp_path)
    register_shard(conn, "a")
    with pytest.raises(NothingComplete, match="a: nothing is complete yet"):
        read_as_of(conn, store, "a")
    compare_and_append(conn, [Append("a", D(0, 10), ())])
    with pytest.raises(BeyondUpper, match=r"a: time 10 is not complete yet \(upper is 10\); read at most 9"):
        read_as_of(conn, store, "a", 10)
    assert read_as_of(conn, store, "a", 9).num_rows == 0
    with pytest.raises(UnknownShard, match="shard nosuch: not registered"):
        read_as_of(conn, store, "nosuch")


@pytest.mark.parametrize("server, session", [("off", "on"), ("local", "local"), ("remote_apply", "remote_apply")])
def test_a_persist_session_flushes_its_commits_whatever_the_server_says(db, server, session):
    """A commit acknowledged unflushed (``synchronous_commit = off``, as the test cluster runs) is forgotten
    by a crash; a persist session turns it on, and keeps the levels that flush anyway."""
    import psycopg

    role = psycopg.conninfo.conninfo_to_dict(db)["user"]
    with psycopg.connect(db, autocommit=True) as admin:
        admin.execute(f"ALTER ROLE \"{role}\" SET synchronous_commit = '{server}'")
    try:
        with connect(db) as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == session
    finally:
        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute(f'ALTER ROLE "{role}" RESET synchronous_commit')


def test_a_source_has_one_write_lock_holder_and_a_dead_holder_releases_it(db):
    """``WriteLock``: one holder per source at a time (another source's is its own); release frees it; a
    process that dies holding it (SIGKILL: no release) frees it with its connection, so the next writer knows
    no live writer of the source is writing (``reclock.spark.orphans``)."""
    import subprocess
    import sys

    from reclock.persist.shards import WriteLock

    first, second, other = WriteLock(db, "orders"), WriteLock(db, "orders"), WriteLock(db, "items")
    assert first.take() and first.take()  # held: taking again says so
    assert not second.take() and other.take()
    first.release()
    assert second.take()
    second.release()
    other.release()

    holder = subprocess.Popen([sys.executable, "-c", "import sys; from reclock.persist.shards import WriteLock; "
                               "lock = WriteLock(sys.argv[1], 'orders'); assert lock.take(); "
                               "print('held', flush=True); sys.stdin.read()", db], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not first.take(), "a live holder in another process"
        holder.kill()
        holder.wait(30)
        for _ in range(50):  # the server notices the closed connection at once; a moment to be sure
            if first.take():
                break
            time.sleep(0.1)
        assert first.take(), "the dead holder's lock was not released"
    finally:
        holder.kill()
        first.release()
