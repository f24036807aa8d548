"""The window a rebuild re-derives (``reclock.batch.rebuild_window``): a hypothesis law."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.batch import rebuild_window


@st.composite
def shards(draw):
    """An upper, a since below it, and batch rows: contiguous descriptions over [0, upper) (some without a
    part: gaps), per shard, cut at different points, plus compaction's merged spans."""
    upper = draw(st.integers(1, 200))
    since = draw(st.integers(0, upper - 1))
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        cuts = sorted(set(draw(st.lists(st.integers(1, upper - 1), max_size=12))) | {0, upper}) if upper > 1 else [0, 1]
        spans = list(zip(cuts, cuts[1:]))
        rows += [s for s in spans if draw(st.booleans())]
    return upper, since, rows


@settings(max_examples=500)
@given(shards(), st.one_of(st.none(), st.integers(0, 250)), st.one_of(st.none(), st.integers(0, 250)))
def test_the_window_covers_what_was_asked_and_cuts_no_row(state, lo, hi):
    upper, since, rows = state
    got = rebuild_window(rows, since, upper, lo, hi)
    want_lo, want_hi = 0 if lo is None else lo, upper if hi is None else min(upper, hi)
    if want_lo >= want_hi:
        assert got is None
        return
    assert got is not None
    assert got.lower <= want_lo and got.upper >= want_hi  # covers the window asked for
    assert 0 <= got.lower < got.upper <= upper  # inside [0, upper)
    for a, b in rows:  # every row inside or outside, never cut
        assert (got.lower <= a and b <= got.upper) or b <= got.lower or a >= got.upper
    if got.lower <= since:  # collapsed bindings: re-derived together, from the first offset
        assert got.lower == 0 and got.upper > since


def test_examples():
    rows = [(0, 10), (10, 20), (20, 30), (30, 40)]
    assert (rebuild_window(rows, 5, 40, 22, 25).lower, rebuild_window(rows, 5, 40, 22, 25).upper) == (20, 30)
    w = rebuild_window(rows, 25, 40, 30, 40)
    assert (w.lower, w.upper) == (30, 40)
    w = rebuild_window(rows, 25, 40, 22, 35)  # reaches since: from 0
    assert (w.lower, w.upper) == (0, 40)
    assert rebuild_window(rows, 5, 40, 40, 50) is None  # nothing below the upper
