"""Batch descriptions, the ranges they cover, and splitting a backlog by budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock import remap
from reclock.batch import (BatchDescription, OffsetRange, check_servable, mint_descriptions,
                           ranges_for, split_ranges)
from reclock.remap import Binding, RemapCollection
from reclock.time import PartitionedFrontier
from strategies import compacted_collections, remap_collections

F = PartitionedFrontier.of
budgets = st.integers(min_value=1, max_value=200)
any_collection = st.one_of(remap_collections(), compacted_collections())


def collection(*bindings: tuple[int, dict[int, int]]) -> RemapCollection:
    rc = RemapCollection("s")
    for ts, f in bindings:
        rc = remap.append(rc, Binding(ts, F(f)))
    return rc


def servable(rc: RemapCollection, shard_upper: int) -> bool:
    return shard_upper > rc.since or rc.since == 0 or all(b.ts != rc.since for b in rc.bindings)


def offsets_of(ranges: list[OffsetRange]) -> list[tuple[int, int]]:
    return sorted((r.partition, o) for r in ranges for o in range(r.start, r.end))


# -- mint_descriptions ----------------------------------------------------------------------------------

@settings(max_examples=200)
@given(any_collection, budgets, st.data())
def test_descriptions_are_contiguous_exact_and_within_budget(rc, budget, data):
    candidates = [0, rc.since, rc.since + 1, rc.upper] + [b.ts + d for b in rc.bindings for d in (0, 1)]
    shard_upper = data.draw(st.one_of(st.sampled_from(candidates), st.integers(0, rc.upper + 3)))
    pending = [b for b in rc.bindings if b.ts >= shard_upper]
    if pending and (shard_upper < rc.since or not servable(rc, shard_upper)):
        with pytest.raises(ValueError, match="rebuild the shard"):
            mint_descriptions(shard_upper, rc, budget)
        return
    descs = mint_descriptions(shard_upper, rc, budget)
    if not pending:  # caught up (in particular whenever shard_upper >= rc.upper)
        assert descs == []
        return
    # contiguous
    assert descs[0].lower == shard_upper and descs[-1].upper == pending[-1].ts + 1
    assert all(a.upper == b.lower for a, b in zip(descs, descs[1:]))
    counts = []
    for d in descs:
        inside = [b for b in rc.bindings if d.lower <= b.ts < d.upper]
        assert inside, "every description holds at least one binding"
        assert d.upper == inside[-1].ts + 1
        n = sum(r.count for r in ranges_for(rc, d))
        assert n <= budget or len(inside) == 1  # within budget unless one binding alone exceeds it
        counts.append((n, inside))
    # greedy: a description is never closed while the next binding would still have fitted
    for (n, _), (_, nxt) in zip(counts, counts[1:]):
        first = nxt[0].frontier.record_count_since(remap.source_upper_at(rc, nxt[0].ts))
        assert n + first > budget
    # exact cover: the offsets between the shard's frontier and the newest binding, each once
    covered = offsets_of([r for d in descs for r in ranges_for(rc, d)])
    start = remap.source_upper_at(rc, shard_upper)
    assert covered == sorted((p, o) for p, top in pending[-1].frontier for o in range(start.get(p), top))


@given(remap_collections(), budgets, st.data())
def test_descriptions_and_ranges_are_compaction_invariant(rc, budget, data):
    if not rc.bindings:
        return
    since = data.draw(st.integers(0, rc.upper - 1))
    c = remap.compact(rc, since)
    shard_upper = data.draw(st.integers(since + 1, rc.upper + 1))  # a servable shard: above since
    descs = mint_descriptions(shard_upper, rc, budget)
    assert mint_descriptions(shard_upper, c, budget) == descs
    for d in descs:
        assert ranges_for(c, d) == ranges_for(rc, d)


@given(any_collection, st.data())
def test_ranges_for_holds_exactly_the_records_reclocked_into_the_description(rc, data):
    if not rc.bindings:
        return
    lower = data.draw(st.integers(rc.since, rc.upper - 1))
    if not servable(rc, lower):
        lower += 1
    upper = data.draw(st.integers(lower + 1, rc.upper + 1))
    d = BatchDescription(lower, upper)
    rs = ranges_for(rc, d)
    assert [r.partition for r in rs] == sorted({r.partition for r in rs})
    inside = set(offsets_of(rs))
    for p in range(6):
        for s, e, ts in remap.reclock_ranges(rc, p):
            for o in (s, e - 1):
                assert ((p, o) in inside) == (lower <= ts < upper)


def test_description_edges():
    empty = RemapCollection("s")
    assert mint_descriptions(0, empty, 10) == []
    first = collection((0, {0: 5}))
    check_servable(first, 0)  # a shard at 0 with since 0 and a binding at 0 is the normal start
    assert mint_descriptions(0, first, 10) == [BatchDescription(0, 1)]
    rc = collection((10, {0: 5}), (20, {0: 9}), (30, {0: 30, 1: 10}), (40, {0: 31, 1: 10}))
    assert mint_descriptions(0, rc, 10) == [BatchDescription(0, 21), BatchDescription(21, 31),
                                            BatchDescription(31, 41)]  # the 31-offset binding alone
    assert mint_descriptions(0, rc, 1000) == [BatchDescription(0, 41)]
    assert mint_descriptions(15, rc, 1000) == [BatchDescription(15, 41)]
    assert ranges_for(rc, BatchDescription(15, 41)) == [OffsetRange(0, 5, 31), OffsetRange(1, 0, 10)]
    assert mint_descriptions(41, rc, 10) == [] and mint_descriptions(99, rc, 10) == []
    with pytest.raises(ValueError, match="positive"):
        mint_descriptions(0, rc, 0)


def test_a_shard_at_or_behind_the_remap_since_cannot_be_served():
    rc = collection((10, {0: 5}), (20, {0: 9}))
    compacted = remap.compact(rc, 15)
    with pytest.raises(ValueError, match="below the remap since 15"):
        mint_descriptions(0, compacted, 10)
    assert mint_descriptions(16, compacted, 10) == mint_descriptions(16, rc, 10)
    # the t == since edge: the binding at since holds data from below since the shard may already have
    onto = remap.compact(rc, 20)
    with pytest.raises(ValueError, match="equals the remap since 20"):
        mint_descriptions(20, onto, 10)
    # no binding at since: nothing was advanced there, so a shard exactly at since is served
    before = remap.compact(rc, 5)
    assert mint_descriptions(5, before, 10) == mint_descriptions(5, rc, 10)


# -- split_ranges ----------------------------------------------------------------------------------

ranges = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 100), st.integers(1, 100)), max_size=6,
                  unique_by=lambda t: t[0]).map(lambda ts: [OffsetRange(p, s, s + n) for p, s, n in ts])


@settings(max_examples=200)
@given(ranges, st.integers(min_value=1, max_value=60), st.randoms(use_true_random=False))
def test_split_covers_exactly_within_bound(rs, budget, rnd):
    slices = split_ranges(rs, budget)
    assert all(sl and sum(r.count for r in sl) <= budget for sl in slices)  # no empty slice, bounded
    assert all(sum(r.count for r in sl) == budget for sl in slices[:-1])  # packed
    assert offsets_of([r for sl in slices for r in sl]) == offsets_of(rs)  # exact cover
    total = sum(r.count for r in rs)
    assert len(slices) == -(-total // budget)
    assert split_ranges(rs, budget) == slices  # deterministic
    shuffled = list(rs)
    rnd.shuffle(shuffled)
    assert split_ranges(shuffled, budget) == slices  # whatever order the ranges come in


def test_split_edges():
    assert split_ranges([], 10) == []
    assert split_ranges([OffsetRange(0, 0, 25)], 10) == [[OffsetRange(0, 0, 10)], [OffsetRange(0, 10, 20)],
                                                         [OffsetRange(0, 20, 25)]]
    assert split_ranges([OffsetRange(1, 0, 3), OffsetRange(0, 5, 9)], 5) == [
        [OffsetRange(0, 5, 9), OffsetRange(1, 0, 1)], [OffsetRange(1, 1, 3)]]
    with pytest.raises(ValueError, match="positive"):
        split_ranges([OffsetRange(0, 0, 1)], 0)
    for bad in ((0, 5, 5), (0, 6, 5), (0, -1, 5), (-1, 0, 5)):
        with pytest.raises(ValueError):
            OffsetRange(*bad)


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(1, 100), st.none() | st.integers(1, 6))
def test_pack_keeps_every_item_once_in_order_within_the_limits(weights, max_weight, max_items):
    from reclock.batch import pack

    items = list(enumerate(weights))
    runs = pack(items, lambda i: i[1], max_weight, max_items)
    assert [i for run in runs for i in run] == items
    for run in runs:
        assert run, "no run is empty"
        assert len(run) == 1 or sum(w for _, w in run) <= max_weight  # a heavier item alone
        assert max_items is None or len(run) <= max_items
    for a, b in zip(runs, runs[1:]):  # a run closes only when the next item would not fit
        assert sum(w for _, w in a) + b[0][1] > max_weight or (max_items is not None and len(a) == max_items)
