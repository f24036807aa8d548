"""The pgoutput decoder: encode/decode round trips of generated messages (the encoder below follows the
protocol's documented layout, independently of the decoder), and the text-form conversions."""

from __future__ import annotations

import datetime as dt
import decimal
import struct

import pyarrow as pa
import pytest
from hypothesis import given, strategies as st

from pgoutput_encode import encode
from reclock.sources.postgres import pgoutput as po


u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-2**63, 2**63 - 1)
names = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=20)
values = st.one_of(st.none(), st.just(po.UNCHANGED_TOAST), st.binary(max_size=40))
tuples = st.lists(values, max_size=8).map(tuple)
columns = st.builds(po.Column, st.integers(0, 1), names, u32, st.integers(-2**31, 2**31 - 1))

messages = st.one_of(
    st.builds(po.Begin, u64, i64, u32),
    st.builds(po.Commit, st.just(0), u64, u64, i64),
    st.builds(po.Origin, u64, names),
    st.builds(po.Relation, u32, names, names, st.sampled_from("dnfi"), st.lists(columns, max_size=6).map(tuple)),
    st.builds(po.Type, u32, names, names),
    st.builds(po.Insert, u32, tuples),
    st.builds(po.Update, u32, st.just(None), st.just(None), tuples),
    st.builds(lambda r, k, o, n: po.Update(r, k, o, n), u32, st.sampled_from("KO"), tuples, tuples),
    st.builds(po.Delete, u32, st.sampled_from("KO"), tuples),
    st.builds(po.Truncate, st.integers(0, 3), st.lists(u32, max_size=5).map(tuple)),
)


@given(messages)
def test_decode_inverts_encode(m):
    assert po.decode(encode(m)) == m


@given(messages, st.data())
def test_a_truncated_message_is_a_protocol_error(m, data):
    raw = encode(m)
    cut = data.draw(st.integers(1, len(raw) - 1)) if len(raw) > 1 else None
    if cut is None:
        return
    try:
        got = po.decode(raw[:cut])
    except po.ProtocolError:
        return
    # a prefix may itself be a whole, shorter message only when the cut falls on a tuple or list boundary
    assert encode(got) == raw[:cut]


def test_trailing_bytes_and_unknown_kinds_are_refused():
    with pytest.raises(po.ProtocolError, match="trailing"):
        po.decode(encode(po.Begin(1, 2, 3)) + b"x")
    with pytest.raises(po.ProtocolError, match="unknown message kind"):
        po.decode(b"Z")
    with pytest.raises(po.ProtocolError, match="column kind"):
        po.decode(b"I" + struct.pack("!I", 1) + b"N" + struct.pack("!h", 1) + b"b")


@given(st.integers(0, 2**64 - 1))
def test_lsn_text_round_trip(lsn):
    assert po.lsn_to_int(po.lsn_to_str(lsn)) == lsn


@pytest.mark.parametrize("oid,typmod,text,value,atype", [
    (po.BOOL, -1, "t", True, pa.bool_()),
    (po.INT2, -1, "-32768", -32768, pa.int16()),
    (po.INT8, -1, "9223372036854775807", 2**63 - 1, pa.int64()),
    (po.NUMERIC, (12 << 16 | 2) + 4, "-1234.50", decimal.Decimal("-1234.50"), pa.decimal128(12, 2)),
    (po.FLOAT8, -1, "-Infinity", float("-inf"), pa.float64()),
    (po.TEXT, -1, "héllo", "héllo", pa.string()),
    (po.BYTEA, -1, "\\x00ff", b"\x00\xff", pa.binary()),
    (po.DATE, -1, "2024-02-29", dt.date(2024, 2, 29), pa.date32()),
    (po.TIMESTAMP, -1, "2024-01-02 03:04:05.123456", dt.datetime(2024, 1, 2, 3, 4, 5, 123456), pa.timestamp("us")),
    (po.TIMESTAMPTZ, -1, "2024-01-02 03:04:05+00", dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
     pa.timestamp("us", tz="UTC")),
    (po.JSONB, -1, '{"a": 1}', '{"a": 1}', pa.string()),
    (po.UUID, -1, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", pa.string()),
    (600, -1, "(1,2)", "(1,2)", pa.string()),  # point: an unknown type stays text
])
def test_convert(oid, typmod, text, value, atype):
    got = po.convert(oid, typmod, text.encode(), "c")
    assert got == value and po.arrow_type(oid, typmod) == atype
    assert pa.array([got], atype).to_pylist() == [value]


@pytest.mark.parametrize("oid,typmod,text", [
    (po.NUMERIC, -1, "NaN"), (po.NUMERIC, (5 << 16 | 2) + 4, "123456.00"), (po.TIMESTAMP, -1, "infinity"),
    (po.INT2, -1, "40000"), (po.BOOL, -1, "maybe"), (po.BYTEA, -1, "abc"),
])
def test_convert_refuses_what_the_type_cannot_hold(oid, typmod, text):
    with pytest.raises(po.ConversionError, match="column c"):
        po.convert(oid, typmod, text.encode(), "c")
    with pytest.raises(po.ConversionError):
        po.convert(oid, typmod, po.UNCHANGED_TOAST, "c")


@given(st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-10**9, max_value=10**9))
def test_numeric_round_trip(d):
    typmod = (12 << 16 | 2) + 4
    text = f"{d:.2f}"
    assert po.convert(po.NUMERIC, typmod, text.encode()) == decimal.Decimal(text)
    assert pa.array([decimal.Decimal(text)], po.arrow_type(po.NUMERIC, typmod)).to_pylist() == [decimal.Decimal(text)]


def _pg_float(x: float) -> str:
    """Postgres's float text: NaN, Infinity, -Infinity, else the shortest exact form."""
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(x).replace("e+", "e+")


_texts = {
    po.INT2: st.integers(-2**16, 2**16).map(str),
    po.INT8: st.integers(-2**63, 2**63 - 1).map(str),
    po.FLOAT4: st.floats(width=32).map(_pg_float),
    po.FLOAT8: st.floats().map(_pg_float),
    po.NUMERIC: st.decimals(allow_nan=True, allow_infinity=False, places=2, min_value=-10**11, max_value=10**11)
    .map(lambda d: "NaN" if d.is_nan() else f"{d:.2f}"),
    po.BOOL: st.sampled_from(["t", "f", "x"]),
    po.DATE: st.one_of(st.dates().map(str), st.just("infinity"), st.just("2000-01-01 BC")),
    po.TIMESTAMP: st.one_of(st.datetimes().map(lambda t: t.isoformat(sep=" ")), st.just("-infinity")),
    po.TIMESTAMPTZ: st.datetimes().map(lambda t: t.isoformat(sep=" ") + "+00"),
    po.BYTEA: st.binary(max_size=8).map(lambda b: "\\x" + b.hex()),
    po.JSONB: st.text(max_size=10),
}


@given(st.data())
def test_text_column_equals_convert_value_by_value(data):
    oid = data.draw(st.sampled_from(sorted(_texts)))
    typmod = (12 << 16 | 2) + 4 if oid == po.NUMERIC else -1
    values = data.draw(st.lists(st.one_of(st.none(), _texts[oid]), max_size=6))
    as_bytes = data.draw(st.booleans())
    values = [v.encode() if as_bytes and v is not None else v for v in values]
    try:
        want = pa.array([po.convert(oid, typmod, v, "c") for v in values], po.arrow_type(oid, typmod))
    except po.ConversionError:
        with pytest.raises(po.ConversionError, match="column c"):
            po.text_column(oid, typmod, values, "c")
        return
    got = po.text_column(oid, typmod, values, "c")
    assert got.type == want.type
    same = [(a == b) or (a != a and b != b) for a, b in zip(got.to_pylist(), want.to_pylist())]
    assert all(same) and len(got) == len(want), (values, got, want)


@given(st.data())
def test_text_column_of_an_arrow_string_array_equals_that_of_a_list(data):
    oid = data.draw(st.sampled_from(sorted(_texts)))
    typmod = (12 << 16 | 2) + 4 if oid == po.NUMERIC else -1
    values = data.draw(st.lists(st.one_of(st.none(), _texts[oid]), max_size=6))
    try:
        want = po.text_column(oid, typmod, values, "c")
    except po.ConversionError:
        with pytest.raises(po.ConversionError):
            po.text_column(oid, typmod, pa.array(values, pa.string()), "c")
        return
    got = po.text_column(oid, typmod, pa.chunked_array([pa.array(values, pa.string())]), "c")
    assert got.type == want.type
    assert all((a == b) or (a != a and b != b) for a, b in zip(got.to_pylist(), want.to_pylist()))
