"""Line formats read by byte ranges (``reclock.sources.s3.lines``): the splits of a bound range read each of
its lines exactly once, at the offset of its first byte, whatever the chunk sizes; gzip whole, damage found."""

from __future__ import annotations

import gzip

from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.sources.s3.lines import (Lines, ReadProblem, complete_upto, read_gzip_lines, read_lines,
                                      split_points)

line = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x"))
texts = st.lists(st.tuples(line, st.sampled_from([b"\n", b"\r\n"])), max_size=25)


def reference(data: bytes, start: int, end: int, skip_empty: bool) -> list[tuple[int, bytes]]:
    """Lines of data[start:end] the obvious way (start, end at line boundaries)."""
    out, at = [], start
    for raw in data[start:end].split(b"\n"):
        value = raw[:-1] if raw.endswith(b"\r") else raw
        if at < end and not (skip_empty and not value):
            out.append((at, value))
        at += len(raw) + 1
    return out


def chunked(data: bytes, lo: int, hi: int, size: int):
    for i in range(lo, hi, size):
        yield data[i:min(hi, i + size)]


def collect(items) -> list[tuple[int, bytes]]:
    out = []
    for item in items:
        assert isinstance(item, Lines)
        out += list(zip(item.offsets.tolist(), item.values.to_pylist()))
    return out


@settings(max_examples=300, deadline=None)
@given(texts, st.booleans(), st.data())
def test_splits_read_each_line_of_a_bound_range_once(pairs, last_line_open, data):
    body = b"".join(v + e for v, e in pairs) + (b"tail\r" if last_line_open else b"")
    bounds = [0] + [i + 1 for i, c in enumerate(body) if c == 0x0A] + [len(body)]
    start = data.draw(st.sampled_from(bounds))
    end = data.draw(st.sampled_from([x for x in bounds if x >= start]))
    skip_empty = data.draw(st.booleans())
    size = data.draw(st.integers(min_value=1, max_value=40))
    chunk = data.draw(st.integers(min_value=1, max_value=17))
    got = []
    for a, b in split_points(start, end, size):
        first = a if a == start else a - 1
        got += collect(read_lines(chunked(body, first, end, chunk), start, a, b, end, skip_empty))
    assert got == reference(body, start, end, skip_empty)


plain_texts = st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"x")), max_size=25)


@settings(max_examples=300, deadline=None)
@given(plain_texts, st.binary(max_size=5), st.booleans(), st.integers(min_value=1, max_value=64), st.data())
def test_the_plain_path_splits_as_the_general_one(values, rest, skip_empty, tail, data):
    """Lines ending in a bare \\n (the common case) go through Arrow's split; whatever it declines (a \\r before a
    line end, an empty line to drop, no line end) goes through numpy; both give the same lines."""
    import numpy as np

    from reclock.sources.s3 import lines as L

    body = b"".join(v + b"\n" for v in values) + rest.replace(b"\n", b"")
    if data.draw(st.booleans()):  # lines that give the plain path no reason to decline
        body = body.replace(b"\r", b"x")
    buf = np.frombuffer(body, np.uint8)
    base = data.draw(st.integers(min_value=0, max_value=2**40))
    want_lines, want_used = L._any_lines_of(buf, base, skip_empty)
    for tail_bytes in (tail, L.TAIL_BYTES):  # the last line end in the tail searched first, or before it
        L_tail, L.TAIL_BYTES = L.TAIL_BYTES, tail_bytes
        try:
            got = L._plain_lines_of(buf, base, skip_empty)
        finally:
            L.TAIL_BYTES = L_tail
        if got is None:
            assert b"\r\n" in body[:want_used] or b"\n" not in body or (skip_empty and (
                body.startswith(b"\n") or b"\n\n" in body[:want_used]))
            continue
        got_lines, got_used = got
        assert got_used == want_used
        assert got_lines.offsets.tolist() == want_lines.offsets.tolist()
        assert got_lines.values.to_pylist() == want_lines.values.to_pylist()
        assert got_lines.values.type == want_lines.values.type


def test_a_reader_stops_pulling_after_its_split():
    body = b"a\n" * 1000
    pulled = []

    def chunks():
        for c in chunked(body, 0, len(body), 10):
            pulled.append(len(c))
            yield c
    got = collect(read_lines(chunks(), 0, 0, 20, len(body), False))
    assert [o for o, _ in got] == list(range(0, 20, 2))
    assert sum(pulled) <= 30


def test_complete_upto_finds_the_last_line_end():
    assert complete_upto(b"ab\ncd", 100) == 103
    assert complete_upto(b"abcd", 100) is None
    assert complete_upto(b"ab\n", 0) == 3


def test_an_overlong_line_is_a_problem_and_reading_goes_on():
    body = b"ok\n" + b"x" * 100 + b"\nafter\n"
    items = list(read_lines(chunked(body, 0, len(body), 7), 0, 0, len(body), len(body), False, max_line=50))
    lines = collect(i for i in items if isinstance(i, Lines))
    problems = [i for i in items if isinstance(i, ReadProblem)]
    assert lines == [(0, b"ok"), (104, b"after")]
    assert len(problems) == 1 and problems[0].offset == 3 and "101 bytes" in problems[0].reason


def test_gzip_members_and_damage():
    text = b"".join(b'{"n": %d}\n' % i for i in range(1000))
    two = gzip.compress(text[:5000]) + gzip.compress(text[5000:]) + b"\0" * 10
    items = list(read_gzip_lines(chunked(two, 0, len(two), 333), "s3://b/k.gz", True))
    assert [v for _, v in collect(items)] == text.splitlines()

    cut = gzip.compress(text)[:-200]
    items = list(read_gzip_lines(chunked(cut, 0, len(cut), 100), "s3://b/k.gz", True))
    lines = collect(i for i in items if isinstance(i, Lines))
    problem = items[-1]
    assert isinstance(problem, ReadProblem) and "ends early" in problem.reason and "s3://b/k.gz" in problem.reason
    assert lines and [v for _, v in lines] == text.splitlines()[:len(lines)]
    assert problem.offset == lines[-1][0] + len(lines[-1][1]) + 1  # right after the last whole line

    bad = gzip.compress(text)[:50] + b"garbage" * 20
    items = list(read_gzip_lines([bad], "s3://b/k.gz", True))
    assert isinstance(items[-1], ReadProblem) and "damaged" in items[-1].reason
    assert list(read_gzip_lines([b""], "s3://b/empty.gz", True)) == []
