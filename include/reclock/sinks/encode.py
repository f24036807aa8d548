"""Turning a collection's consolidated updates into Kafka messages, column-at-a-time.

Each row becomes one JSON object built with Arrow kernels (integers, floats, booleans and plain strings
never pass through Python objects); other types (bytes as base64, timestamps and dates as ISO 8601,
decimals as strings, nested values) fall back to ``json.dumps`` for their column only. Every value reads
back as it was, bit for bit: a float is its shortest round-trip text (``-0.0`` keeps its sign, not ``-0``,
which JSON readers take for the integer 0); JSON has no NaN or infinity, so those are the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, as Jackson (Kafka Connect, Debezium) writes them and Spark's
``from_json`` and Jackson read them back into a float column. JSON's one NaN reads back as the canonical
NaN (``0x7ff8000000000000``), so a NaN of other bits (a payload, the sign bit) is refused
(``ValueNotCarried``) rather than written as another value. Then:

- ``debezium``: ``{"before": row|null, "after": row|null}``, one message per unit of ``diff``; with key
  columns, a key's retraction and insertion at one timestamp pair up into one message;
- ``upsert``: key ``{"k": ...}``, value the row, or a tombstone (null) when the key's row is gone; two
  values for one key at one timestamp raise ``KeyNotUnique``.

Messages come out in timestamp order (then by key): :func:`encode_runs` gives them as one :class:`TsRun`
per timestamp (what the sink produces from: a run's messages go out in a tight loop, with one header),
:func:`encode_updates` as ``(ts, key, value)`` tuples.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.bitexact import noncanonical_nans
from reclock.compaction import sorted_by_ts
from reclock.config import SinkSpec
from reclock.errors import ReclockError, ValueNotCarried

Message = tuple[int, "bytes | None", "bytes | None"]
_CONTROL = "[\\x00-\\x1f]"


VALUE_SLICE = 1024
"""Values turned into ``bytes`` at a time by :meth:`TsRun.value_lists`: the objects of a slice reuse the
memory the previous slice's freed once produced, where a whole run's 50,000 new objects at once took
fresh pages from the OS (a page fault every ~20 objects: ~4x the cost of making them)."""


@dataclass(frozen=True)
class TsRun:
    """The messages of one timestamp, in order: ``keys[i]`` (``keys`` is None when no message has a key)
    and ``values[i]`` (a binary Arrow array, or a list of ``bytes`` or None); ``nbytes`` is the size of
    all of them, keys and values."""

    ts: int
    keys: "list[bytes] | None"
    values: "pa.Array | pa.ChunkedArray | list[bytes | None]"
    nbytes: int

    def value_lists(self) -> Iterator["list[bytes | None]"]:
        """The values as consecutive lists of ``bytes`` (or None), at most :data:`VALUE_SLICE` each when
        they are Arrow's: produce each list's messages before taking the next."""
        if isinstance(self.values, list):
            yield self.values
            return
        for i in range(0, len(self.values), VALUE_SLICE):
            yield self.values.slice(i, VALUE_SLICE).to_pylist()

    def value_list(self) -> "list[bytes | None]":
        """All the values as one list."""
        return [v for values in self.value_lists() for v in values]


class KeyNotUnique(ReclockError):
    def __init__(self, sink: str, ts: int, key: Any) -> None:
        super().__init__(f"sink {sink}: format upsert, but key {key} has several values at ts {ts}; "
                         "declare key columns that identify a row")


def _json_default(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):
        return str(v)
    raise TypeError(f"cannot encode {type(v).__name__} as JSON")


NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
"""A float JSON has no number for, by Python's ``str`` of it: the JSON string it is written as."""


def _finite(v: Any) -> Any:
    """``v`` with every NaN and infinity in it (at any depth) as its string (:data:`NONFINITE`)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else NONFINITE[str(v)]
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def dumps(v: Any) -> bytes:
    return json.dumps(_finite(v), default=_json_default, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def json_literals(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each value of ``col`` as a JSON literal (``null`` for nulls), as a string array."""
    out, quote = _literals(col)
    return pc.binary_join_element_wise('"', out, '"', "") if quote else out


def _literals(col: pa.ChunkedArray | pa.Array) -> tuple[pa.Array, bool]:
    """``(pieces, quote)``: each value of ``col`` as a JSON literal, or, when ``quote``, as the text that
    goes between two quotes (a string column with no nulls and nothing to escape: the caller puts the
    quotes into the literal pieces around it instead of copying every value once more)."""
    t = col.type
    if pa.types.is_large_string(t):  # Arrow's string join takes one string type: the pieces' (a chunk of
        col, t = pc.cast(col, pa.string()), pa.string()  # rows is far below string's 2 GiB)
    out = None
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        out = pc.cast(col, pa.string())
    elif pa.types.is_floating(t):
        text = pc.cast(col, pa.string())  # shortest round-trip text; but -0.0 is "-0", and NaN, inf Arrow's
        out = pc.if_else(pc.is_finite(col), pc.if_else(pc.equal(text, "-0"), pa.scalar("-0.0"), text),
                         pc.if_else(pc.is_nan(col), pa.scalar('"NaN"'),
                                    pc.if_else(pc.greater(col, 0), pa.scalar('"Infinity"'),
                                               pa.scalar('"-Infinity"'))))
    elif pa.types.is_string(t) and not _may_need_escapes(col):
        if col.null_count == 0:
            return col, True
        out = pc.binary_join_element_wise('"', col, '"', "")  # nothing to escape (the common case)
    elif pa.types.is_string(t) and not pc.any(pc.match_substring_regex(col, _CONTROL)).as_py():
        escaped = col
        if pc.any(pc.match_substring(col, "\\")).as_py():
            escaped = pc.replace_substring(escaped, "\\", "\\\\")
        if pc.any(pc.match_substring(col, '"')).as_py():
            escaped = pc.replace_substring(escaped, '"', '\\"')
        out = pc.binary_join_element_wise('"', pc.cast(escaped, pa.string()), '"', "")
    if out is None:  # the general case, in Python
        return pa.array([json.dumps(_finite(v), default=_json_default, ensure_ascii=False, allow_nan=False)
                         for v in col.to_pylist()], pa.string()), False
    return pc.fill_null(out, "null"), False


def _may_need_escapes(col: pa.ChunkedArray | pa.Array) -> bool:
    """Whether a string column's values hold a quote, a backslash or a control character: a vectorised
    pass over the bytes its values span (of a slice: only the slice's, not the whole data buffer's)."""
    for chunk in col.chunks if isinstance(col, pa.ChunkedArray) else [col]:
        data = chunk.buffers()[2]
        if data is None or len(chunk) == 0:
            continue
        offsets = np.frombuffer(chunk.buffers()[1], np.int64 if pa.types.is_large_string(chunk.type) else np.int32)
        lo, hi = int(offsets[chunk.offset]), int(offsets[chunk.offset + len(chunk)])
        b = np.frombuffer(data, np.uint8)[lo:hi]
        for i in range(0, len(b), _SCAN_BYTES):  # in slices that stay in the cache
            s = b[i:i + _SCAN_BYTES]
            if s.min() < 0x20 or (s == 0x22).any() or (s == 0x5C).any():
                return True
    return False


_SCAN_BYTES = 1 << 16


def json_objects(table: pa.Table, columns: Sequence[str]) -> list[str]:
    """One JSON object per row of ``table`` over ``columns``."""
    return _objects(table, columns).to_pylist()


def _objects(table: pa.Table, columns: Sequence[str], prefix: str = "", suffix: str = "") -> pa.Array:
    """``prefix + {"col": value, ...} + suffix`` per row, in one pass of Arrow's string join."""
    if not columns:
        return pa.array([prefix + "{}" + suffix] * table.num_rows, pa.string())
    pieces: list = []
    text = prefix + "{"
    for i, c in enumerate(columns):
        literals, quote = _literals(table[c])
        text += ("," if i else "") + json.dumps(c) + ":" + ('"' if quote else "")
        pieces += [pa.scalar(text), literals]
        text = '"' if quote else ""
    pieces.append(pa.scalar(text + "}" + suffix))
    return pc.binary_join_element_wise(*pieces, "")


def _debezium_unkeyed(table: pa.Table, data_cols: Sequence[str]) -> list[TsRun]:
    """``{"before": null, "after": row}`` for insertions, the other way round for retractions, one message
    per unit of ``diff``; built entirely with Arrow kernels."""
    table = sorted_by_ts(table)  # stable: rows keep their order within a ts
    diff = table["diff"]
    if pc.max(pc.abs(diff)).as_py() > 1:  # multiplicities: repeat the rows (rare)
        reps = pc.abs(diff).to_pylist()
        table = table.take(pa.array([i for i, r in enumerate(reps) for _ in range(r)], pa.int64()))
        diff = table["diff"]
    after = _objects(table, data_cols, '{"before":null,"after":', "}")
    if pc.min(diff).as_py() > 0:  # insertions only (the common case): one envelope
        values = after
    else:
        before = _objects(table, data_cols, '{"before":', ',"after":null}')
        values = pc.if_else(pc.greater(diff, 0), after, before)
    values = pc.cast(values, pa.binary())
    ts = table["ts"].to_numpy()
    starts = np.concatenate(([0], np.flatnonzero(np.diff(ts)) + 1))
    nbytes = np.add.reduceat(pc.binary_length(values).to_numpy(zero_copy_only=False), starts)
    ends = [*starts[1:].tolist(), len(values)]
    return [TsRun(int(ts[a]), None, values.slice(a, b - a), int(n))
            for a, b, n in zip(starts.tolist(), ends, nbytes)]


def _runs(messages: list[Message]) -> list[TsRun]:
    """``messages`` (sorted by ts) as one run per ts."""
    out = []
    for ts, group in groupby(messages, key=lambda m: m[0]):
        group = list(group)
        keys = [k for _, k, _ in group]
        values = [v for _, _, v in group]
        out.append(TsRun(ts, keys, values, sum(len(k) for k in keys) + sum(len(v) for v in values if v)))
    return out


def encode_updates(spec: SinkSpec, table: pa.Table) -> list[Message]:
    """The messages of consolidated updates (columns: data..., ``ts``, ``diff``), sorted by ts."""
    return [(run.ts, k, v) for run in encode_runs(spec, table)
            for k, v in zip(run.keys or [None] * len(run.values), run.value_list())]


def encode_runs(spec: SinkSpec, table: pa.Table) -> list[TsRun]:
    """The messages of consolidated updates (columns: data..., ``ts``, ``diff``), one run per ts, in ts
    order."""
    if table.num_rows == 0:
        return []
    data_cols = [c for c in table.column_names if c not in ("ts", "diff")]
    for c in data_cols:
        odd = noncanonical_nans(table[c])
        if odd:
            raise ValueNotCarried(f"sink {spec.name}", c, f"{odd} NaN value(s) of other bits than the NaN JSON "
                                  "reads back as (a payload, or the sign bit)", "JSON has one NaN: the sink "
                                  "stops here rather than write another value; change the value upstream")
    missing = [c for c in spec.key if c not in data_cols]
    if missing:
        raise ReclockError(f"sink {spec.name}: key column(s) {', '.join(missing)} not in {spec.collection} "
                           f"(columns: {', '.join(data_cols)})")
    if spec.format == "debezium" and not spec.key:
        return _debezium_unkeyed(table, data_cols)
    return _runs(_keyed(spec, table, data_cols))


def _keyed(spec: SinkSpec, table: pa.Table, data_cols: Sequence[str]) -> list[Message]:
    rows = json_objects(table, data_cols)
    keys = json_objects(table, list(spec.key)) if spec.key else None
    ts_list = table["ts"].to_pylist()
    diffs = table["diff"].to_pylist()
    groups: dict[tuple[int, str], tuple[list[str], list[str]]] = {}
    for ts, k, r, d in zip(ts_list, keys, rows, diffs):
        befores, afters = groups.setdefault((ts, k), ([], []))
        (afters if d > 0 else befores).extend([r] * abs(d))
    out = []
    for (ts, k) in sorted(groups):
        befores, afters = groups[(ts, k)]
        key = k.encode()
        if spec.format == "upsert":
            if len(afters) > 1:
                raise KeyNotUnique(spec.name, ts, k)
            out.append((ts, key, afters[0].encode() if afters else None))
            continue
        for i in range(max(len(befores), len(afters))):
            b = befores[i] if i < len(befores) else "null"
            a = afters[i] if i < len(afters) else "null"
            out.append((ts, key, f'{{"before":{b},"after":{a}}}'.encode()))
    return out
