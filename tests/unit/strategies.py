"""Hypothesis strategies for the pure core: frontiers and well-formed remap collections."""

from __future__ import annotations

from hypothesis import strategies as st

from reclock import remap
from reclock.remap import Binding, RemapCollection
from reclock.time import PartitionedFrontier

partitions = st.integers(min_value=0, max_value=5)
offsets = st.integers(min_value=0, max_value=1000)

frontiers = st.dictionaries(partitions, offsets, max_size=6).map(PartitionedFrontier.of)


@st.composite
def remap_collections(draw, max_bindings: int = 8) -> RemapCollection:
    """Increasing timestamps, non-decreasing frontiers, partitions 0..5 appearing over time; ``since`` 0,
    ``upper`` at or a little past the newest binding's ``ts + 1``."""
    n = draw(st.integers(min_value=0, max_value=max_bindings))
    ts = draw(st.integers(min_value=0, max_value=100))
    current: dict[int, int] = {}
    bindings = []
    for _ in range(n):
        for p in draw(st.lists(partitions, max_size=3)):
            current[p] = current.get(p, 0) + draw(st.integers(min_value=0, max_value=50))
        bindings.append(Binding(ts, PartitionedFrontier.of(current)))
        ts += draw(st.integers(min_value=1, max_value=20))
    upper = (bindings[-1].ts + 1 if bindings else ts) + draw(st.integers(min_value=0, max_value=3))
    return RemapCollection("src", tuple(bindings), 0, upper)


@st.composite
def compacted_collections(draw) -> RemapCollection:
    """A generated collection, compacted to some valid ``since`` (possibly not at all)."""
    rc = draw(remap_collections())
    top = rc.upper - 1 if rc.bindings else rc.upper
    return remap.compact(rc, draw(st.integers(min_value=0, max_value=top)))


@st.composite
def records(draw, rc: RemapCollection):
    """A ``(partition, offset)`` that some binding of ``rc`` covers (``rc`` must cover something)."""
    covered = [(p, o) for b in rc.bindings for p, o in b.frontier]
    p, top = draw(st.sampled_from(covered))
    return p, draw(st.integers(min_value=0, max_value=top - 1))


@st.composite
def uncovered_records(draw, rc: RemapCollection):
    """A ``(partition, offset)`` at or past the newest frontier: no binding covers it yet."""
    p = draw(partitions)
    return p, remap.last_frontier(rc).get(p) + draw(st.integers(min_value=0, max_value=20))


def covers_anything(rc: RemapCollection) -> bool:
    return any(len(b.frontier) for b in rc.bindings)
