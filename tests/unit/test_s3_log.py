"""Laws of the S3 source's log (``reclock.sources.s3.log``): the bindings' frontiers, mapped back through
the objects' places, bind every byte and every object's end exactly once, at the least binding covering it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.sources.s3.log import LOG, BoundRange, Layout, Placed, bound_ranges, frontier_of
from reclock.time import PartitionedFrontier


@st.composite
def histories(draw):
    """Objects placed in the log in order (some zero-byte) and own-partition objects, and bindings whose
    frontiers move forward: the log to object boundaries or anywhere, own partitions anywhere."""
    n = draw(st.integers(min_value=0, max_value=8))
    placed, base = [], 0
    for i in range(1, n + 1):
        size = draw(st.integers(min_value=0, max_value=20))
        placed.append(Placed(i, base, size))
        base += size + 1
    own = [Placed(100 + j, None, 0, own=True) for j in range(draw(st.integers(min_value=0, max_value=3)))]
    k = draw(st.integers(min_value=1, max_value=5))
    logs = sorted(draw(st.lists(st.integers(min_value=0, max_value=base), min_size=k, max_size=k)))
    frontiers = []
    offsets = {p.id: 0 for p in own}
    for lg in logs:
        for p in own:
            offsets[p.id] += draw(st.integers(min_value=0, max_value=9))
        frontiers.append(frontier_of(lg, offsets.items()))
    start = draw(st.integers(min_value=0, max_value=len(frontiers)))
    before = frontiers[start - 1] if start else PartitionedFrontier()
    return placed, own, [(10 * (i + 1), f) for i, f in enumerate(frontiers[start:])], before


def _positions(placed, own, f: PartitionedFrontier) -> set:
    """(object, byte) covered by f, and (object, 'end') for ends: by the log's layout, directly."""
    out = set()
    for p in placed:
        for b in range(p.size):
            if p.base + b < f.get(LOG):
                out.add((p.id, b))
        if p.base + p.size < f.get(LOG):
            out.add((p.id, "end"))
    for p in own:
        out |= {(p.id, b) for b in range(f.get(p.id))}
    return out


@given(histories())
def test_each_byte_and_end_once_at_the_least_covering_binding(h):
    placed, own, bindings, before = h
    got = bound_ranges(bindings, before, Layout(placed + own))
    seen = {}
    for r in got:
        assert isinstance(r, BoundRange) and r.start <= r.end
        for b in range(r.start, r.end):
            assert (r.id, b) not in seen
            seen[(r.id, b)] = r.ts
        if r.ends:
            assert (r.id, "end") not in seen
            seen[(r.id, "end")] = r.ts
    want = _positions(placed, own, bindings[-1][1] if bindings else before) - _positions(placed, own, before)
    assert set(seen) == want
    for pos, ts in seen.items():
        assert ts == next(t for t, f in bindings if pos in _positions(placed, own, f))


def test_a_binding_over_a_thousand_objects_is_one_row():
    placed, base = [], 0
    for i in range(1, 1001):
        placed.append(Placed(i, base, 10))
        base += 11
    f = frontier_of(base, [])
    assert list(f) == [(LOG, 11_000)]
    got = bound_ranges([(5, f)], PartitionedFrontier(), Layout(placed))
    assert len(got) == 1000 and all(r.bytes == 10 and r.ends for r in got)


def test_a_position_no_object_takes_is_an_error():
    with pytest.raises(ValueError, match="log position 5 is bound but no object"):
        bound_ranges([(1, frontier_of(9, []))], PartitionedFrontier(), Layout([Placed(1, 0, 4)]))
    with pytest.raises(ValueError, match="overlap"):
        Layout([Placed(1, 0, 4), Placed(2, 3, 1)])
    with pytest.raises(ValueError, match="partition 7 is bound"):
        bound_ranges([(1, PartitionedFrontier.of({7: 3}))], PartitionedFrontier(), Layout([]))


@given(histories(), st.data())
def test_forgotten_objects_below_a_position_are_skipped_and_the_rest_exact(h, data):
    placed, own, bindings, before = h
    if not placed or not bindings:
        return
    cut = data.draw(st.integers(min_value=0, max_value=placed[-1].span[1]))
    kept = [p for p in placed if p.span[1] > cut or data.draw(st.booleans())]  # forget some below the cut
    full = bound_ranges(bindings, before, Layout(placed + own))
    got = bound_ranges(bindings, before, Layout(kept + own), forgotten_below=cut)
    forgotten = {p.id for p in placed} - {p.id for p in kept}
    assert got == [r for r in full if r.id not in forgotten]
