"""Decoding PostgreSQL's ``pgoutput`` logical replication protocol, version 1 (pure Python, no I/O).

``pg_logical_slot_peek_binary_changes(slot, upto_lsn, NULL, 'proto_version', '1', 'publication_names',
'<pub>')`` returns one ``bytea`` message per row. :func:`decode` turns one into a frozen value:

========  ==================  ==============================================================================
byte      message             fields
========  ==================  ==============================================================================
``B``     :class:`Begin`      final (commit) LSN, commit time (µs since 2000-01-01), xid
``C``     :class:`Commit`     flags, commit LSN, end LSN, commit time
``O``     :class:`Origin`     the origin's commit LSN, origin name
``R``     :class:`Relation`   relid, namespace, name, replica identity, columns (flags, name, type oid, typmod)
``Y``     :class:`Type`       type oid, namespace, name
``I``     :class:`Insert`     relid, the new tuple
``U``     :class:`Update`     relid, the old tuple (``K``: key columns only, ``O``: the whole row) if sent,
                              the new tuple
``D``     :class:`Delete`     relid, the old tuple (``K`` or ``O``)
``T``     :class:`Truncate`   options (cascade, restart identity), relids
========  ==================  ==============================================================================

A tuple is one :data:`Value` per column: :data:`NULL` (``n``), :data:`UNCHANGED_TOAST` (``u``: a TOASTed
value the update did not change, so the message does not carry it) or the value's text form as ``bytes``
(``t``). Every transaction's messages arrive between its Begin and its Commit, whole (protocol v1 streams
nothing in progress), and a Relation precedes the first change of its table in each decoding session.

:func:`arrow_type` and :func:`convert` turn a column's text form into an Arrow-friendly Python value by its
type oid (:data:`CONVERSIONS` lists the types known; any other type stays text). The reader's session must
use ``DateStyle = ISO``, ``IntervalStyle = postgres``, ``bytea_output = hex`` and ``TimeZone = UTC``, the
forms :func:`convert` parses (``reclock.sources.postgres.upstream`` sets them).

Law (tested with hypothesis): ``decode(encode(m)) == m`` for every message ``m`` (the encoder lives in the
tests), and ``convert`` inverts Postgres's text output for every type it knows.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from dataclasses import dataclass
from typing import Callable, Union

import numpy as np
import pyarrow as pa

from reclock.errors import ReclockError


class ProtocolError(ReclockError):
    """A ``pgoutput`` message could not be decoded (truncated, unknown kind, trailing bytes)."""


class ConversionError(ReclockError):
    """A column's text form could not be converted to its Arrow type (a value the type cannot hold, like
    numeric ``NaN`` or a timestamp at ``infinity``)."""


class _Unchanged:
    """The marker of an unchanged TOASTed value (``u``): the message does not carry the value."""

    _instance: "_Unchanged | None" = None

    def __new__(cls) -> "_Unchanged":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


NULL = None
UNCHANGED_TOAST = _Unchanged()
Value = Union[None, _Unchanged, bytes]
"""One column of a tuple: NULL (None), UNCHANGED_TOAST, or the text form's bytes."""
Tuple = tuple[Value, ...]

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_time: int  # µs since 2000-01-01 UTC
    xid: int


@dataclass(frozen=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True)
class Origin:
    commit_lsn: int
    name: str


@dataclass(frozen=True)
class Column:
    flags: int  # 1: part of the replica identity key
    name: str
    type_oid: int
    typmod: int


@dataclass(frozen=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str  # d default, n nothing, f full, i index
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        """``namespace.name`` (the form a source's ``tables:`` uses)."""
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True)
class Type:
    oid: int
    namespace: str
    name: str


@dataclass(frozen=True)
class Insert:
    relid: int
    new: Tuple


@dataclass(frozen=True)
class Update:
    relid: int
    old_kind: str | None  # None (no old tuple sent), "K" (key columns) or "O" (the whole old row)
    old: Tuple | None
    new: Tuple


@dataclass(frozen=True)
class Delete:
    relid: int
    old_kind: str  # "K" or "O"
    old: Tuple


@dataclass(frozen=True)
class Truncate:
    options: int  # 1 CASCADE, 2 RESTART IDENTITY
    relids: tuple[int, ...]


Message = Union[Begin, Commit, Origin, Relation, Type, Insert, Update, Delete, Truncate]


class _Reader:
    """A cursor over one message's bytes; every read checks the bytes are there."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ProtocolError(f"pgoutput message truncated: needs {n} bytes at {self.pos}, has {len(self.data)}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def i8(self) -> int:
        return self.unpack("!b")[0]

    def i16(self) -> int:
        return self.unpack("!h")[0]

    def i32(self) -> int:
        return self.unpack("!i")[0]

    def u32(self) -> int:
        return self.unpack("!I")[0]

    def i64(self) -> int:
        return self.unpack("!q")[0]

    def u64(self) -> int:
        return self.unpack("!Q")[0]

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def string(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError(f"pgoutput message truncated: a string at {self.pos} has no terminator")
        out = self.data[self.pos:end].decode("utf-8")
        self.pos = end + 1
        return out

    def tuple(self) -> Tuple:
        out, self.pos = _tuple(self.data, self.pos)
        return out

    def done(self, what: str) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"pgoutput {what}: {len(self.data) - self.pos} trailing bytes")


_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")


def _tuple(data: bytes, pos: int) -> tuple[Tuple, int]:
    """TupleData at ``pos``: the values and the position after it (the hot loop of every change, so
    written flat: one bounds check per read, no method calls)."""
    end_all = len(data)
    if pos + 2 > end_all:
        raise ProtocolError(f"pgoutput message truncated: a tuple at {pos} has no column count")
    (n,) = _I16.unpack_from(data, pos)
    pos += 2
    out: list[Value] = []
    append = out.append
    for _ in range(n):
        if pos >= end_all:
            raise ProtocolError(f"pgoutput message truncated: a tuple's column at {pos} is missing")
        kind = data[pos]
        pos += 1
        if kind == 116:  # t: text
            if pos + 4 > end_all:
                raise ProtocolError(f"pgoutput message truncated: a value's length at {pos} is missing")
            (size,) = _I32.unpack_from(data, pos)
            pos += 4
            end = pos + size
            if size < 0 or end > end_all:
                raise ProtocolError(f"pgoutput message truncated: a value of {size} bytes at {pos}")
            append(data[pos:end])
            pos = end
        elif kind == 110:  # n: null
            append(NULL)
        elif kind == 117:  # u: unchanged TOAST
            append(UNCHANGED_TOAST)
        else:
            raise ProtocolError(f"pgoutput tuple: unknown column kind {chr(kind)!r} (binary values need "
                                "protocol option binary, which Reclock does not ask for)")
    return tuple(out), pos


def decode(data: bytes) -> Message:
    """The message ``data`` holds (one row of ``pg_logical_slot_peek_binary_changes``); ``ProtocolError``
    if it is not a whole protocol v1 message of a kind listed in the module."""
    data = bytes(data)
    kind = data[0] if data else 0
    if kind in (73, 85, 68) and len(data) >= 6:  # I, U, D: the common messages, straight through
        relid, tag = int.from_bytes(data[1:5], "big"), data[5]
        if kind == 73 and tag == 78:  # Insert, N
            new, pos = _tuple(data, 6)
            msg: Message = Insert(relid, new)
        elif kind == 68 and tag in (75, 79):  # Delete, K or O
            old, pos = _tuple(data, 6)
            msg = Delete(relid, chr(tag), old)
        elif kind == 85 and tag in (75, 79):  # Update with an old tuple
            old, pos = _tuple(data, 6)
            if pos >= len(data) or data[pos] != 78:
                raise ProtocolError("pgoutput Update: expected N before the new tuple")
            new, pos = _tuple(data, pos + 1)
            msg = Update(relid, chr(tag), old, new)
        elif kind == 85 and tag == 78:  # Update without one
            new, pos = _tuple(data, 6)
            msg = Update(relid, None, None, new)
        else:
            pos = -1
            msg = None  # type: ignore[assignment]  # a malformed one: the general path says what is wrong
        if msg is not None:
            if pos != len(data):
                raise ProtocolError(f"pgoutput {type(msg).__name__}: {len(data) - pos} trailing bytes")
            return msg
    r = _Reader(data)
    kind = r.byte()
    msg: Message
    if kind == "B":
        msg = Begin(r.u64(), r.i64(), r.u32())
    elif kind == "C":
        msg = Commit(r.i8(), r.u64(), r.u64(), r.i64())
    elif kind == "O":
        msg = Origin(r.u64(), r.string())
    elif kind == "R":
        relid, ns, name, ident = r.u32(), r.string(), r.string(), r.byte()
        cols = tuple(Column(r.i8(), r.string(), r.u32(), r.i32()) for _ in range(r.i16()))
        msg = Relation(relid, ns, name, ident, cols)
    elif kind == "Y":
        msg = Type(r.u32(), r.string(), r.string())
    elif kind == "I":
        relid = r.u32()
        if r.byte() != "N":
            raise ProtocolError("pgoutput Insert: expected N before the new tuple")
        msg = Insert(relid, r.tuple())
    elif kind == "U":
        relid = r.u32()
        tag = r.byte()
        old_kind, old = None, None
        if tag in ("K", "O"):
            old_kind, old = tag, r.tuple()
            tag = r.byte()
        if tag != "N":
            raise ProtocolError(f"pgoutput Update: expected N before the new tuple, got {tag!r}")
        msg = Update(relid, old_kind, old, r.tuple())
    elif kind == "D":
        relid = r.u32()
        tag = r.byte()
        if tag not in ("K", "O"):
            raise ProtocolError(f"pgoutput Delete: expected K or O before the old tuple, got {tag!r}")
        msg = Delete(relid, tag, r.tuple())
    elif kind == "T":
        n, options = r.i32(), r.i8()
        msg = Truncate(options, tuple(r.u32() for _ in range(n)))
    else:
        raise ProtocolError(f"pgoutput: unknown message kind {kind!r}")
    r.done(type(msg).__name__)
    return msg


# -- LSNs ---------------------------------------------------------------------------------------------

def lsn_to_int(text: str) -> int:
    """``'16/B374D848'`` -> the 64-bit integer it spells."""
    hi, _, lo = str(text).partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def lsn_to_str(lsn: int) -> str:
    """The ``pg_lsn`` text form of a 64-bit LSN."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# -- values ---------------------------------------------------------------------------------------------

BOOL, BYTEA, NAME, INT8, INT2, INT4, TEXT, OID, JSON, FLOAT4, FLOAT8 = 16, 17, 19, 20, 21, 23, 25, 26, 114, 700, 701
BPCHAR, VARCHAR, DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, JSONB = 1042, 1043, 1082, 1114, 1184, 1700, 2950, 3802


def _bool(s: str) -> bool:
    if s in ("t", "true"):
        return True
    if s in ("f", "false"):
        return False
    raise ValueError(f"not a bool: {s!r}")


def _float(s: str) -> float:
    return float(s)  # Python reads NaN, Infinity, -Infinity as Postgres writes them


def _bytea(s: str) -> bytes:
    if not s.startswith("\\x"):
        raise ValueError("bytea is not in hex form (set bytea_output = hex)")
    return bytes.fromhex(s[2:])


def _date(s: str) -> dt.date:
    if s.endswith(" BC") or s in ("infinity", "-infinity"):
        raise ValueError(f"date {s!r} is outside what Arrow holds")
    return dt.date.fromisoformat(s)


def _timestamp(s: str) -> dt.datetime:
    if s.endswith(" BC") or s in ("infinity", "-infinity"):
        raise ValueError(f"timestamp {s!r} is outside what Arrow holds")
    return dt.datetime.fromisoformat(s)


def _timestamptz(s: str) -> dt.datetime:
    t = _timestamp(s)
    if t.tzinfo is None:
        raise ValueError(f"timestamptz {s!r} has no offset")
    return t.astimezone(dt.timezone.utc)


def _numeric(s: str) -> decimal.Decimal:
    d = decimal.Decimal(s)
    if not d.is_finite():
        raise ValueError(f"numeric {s!r} has no decimal value")
    return d


CONVERSIONS: dict[int, Callable[[str], object]] = {
    BOOL: _bool, INT2: int, INT4: int, INT8: int, OID: int, FLOAT4: _float, FLOAT8: _float,
    NUMERIC: _numeric, TEXT: str, VARCHAR: str, BPCHAR: str, NAME: str, JSON: str, JSONB: str, UUID: str,
    BYTEA: _bytea, DATE: _date, TIMESTAMP: _timestamp, TIMESTAMPTZ: _timestamptz,
}
"""Type oid -> the function that reads its text form. Any other type is kept as its text (a string)."""


def numeric_precision(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric(p, s)`` typmod; None for an unconstrained numeric."""
    if typmod < 4:
        return None
    t = typmod - 4
    return (t >> 16) & 0xFFFF, t & 0xFFFF


def arrow_type(type_oid: int, typmod: int = -1) -> pa.DataType:
    """The Arrow type a column of this Postgres type becomes. ``numeric(p, s)`` is ``decimal128(p, s)``
    (``decimal256`` beyond 38 digits); an unconstrained ``numeric`` is ``decimal128(38, 10)`` when its
    values fit, and otherwise ``ConversionError`` at the value (declare the column's precision). json,
    jsonb and uuid are their text; an unknown type is its text form."""
    simple = {BOOL: pa.bool_(), INT2: pa.int16(), INT4: pa.int32(), INT8: pa.int64(), OID: pa.int64(),
              FLOAT4: pa.float32(), FLOAT8: pa.float64(), BYTEA: pa.binary(), DATE: pa.date32(),
              TIMESTAMP: pa.timestamp("us"), TIMESTAMPTZ: pa.timestamp("us", tz="UTC")}
    if type_oid in simple:
        return simple[type_oid]
    if type_oid == NUMERIC:
        ps = numeric_precision(typmod)
        if ps is None:
            return pa.decimal128(38, 10)
        p, s = ps
        return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    return pa.string()


def convert(type_oid: int, typmod: int, text: bytes | str | None, column: str = "?") -> object:
    """The Python value of one column's text form (bytes as pgoutput sends it, or ``str`` as a ``::text``
    query reads it; None stays None); ``ConversionError`` naming the column
    if the text is not a value its Arrow type (:func:`arrow_type`) can hold."""
    if text is None:
        return None
    if text is UNCHANGED_TOAST:
        raise ConversionError(f"column {column}: an unchanged TOASTed value has no value to convert")
    try:
        s = text if isinstance(text, str) else text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError(f"column {column}: a value is not UTF-8 text: {e}") from e
    fn = CONVERSIONS.get(type_oid, str)
    try:
        value = fn(s)
        if type_oid == NUMERIC:
            _check_decimal(value, arrow_type(type_oid, typmod))
        if type_oid == INT2 and not -2**15 <= value < 2**15 or type_oid == INT4 and not -2**31 <= value < 2**31:
            raise ValueError("out of range")
        return value
    except (ValueError, decimal.InvalidOperation) as e:
        raise ConversionError(f"column {column}: {s[:80]!r} is not a value of type oid {type_oid} "
                              f"as {arrow_type(type_oid, typmod)}: {e}") from e


def text_column(type_oid: int, typmod: int, values, column: str = "?") -> pa.Array:
    """One column's text forms (a list of bytes or str, None for NULL; or an Arrow string array) as an Arrow
    array of :func:`arrow_type`, with Arrow's vectorized casts where they read Postgres's text exactly as
    :func:`convert` does, else value by value with :func:`convert` (which names the column and the value
    that cannot be converted).

    Law (tested with hypothesis): equal to ``pa.array([convert(...) for v in values], arrow_type(...))``,
    and raising ``ConversionError`` exactly when that does."""
    import pyarrow.compute as pc

    target = arrow_type(type_oid, typmod)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    try:
        text = _as_text(values, column)
        if pa.types.is_string(target):
            return text
        if type_oid in (INT2, INT4, INT8, OID, NUMERIC, DATE, TIMESTAMP, TIMESTAMPTZ):
            if type_oid in (DATE, TIMESTAMP, TIMESTAMPTZ) and _any_bc_or_infinite(text):
                raise pa.ArrowInvalid("BC or infinite")  # Arrow would read some of these; convert refuses them
            return text.cast(target)
        if type_oid in (FLOAT4, FLOAT8):
            return text.cast(pa.float64()).cast(target)
        if type_oid == BOOL:
            if not pc.all(pc.is_in(text.drop_null(), pa.array(["t", "f"]))).as_py():
                raise pa.ArrowInvalid("not t or f")
            return pc.equal(text, "t")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass  # value by value below: the error names the value
    listed = values.to_pylist() if isinstance(values, pa.Array) else values
    return pa.array([convert(type_oid, typmod, v, column) for v in listed], target)


def _as_text(values, column: str) -> pa.Array:
    """The values as an Arrow string array (bytes checked to be UTF-8: ``ArrowInvalid`` otherwise)."""
    if isinstance(values, pa.Array):
        return values.cast(pa.string())
    if UNCHANGED_TOAST in values:
        raise ConversionError(f"column {column}: an unchanged TOASTed value has no value to convert")
    first = next((v for v in values if v is not None), None)
    if first is None or isinstance(first, str):
        return pa.array(values, pa.string())
    return pa.array(values, pa.binary()).cast(pa.string())


def _any_bc_or_infinite(text: pa.Array) -> bool:
    import pyarrow.compute as pc

    return bool(pc.any(pc.or_(pc.ends_with(text, " BC"), pc.match_substring(text, "infinity"))).as_py())


def _check_decimal(d: decimal.Decimal, t: pa.DataType) -> None:
    sign, digits, exp = d.as_tuple()
    scale = -exp if isinstance(exp, int) else 0
    integer_digits = len(digits) + (exp if isinstance(exp, int) else 0)
    if scale > t.scale or integer_digits > t.precision - t.scale:
        raise ValueError(f"does not fit {t} (give the column a declared numeric(p, s))")


# -- many messages at once ------------------------------------------------------------------------------

class Irregular(Exception):
    """Raised by :func:`tuples_at` where a tuple is not the plain kind it reads (a value other than text or
    NULL, a truncated or overlong tuple): the caller decodes those messages one by one instead, which says
    exactly what is wrong, if anything."""


@dataclass(frozen=True)
class TupleColumns:
    """``m`` tuples of ``n`` columns read in place from one buffer: per tuple and column, where its text
    starts and how long it is, and whether it is NULL (``m x n`` arrays); ``end``: where each tuple ends."""

    start: np.ndarray
    length: np.ndarray
    null: np.ndarray
    end: np.ndarray


def be_int(buf, at, width: int, signed: bool = True) -> np.ndarray:
    """The big-endian integers of ``width`` bytes (2 or 4) at positions ``at`` of the ``uint8`` array
    ``buf``, as int64 (signed ones of 4 bytes as int32: shifted in 32 bits, the top byte's bit is the sign)."""
    if width == 4 and signed:
        v32 = buf[at].astype(np.int32) << 24
        v32 |= buf[at + 1].astype(np.int32) << 16
        v32 |= buf[at + 2].astype(np.int32) << 8
        v32 |= buf[at + 3]
        return v32
    v = buf[at].astype(np.int64)
    for k in range(1, width):
        v = (v << 8) | buf[at + k]
    return np.where(v >= 1 << (8 * width - 1), v - (1 << (8 * width)), v) if signed else v


def be_u64(buf, at) -> np.ndarray:
    """The big-endian unsigned 64-bit integers at positions ``at`` of the ``uint8`` array ``buf`` (each
    with 8 bytes there)."""
    at = np.asarray(at, np.int64)
    return buf[at[:, None] + np.arange(8)].view(">u8").ravel().astype(np.uint64)


def tuples_at(buf, pos, limit, columns: int) -> TupleColumns:
    """The TupleData at each of ``pos`` (positions in the ``uint8`` array ``buf``), each of ``columns``
    columns and ending at or before its ``limit``, read column by column over all tuples at once.

    Law (tested with hypothesis): for tuples of text and NULL values only, the values equal what
    :func:`decode` reads; any other tuple raises :class:`Irregular` (never a wrong value)."""
    m = len(pos)
    size = len(buf)
    start = np.zeros((m, columns), np.int64)
    length = np.zeros((m, columns), np.int64)
    null = np.zeros((m, columns), bool)
    if m == 0:
        return TupleColumns(start, length, null, np.asarray(pos, np.int64))
    pos = np.asarray(pos, np.int64)
    limit = np.asarray(limit, np.int64)
    if np.any(pos + 2 > limit) or np.any(be_int(buf, pos, 2) != columns):
        raise Irregular("a tuple of another column count, or truncated")
    p = pos + 2
    for j in range(columns):
        if np.any(p >= limit):
            raise Irregular("a tuple truncated")
        kind = buf[p]
        text = kind == 116  # t
        if not np.all(text | (kind == 110)):  # n; u (unchanged TOAST) and anything else: one by one
            raise Irregular("a value neither text nor NULL")
        at = np.where(text, p + 1, 0)
        if np.any(text & (at + 4 > limit)):
            raise Irregular("a value's length truncated")
        n = np.where(text, be_int(buf, np.minimum(at, size - 4), 4), 0) if text.any() else np.zeros(m, np.int64)
        nxt = np.where(text, at + 4 + n, p + 1)
        if np.any(n < 0) or np.any(nxt > limit):
            raise Irregular("a value truncated")
        start[:, j] = at + 4
        length[:, j] = n
        null[:, j] = ~text
        p = nxt
    return TupleColumns(start, length, null, p)


def binary_column(buf, start, length, null) -> pa.Array:
    """The values at ``start`` of ``length`` bytes in ``buf`` (NULL where ``null``) as one Arrow binary
    array, gathered into a contiguous buffer with numpy."""
    m = len(start)
    length = np.where(null, 0, length)
    offsets = np.zeros(m + 1, np.int64)
    np.cumsum(length, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        # each value's bytes: its start, shifted by where it lands, plus a running count; in int32 where the
        # buffer and the column fit (half the memory traffic of int64, and much faster here)
        wide = np.int64 if max(len(buf), total) >= 2**31 else np.int32
        index = np.repeat((np.asarray(start, np.int64) - offsets[:-1]).astype(wide), length.astype(wide))
        index += np.arange(total, dtype=wide)
        data = buf[index]
    else:
        data = np.zeros(0, np.uint8)
    nulls = int(np.count_nonzero(null))
    validity = pa.py_buffer(np.packbits(~np.asarray(null), bitorder="little")) if nulls else None
    if total < 2**31:
        return pa.Array.from_buffers(pa.binary(), m, [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                      pa.py_buffer(data)], null_count=nulls)
    return pa.Array.from_buffers(pa.large_binary(), m, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)
