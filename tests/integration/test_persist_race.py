"""THE race: many writers, each with its own connection, ``compare_and_append`` the SAME three shards
with the SAME lower at the same moment, round after round -- as threads and as OS processes.

Contender ``i`` asks for ``[lower, lower + 1 + i)`` with parts of its own, and lists the shards in an
order of its own (the shard locks are taken in one fixed order anyway, so nobody deadlocks). Exactly one
contender must win each round; then a loser with a smaller or equal upper sees ``already_present`` (the
winner covered its range) and a loser with a larger one ``UpperMismatch`` carrying the winner's upper.
Every round adds exactly the winner's parts, no batch is lost or doubled, and the three shards agree at
every moment, as seen by an observer reading their uppers throughout.
"""

from __future__ import annotations

import multiprocessing
import random
import threading

from reclock.batch import BatchDescription, Part
from reclock.errors import UpperMismatch
from reclock.persist import connect
from reclock.persist.shards import Append, batches, compare_and_append, register_shard, shard_info

SHARDS = ("r0", "r1", "r2")
ROUNDS = 30
PARTS = 2  # parts per shard per append


def _contend(dsn: str, me: int, rounds: int, same_upper: bool, barrier, results) -> None:
    """Each round: read the common upper, wait for everyone, append to all shards, wait again."""
    rng = random.Random(me)
    with connect(dsn) as conn:
        for rnd in range(rounds):
            lower = shard_info(conn, SHARDS[0]).upper
            desc = BatchDescription(lower, lower + 1 + (0 if same_upper else me))
            shards = list(SHARDS)
            rng.shuffle(shards)
            appends = [Append(s, desc, tuple(Part(f"{s}/{rnd}/{me}/{k}.parquet", 1 + k, 100, lower, lower)
                                             for k in range(PARTS))) for s in shards]
            barrier.wait(60)
            try:
                out = compare_and_append(conn, appends)
                results.append((rnd, me, lower, desc.upper, sorted((o.shard, o.status, o.upper) for o in out)))
            except UpperMismatch as e:
                results.append((rnd, me, lower, desc.upper, [(e.shard, type(e).__name__, e.expected, e.actual)]))
            barrier.wait(60)


def _observe(dsn: str, stop: threading.Event, seen: list) -> None:
    """Read the three uppers in one statement, again and again: one snapshot must never show them apart."""
    with connect(dsn) as conn:
        while not stop.is_set():
            (uppers,) = conn.execute("SELECT array_agg(upper ORDER BY id) FROM reclock.shards WHERE id = ANY(%s)",
                                     (list(SHARDS),)).fetchone()
            seen.append(tuple(uppers))


def _check(dsn: str, results: list, contenders: int, rounds: int, same_upper: bool) -> None:
    with connect(dsn) as conn:
        uppers = [shard_info(conn, s).upper for s in SHARDS]
        rows = {s: batches(conn, s) for s in SHARDS}
    assert len(results) == contenders * rounds
    by_round: dict[int, list] = {}
    for r in results:
        by_round.setdefault(r[0], []).append(r)
    last_upper = 0
    for rnd in range(rounds):
        rs = by_round[rnd]
        assert sorted(r[1] for r in rs) == list(range(contenders))
        assert {r[2] for r in rs} == {last_upper}, rs  # every contender started from the last winner's upper
        winners = [r for r in rs if r[4] == [(s, "appended", r[3]) for s in SHARDS]]
        assert len(winners) == 1, rs  # exactly one wins each round
        _, w, lower, w_upper, _ = winners[0]
        for _, me, _, upper, outcome in rs:
            if me == w:
                continue
            if upper <= w_upper:  # the winner covered this range: a no-op success on every shard
                assert outcome == [(s, "already_present", w_upper) for s in SHARDS], rs
            else:  # the winner moved the shards part of the way: a mismatch carrying the winner's upper
                assert len(outcome) == 1 and outcome[0][1:] == ("UpperMismatch", lower, w_upper), rs
        if same_upper:
            assert all(r[4][0][1] != "UpperMismatch" for r in rs)
        for s in SHARDS:  # the round added exactly the winner's parts, once each, under its description
            added = [(b.path, b.lower, b.upper) for b in rows[s] if b.lower == lower]
            assert added == [(f"{s}/{rnd}/{w}/{k}.parquet", lower, w_upper) for k in range(PARTS)]
        last_upper = w_upper
    assert uppers == [last_upper] * len(SHARDS)  # every shard ends at the last winner's upper
    for s in SHARDS:  # no batch lost or doubled overall
        assert len(rows[s]) == rounds * PARTS
        assert sum(b.rows for b in rows[s]) == rounds * sum(1 + k for k in range(PARTS))


def _run_threads(db: str, contenders: int, rounds: int, same_upper: bool) -> None:
    with connect(db) as conn:
        for s in SHARDS:
            register_shard(conn, s)
    barrier = threading.Barrier(contenders)
    results: list = []
    errors: list[BaseException] = []
    stop, seen = threading.Event(), []

    def contender(me: int) -> None:
        try:
            _contend(db, me, rounds, same_upper, barrier, results)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    observer = threading.Thread(target=_observe, args=(db, stop, seen))
    observer.start()
    threads = [threading.Thread(target=contender, args=(i,)) for i in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    observer.join(30)
    assert errors == []
    _check(db, results, contenders, rounds, same_upper)
    assert seen and all(len(set(u)) == 1 for u in seen)  # the shards always agreed


def test_race_threads(db):
    _run_threads(db, contenders=6, rounds=ROUNDS, same_upper=False)


def test_race_threads_same_description(db):
    """Everyone asks for the same range: one appends, every other sees it already present."""
    _run_threads(db, contenders=6, rounds=10, same_upper=True)


def test_race_processes(db):
    with connect(db) as conn:
        for s in SHARDS:
            register_shard(conn, s)
    n = 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as mgr:
        barrier = ctx.Barrier(n)
        results = mgr.list()
        procs = [ctx.Process(target=_contend, args=(db, i, ROUNDS, False, barrier, results)) for i in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        codes = [p.exitcode for p in procs]
        for p in procs:
            if p.is_alive():
                p.terminate()
        assert codes == [0] * n
        _check(db, list(results), n, ROUNDS, False)
