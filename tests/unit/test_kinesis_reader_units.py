"""Laws of cutting a description's Kinesis ranges into counted units, read tasks and slices."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.sources.kinesis.lineage import FINISHED, Segment, ShardInfo
from reclock.sources.kinesis.reader import (CountsMissing, RangeLost, Unit, parse_lost, plan_tasks, segment_path,
                                            slices, units_for)


@st.composite
def chains(draw):
    """A shard's records (sparse sequence numbers) and several scans' segments over them: scans from
    different positions with different strides, as racing and later mints leave them."""
    seqs = sorted(draw(st.sets(st.integers(10 ** 50, 10 ** 50 + 10 ** 6), min_size=1, max_size=40)))
    positions = [0] + [s + 1 for s in seqs]
    segs = set()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(positions) - 2))
        stride = draw(st.integers(1, 7))
        j = draw(st.integers(i + 1, len(positions) - 1))
        pts = list(range(i, j, stride)) + [j]
        for a, b in zip(pts, pts[1:]):
            segs.add(Segment(0, positions[a], positions[b], b - a))
    # the winning scans (whose tips became bindings) from 0 to the end, with strides of their own: a chain
    # always joins two binding positions
    bound = [0]
    while bound[-1] < len(positions) - 1:
        stride = draw(st.integers(1, 7))
        tip = draw(st.integers(bound[-1] + 1, len(positions) - 1))
        pts = list(range(bound[-1], tip, stride)) + [tip]
        for a, b in zip(pts, pts[1:]):
            segs.add(Segment(0, positions[a], positions[b], b - a))
        bound.append(tip)
    return seqs, [positions[i] for i in bound], sorted(segs, key=lambda s: (s.start, s.stop))


@settings(max_examples=200, deadline=None)
@given(chains(), st.data())
def test_any_chain_counts_exactly(chain, data):
    seqs, bound, segs = chain
    a = data.draw(st.sampled_from(bound[:-1]))
    b = data.draw(st.sampled_from([p for p in bound if p > a]))
    path = segment_path(segs, a, b)
    assert path[0].start == a and path[-1].stop == b
    assert all(x.stop == y.start for x, y in zip(path, path[1:]))
    assert sum(s.records for s in path) == len([s for s in seqs if a <= s < b])


def test_no_chain_is_an_error():
    segs = [Segment(0, 0, 10, 3), Segment(0, 20, 30, 1)]
    with pytest.raises(CountsMissing):
        segment_path(segs, 0, 30)
    assert segment_path(segs, 5, 5) == []


def test_units_follow_bindings_and_points_and_skip_empty_stretches():
    segs = {1: [Segment(1, 0, 100, 4), Segment(1, 100, 150, 2), Segment(1, 150, FINISHED, 0)],
            2: [Segment(2, 0, 500, 0), Segment(2, 500, 600, 3)]}
    ranges = {1: [(0, 100, 7), (100, FINISHED, 8)], 2: [(0, 500, 8), (500, 600, 9)]}
    assert units_for(ranges, segs) == [Unit(1, 0, 100, 4, 7), Unit(1, 100, 150, 2, 8), Unit(2, 500, 600, 3, 9)]


@given(st.lists(st.integers(1, 30), min_size=1, max_size=30), st.integers(1, 60), st.integers(1, 100))
def test_tasks_and_slices_hold_every_unit_once_within_their_budgets(sizes, task_records, max_records):
    units, pos = [], 0
    for i, n in enumerate(sizes):
        shard = i % 3 if i % 5 else 0
        units.append(Unit(shard, pos, pos + 10, n, 1000 + i))
        pos += 10
    infos = {n: ShardInfo(n, (), 1) for n in range(3)}
    tasks = plan_tasks(units, infos, task_records)
    assert sorted((u for t in tasks for u in t.units), key=lambda u: u.start) == units
    for t in tasks:
        assert all(u.shard == t.shard for u in t.units)
        assert all(x.stop == y.start for x, y in zip(t.units, t.units[1:]))
        assert t.records <= task_records or len(t.units) == 1
    sl = slices(tasks, max_records)
    assert [t for s in sl for t in s] == tasks
    assert all(sum(t.records for t in s) <= max_records or len(s) == 1 for s in sl)


def test_a_lost_range_survives_a_spark_error_message():
    e = RangeLost(3, 10 ** 55, 10 ** 55 + 99, 12, 9)
    got = parse_lost(f"org.apache.spark.SparkException: Job aborted ... PythonException: {e} ... at ...")
    assert (got.shard, got.start, got.stop, got.expected, got.found) == (3, 10 ** 55, 10 ** 55 + 99, 12, 9)
    assert parse_lost("some other error") is None
