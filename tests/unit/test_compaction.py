"""Part compaction, the pure half: consolidating with times advanced to since changes no read AS OF
``t >= since``, and the plan merges only small parts at or below since, in runs of at most the target."""

from __future__ import annotations

import math
import struct
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.compaction import (advance, compaction_candidates, consolidate, contents_as_of, has_retractions,
                                merged_description, plan_compaction)

SCHEMA = pa.schema([("a", pa.int64()), ("f", pa.float64()), ("s", pa.string()), ("ts", pa.int64()),
                    ("diff", pa.int64())], metadata={b"origin": b"test"})
NAN_BITS = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]  # a NaN with another payload


def _key(v):
    """Floats by their bits: the grouping compares them so (NaN payloads apart, -0.0 is not 0.0)."""
    return ("float", struct.pack("<d", v)) if isinstance(v, float) else v


def bag(table: pa.Table) -> Counter:
    return Counter(tuple(_key(v) for v in row.values()) for row in table.to_pylist())


updates = st.lists(st.tuples(
    st.one_of(st.none(), st.integers(-2, 2)),
    st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, math.nan, -math.nan, NAN_BITS, math.inf])),
    st.one_of(st.none(), st.sampled_from(["", "x", "y"])),
    st.integers(0, 20),
    st.integers(-2, 2)), max_size=60).map(lambda rows: pa.Table.from_pylist(
        [dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA))


@settings(max_examples=300, deadline=None)
@given(updates, st.integers(0, 22), st.integers(0, 5))
def test_consolidating_with_advance_changes_no_read_at_or_after_since(table, since, dt):
    t = since + dt
    merged = consolidate(table, advance_to=since)
    assert bag(contents_as_of(merged, t)) == bag(contents_as_of(table, t))
    assert merged.schema == table.schema  # same columns, order, types and metadata
    assert all(ts >= since for ts in merged["ts"].to_pylist())
    assert 0 not in merged["diff"].to_pylist()
    keys = Counter(row[:-1] for row in bag(merged).elements())
    assert all(n == 1 for n in keys.values()), "one row per (data, ts)"
    # consolidating again changes nothing, and the updates above since only sum up
    assert bag(consolidate(merged, advance_to=since)) == bag(merged)
    above = table.filter(pc.greater(table["ts"], since))
    assert bag(merged.filter(pc.greater(merged["ts"], since))) == bag(consolidate(above))


def test_nulls_are_one_key_and_floats_compare_by_bits():
    table = pa.Table.from_pylist([
        {"a": None, "f": None, "s": None, "ts": 1, "diff": 1},
        {"a": None, "f": None, "s": None, "ts": 3, "diff": -1},  # cancels the first once both are at 3
        {"a": 1, "f": math.nan, "s": "x", "ts": 1, "diff": 1},
        {"a": 1, "f": math.nan, "s": "x", "ts": 2, "diff": -1},  # the same NaN: cancels
        {"a": 1, "f": NAN_BITS, "s": "x", "ts": 2, "diff": 1},  # another NaN: stays
        {"a": 2, "f": 0.0, "s": "y", "ts": 1, "diff": 1},
        {"a": 2, "f": -0.0, "s": "y", "ts": 1, "diff": -1},  # -0.0 is not 0.0: both stay
        {"a": 3, "f": 1.0, "s": "z", "ts": 1, "diff": 1},
        {"a": 3, "f": 1.0, "s": "z", "ts": 2, "diff": 1},  # a duplicate: one row, diff 2
        {"a": 4, "f": 1.0, "s": "z", "ts": 5, "diff": 1},  # above since: untouched
    ], schema=SCHEMA)
    out = consolidate(table, advance_to=3)
    assert bag(out) == bag(pa.Table.from_pylist([
        {"a": 1, "f": NAN_BITS, "s": "x", "ts": 3, "diff": 1},
        {"a": 2, "f": 0.0, "s": "y", "ts": 3, "diff": 1},
        {"a": 2, "f": -0.0, "s": "y", "ts": 3, "diff": -1},
        {"a": 3, "f": 1.0, "s": "z", "ts": 3, "diff": 2},
        {"a": 4, "f": 1.0, "s": "z", "ts": 5, "diff": 1},
    ], schema=SCHEMA))


def test_nested_values_consolidate_bit_for_bit():
    """Lists, structs and maps (which pyarrow's group_by refuses) are summed by their encoding: ``[-0.0]`` is
    not ``[0.0]``, and the values come out as they went in."""
    table = pa.table({"l": pa.array([[1.0], [1.0], [2.0], [-0.0], [0.0], [-0.0]]),
                      "m": pa.array([[("k", 1)]] * 3 + [[], [], []], pa.map_(pa.string(), pa.int64())),
                      "ts": pa.array([1, 2, 4, 1, 1, 2], pa.int64()), "diff": pa.array([1, -1, 0, 1, -1, 1], pa.int64())})
    out = consolidate(table, advance_to=3)
    assert out.schema == table.schema
    got = sorted((str([_key(v) for v in r["l"]]), r["ts"], r["diff"]) for r in out.to_pylist())
    assert got == sorted([(str([_key(-0.0)]), 3, 2), (str([_key(0.0)]), 3, -1)])


def test_dictionary_and_empty_tables_keep_their_schema():
    table = pa.table({"d": pa.array(["x", "x", "y"]).dictionary_encode(), "ts": pa.array([0, 1, 1], pa.int64()),
                      "diff": pa.array([1, -1, 1], pa.int64())})
    out = consolidate(table, advance_to=1)
    assert out.schema == table.schema and out.to_pylist() == [{"d": "y", "ts": 1, "diff": 1}]
    empty = table.slice(0, 0)
    assert consolidate(empty, advance_to=5).schema == table.schema


@dataclass(frozen=True)
class Row:
    lower: int
    upper: int
    path: str
    bytes: int


rows = st.lists(st.builds(lambda lo, n, p, b: Row(lo, lo + n, f"p{p}", b), st.integers(0, 30), st.integers(1, 6),
                          st.integers(0, 10**6), st.integers(0, 120)), max_size=30,
                unique_by=lambda r: r.path)


@settings(max_examples=300, deadline=None)
@given(rows, st.integers(0, 40), st.integers(1, 150), st.integers(2, 10))
def test_the_plan_merges_small_parts_at_or_below_since_in_bounded_runs(rows, since, target, min_parts):
    candidates = compaction_candidates(rows, since, target)
    assert all(r.upper <= since + 1 and r.bytes < target for r in candidates)
    assert len(candidates) == sum(1 for r in rows if r.upper <= since + 1 and r.bytes < target)
    assert candidates == sorted(candidates, key=lambda r: (r.lower, r.path))
    runs = plan_compaction(rows, since, target_bytes=target, min_parts=min_parts)
    if len(candidates) < min_parts:
        assert runs == []
        return
    flat = [r for run in runs for r in run]
    assert len(set(flat)) == len(flat) and set(flat) <= set(candidates)
    for run in runs:
        assert len(run) >= 2 and sum(r.bytes for r in run) <= target
        i = candidates.index(run[0])
        assert list(run) == candidates[i:i + len(run)], "a run is consecutive candidates"
        desc = merged_description(run)
        assert desc.lower == min(r.lower for r in run) and desc.upper - 1 <= since
    if sum(r.bytes for r in candidates) <= target:
        assert runs == [tuple(candidates)]


def test_the_plan_refuses_nonsense():
    with pytest.raises(ValueError, match="min_parts"):
        plan_compaction([], 0, target_bytes=10, min_parts=1)
    with pytest.raises(ValueError, match="target_bytes"):
        plan_compaction([], 0, target_bytes=0, min_parts=2)


@settings(max_examples=200, deadline=None)
@given(updates, st.integers(0, 22), st.integers(0, 5))
def test_an_append_only_run_is_only_advanced_and_reads_the_same(table, since, dt):
    """Compaction skips consolidation when nothing can cancel (no diff <= 0): advancing alone keeps every
    read at or after since."""
    inserts = table.filter(pc.greater(table["diff"], 0))
    assert not has_retractions(inserts) and has_retractions(table) == (inserts.num_rows < table.num_rows)
    moved = advance(inserts, since)
    assert moved.num_rows == inserts.num_rows and moved.schema == inserts.schema
    assert all(ts >= since for ts in moved["ts"].to_pylist())
    assert bag(contents_as_of(moved, since + dt)) == bag(contents_as_of(inserts, since + dt))


def test_the_plan_takes_only_small_parts_as_candidates():
    rows = [Row(0, 1, "a", 10), Row(1, 2, "b", 500), Row(2, 3, "c", 10), Row(3, 4, "d", 10)]
    runs = plan_compaction(rows, 10, target_bytes=1000, min_parts=2, small_bytes=100)
    assert [[r.path for r in run] for run in runs] == [["a", "c", "d"]]
    with pytest.raises(ValueError, match="small_bytes"):
        plan_compaction(rows, 10, target_bytes=1000, min_parts=2, small_bytes=0)


NESTED = pa.schema([("a", pa.int64()), ("st", pa.struct([("x", pa.float64()), ("y", pa.string())])),
                    ("l", pa.list_(pa.float64())), ("m", pa.map_(pa.string(), pa.int64())), ("ts", pa.int64()),
                    ("diff", pa.int64())])
_floats = st.one_of(st.none(), st.sampled_from([0.0, -0.0, math.nan, NAN_BITS, 1.5]))
nested_updates = st.lists(st.fixed_dictionaries({
    "a": st.one_of(st.none(), st.integers(0, 1)),
    "st": st.one_of(st.none(), st.fixed_dictionaries({"x": _floats, "y": st.one_of(st.none(), st.just("y"))})),
    "l": st.one_of(st.none(), st.lists(_floats, max_size=2)),
    "m": st.one_of(st.none(), st.sampled_from([[], [("k", 1)], [("k", None)]])),
    "ts": st.integers(0, 5), "diff": st.integers(-2, 2)}), max_size=40)


def _nested_key(v):
    if isinstance(v, dict):
        return ("struct", tuple(sorted((k, _nested_key(x)) for k, x in v.items())))
    if isinstance(v, list):
        return ("list", tuple(_nested_key(x) for x in v))
    if isinstance(v, tuple):
        return tuple(_nested_key(x) for x in v)
    return _key(v)


@settings(max_examples=200, deadline=None)
@given(nested_updates, st.integers(0, 6))
def test_contents_as_of_sums_rows_with_nested_columns_bit_for_bit(rows, t):
    """Structs, lists and maps (which pyarrow cannot group by) are summed by value, floats inside them by their
    bits, nulls equal; the columns and types are kept, also when nothing is at or before t."""
    table = pa.Table.from_pylist(rows, schema=NESTED)
    got = contents_as_of(table, t)
    want: Counter = Counter()
    for r in rows:
        if r["ts"] <= t:
            want[tuple(_nested_key(r[c]) for c in ("a", "st", "l", "m"))] += r["diff"]
    keys = [tuple(_nested_key(r[c]) for c in ("a", "st", "l", "m")) for r in got.to_pylist()]
    assert len(keys) == len(set(keys)), "one row per value"
    assert dict(zip(keys, got["diff"].to_pylist())) == {k: v for k, v in want.items() if v}
    assert got.schema.names == ["a", "st", "l", "m", "diff"] and got.schema.field("st").type == NESTED.field("st").type
