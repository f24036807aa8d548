"""Reading a part written with one schema as another, in each engine (pure: SQL text and Arrow arrays).

A collection whose schema evolved (``reclock.schema_evolution``) has parts of several schemas: a part keeps
the columns and types it was written with, and a read AS OF ``t`` gives the schema in force at ``t``. Each
part is read through a *projection* from its schema to that one:

- a column (or struct field) the part lacks is a null of the target's type;
- a column the target lacks is left out (a read before the change that added it);
- a column renamed since the part was written is read from the part's column of its earlier name
  (``Column.was``, :func:`~reclock.schema_evolution.source_names`);
- a widened type is cast up (``int`` to ``bigint``, ``decimal(10,2)`` to ``decimal(12,2)``); a column
  read at a time before it was widened is cast down to the type then in force, which holds every value a
  row of that time can have (it came from a writer of the narrower type);
- a struct is rebuilt field by field (a null struct stays null), an array's elements and a map's keys and
  values are projected element by element.

The same projection is built for three engines, so that every reader gives the same values:
:func:`spark_sql` (Spark SQL expression text), :func:`duckdb_sql` (DuckDB expression text) and
:func:`arrow_project` (pyarrow arrays, for ``reclock.read`` and the sinks). Types are Spark SQL type strings
(``DataType.simpleString()``), as :class:`~reclock.schema_evolution.CollectionSchema` keeps them; a part's
are read from its Parquet footer's Arrow schema (:func:`spark_type`).

Law (``tests/unit/test_schema_projection.py``, hypothesis): projecting a part of schema ``s`` to
``evolve(s, x).schema`` and back to ``s`` gives the values it had; projections compose.
"""

from __future__ import annotations

import re
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from reclock.schema_evolution import CollectionSchema, Column, _container, _struct, source_names, struct_fields

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_PRIMITIVE_ARROW = {
    "boolean": pa.bool_(), "tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "string": pa.string(), "binary": pa.binary(),
    "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
}
_DUCKDB = {
    "boolean": "BOOLEAN", "tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "bigint": "BIGINT",
    "float": "FLOAT", "double": "DOUBLE", "string": "VARCHAR", "binary": "BLOB", "date": "DATE",
    "timestamp": "TIMESTAMP WITH TIME ZONE", "timestamp_ntz": "TIMESTAMP", "void": "INTEGER",
}


# -- types --------------------------------------------------------------------------------------------------

def spark_type(t: pa.DataType) -> str:
    """The Spark SQL type string of an Arrow type as a Parquet part holds it. Timestamps: with a zone, or in
    nanoseconds (Spark's INT96, which pyarrow reads as nanoseconds without a zone), ``timestamp``; else
    ``timestamp_ntz``. A type Spark has no name for keeps pyarrow's (it is only ever compared)."""
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    if pa.types.is_boolean(t):
        return "boolean"
    for width, name in ((8, "tinyint"), (16, "smallint"), (32, "int"), (64, "bigint")):
        if pa.types.is_signed_integer(t) and t.bit_width == width:
            return name
    if pa.types.is_unsigned_integer(t):
        return {8: "smallint", 16: "int", 32: "bigint", 64: "decimal(20,0)"}[t.bit_width]
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", bool)(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or getattr(pa.types, "is_binary_view", bool)(t):
        return "binary"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz is not None or t.unit == "ns" else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_map(t):
        return f"map<{spark_type(t.key_type)},{spark_type(t.item_type)}>"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"array<{spark_type(t.value_type)}>"
    if pa.types.is_struct(t):
        return _struct([(t.field(i).name, spark_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_null(t):
        return "void"
    return str(t)


def arrow_type(t: str) -> pa.DataType:
    """The Arrow type of a Spark SQL type string (timestamps in microseconds; ``timestamp`` in UTC)."""
    t = t.strip()
    if t in _PRIMITIVE_ARROW:
        return _PRIMITIVE_ARROW[t]
    m = _DECIMAL.match(t)
    if m:
        p, s = int(m.group(1)), int(m.group(2))
        return pa.decimal128(p, s) if p <= 38 else pa.decimal256(p, s)
    fields = struct_fields(t)
    if fields is not None:
        return pa.struct([(n, arrow_type(ft)) for n, ft in fields])
    inner = _container(t, "array")
    if inner is not None:
        return pa.list_(arrow_type(inner[0]))
    kv = _container(t, "map")
    if kv is not None:
        return pa.map_(arrow_type(kv[0]), arrow_type(kv[1]))
    raise ValueError(f"no Arrow type for the Spark type {t!r}")


def duckdb_type(t: str) -> str:
    """The DuckDB type of a Spark SQL type string."""
    t = t.strip()
    if t in _DUCKDB:
        return _DUCKDB[t]
    m = _DECIMAL.match(t)
    if m:
        return f"DECIMAL({m.group(1)},{m.group(2)})"
    fields = struct_fields(t)
    if fields is not None:
        return "STRUCT(" + ", ".join(f"{_dq(n)} {duckdb_type(ft)}" for n, ft in fields) + ")"
    inner = _container(t, "array")
    if inner is not None:
        return f"{duckdb_type(inner[0])}[]"
    kv = _container(t, "map")
    if kv is not None:
        return f"MAP({duckdb_type(kv[0])}, {duckdb_type(kv[1])})"
    raise ValueError(f"no DuckDB type for the Spark type {t!r}")


def part_schema(schema: pa.Schema, columns: Sequence[str] | None = None) -> CollectionSchema:
    """The :class:`CollectionSchema` of a part's Arrow schema (its fields ``columns``, by default all)."""
    names = schema.names if columns is None else columns
    return CollectionSchema(tuple(Column(n, spark_type(schema.field(n).type), schema.field(n).nullable)
                                  for n in names))


# -- the projection ---------------------------------------------------------------------------------------

def _bq(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _dq(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sq(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def spark_sql(expr: str, have: str | None, want: str, depth: int = 0) -> str:
    """Spark SQL reading ``expr`` (of type ``have``; None: absent) as type ``want``."""
    if have is None:
        return f"CAST(NULL AS {want})"
    if have.strip() == want.strip():
        return expr
    hf, wf = struct_fields(have), struct_fields(want)
    if hf is not None and wf is not None:
        got = dict(hf)
        parts = ", ".join(f"{_sq(n)}, {spark_sql(f'{expr}.{_bq(n)}', got.get(n), t, depth + 1)}" for n, t in wf)
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE named_struct({parts}) END"
    ha, wa = _container(have, "array"), _container(want, "array")
    if ha is not None and wa is not None:
        x = f"_x{depth}"
        return f"transform({expr}, {x} -> {spark_sql(x, ha[0], wa[0], depth + 1)})"
    hm, wm = _container(have, "map"), _container(want, "map")
    if hm is not None and wm is not None:
        k, v = f"_k{depth}", f"_v{depth}"
        out = expr
        if hm[0].strip() != wm[0].strip():
            out = f"transform_keys({out}, ({k}, {v}) -> {spark_sql(k, hm[0], wm[0], depth + 1)})"
        if hm[1].strip() != wm[1].strip():
            out = f"transform_values({out}, ({k}, {v}) -> {spark_sql(v, hm[1], wm[1], depth + 1)})"
        return out
    return f"CAST({expr} AS {want})"


def duckdb_sql(expr: str, have: str | None, want: str, depth: int = 0) -> str:
    """DuckDB SQL reading ``expr`` (of type ``have``; None: absent) as type ``want``."""
    if have is None:
        return f"CAST(NULL AS {duckdb_type(want)})"
    if have.strip() == want.strip():
        return expr
    hf, wf = struct_fields(have), struct_fields(want)
    if hf is not None and wf is not None:
        got = dict(hf)
        parts = ", ".join(f"{_dq(n)} := {duckdb_sql(f'struct_extract({expr}, {_sq_duck(n)})', got.get(n), t, depth + 1)}"
                          for n, t in wf)
        return f"CASE WHEN {expr} IS NULL THEN NULL ELSE struct_pack({parts}) END"
    ha, wa = _container(have, "array"), _container(want, "array")
    if ha is not None and wa is not None:
        x = f"_x{depth}"
        return f"list_transform({expr}, lambda {x}: {duckdb_sql(x, ha[0], wa[0], depth + 1)})"
    hm, wm = _container(have, "map"), _container(want, "map")
    if hm is not None and wm is not None:
        e = f"_e{depth}"
        key = duckdb_sql(f"{e}.key", hm[0], wm[0], depth + 1)
        value = duckdb_sql(f"{e}.value", hm[1], wm[1], depth + 1)
        return (f"map_from_entries(list_transform(map_entries({expr}), "
                f"lambda {e}: struct_pack(key := {key}, value := {value})))")
    return f"CAST({expr} AS {duckdb_type(want)})"


def _sq_duck(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def arrow_project(arr: pa.Array | pa.ChunkedArray | None, have: str | None, want: str, length: int = 0) -> pa.Array:
    """``arr`` (of Spark type ``have``; None: absent, ``length`` nulls) read as type ``want``. A column of the
    type it should have is returned as it is (a dictionary array stays one)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if have is None or arr is None:
        return pa.nulls(length if arr is None else len(arr), arrow_type(want))
    if have.strip() == want.strip():
        return arr
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    hf, wf = struct_fields(have), struct_fields(want)
    if hf is not None and wf is not None:
        got = dict(hf)
        children = [arrow_project(arr.field(n) if n in got else None, got.get(n), t, len(arr)) for n, t in wf]
        return pa.StructArray.from_arrays(children, names=[n for n, _ in wf], mask=arr.is_null()) \
            if len(arr) else pa.array([], arrow_type(want))
    ha, wa = _container(have, "array"), _container(want, "array")
    if ha is not None and wa is not None:
        arr = arr.cast(pa.list_(arr.type.value_type)) if not pa.types.is_list(arr.type) else arr
        values = arrow_project(arr.values, ha[0], wa[0])
        return pa.ListArray.from_arrays(arr.offsets, values, mask=arr.is_null())
    hm, wm = _container(have, "map"), _container(want, "map")
    if hm is not None and wm is not None:
        keys = arrow_project(arr.keys, hm[0], wm[0])
        items = arrow_project(arr.items, hm[1], wm[1])
        return pa.MapArray.from_arrays(arr.offsets, keys, items, mask=arr.is_null())
    return arr.cast(arrow_type(want))


def project_table(table: pa.Table, part: CollectionSchema, target: CollectionSchema,
                  keep: Sequence[str] = ("ts", "diff")) -> pa.Table:
    """``table`` (a part's columns: ``part``'s, and ``keep``) read as ``target``: ``target``'s columns in its
    order, then ``keep``'s. A column already of its type is passed through untouched; one of the target's
    that an earlier, dropped column of its name held (``Column.from_ts``) is null at the rows before it; one
    the part holds under an earlier name (``Column.was``: a rename) is read from it."""
    cols, names = [], []
    sources = source_names(part, target)
    for c in target.columns:
        src = sources[c.name]
        have = part.column(src) if src is not None else None
        arr = table[src] if have is not None else None
        if arr is not None and c.from_ts is not None:
            arr = null_before(arr, table["ts"], c.from_ts)
        if have is not None and have.type.strip() == c.type.strip():
            cols.append(arr)
        else:
            cols.append(arrow_project(arr, have.type if have else None, c.type, table.num_rows))
        names.append(c.name)
    for k in keep:
        if k in table.column_names:
            cols.append(table[k])
            names.append(k)
    return pa.table(dict(zip(names, cols))) if cols else table.select([])


def null_before(arr: pa.Array | pa.ChunkedArray, ts: pa.ChunkedArray, from_ts: int) -> pa.Array:
    """``arr`` with null at the rows before ``from_ts`` (a column's values from another, earlier column of its
    name: :attr:`reclock.schema_evolution.Column.from_ts`)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    ts = ts.combine_chunks() if isinstance(ts, pa.ChunkedArray) else ts
    return pc.if_else(pc.greater_equal(ts, from_ts), arr, pa.scalar(None, arr.type))


def from_ts_sql(expr: str, from_ts: int | None) -> str:
    """SQL (Spark's and DuckDB's alike) of ``expr`` null at the rows before ``from_ts`` (None: ``expr``)."""
    return expr if from_ts is None else f"CASE WHEN ts >= {int(from_ts)} THEN {expr} END"


def project_part(table: pa.Table, target: CollectionSchema) -> pa.Table:
    """A part's own columns (named as the shard names them, ``ts`` and ``diff`` among them) read as
    ``target``: its user columns projected, then ``ts`` and ``diff``."""
    cols = [n for n in table.column_names if n not in ("ts", "diff")]
    return project_table(table, part_schema(table.schema, cols), target)


def target_arrow_schema(target: CollectionSchema, schemas: Sequence[pa.Schema]) -> pa.Schema:
    """``target`` as one Arrow schema for parts of ``schemas``: a column's type as a part of its Spark type
    keeps it (the first such part's; a dictionary's value type), else :func:`arrow_type`'s; then ``ts`` and
    ``diff``."""
    fields = []
    for c in target.columns:
        found = next((s.field(c.name).type for s in schemas
                      if c.name in s.names and spark_type(s.field(c.name).type) == c.type.strip()), None)
        if found is not None and pa.types.is_dictionary(found):
            found = found.value_type
        fields.append(pa.field(c.name, found if found is not None else arrow_type(c.type)))
    return pa.schema(fields + [pa.field("ts", pa.int64()), pa.field("diff", pa.int64())])


def unify_tables(tables: Sequence[pa.Table]) -> list[pa.Table]:
    """Tables of the same columns and Spark types given one Arrow schema (a part's ``large_string`` and
    another's ``string`` are one column type; a dictionary array is decoded where another table's is not)."""
    if len(tables) < 2 or all(t.schema == tables[0].schema for t in tables[1:]):
        return list(tables)
    types = []
    for i in range(tables[0].num_columns):
        plain = [t.schema.field(i).type for t in tables if not pa.types.is_dictionary(t.schema.field(i).type)]
        types.append(plain[0] if plain else tables[0].schema.field(i).type.value_type)
    schema = pa.schema([pa.field(n, t) for n, t in zip(tables[0].column_names, types)])
    return [t.cast(schema) if t.schema != schema else t for t in tables]
