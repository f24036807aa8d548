"""The reclocking expression ``write_batches`` compiles into the Spark scan (:func:`reclock_ts_sql`),
evaluated by SQLite over every offset a slice reads: each record gets the ts of the binding that holds
its offset; a description's slices never need the filter for unbound records; arbitrary ranges do."""

from __future__ import annotations

import re
import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from reclock import remap
from reclock.batch import BatchDescription, OffsetRange, ranges_for, split_ranges
from reclock.spark.reclocking import BindingRange, reclock_case_sql, reclock_ts_sql
from strategies import remap_collections


def sqlite_sql(expr: str) -> str:
    """``expr`` in SQLite's words: Spark's ``element_at(array(e0, e1, ...), partition + 1)`` (1-based) is
    ``CASE partition WHEN 0 THEN e0 WHEN 1 THEN e1 ... END``."""
    def case(m: re.Match) -> str:
        entries = [e.strip() for e in m.group(1).split(",")]
        return "CASE partition " + " ".join(f"WHEN {i} THEN {e}" for i, e in enumerate(entries)) + " END"

    return re.sub(r"element_at\(array\(([^()]*)\), partition \+ 1\)", case, expr)


def evaluate(expr: str, records: list[tuple[int, int]]) -> list[int | None]:
    """``expr`` (Spark SQL over ``partition`` and ``offset``) evaluated for each ``(partition, offset)``."""
    sql = re.sub(r"\boffset\b", "o_", re.sub(r"\bpartition\b", "p_", sqlite_sql(expr)))
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE r (i INTEGER, p_ INTEGER, o_ INTEGER)")
    db.executemany("INSERT INTO r VALUES (?, ?, ?)", [(i, p, o) for i, (p, o) in enumerate(records)])
    return [ts for (ts,) in db.execute(f"SELECT {sql} FROM r ORDER BY i")]


def expected(bindings: list[BindingRange], p: int, o: int) -> int | None:
    hits = [b.ts for b in bindings if b.partition == p and b.start <= o < b.end]
    assert len(hits) <= 1
    return hits[0] if hits else None


def description_bindings(rc, desc: BatchDescription) -> tuple[list[OffsetRange], list[BindingRange]]:
    """What ``write_batches`` reads for ``desc`` and the bindings it reclocks with (as in ``cycle._write``)."""
    ranges = ranges_for(rc, desc)
    bindings = [BindingRange(r.partition, s, e, ts) for r in ranges
                for (s, e, ts) in remap.reclock_ranges(rc, r.partition)
                if s < r.end and e > r.start and desc.lower <= ts < desc.upper]
    return ranges, bindings


@settings(max_examples=300, deadline=None)
@given(remap_collections(), st.data(), st.integers(min_value=1, max_value=120))
def test_a_descriptions_slices_get_their_bindings_ts_without_a_filter(rc, data, budget):
    lower = data.draw(st.integers(min_value=0, max_value=rc.upper))
    desc = BatchDescription(lower, data.draw(st.integers(min_value=lower + 1, max_value=rc.upper + 1)))
    ranges, bindings = description_bindings(rc, desc)
    for sl in split_ranges(ranges, budget) if ranges else []:
        expr, drop_unbound = reclock_ts_sql(sl, bindings)
        assert not drop_unbound  # a description's ranges are what its bindings cover
        records = [(r.partition, o) for r in sl for o in range(r.start, r.end)]
        assert evaluate(expr, records) == [expected(bindings, p, o) for p, o in records]
        assert None not in evaluate(expr, records)
        by_partition = {r.partition: [b for b in bindings if b.partition == r.partition
                                      and b.start < r.end and b.end > r.start] for r in sl}
        if all(len(bs) == 1 for bs in by_partition.values()):  # one binding a partition: an array's entry,
            assert "offset" not in expr and "element_at(array(" in expr  # no literal in Spark's generated code


@st.composite
def loose_bindings(draw):
    """Disjoint bindings per partition with gaps between them, and ranges that may reach into the gaps."""
    bindings, ranges = [], []
    for p in draw(st.lists(st.integers(0, 4), unique=True, max_size=4)):
        at = draw(st.integers(0, 5))
        for _ in range(draw(st.integers(0, 3))):
            start = at + draw(st.integers(0, 3))
            end = start + draw(st.integers(1, 6))
            bindings.append(BindingRange(p, start, end, draw(st.integers(0, 3))))
            at = end
        lo = draw(st.integers(0, at + 2))
        ranges.append(OffsetRange(p, lo, lo + draw(st.integers(1, 12))))
    return ranges, bindings


@settings(max_examples=300, deadline=None)
@given(loose_bindings())
def test_ranges_the_bindings_do_not_cover_keep_the_filter(case):
    ranges, bindings = case
    expr, drop_unbound = reclock_ts_sql(ranges, bindings)
    records = [(r.partition, o) for r in ranges for o in range(r.start, r.end)]
    want = [expected(bindings, p, o) for p, o in records]
    got = evaluate(expr, records)
    assert got == want
    if records:
        assert drop_unbound == (None in want)  # the filter exactly when some record has no binding
    assert evaluate(reclock_case_sql(bindings), records) == want  # the general form is exact everywhere
