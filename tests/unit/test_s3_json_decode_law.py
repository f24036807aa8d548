"""The S3 read task's JSON decode (``reclock.sources.s3.json_lines``) as pure logic: every line is either
decoded or left to Spark, never both, never lost, never moved; a bad line leaves only its block to Spark.
Its values against Spark's ``from_json``: tests/integration/test_s3_json_lines.py."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.sources.s3 import json_lines

CORRUPT = "_reclock_corrupt"
FIELDS = (("id", "bigint"), ("name", "string"), ("amount", "double"), (CORRUPT, "string"))


def test_a_bad_line_leaves_only_its_block_to_spark(monkeypatch):
    monkeypatch.setattr(json_lines, "BLOCK_LINES", 2)
    schema = json_lines.arrow_schema(FIELDS)
    lines = [b'{"id": %d}' % i for i in range(7)]
    lines[3] = b'{"id": 1.5}'
    typed, rest = json_lines.decode_lines(pa.array(lines, pa.binary()), schema, CORRUPT)
    assert [t["id"] for t in typed.to_pylist()[:2]] == [0, 1] and typed.to_pylist()[4]["id"] == 4
    assert rest.to_pylist() == [None, None, lines[2], lines[3], None, None, None]


def test_only_the_types_it_decodes_exactly():
    assert json_lines.arrow_schema((("t", "timestamp"),)) is None
    assert json_lines.arrow_schema((("d", "decimal(10,2)"), ("n", "bigint"))) is None
    assert json_lines.arrow_schema(()) is None


_line = st.one_of(
    st.builds(lambda i, n: b'{"id": %d, "name": "%s"}' % (i, n.encode()), st.integers(-(2**63), 2**63 - 1),
              st.text("abc\u00e9", max_size=5)),
    st.builds(lambda f: b'{"amount": %s}' % repr(f).encode(), st.floats()),
    st.binary(max_size=20), st.just(b'{"id": 1}{"id": 2}'), st.just(b"{}"))


@settings(max_examples=200, deadline=None)
@given(st.lists(_line, max_size=40), st.integers(1, 8))
def test_each_line_decoded_or_left_to_spark_exactly_once(lines, block):
    saved, json_lines.BLOCK_LINES = json_lines.BLOCK_LINES, block
    try:
        typed, rest = json_lines.decode_lines(pa.array(lines, pa.binary()), json_lines.arrow_schema(FIELDS), CORRUPT)
    finally:
        json_lines.BLOCK_LINES = saved
    assert len(typed) == len(rest) == len(lines)
    for line, t, r in zip(lines, typed.to_pylist(), rest.to_pylist()):
        assert (t is None) != (r is None)
        assert r is None or r == line
        if t is not None:  # a decoded line is one object whose id, where given, is its own
            assert line.startswith(b"{") and line.endswith(b"}") and t[CORRUPT] is None
            if line.startswith(b'{"id": ') and b"}{" not in line:
                assert t["id"] == int(line.split(b",")[0][7:].rstrip(b"}"))
