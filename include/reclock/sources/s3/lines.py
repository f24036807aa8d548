"""Reading line formats (JSON lines, CSV, text) by byte ranges, and gzip'd ones whole (no I/O here: the
bytes come in as chunks from ``reclock.sources.s3.client``).

A line is the bytes up to a ``\\n`` (a ``\\r`` right before it is dropped too: CRLF files), or up to the end
of an object that does not end with one. Its FromTime is ``(object id, byte offset of its first byte)``.

Bindings of a line format only ever end at a line boundary (*only complete lines are bound*): after a
``\\n``, or at the end of an object that is sealed (complete: S3 objects are immutable; a local file is
sealed once it has not changed for the source's ``settle`` time). :func:`complete_upto` finds that
boundary. So a bound range ``[start, end)`` of an object holds whole lines, and a reader of it never needs
a byte outside it.

A range may be split further (a large object read by several Spark tasks). A split ``[a, b)`` of a bound
range ``[start, end)`` reads the lines that *start* in ``[a, b)`` (Hadoop's rule for text splits): it skips
the partial line at ``a`` unless ``a`` is a line start, and reads the line that crosses ``b`` to its end
(never past ``end``). The splits of a range together read each of its lines exactly once
(:func:`split_points`, the law in tests/unit/test_s3_lines.py).

A gzip'd object (``.gz``, or ``compression: gzip``) cannot be entered in the middle, so it is bound and read
whole; its lines' offsets are positions in the decompressed bytes. A stream that ends before gzip's end of
stream (a truncated upload) yields every complete line before the damage, then :class:`ReadProblem`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa

NL, CR = 0x0A, 0x0D
MAX_LINE_BYTES = 256 << 20
"""A line longer than this is not held in memory: it becomes an error row (its first bytes as the raw
value) and reading goes on after it."""
RAW_PREFIX = 1 << 20
"""How many bytes of an overlong line the error row keeps."""


@dataclass(frozen=True)
class Lines:
    """A batch of lines: ``values`` (Arrow binary, without the line ends) and ``offsets`` (int64, each
    line's first byte); ``problem`` is set on the batch that ends a read that went wrong."""

    values: pa.Array
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class ReadProblem:
    """Something in an object's bytes that is not a line: an overlong line, or a damaged gzip stream.
    ``offset`` is where it starts; ``raw`` the bytes kept of it; ``reason`` in words."""

    offset: int
    raw: bytes
    reason: str


def complete_upto(tail: bytes, base: int) -> int | None:
    """The offset right after the last ``\\n`` in ``tail`` (whose first byte is at ``base``): how far the
    complete lines of a growing object reach. None when ``tail`` holds no line end."""
    i = tail.rfind(b"\n")
    return None if i < 0 else base + i + 1


def split_points(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into consecutive splits of at most ``size`` bytes (at least one split)."""
    if size <= 0:
        raise ValueError(f"split size must be positive, got {size}")
    if end <= start:
        return [(start, end)]
    return [(a, min(end, a + size)) for a in range(start, end, size)]


def _lines_of(buf: np.ndarray, base: int, skip_empty: bool) -> tuple[Lines, int]:
    """The complete lines in ``buf`` (whose first byte is at ``base``) and how many bytes they take (up to
    and with the last ``\\n``); the bytes after it are the start of a line not complete yet."""
    plain = _plain_lines_of(buf, base, skip_empty)
    return plain if plain is not None else _any_lines_of(buf, base, skip_empty)


def _any_lines_of(buf: np.ndarray, base: int, skip_empty: bool) -> tuple[Lines, int]:
    """:func:`_lines_of` for any bytes (CRLF line ends, empty lines dropped), in numpy."""
    nl = np.flatnonzero(buf == NL)
    if len(nl) == 0:
        return Lines(pa.array([], pa.binary()), np.empty(0, np.int64)), 0
    starts = np.empty(len(nl), np.int64)
    starts[0] = 0
    starts[1:] = nl[:-1] + 1
    ends = nl.astype(np.int64)
    cr = np.zeros(len(nl), bool)
    nonempty = ends > starts
    cr[nonempty] = buf[ends[nonempty] - 1] == CR
    ends -= cr
    used = int(nl[-1]) + 1
    # the values buffer: the used bytes without the line ends (each \n, and a \r right before one)
    mask = np.ones(used, bool)
    mask[nl] = False
    mask[ends[cr]] = False
    data = buf[:used][mask]
    lengths = ends - starts
    if skip_empty:  # an empty line has no bytes in `data`: dropping it leaves the others' offsets as they are
        keep = lengths > 0
        starts, lengths = starts[keep], lengths[keep]
    wide = len(data) >= 2**31
    offsets = np.zeros(len(lengths) + 1, np.int64 if wide else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    typ = pa.large_binary() if wide else pa.binary()
    values = pa.Array.from_buffers(typ, len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return Lines(values, starts + base), used


TAIL_BYTES = 1 << 16
"""Where :func:`_plain_lines_of` looks for the last line end first (lines are mostly far shorter)."""


def _plain_lines_of(buf: np.ndarray, base: int, skip_empty: bool) -> tuple[Lines, int] | None:
    """:func:`_lines_of` in the common case, in Arrow's C++ split (no mask, no per-byte copy in numpy: ~10x
    faster): lines ending in ``\\n`` alone, and with ``skip_empty`` none empty. None for anything else (a
    ``\\r`` right before a line end, an empty line to drop, no line end, 2 GiB and more), which the general
    path handles."""
    import pyarrow.compute as pc

    n = len(buf)
    tail = max(0, n - TAIL_BYTES)
    ends = np.flatnonzero(buf[tail:] == NL)
    if len(ends) == 0:
        if tail == 0:
            return None
        ends = np.flatnonzero(buf[:tail] == NL)
        if len(ends) == 0:
            return None
        last = int(ends[-1])
    else:
        last = tail + int(ends[-1])
    if last >= 2**31 - 1:
        return None
    whole = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.array([0, last], np.int32)),
                                                    pa.py_buffer(buf[:last])])
    values = pc.split_pattern(whole, pattern=b"\n").values  # every line before the last \n, without its \n
    offsets = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4)
    lengths = np.diff(offsets)
    nonempty = lengths > 0
    if skip_empty and not nonempty.all():
        return None
    data = values.buffers()[2]
    if data is not None and len(data) and nonempty.any():
        if (np.frombuffer(data, np.uint8)[offsets[1:][nonempty] - 1] == CR).any():
            return None
    starts = offsets[:-1].astype(np.int64) + np.arange(len(values), dtype=np.int64) + base
    return Lines(values, starts), last + 1


class LineSplitter:
    """Cuts a stream of chunks into :class:`Lines` batches. ``base``: the offset of the first byte fed;
    ``skip_empty``: empty lines are not records (JSON lines and CSV, as Spark's readers skip them)."""

    def __init__(self, base: int, skip_empty: bool, max_line: int = MAX_LINE_BYTES) -> None:
        self.at = base  # offset of the first byte of `carry`
        self.carry = b""
        self.skip_empty = skip_empty
        self.max_line = max_line
        self.overlong: int | None = None  # offset of a line being skipped, too long to hold
        self.overlong_raw = b""
        self.problems: list[ReadProblem] = []

    def feed(self, chunk: bytes) -> Iterator[Lines]:
        if self.overlong is not None:
            i = chunk.find(b"\n")
            if i < 0:
                self.at += len(chunk)
                return
            self._end_overlong(self.at + i + 1)
            self.at += i + 1
            chunk = chunk[i + 1:]
        data = self.carry + chunk if self.carry else chunk
        buf = np.frombuffer(data, np.uint8)
        lines, used = _lines_of(buf, self.at, self.skip_empty)
        if len(lines):
            yield lines
        self.carry = data[used:]
        self.at += used
        if len(self.carry) > self.max_line:
            self.overlong, self.overlong_raw = self.at, self.carry[:RAW_PREFIX]
            self.at += len(self.carry)
            self.carry = b""

    def _end_overlong(self, end: int) -> None:
        self.problems.append(ReadProblem(self.overlong, self.overlong_raw,
                                         f"a line of {end - self.overlong} bytes is longer than the "
                                         f"{self.max_line} bytes a line may have (its first {len(self.overlong_raw)} "
                                         "bytes are kept here)"))
        self.overlong, self.overlong_raw = None, b""

    def finish(self) -> Iterator[Lines]:
        """The last line, if the stream ended without a line end after it."""
        if self.overlong is not None:
            self._end_overlong(self.at)
            return
        if self.carry:
            yield from self.feed(b"\n")  # the end of the object ends its last line
            self.at -= 1
        self.carry = b""


def read_lines(chunks: Iterable[bytes], start: int, a: int, b: int, end: int, skip_empty: bool,
               max_line: int = MAX_LINE_BYTES) -> Iterator[Lines | ReadProblem]:
    """The lines that start in ``[a, b)`` of the bound range ``[start, end)`` of one object, and the
    problems found there. ``chunks``: the object's bytes from ``a - 1`` (from ``a`` when ``a == start``) to
    ``end``, consumed lazily: reading stops once the line that crosses ``b`` is complete."""
    it = iter(chunks)
    if a > start:  # a is a line start iff the byte before it ends a line; else the first line starts later
        pos = a - 1
        while True:
            chunk = next(it, None)
            if chunk is None:
                return
            i = chunk.find(b"\n")
            if i >= 0:
                line_start, rest = pos + i + 1, chunk[i + 1:]
                break
            pos += len(chunk)
            if pos >= b - 1:
                return  # the next line starts at or after b: another split's
    else:
        line_start, rest = a, b""
    if line_start >= b:
        return
    splitter = LineSplitter(line_start, skip_empty, max_line)
    chunk: bytes | None = rest
    while chunk is not None:
        for lines in splitter.feed(chunk):
            yield from _until(lines, b)
        yield from _problems(splitter, b)
        if splitter.at >= b and splitter.overlong is None:
            return
        chunk = next(it, None)
    for lines in splitter.finish():  # the range ended: at a line boundary, or the end of the object
        yield from _until(lines, b)
    yield from _problems(splitter, b)


def _until(lines: Lines, b: int) -> Iterator[Lines]:
    if len(lines) and lines.offsets[-1] >= b:
        n = int(np.searchsorted(lines.offsets, b))
        if n:
            yield Lines(lines.values.slice(0, n), lines.offsets[:n])
        return
    if len(lines):
        yield lines


def _problems(splitter: LineSplitter, b: int) -> Iterator[ReadProblem]:
    while splitter.problems:
        p = splitter.problems.pop(0)
        if p.offset < b:
            yield p


def gunzip(chunks: Iterable[bytes], url: str) -> Iterator[bytes | ReadProblem]:
    """The decompressed bytes of a gzip stream (several members one after the other, as ``cat a.gz b.gz``
    makes, are one stream; zero bytes after the last member are padding). A stream that is damaged or ends
    before its end yields a :class:`ReadProblem` last, whose ``offset`` is the decompressed bytes before it."""
    d = zlib.decompressobj(wbits=31)
    fed = False  # whether the current member has had any byte
    out_bytes = 0
    for chunk in chunks:
        data = chunk
        while data:
            if not fed and not data.strip(b"\x00"):
                break  # padding between or after members
            fed = True
            try:
                out = d.decompress(data)
            except zlib.error as e:
                yield ReadProblem(out_bytes, b"", f"the gzip stream of {url} is damaged after {out_bytes} "
                                                  f"decompressed bytes ({e}); the lines before the damage are read")
                return
            if out:
                out_bytes += len(out)
                yield out
            if d.eof:
                data = d.unused_data
                d, fed = zlib.decompressobj(wbits=31), False
            else:
                data = b""
    if fed:
        yield ReadProblem(out_bytes, b"", f"the gzip stream of {url} ends early, after {out_bytes} decompressed "
                                          "bytes (a truncated upload?); the lines before the damage are read")


def read_gzip_lines(chunks: Iterable[bytes], url: str, skip_empty: bool,
                    max_line: int = MAX_LINE_BYTES) -> Iterator[Lines | ReadProblem]:
    """Every line of a gzip'd object (``chunks``: all its compressed bytes), offsets in the decompressed
    bytes; a damaged or truncated stream ends with its :class:`ReadProblem` after the lines before it
    (a partial last line before the damage is not a line)."""
    splitter = LineSplitter(0, skip_empty, max_line)
    damaged = None
    for piece in gunzip(chunks, url):
        if isinstance(piece, ReadProblem):
            damaged = piece
            break
        yield from splitter.feed(piece)
        yield from _problems(splitter, 2**63 - 1)
    if damaged is None:
        yield from splitter.finish()
    yield from _problems(splitter, 2**63 - 1)
    if damaged is not None:
        yield ReadProblem(splitter.at, splitter.carry[:RAW_PREFIX], damaged.reason)
