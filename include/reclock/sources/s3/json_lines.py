"""JSON lines decoded in the read task, by Arrow's C++ JSON reader, into the declared columns: exactly what
Spark's ``from_json`` (PERMISSIVE, the declared schema) makes of them, or nothing.

::

    lines (Arrow binary, one JSON object each)
        |  guards: every line 2..FAST_LINE_BYTES bytes, starting with `{` and ending with `}`, valid UTF-8
        |  pyarrow.json.read_json(explicit schema, unknown fields ignored), single-threaded
        |  guards: one row per line, the reserved column null, no NaN, no infinity, no -0.0
        v
    typed rows (a struct per line)   |   or None: the lines are left to Spark's from_json, as before

Law: for every line, :func:`decode_lines` either gives the values ``from_json`` gives (bit for bit) and the
line is no error there, or leaves the line to ``from_json`` (tests/integration/test_s3_json_lines.py holds
the two equal against Spark itself). So whatever the task decodes is what Spark would have decoded, and
every line Spark would reject (or read differently from Arrow) still goes through Spark, into the errors
collection as before.

Why each guard (where Arrow would accept a line and differ from Spark, or a row could shift):

- a line starts with ``{`` and ends with ``}``, and the reader gives one row per line: Arrow reads
  ``{..}{..}`` as two rows where Spark takes the first object, and skips a line of blanks; with both guards
  no row can shift to another line;
- at most ``FAST_LINE_BYTES`` bytes: Spark's Jackson refuses numbers longer than 1,000 digits and nesting
  deeper than 1,000 levels (its read constraints); Arrow has no such limit;
- valid UTF-8: Arrow keeps invalid bytes in a string as they are; Spark reads them as U+FFFD;
- no NaN, infinity or -0.0 in a DOUBLE column: Spark reads the integer ``-0`` as 0.0 (Arrow: -0.0); the
  non-finite tokens are left to Spark so their bits are Spark's;
- the reserved column (the corrupt-record column Spark's decode adds) null: a line naming it is Spark's.

Anything else Arrow does not read as Spark does, it refuses (the types Spark would not convert: a number
for a string, ``1.0`` for a BIGINT, a string for a number; duplicate keys; a lone surrogate escape;
unescaped control characters; single quotes; trailing commas; leading zeros), and the lines go to Spark.
Only BIGINT, DOUBLE, STRING and BOOLEAN columns are decoded here (:func:`arrow_schema`): a schema with any
other type leaves every line to Spark.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

FAST_LINE_BYTES = 1000
"""A line longer than this is left to Spark (see the module's guards)."""
BLOCK_LINES = 4096
"""When a batch's lines do not all pass, they are tried again in blocks of this many lines: a bad line
leaves only its block to Spark."""

_TYPES = {"bigint": pa.int64(), "double": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}


def arrow_schema(fields: Sequence[tuple[str, str]]) -> pa.Schema | None:
    """The Arrow schema of declared columns ``(name, Spark type's simple string)``, or None when a type is
    not one this module decodes (then every line is Spark's)."""
    if not fields or any(t not in _TYPES for _, t in fields):
        return None
    return pa.schema([pa.field(n, _TYPES[t]) for n, t in fields])


def _layout(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The line offsets (into the data buffer) and the data buffer of a binary array."""
    offsets = np.frombuffer(values.buffers()[1], np.int32, len(values) + 1, values.offset * 4)
    data = values.buffers()[2]
    return offsets, (np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8))


def _decode_block(values: pa.Array, schema: pa.Schema, reserved: str) -> pa.StructArray | None:
    import pyarrow.compute as pc
    import pyarrow.json as pj

    n = len(values)
    if values.null_count:
        return None
    offsets, data = _layout(values)
    lengths = np.diff(offsets)
    if lengths.min() < 2 or lengths.max() > FAST_LINE_BYTES:
        return None
    first, last = int(offsets[0]), int(offsets[-1])
    if (data[offsets[:-1]] != 0x7B).any() or (data[offsets[1:] - 1] != 0x7D).any():  # '{' ... '}'
        return None
    if len(data) and data[first:last].max() >= 0x80:
        try:
            data[first:last].tobytes().decode("utf-8")
        except UnicodeDecodeError:
            return None
    # the lines joined by "\n", in Arrow's C++
    one = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), values),
                         pa.scalar(b"\n", pa.binary()))
    joined = one.buffers()[2].slice(0, (last - first) + n - 1)
    try:
        table = pj.read_json(pa.BufferReader(joined),
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(joined.size, 1 << 16)),
                             parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    if table.num_rows != n or table.column(reserved).null_count != n:
        return None
    columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
    for col in columns:
        if pa.types.is_floating(col.type) and col.null_count < n:
            x = col.fill_null(1.0).to_numpy(zero_copy_only=False)
            if not np.isfinite(x).all() or (np.signbit(x) & (x == 0)).any():
                return None
    return pa.StructArray.from_arrays(columns, fields=list(schema))


def decode_lines(values: pa.Array, schema: pa.Schema, reserved: str) -> tuple[pa.StructArray, pa.Array]:
    """``values`` (binary, one JSON object a line) decoded into ``schema`` (which has a string column
    ``reserved`` that must stay null) where the module's guards allow: ``(typed, rest)``, each as long as
    ``values``, where for each line exactly one of the two is set: ``typed`` its decoded row, or ``rest``
    its bytes, left to Spark's ``from_json``."""
    n = len(values)
    struct = pa.struct(list(schema))
    if n == 0:
        return pa.array([], struct), values
    whole = _decode_block(values, schema, reserved)
    if whole is not None:
        return whole, pa.nulls(n, values.type)
    if n <= BLOCK_LINES:
        return pa.nulls(n, struct), values
    typed, rest = [], []
    for at in range(0, n, BLOCK_LINES):
        block = values.slice(at, BLOCK_LINES)
        got = _decode_block(block, schema, reserved)
        typed.append(got if got is not None else pa.nulls(len(block), struct))
        rest.append(pa.nulls(len(block), values.type) if got is not None else block)
    return pa.concat_arrays(typed), pa.concat_arrays(rest)
