"""JSON lines decoded in the S3 read task (``reclock.sources.s3.json_lines``) against Spark itself: the same
lines through the task's decode and through ``from_json`` alone (the path every line took before) give the
same decoded rows bit for bit (-0.0, NaN, unicode), the same error rows and the same raw bytes kept for
them; lines Arrow reads otherwise than Spark are left to Spark."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reclock.sources.s3 import json_lines
from reclock.sources.s3.read import ReadUnit, _batch
from reclock.sources.s3.spec import S3Spec
from reclock.spark.decode import CORRUPT, decoded
from reclock.specs import FormatSpec, SourceSpec

DDL = "id BIGINT, name STRING, amount DOUBLE, ok BOOLEAN"
SPEC = SourceSpec(name="jl", upstream=S3Spec(url="s3://unused/jl/"), format=FormatSpec("json", schema=DDL))
FIELDS = (("id", "bigint"), ("name", "string"), ("amount", "double"), ("ok", "boolean"), (CORRUPT, "string"))
UNIT = ReadUnit(1, "in/a.json", "e", None, 10, 1_700_000_000_000, "sealed", None, 0, 10, 0, 10, 7)

EDGE = [
    b'{"id": 1, "name": "a", "amount": 1.5, "ok": true}', b'{"amount": -0.0}', b'{"amount": -0}', b'{"amount": -0E0}',
    b'{"amount": NaN}', b'{"amount": "NaN"}', b'{"amount": -Infinity}', b'{"amount": 1e400}', b'{"amount": -1e-400}',
    b'{"amount": 9007199254740993}', b'{"amount": 123456789012345678901234567890}', b'{"amount": 5e-324}',
    b'{"id": 9223372036854775807}', b'{"id": 9223372036854775808}', b'{"id": -0}', b'{"id": 1.0}', b'{"id": "5"}',
    b'{"id": 01}', b'{"name": 5}', b'{"name": {"a": [1, 2]}}', b'{"name": "\\u00e9\\ud83d\\ude00\\n\\u0000"}',
    b'{"name": "\\ud800"}', b'{"name": "\\udc00x"}', b'{"name": "\xc3\xa9\xf0\x9f\x98\x80"}', b'{"name": "\xff"}',
    b'{"name": "\xed\xa0\x80"}', b'{"name": "a\tb"}', b'{"id": 1, "id": 2}', b'{"ID": 5, "Name": "x"}', b'{"id": 1,}',
    b'{"id": 1}{"id": 2}', b'{"id": 1} x', b' {"id": 1}', b'   ', b'[{"id": 1}]', b'7', b"{'id': 1}", b'{}',
    b'{"ok": "true"}', b'{"ok": 1}', b'{"x": [1, {"y": null}], "id": 3}', b'{"x": NaN, "id": 4}',
    b'{"_reclock_corrupt": "x"}', b'{"_reclock_corrupt": null, "id": 5}', b'{"\\u005freclock_corrupt": "y"}',
    b'{"id": 1, "name": null}', b'{"amount": ' + b"1" * 1200 + b'}', b'{"name": "' + b"n" * 990 + b'"}',
    b'{"a": ' + b"[" * 600 + b"]" * 600 + b"}", b'{"id": 2} ', b'{"id":\r3}', b'{"id": 3\r}',
]

_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 0.0, 5e-324, 1.7976931348623157e308])
_number_text = st.one_of(
    _floats.map(lambda f: json.dumps(f)), _floats.map(lambda f: f"{f:.17e}" if math.isfinite(f) else "NaN"),
    st.integers(-(2**70), 2**70).map(str), st.sampled_from(["-0", "-0.0", "1E2", "1e-400", "-1e-400", "00", "+1",
                                                            ".5", "1.", "0x10", "Infinity", "-Infinity", "NaN"]))
_string_text = st.one_of(
    st.text().map(lambda s: json.dumps(s, ensure_ascii=False)), st.text().map(json.dumps),
    st.sampled_from(['"\\ud800"', '"\\udfff"', '"a\\qb"', "'single'", '"\t"', '"\\/"']))
_value_text = st.one_of(_number_text, _string_text, st.sampled_from(["true", "false", "null", "[]", "{}", '{"z": 1}']))


@st.composite
def json_line(draw) -> bytes:
    names = draw(st.lists(st.sampled_from(["id", "name", "amount", "ok", "x", "ID", CORRUPT]), max_size=5))
    body = ", ".join(f'"{n}": {draw(_value_text)}' for n in names)
    line = ("{" + body + "}").encode()
    if draw(st.integers(0, 9)) == 0:  # now and then damaged: cut, padded, bytes not UTF-8, two objects
        line = draw(st.sampled_from([line[: len(line) // 2], line + b" ", b" " + line, line + b"\xff",
                                     line.replace(b'"', b"\xc3", 1), line + line]))
    return line if line.strip() else b"{}"


def _decoded(spark, batches: list[pa.RecordBatch], typed: bool):
    """The batches' rows decoded by Spark (``typed``: the task's decode first)."""
    ddl = "key BINARY, value BINARY, partition INT, offset BIGINT, timestamp TIMESTAMP, ts BIGINT, _problem STRING"
    if typed:
        ddl += ", _typed STRUCT<id: BIGINT, name: STRING, amount: DOUBLE, ok: BOOLEAN, _reclock_corrupt: STRING>"
    df = spark.range(0, 1, 1, 1).mapInArrow(lambda _: iter(batches), ddl)
    return decoded(SPEC, df, problem="_problem", predecoded="_typed" if typed else None)


def _rows(old, new) -> dict[int, list[tuple]]:
    """Both paths' rows in one Spark job, by ts, in offset order."""
    out: dict[int, list[tuple]] = {}
    for r in sorted(old.unionByName(new).collect(), key=lambda r: (r["ts"], r["_o"])):
        amount = None if r["amount"] is None else struct.pack(">d", r["amount"]).hex()  # bits: -0.0, NaN
        out.setdefault(r["ts"], []).append(
            (r["_o"], r["id"], r["name"], amount, r["ok"], r["_reason"],
             None if r["_raw"] is None else bytes(r["_raw"]), None if r["_v"] is None else bytes(r["_v"])))
    return out


def _compare(spark, lines: list[bytes]) -> tuple[int, int]:
    """The lines through ``from_json`` alone (as before), and through the task's decode as one batch (in
    blocks where a line does not pass) and each line alone: the same rows. Returns how many lines the task
    decoded alone and how many are errors."""
    values = pa.array(lines, pa.binary())
    offsets = np.arange(len(lines), dtype=np.int64) * 1000
    schema = json_lines.arrow_schema(FIELDS)
    batch, alone = replace(UNIT, ts=2), replace(UNIT, ts=3)
    rows = _rows(_decoded(spark, [_batch(UNIT, values, offsets)], typed=False),
                 _decoded(spark, [_batch(batch, values, offsets, typed=schema)]
                          + [_batch(alone, values.slice(i, 1), offsets[i:i + 1], typed=schema)
                             for i in range(len(lines))], typed=True))
    before, afters = rows.pop(UNIT.ts), rows
    assert sorted(afters) == [2, 3]
    for after in afters.values():
        # the raw value is handed over only where the task did not decode (never an error row's)
        assert [r[:7] for r in after] == [r[:7] for r in before]
        assert all(a[7] == b[7] if (a[7] is not None or b[5] is not None) else True for a, b in zip(after, before))
    took = sum(1 for r in afters[3] if r[7] is None)
    return took, sum(1 for r in before if r[5] is not None)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(json_line(), min_size=1, max_size=60))
@example(EDGE)
def test_task_decode_equals_from_json(spark, lines):
    saved, json_lines.BLOCK_LINES = json_lines.BLOCK_LINES, 8  # blocks too, not only the whole batch
    try:
        took, errors = _compare(spark, lines)
    finally:
        json_lines.BLOCK_LINES = saved
    if lines == EDGE:  # the clean edge lines went through the task; the bad ones are errors as before
        assert took >= 8 and errors >= 10
