"""The sink's column-at-a-time JSON encoding: valid JSON that round-trips every value, and the message
shapes of the debezium and upsert formats."""

from __future__ import annotations

import base64
import json
import math
import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.config import KafkaSpec, SinkSpec
from reclock.errors import ValueNotCarried
from reclock.sinks.encode import VALUE_SLICE, KeyNotUnique, encode_runs, encode_updates, json_objects


def spec(fmt: str = "debezium", key: tuple[str, ...] = ()) -> SinkSpec:
    return SinkSpec(name="s", collection="c", kafka=KafkaSpec(topic="t"), format=fmt, key=key)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
                          st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
                          st.one_of(st.none(), st.text()),
                          st.one_of(st.none(), st.binary(max_size=20)),
                          st.one_of(st.none(), st.booleans())), min_size=1, max_size=30))
def test_json_objects_round_trip_every_value(rows):
    cols = list(zip(*rows))
    table = pa.table({"i": pa.array(cols[0], pa.int64()), "f": pa.array(cols[1], pa.float64()),
                      "s": pa.array(cols[2], pa.string()), "b": pa.array(cols[3], pa.binary()),
                      "flag": pa.array(cols[4], pa.bool_())})
    for text, (i, f, s, b, flag) in zip(json_objects(table, ["i", "f", "s", "b", "flag"]), rows):
        got = json.loads(text)
        assert list(got) == ["i", "f", "s", "b", "flag"]
        assert got["i"] == i and got["s"] == s and got["flag"] == flag
        assert got["b"] == (None if b is None else base64.b64encode(b).decode())
        if f is None:
            assert got["f"] is None
        elif math.isnan(f):
            assert got["f"] == "NaN"  # JSON has no NaN: the string Jackson writes and reads back
        elif math.isinf(f):
            assert got["f"] == ("Infinity" if f > 0 else "-Infinity")
        else:  # bit for bit: -0.0 keeps its sign
            assert isinstance(got["f"], (int, float)) and struct.pack("<d", float(got["f"])) == struct.pack("<d", f)


def test_floats_read_back_bit_for_bit_and_other_nans_are_refused():
    table = pa.table({"f": pa.array([-0.0, 0.0, math.nan, math.inf, -math.inf, 1e300, 5e-324]),
                      "l": pa.array([[-0.0, math.nan, -math.inf]] * 7),
                      "ts": pa.array([1] * 7, pa.int64()), "diff": pa.array([1] * 7, pa.int64())})
    values = [json.loads(v)["after"] for _, _, v in encode_updates(spec(), table)]
    assert [struct.pack("<d", v["f"]) for v in values if not isinstance(v["f"], str)] == \
        [struct.pack("<d", f) for f in (-0.0, 0.0, 1e300, 5e-324)]
    assert [v["f"] for v in values if isinstance(v["f"], str)] == ["NaN", "Infinity", "-Infinity"]
    assert values[0]["l"] == [-0.0, "NaN", "-Infinity"] and math.copysign(1, values[0]["l"][0]) == -1
    for bits in (0x7FF8000000000001, 0xFFF8000000000000):  # a payload; the sign bit (x86's 0/0)
        odd = struct.unpack("<d", struct.pack("<Q", bits))[0]
        for col in (pa.array([1.0, odd]), pa.array([[1.0], [odd]])):
            bad = table.slice(0, 2).set_column(0, "f", col)
            with pytest.raises(ValueNotCarried, match="column f: 1 NaN value"):
                encode_runs(spec(), bad)


def updates(*rows):
    ts, k, v, d = zip(*rows)
    return pa.table({"k": pa.array(k, pa.int64()), "v": pa.array(v, pa.string()),
                     "ts": pa.array(ts, pa.int64()), "diff": pa.array(d, pa.int64())})


def test_debezium_unkeyed_one_message_per_unit_of_diff_in_ts_order():
    msgs = encode_updates(spec(), updates((2, 1, "a", 1), (1, 2, "b", 2), (2, 2, "b", -1)))
    assert [(ts, k, json.loads(v)) for ts, k, v in msgs] == [
        (1, None, {"before": None, "after": {"k": 2, "v": "b"}}),
        (1, None, {"before": None, "after": {"k": 2, "v": "b"}}),
        (2, None, {"before": None, "after": {"k": 1, "v": "a"}}),
        (2, None, {"before": {"k": 2, "v": "b"}, "after": None})]


def test_a_long_run_comes_out_in_order_a_slice_at_a_time():
    n = 2 * VALUE_SLICE + 7  # three slices of one timestamp, then a second timestamp
    rows = [(1, i, f"v{i}", 1) for i in range(n)] + [(2, n, "last", 1)]
    runs = encode_runs(spec(), updates(*rows))
    assert [(r.ts, len(r.values)) for r in runs] == [(1, n), (2, 1)]
    lists = list(runs[0].value_lists())
    assert [len(values) for values in lists] == [VALUE_SLICE, VALUE_SLICE, 7]
    got = [json.loads(v)["after"]["k"] for values in lists for v in values]
    assert got == list(range(n)) and runs[0].value_list() == [v for values in lists for v in values]
    assert runs[0].nbytes == sum(len(v) for v in runs[0].value_list())


def test_debezium_keyed_pairs_a_retraction_with_an_insertion():
    msgs = encode_updates(spec(key=("k",)), updates((1, 1, "a", 1), (2, 1, "a", -1), (2, 1, "b", 1),
                                                    (2, 2, "x", 1)))
    assert [(ts, json.loads(k), json.loads(v)) for ts, k, v in msgs] == [
        (1, {"k": 1}, {"before": None, "after": {"k": 1, "v": "a"}}),
        (2, {"k": 1}, {"before": {"k": 1, "v": "a"}, "after": {"k": 1, "v": "b"}}),
        (2, {"k": 2}, {"before": None, "after": {"k": 2, "v": "x"}})]


def test_upsert_values_and_tombstones_and_key_uniqueness():
    msgs = encode_updates(spec("upsert", ("k",)), updates((1, 1, "a", 1), (2, 1, "a", -1), (2, 1, "b", 1),
                                                          (3, 1, "b", -1)))
    assert [(ts, json.loads(k), v and json.loads(v)) for ts, k, v in msgs] == [
        (1, {"k": 1}, {"k": 1, "v": "a"}), (2, {"k": 1}, {"k": 1, "v": "b"}), (3, {"k": 1}, None)]
    with pytest.raises(KeyNotUnique, match="key .* has several values at ts 1"):
        encode_updates(spec("upsert", ("k",)), updates((1, 1, "a", 1), (1, 1, "b", 1)))


def test_ahead_keeps_order_raises_the_helpers_error_and_stops_when_closed():
    import threading

    from reclock.sinks.kafka import _ahead

    assert list(_ahead(iter(range(50)), 1, "t-order")) == list(range(50))

    def failing():
        yield 1
        yield 2
        raise ValueError("broken part")

    got = []
    with pytest.raises(ValueError, match="broken part"):
        for x in _ahead(failing(), 2, "t-fail"):
            got.append(x)
    assert got == [1, 2]

    def endless():
        i = 0
        while True:
            yield i
            i += 1

    it = _ahead(endless(), 2, "t-endless")
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()  # what leaving the sink's loop early does
    assert not any(t.name == "t-endless" for t in threading.enumerate())


def test_a_character_to_escape_far_into_a_long_string_column_is_found():
    """The escape scan goes over the column's bytes in slices: a quote in a later slice still counts."""
    from reclock.sinks.encode import _SCAN_BYTES

    values = ["x" * 1000] * (3 * _SCAN_BYTES // 1000) + ['say "hi"\\']
    table = pa.table({"s": pa.array(values)})
    assert json.loads(json_objects(table, ["s"])[-1]) == {"s": 'say "hi"\\'}


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string()])
def test_the_escape_scan_of_a_slice_reads_the_slice_own_bytes(type_):
    """The sink encodes slices of larger arrays: the scan covers exactly the bytes a slice's values span,
    so a quote in the slice is found wherever the slice starts, and one outside it does not matter."""
    values = ['a "quoted" one'] + ["plain"] * 300 + ["back\\slash", "ctl\x01"] + ["plain"] * 300 + ['"']
    table = pa.table({"s": pa.array(values, type_)})
    for start, length in [(1, 300), (1, 301), (250, 52), (301, 2), (302, 1), (303, 301), (0, len(values))]:
        part = table.slice(start, length)
        got = [json.loads(o)["s"] for o in json_objects(part, ["s"])]
        assert got == values[start:start + length], (start, length)
