"""Bit-exact grouping, the pyarrow half: :func:`reclock.bitexact.encode` is equal exactly when values are bit
for bit (a Python reference compares floats by their bits), for flat and nested types, slices and nulls;
``sum_by_row`` sums by that equality and gives each value back as it went in."""

from __future__ import annotations

import collections
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.bitexact import encode, noncanonical_nans
from reclock.compaction import sum_by_row


def f64(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


FLOATS = [0.0, -0.0, 1.0, -1.5, float("inf"), float("-inf"), f64(0x7FF8000000000000), f64(0x7FF8000000000001),
          f64(0xFFF8000000000000), f64(0x7FF0000000000001), 5e-324]


def ref(v):
    """A value as a hashable key, floats by their bits (the reference equality)."""
    if isinstance(v, float):
        return ("f", struct.pack("<d", v))
    if isinstance(v, dict):
        return ("s", tuple((k, ref(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return ("l", tuple(ref(x) for x in v))
    return v


LEAVES = [
    (pa.float64(), st.sampled_from(FLOATS)),
    (pa.int64(), st.integers(-3, 3)),
    (pa.string(), st.sampled_from(["", "a", "ab", "a\x00"])),
    (pa.binary(), st.sampled_from([b"", b"\x00", b"\x00\x00", b"x"])),
    (pa.bool_(), st.booleans()),
]


@st.composite
def columns(draw, depth: int = 0):
    """``(type, values)``: a flat type, or a list, struct or map of them, with nulls anywhere."""
    kind = draw(st.sampled_from(["leaf"] if depth >= 2 else ["leaf", "leaf", "list", "struct", "map"]))
    if kind == "leaf":
        t, values = draw(st.sampled_from(LEAVES))
        return t, st.one_of(st.none(), values)
    if kind == "list":
        t, values = draw(columns(depth + 1))
        return pa.list_(t), st.one_of(st.none(), st.lists(values, max_size=3))
    if kind == "struct":
        (ta, va), (tb, vb) = draw(columns(depth + 1)), draw(columns(depth + 1))
        return pa.struct([("a", ta), ("b", tb)]), st.one_of(st.none(), st.fixed_dictionaries({"a": va, "b": vb}))
    t, values = draw(columns(depth + 1))
    return (pa.map_(pa.string(), t),
            st.one_of(st.none(), st.lists(st.tuples(st.sampled_from(["k", "j"]), values), max_size=2)))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_encodings_are_equal_exactly_when_values_are_bit_for_bit(data):
    t, values = data.draw(columns())
    rows = data.draw(st.lists(values, min_size=1, max_size=12))
    start = data.draw(st.integers(0, len(rows) - 1))
    arr = pa.array(rows, t).slice(start)  # a slice: offsets into the buffers
    got = encode(arr).to_pylist()
    keys = [ref(v) for v in arr.to_pylist()]
    assert None not in got
    for i in range(len(keys)):
        for j in range(len(keys)):
            assert (got[i] == got[j]) == (keys[i] == keys[j]), (arr[i], arr[j])
    chunked = encode(pa.chunked_array([arr.slice(0, 1), arr.slice(1)], t))
    assert chunked.to_pylist() == got


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_sum_by_row_sums_bit_for_bit_and_keeps_the_bits(data):
    (ta, va), (tb, vb) = data.draw(columns()), data.draw(columns())
    rows = data.draw(st.lists(st.tuples(va, vb, st.integers(-2, 2)), max_size=20))
    table = pa.table({"a": pa.array([r[0] for r in rows], ta), "b": pa.array([r[1] for r in rows], tb),
                      "diff": pa.array([r[2] for r in rows], pa.int64())})
    want = collections.Counter()
    for r in table.to_pylist():
        want[(ref(r["a"]), ref(r["b"]))] += r["diff"]
    out = sum_by_row(table, ["a", "b"])
    assert out.schema.field("a").type == ta and out.schema.field("b").type == tb
    got = [((ref(r["a"]), ref(r["b"])), r["diff"]) for r in out.to_pylist()]
    assert len(got) == len(want) and dict(got) == dict(want)


def test_nulls_are_one_key_whatever_lies_under_them():
    """A null float's slot may hold any bytes (a writer leaves them): it groups with every other null."""
    data = np.array([1.5, 2.5, -0.0, 0.0], dtype=np.float64)
    validity = pa.array([False, False, True, True]).buffers()[1]
    col = pa.Array.from_buffers(pa.float64(), 4, [validity, pa.py_buffer(data.tobytes())])
    table = pa.table({"f": col, "l": pa.array([None, None, [1.0], [1.0]]), "diff": pa.array([1, 1, 1, 1])})
    out = sum_by_row(table, ["f"])
    assert sorted(((ref(r["f"]), r["diff"]) for r in out.to_pylist()), key=repr) == sorted(
        [(None, 2), (ref(-0.0), 1), (ref(0.0), 1)], key=repr)
    assert len(set(encode(col).to_pylist())) == 3


def test_float32_and_dictionaries():
    bits = np.array([0x00000000, 0x80000000, 0x7FC00000, 0x7FC00001, 0x7FC00000], dtype=np.uint32)
    col = pa.array(bits.view(np.float32))
    assert len(set(encode(col).to_pylist())) == 4
    assert noncanonical_nans(col) == 1
    assert noncanonical_nans(pa.array([[col[3].as_py(), float("nan")], None], pa.list_(pa.float32()))) == 1
    d = pa.array(["x", "y", "x", None]).dictionary_encode()
    assert encode(d).to_pylist() == encode(d.dictionary_decode()).to_pylist()


def test_types_without_an_encoding_are_refused():
    col = pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])])
    with pytest.raises(TypeError, match="bit for bit"):
        encode(col)
