"""Laws of the S3 source's frontier (``reclock.sources.s3.frontier``): a lattice, pointwise over object ids
with sealed ids at WHOLE, its ranges exact, its rows a faithful encoding, its size bounded by open objects."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.sources.s3.frontier import (SEALED_ROW, WHOLE, BoundRange, ObjectFrontier, ObjectRange, bound_ranges, from_rows,
                                         to_rows)

ids = st.integers(min_value=0, max_value=12)
offsets = st.integers(min_value=0, max_value=60)
intervals = st.lists(st.tuples(ids, st.integers(min_value=0, max_value=4)).map(lambda t: (t[0], t[0] + t[1])),
                     max_size=4)
frontiers = st.builds(ObjectFrontier.of, intervals, st.dictionaries(ids, offsets, max_size=6))
SIZES = {i: 60 + 7 * i for i in range(20)}  # every object is at least as long as any open offset drawn


def size_of(i: int) -> int:
    return SIZES[i]


@given(frontiers, frontiers, frontiers)
def test_lattice_laws(a, b, c):
    assert a.meet(b) == b.meet(a) and a.join(b) == b.join(a)
    assert a.meet(b.meet(c)) == a.meet(b).meet(c)
    assert a.join(b.join(c)) == a.join(b).join(c)
    assert a.meet(a) == a and a.join(a) == a
    assert a.meet(a.join(b)) == a and a.join(a.meet(b)) == a
    assert a.less_equal(b) == (a.meet(b) == a) == (a.join(b) == b)
    if c.less_equal(a) and c.less_equal(b):
        assert c.less_equal(a.meet(b))
    if a.less_equal(c) and b.less_equal(c):
        assert a.join(b).less_equal(c)


@given(frontiers, frontiers, frontiers)
def test_partial_order(a, b, c):
    assert a.less_equal(a) and not a.less_than(a)
    if a.less_equal(b) and b.less_equal(a):
        assert a == b
    if a.less_equal(b) and b.less_equal(c):
        assert a.less_equal(c)


@given(frontiers, frontiers, ids)
def test_pointwise_with_sealed_ids_whole(a, b, i):
    assert a.meet(b).get(i) == min(a.get(i), b.get(i))
    assert a.join(b).get(i) == max(a.get(i), b.get(i))
    if a.less_equal(b):
        assert a.get(i) <= b.get(i)
    assert a.is_sealed(i) == (a.get(i) == WHOLE)
    assert a.covers(i, 10**9) == a.is_sealed(i)


@given(frontiers, st.lists(ids, max_size=5))
def test_seal_moves_forward_and_drops_open_entries(f, sealed):
    g = f.seal(sealed)
    assert f.less_equal(g)
    assert all(g.is_sealed(i) for i in sealed)
    assert all(i not in sealed for i, _ in g.open)


@given(frontiers)
def test_rows_round_trip(f):
    rows = to_rows(f)
    assert from_rows(rows) == f
    assert len({p for p, _ in rows}) == len(rows)  # one row per partition (the remap tables' key)
    assert all(p >= 0 and o > 0 for p, o in rows)  # the tables' checks
    assert len(rows) == len(f.sealed) + len(f.open)


def _bytes(ranges):
    return {(r.id, o) for r in ranges for o in range(r.start, r.end)}


def _covered(f: ObjectFrontier) -> set[tuple[int, int]]:
    return {(i, o) for i in range(20) for o in range(SIZES[i]) if f.covers(i, o)}


@given(frontiers, frontiers, frontiers)
def test_ranges_are_exactly_the_bytes_in_between_and_compose(a, b, c):
    lo, mid, hi = a, a.join(b), a.join(b).join(c)
    ab, bc, ac = mid.ranges_since(lo, size_of), hi.ranges_since(mid, size_of), hi.ranges_since(lo, size_of)
    assert _bytes(ac) == _covered(hi) - _covered(lo)
    assert _bytes(ab) | _bytes(bc) == _bytes(ac) and not _bytes(ab) & _bytes(bc)
    assert [r.id for r in ac] == sorted(r.id for r in ac)


@given(frontiers, frontiers)
def test_ranges_need_an_earlier_frontier(a, b):
    if not a.less_equal(b):
        with pytest.raises(ValueError, match="is not at or before"):
            b.ranges_since(a, size_of)


def test_a_zero_byte_object_sealed_is_an_empty_range():
    f = ObjectFrontier.of([(0, 2)])
    assert f.ranges_since(ObjectFrontier(), {0: 0, 1: 5}.__getitem__) == [ObjectRange(0, 0, 0), ObjectRange(1, 0, 5)]


def test_a_size_below_the_bound_offset_fails():
    with pytest.raises(ValueError, match="below its bound offset"):
        ObjectFrontier.of([(3, 4)]).ranges_since(ObjectFrontier.of(open={3: 10}), lambda i: 5)


@given(st.lists(frontiers, min_size=1, max_size=5), frontiers)
def test_bound_ranges_reclock_each_byte_to_its_least_binding(steps, before):
    chain, f = [], before
    for s in steps:
        f = f.join(s)
        chain.append(f)
    bindings = [(100 + 10 * k, fr) for k, fr in enumerate(chain)]
    got = bound_ranges(bindings, before, size_of)
    ts_of = {(r.id, o): r.ts for r in got for o in range(r.start, r.end)}
    assert len(ts_of) == sum(r.bytes for r in got)  # no byte twice
    for (i, o), ts in ts_of.items():
        assert not before.covers(i, o)
        assert ts == next(t for t, fr in bindings if fr.covers(i, o))
    assert set(ts_of) == _covered(chain[-1]) - _covered(before)
    assert all(isinstance(r, BoundRange) for r in got)


def test_a_thousand_whole_objects_are_one_row():
    f = ObjectFrontier().seal(range(1000))
    assert to_rows(f) == [(0, SEALED_ROW + 1000)]
    g = f.advance({1000: 42}).seal(range(1001, 5000))  # one object still growing between sealed ones
    assert to_rows(g) == [(0, SEALED_ROW + 1000), (1000, 42), (1001, SEALED_ROW + 5000)]
    assert g.next_id() == 5000 and g.sealed_count() == 4999


def test_invalid_values_are_refused():
    with pytest.raises(ValueError, match="object id"):
        ObjectFrontier.of(open={-1: 3})
    with pytest.raises(ValueError, match="byte offset"):
        ObjectFrontier.of(open={1: SEALED_ROW})
    with pytest.raises(ValueError, match="twice"):
        ObjectFrontier((), ((1, 2), (1, 3)))
