"""Frontier laws: both frontier kinds are lattices under meet/join with less_equal as the order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.time import MAX_TIMESTAMP, PartitionedFrontier, TotalFrontier, check_timestamp
from strategies import frontiers, offsets, partitions

totals = st.one_of(st.none(), st.integers(min_value=0, max_value=10**6)).map(TotalFrontier)
times = st.integers(min_value=0, max_value=10**6)


# -- PartitionedFrontier: the product of one total order per partition ------------------------------------

@given(frontiers, frontiers, frontiers)
def test_partitioned_lattice_laws(a, b, c):
    assert a.meet(b) == b.meet(a) and a.join(b) == b.join(a)  # commutative
    assert a.meet(b.meet(c)) == a.meet(b).meet(c)  # associative
    assert a.join(b.join(c)) == a.join(b).join(c)
    assert a.meet(a) == a and a.join(a) == a  # idempotent
    assert a.meet(a.join(b)) == a and a.join(a.meet(b)) == a  # absorption
    assert a.meet(b).less_equal(a) and a.meet(b).less_equal(b)  # meet is a lower bound ...
    assert a.less_equal(a.join(b)) and b.less_equal(a.join(b))  # ... join an upper bound
    assert a.less_equal(b) == (a.meet(b) == a) == (a.join(b) == b)  # the order is the lattice's


@given(frontiers, frontiers, frontiers)
def test_meet_is_the_greatest_lower_bound_and_join_the_least_upper_bound(a, b, c):
    if c.less_equal(a) and c.less_equal(b):
        assert c.less_equal(a.meet(b))
    if a.less_equal(c) and b.less_equal(c):
        assert a.join(b).less_equal(c)


@given(frontiers, frontiers, frontiers)
def test_partitioned_order_is_a_partial_order(a, b, c):
    assert a.less_equal(a)  # reflexive
    if a.less_equal(b) and b.less_equal(a):  # antisymmetric
        assert a == b
    if a.less_equal(b) and b.less_equal(c):  # transitive
        assert a.less_equal(c)
    assert a.less_than(b) == (a.less_equal(b) and a != b)
    assert not a.less_than(a)


@given(frontiers, frontiers, partitions)
def test_order_and_lattice_are_pointwise(a, b, p):
    assert a.meet(b).get(p) == min(a.get(p), b.get(p))
    assert a.join(b).get(p) == max(a.get(p), b.get(p))
    if a.less_equal(b):
        assert a.get(p) <= b.get(p)


@given(frontiers, partitions, offsets)
def test_absent_partitions_are_at_zero(f, p, o):
    assert f.covers(p, o) == (o < f.get(p))
    absent = [q for q in range(10) if q not in f.partitions()]
    assert all(f.get(q) == 0 and not f.covers(q, 0) for q in absent)
    assert PartitionedFrontier.of({**f.as_dict(), 99: 0}) == f  # an explicit 0 is the same as absent
    assert PartitionedFrontier().less_equal(f)  # the minimum frontier is below everything
    assert PartitionedFrontier().join(f) == f and PartitionedFrontier().meet(f) == PartitionedFrontier()


@given(frontiers, frontiers)
def test_record_count_since(a, b):
    assert a.record_count_since(a) == 0
    assert a.join(b).record_count_since(a) == b.record_count_since(a.meet(b))
    assert a.join(b).record_count_since(a) == sum(max(0, b.get(p) - a.get(p)) for p in range(6))


def test_partitioned_edge_cases():
    empty = PartitionedFrontier()
    f = PartitionedFrontier.of({0: 5})
    g = PartitionedFrontier.of({1: 3})  # a new partition appears
    assert empty.is_minimum() and not f.is_minimum()
    assert not f.less_equal(g) and not g.less_equal(f)  # incomparable
    assert f.meet(g) == empty  # the new partition is at 0 on the other side, so it drops out
    assert f.join(g) == PartitionedFrontier.of({0: 5, 1: 3})
    assert f.join(g).record_count_since(f) == 3
    assert f.less_than(f.join(g))
    assert PartitionedFrontier.of([(2, 1), (0, 4)]).items == ((0, 4), (2, 1))  # canonical order
    assert str(f.join(g)) == "{0: 5, 1: 3}"
    with pytest.raises(ValueError):
        PartitionedFrontier.of({0: -1})
    with pytest.raises(ValueError):
        PartitionedFrontier.of({-1: 3})
    with pytest.raises(ValueError):
        PartitionedFrontier(((0, 1), (0, 2)))


# -- TotalFrontier: a totally ordered time, the empty frontier on top -------------------------------------

@given(totals, totals, totals)
def test_total_frontier_lattice_laws(a, b, c):
    assert a.meet(b) == b.meet(a) and a.join(b) == b.join(a)
    assert a.meet(b.meet(c)) == a.meet(b).meet(c)
    assert a.join(b.join(c)) == a.join(b).join(c)
    assert a.meet(a) == a and a.join(a) == a
    assert a.meet(a.join(b)) == a and a.join(a.meet(b)) == a
    assert a.less_equal(b) == (a.meet(b) == a) == (a.join(b) == b)


@given(totals, totals, totals)
def test_total_frontier_is_a_total_order(a, b, c):
    assert a.less_equal(b) or b.less_equal(a)  # total
    if a.less_equal(b) and b.less_equal(a):
        assert a == b
    if a.less_equal(b) and b.less_equal(c):
        assert a.less_equal(c)
    assert TotalFrontier.minimum().less_equal(a) and a.less_equal(TotalFrontier.empty())
    assert a.meet(b) in (a, b) and a.join(b) in (a, b)


@given(totals, times)
def test_total_frontier_completeness(f, t):
    assert f.is_complete(t) != f.less_than(t)
    assert f.is_complete(t) == (f.upper is None or t < f.upper)


def test_total_frontier_edges():
    f = TotalFrontier(10)
    assert f.is_complete(9) and not f.is_complete(10) and f.less_than(10)
    assert TotalFrontier.empty().is_complete(MAX_TIMESTAMP) and TotalFrontier.empty().is_empty()
    assert not TotalFrontier.minimum().is_complete(0)
    assert str(TotalFrontier.empty()) == "[]" and str(f) == "[10]"
    with pytest.raises(ValueError):
        TotalFrontier(-1)
    with pytest.raises(ValueError):
        check_timestamp(MAX_TIMESTAMP + 1)
    with pytest.raises(TypeError):
        check_timestamp(True)
    assert check_timestamp(MAX_TIMESTAMP) == MAX_TIMESTAMP
