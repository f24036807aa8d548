"""Laws of bindings, minting, reclocking, the inverse ``source_upper_at`` and compaction."""

from __future__ import annotations

from itertools import groupby

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reclock import remap
from reclock.remap import Binding, RemapCollection
from reclock.time import PartitionedFrontier
from strategies import (compacted_collections, covers_anything, frontiers, partitions, records,
                        remap_collections, uncovered_records)

now = st.integers(min_value=0, max_value=500)
any_collection = st.one_of(remap_collections(), compacted_collections())
F = PartitionedFrontier.of


def collection(*bindings: tuple[int, dict[int, int]]) -> RemapCollection:
    rc = RemapCollection("s")
    for ts, f in bindings:
        rc = remap.append(rc, Binding(ts, F(f)))
    return rc


# -- well-formedness ------------------------------------------------------------------------------------

@given(any_collection)
def test_generated_and_compacted_collections_are_valid(rc):
    remap.validate(rc)


@pytest.mark.parametrize("rc, message", [
    (RemapCollection("s", (), since=5, upper=4), "beyond upper"),
    (RemapCollection("s", (Binding(3, F({})),), since=5, upper=10), "outside"),
    (RemapCollection("s", (Binding(10, F({})),), since=0, upper=10), "outside"),
    (RemapCollection("s", (Binding(3, F({})), Binding(3, F({0: 1}))), upper=10), "strictly increase"),
    (RemapCollection("s", (Binding(4, F({})), Binding(3, F({0: 1}))), upper=10), "strictly increase"),
    (RemapCollection("s", (Binding(3, F({0: 2})), Binding(4, F({0: 1, 1: 5}))), upper=10), "backwards"),
])
def test_validate_rejects_with_a_clear_message(rc, message):
    with pytest.raises(ValueError, match=message):
        remap.validate(rc)


def test_empty_collection():
    rc = RemapCollection("s")
    remap.validate(rc)
    assert remap.last_frontier(rc) == PartitionedFrontier()
    assert remap.reclock(rc, 0, 0) is None
    assert remap.reclock_ranges(rc, 0) == []
    assert remap.source_upper_at(rc, 100) == PartitionedFrontier()
    assert remap.progress_rows(rc) == []
    assert remap.next_binding_ts(rc, 7) == 7


# -- minting and appending ------------------------------------------------------------------------------

@given(any_collection, now)
def test_next_binding_ts_never_backwards_never_closed(rc, t):
    ts = remap.next_binding_ts(rc, t)
    assert ts >= t and ts >= rc.upper
    assert all(ts > b.ts for b in rc.bindings)
    assert ts == max(t, rc.upper, *(b.ts + 1 for b in rc.bindings[-1:]))


@given(any_collection, now, frontiers)
def test_mint_is_monotone_and_never_in_the_past(rc, t, upstream):
    b = remap.mint(rc, t, upstream)
    if b is None:  # only when upstream did not move past the newest binding
        assert rc.bindings and upstream.less_equal(rc.bindings[-1].frontier)
        return
    assert b.ts == remap.next_binding_ts(rc, t)
    assert b.ts >= t and b.ts >= rc.upper  # never backwards, never at a closed time
    assert b.frontier == remap.last_frontier(rc).join(upstream)  # a stale partition never moves back
    if rc.bindings:
        assert b.ts > rc.bindings[-1].ts
        assert rc.bindings[-1].frontier.less_than(b.frontier)
    after = remap.append(rc, b)
    remap.validate(after)
    assert after.bindings[:-1] == rc.bindings  # definite: earlier bindings never change
    assert (after.source, after.since, after.upper) == (rc.source, rc.since, b.ts + 1)


@given(any_collection, st.lists(st.tuples(now, frontiers), max_size=5), st.data())
def test_definite_reclocked_times_never_change_as_bindings_are_appended(rc, probes, data):
    assume(covers_anything(rc))
    p, o = data.draw(records(rc))
    before = remap.reclock(rc, p, o)
    for t, upstream in probes:
        b = remap.mint(rc, t, upstream)
        if b is not None:
            rc = remap.append(rc, b)
        assert remap.reclock(rc, p, o) == before


def test_first_binding_is_minted_even_for_an_empty_upstream():
    rc = RemapCollection("s")
    b = remap.mint(rc, 1000, PartitionedFrontier())
    assert b == Binding(1000, PartitionedFrontier())
    rc = remap.append(rc, b)
    assert rc.upper == 1001
    assert remap.mint(rc, 2000, PartitionedFrontier()) is None  # nothing moved since
    assert remap.progress_rows(rc) == []  # an empty snapshot exposes no progress rows


def test_first_binding_takes_the_whole_initial_snapshot_at_one_time():
    rc = RemapCollection("s")
    b = remap.mint(rc, 1000, F({0: 40, 1: 7}))
    rc = remap.append(rc, b)
    assert {remap.reclock(rc, p, o) for p, top in ((0, 40), (1, 7)) for o in range(top)} == {1000}


def test_mint_never_moves_a_partition_backwards():
    rc = collection((10, {0: 5, 1: 5}))
    b = remap.mint(rc, 5, F({0: 3, 1: 9}))  # stale on 0, clock behind
    assert b == Binding(11, F({0: 5, 1: 9}))
    assert remap.mint(rc, 50, F({0: 3, 1: 5})) is None  # only went backwards: nothing to bind
    with pytest.raises(ValueError, match="backwards"):
        remap.append(rc, Binding(20, F({0: 4})))
    with pytest.raises(ValueError, match="below the remap upper"):
        remap.append(rc, Binding(10, F({0: 9})))


# -- reclocking -----------------------------------------------------------------------------------------

def _lookup(ranges: list[tuple[int, int, int]], o: int) -> int | None:
    hits = [ts for s, e, ts in ranges if s <= o < e]
    assert len(hits) <= 1
    return hits[0] if hits else None


@given(any_collection, st.data())
def test_reclock_is_the_least_covering_binding(rc, data):
    assume(covers_anything(rc))
    p, o = data.draw(records(rc))
    t = remap.reclock(rc, p, o)
    assert t == min(b.ts for b in rc.bindings if b.frontier.covers(p, o))


@given(any_collection, st.data())
def test_uncovered_records_have_no_time_yet(rc, data):
    p, o = data.draw(uncovered_records(rc))
    assert remap.reclock(rc, p, o) is None


@settings(max_examples=200)
@given(any_collection, partitions, st.lists(st.integers(0, 500), max_size=10))
def test_reclock_agrees_with_reclock_ranges(rc, p, extra):
    ranges = remap.reclock_ranges(rc, p)
    # contiguous from 0 up to the newest frontier, non-empty, in increasing ts
    assert [s for s, _, _ in ranges] == ([0] + [e for _, e, _ in ranges])[:len(ranges)]
    assert all(s < e for s, e, _ in ranges)
    assert [ts for _, _, ts in ranges] == sorted({ts for _, _, ts in ranges})
    assert (ranges[-1][1] if ranges else 0) == remap.last_frontier(rc).get(p)
    probes = {o for s, e, _ in ranges for o in (s, e - 1, e)} | set(extra)
    for o in probes:
        assert remap.reclock(rc, p, o) == _lookup(ranges, o)


@given(any_collection, st.data(), frontiers)
def test_local_bindings_on_other_partitions_never_change_a_time(rc, data, other):
    assume(covers_anything(rc))
    p, o = data.draw(records(rc))
    before = remap.reclock(rc, p, o)
    # a later binding that moves only other partitions (including brand-new ones)
    moved = F({q: v for q, v in other.as_dict().items() if q != p})
    b = remap.mint(rc, rc.upper, moved)
    if b is not None:
        assert remap.reclock(remap.append(rc, b), p, o) == before
    # and the answer is a function of this partition's offsets alone: drop every other partition
    alone = RemapCollection(rc.source, tuple(Binding(x.ts, F({p: x.frontier.get(p)})) for x in rc.bindings),
                            rc.since, rc.upper)
    assert remap.reclock(alone, p, o) == before
    assert remap.reclock_ranges(alone, p) == remap.reclock_ranges(rc, p)


def test_a_partition_appearing_later():
    rc = collection((10, {0: 5}), (20, {0: 5, 1: 3}), (30, {0: 8, 1: 3}))
    assert remap.reclock(rc, 0, 4) == 10 and remap.reclock(rc, 0, 5) == 30
    assert remap.reclock(rc, 1, 0) == 20 and remap.reclock(rc, 1, 3) is None
    assert remap.reclock_ranges(rc, 0) == [(0, 5, 10), (5, 8, 30)]
    assert remap.reclock_ranges(rc, 1) == [(0, 3, 20)]
    assert remap.reclock_ranges(rc, 2) == []
    assert remap.source_upper_at(rc, 20) == F({0: 5})
    assert remap.source_upper_at(rc, 21) == F({0: 5, 1: 3})
    with pytest.raises(ValueError):
        remap.reclock(rc, 0, -1)


# -- the inverse: source_upper_at -----------------------------------------------------------------------

@settings(max_examples=200)
@given(any_collection, st.data(), st.integers(min_value=0, max_value=300))
def test_source_upper_at_round_trip(rc, data, t):
    """r < t  iff  source_upper_at(rc, t) covers the record -- on compacted collections too."""
    assume(covers_anything(rc))
    p, o = data.draw(records(rc))
    r = remap.reclock(rc, p, o)
    assert (r < t) == remap.source_upper_at(rc, t).covers(p, o)
    q, u = data.draw(uncovered_records(rc))
    assert not remap.source_upper_at(rc, t).covers(q, u)


@given(any_collection, st.integers(0, 300), st.integers(0, 300))
def test_source_upper_at_is_monotone(rc, t1, t2):
    t1, t2 = sorted((t1, t2))
    assert remap.source_upper_at(rc, t1).less_equal(remap.source_upper_at(rc, t2))
    assert remap.source_upper_at(rc, max(rc.upper, t2)) == remap.last_frontier(rc)


# -- compaction -----------------------------------------------------------------------------------------

@settings(max_examples=200)
@given(remap_collections(), st.data())
def test_compaction_laws(rc, data):
    assume(rc.bindings)
    since = data.draw(st.integers(min_value=0, max_value=rc.upper - 1))
    c = remap.compact(rc, since)
    remap.validate(c)
    assert (c.source, c.since, c.upper) == (rc.source, since, rc.upper)
    # exact for every t > since ...
    for t in range(since + 1, rc.upper + 2):
        assert remap.source_upper_at(c, t) == remap.source_upper_at(rc, t)
    # ... and the minimum frontier for every t <= since: all of it was advanced to since
    for t in {0, since // 2, since}:
        assert remap.source_upper_at(c, t) == PartitionedFrontier()
        assert remap.source_upper_at(c, t).less_equal(remap.source_upper_at(rc, t))
    # at t == since it is still the original answer exactly when nothing below since held data
    below = [b for b in rc.bindings if b.ts < since]
    assert (remap.source_upper_at(c, since) == remap.source_upper_at(rc, since)) == \
        all(b.frontier.is_minimum() for b in below)
    # reclocked times advance to since, and no further
    for p in range(6):
        for s, e, _ in remap.reclock_ranges(rc, p):
            for o in (s, e - 1):
                assert remap.reclock(c, p, o) == max(remap.reclock(rc, p, o), since)
        top = remap.last_frontier(rc).get(p)
        assert remap.reclock(c, p, top) is None
    # bounded state
    newer = [b for b in rc.bindings if b.ts > since]
    assert len(c.bindings) <= len(newer) + 1
    assert c.bindings[len(c.bindings) - len(newer):] == tuple(newer)  # later bindings unchanged
    assert all(b.ts >= since for b in c.bindings)
    # never backwards, idempotent, and compacting in steps is compacting at once
    assert remap.compact(c, since) is c
    assert remap.compact(c, max(0, since - 1)) is c
    later = data.draw(st.integers(min_value=since, max_value=rc.upper - 1))
    assert remap.compact(c, later) == remap.compact(rc, later)


def test_compaction_collapses_into_one_binding_at_since():
    rc = collection((10, {0: 5}), (20, {0: 9, 1: 2}), (30, {0: 12, 1: 2}))
    c = remap.compact(rc, 25)
    assert c.bindings == (Binding(25, F({0: 9, 1: 2})), rc.bindings[2])
    assert remap.progress_rows(c) == [(25, 0, 9), (25, 1, 2), (30, 0, 12), (30, 1, 2)]
    assert remap.reclock(c, 0, 0) == 25 and remap.reclock(c, 0, 10) == 30
    assert remap.source_upper_at(c, 25) == PartitionedFrontier()  # the t == since edge
    assert remap.source_upper_at(c, 26) == remap.source_upper_at(rc, 26) == F({0: 9, 1: 2})
    # compacting below the first binding keeps every binding, only since moves
    assert remap.compact(rc, 5) == RemapCollection("s", rc.bindings, 5, rc.upper)
    # compacting exactly onto a binding keeps it where it is
    assert remap.compact(rc, 20).bindings == (Binding(20, F({0: 9, 1: 2})), rc.bindings[2])


def test_compaction_to_the_upper():
    rc = collection((10, {0: 5}), (20, {0: 9}))
    assert remap.compact(rc, rc.upper - 1).bindings == (Binding(20, F({0: 9})),)  # the last readable time
    with pytest.raises(ValueError, match="below the remap upper"):
        remap.compact(rc, rc.upper)  # the last complete time must stay readable
    with pytest.raises(ValueError, match="beyond the remap upper"):
        remap.compact(rc, rc.upper + 1)
    # nothing bound yet: since may reach the upper (since == upper), and no further
    empty = remap.compact(RemapCollection("s", upper=5), 5)
    assert (empty.since, empty.upper, empty.bindings) == (5, 5, ())
    remap.validate(empty)
    with pytest.raises(ValueError):
        remap.compact(empty, 6)
    # the first binding after that lands at or past since
    b = remap.mint(empty, 0, F({0: 3}))
    assert b == Binding(5, F({0: 3}))
    remap.validate(remap.append(empty, b))


# -- the progress relation ------------------------------------------------------------------------------

@given(any_collection)
def test_progress_rows_give_back_the_frontiers(rc):
    rows = remap.progress_rows(rc)
    assert rows == sorted(rows)
    by_ts = {ts: F((p, o) for _, p, o in grp) for ts, grp in groupby(rows, key=lambda r: r[0])}
    assert by_ts == {b.ts: b.frontier for b in rc.bindings if not b.frontier.is_minimum()}


@given(remap_collections(), st.integers(0, 2000), st.integers(0, 5000))
def test_advancing_the_upper_changes_no_answer_and_no_binding(rc, extra, now):
    adv = remap.advance_upper(rc, rc.upper + extra)
    assert (adv.bindings, adv.since, adv.upper) == (rc.bindings, rc.since, rc.upper + extra)
    assert remap.advance_upper(adv, rc.upper) == adv  # never backwards
    for t in range(0, rc.upper + extra + 2, max(1, (rc.upper + extra) // 20)):
        assert remap.source_upper_at(adv, t) == remap.source_upper_at(rc, t)
    assert remap.next_binding_ts(adv, now) >= adv.upper
    remap.validate(adv)
