"""Bit-exact grouping: two updates are of one row only when every data column holds the same bits.

Consolidation sums ``diff`` by row, so it needs an equality, and the engines' own is not bit for bit. SQL
equality puts ``0.0`` and ``-0.0`` in one group and every NaN in one: Spark normalises floating-point
grouping keys (``NormalizeFloatingNumbers``: ``-0.0`` becomes ``0.0``, every NaN the one NaN, also inside
structs and arrays) and cannot group by a map at all; DuckDB hashes and compares ``-0.0`` as ``0.0`` and
every NaN alike (inside lists, structs and maps too); pyarrow's ``group_by`` compares flat columns by their
bits but refuses nested ones. Merged that way, the retraction of ``(1, 0.0)`` and the insertion of
``(1, -0.0)`` cancel out, and the row that stays holds whichever value the group saw first.

So every consolidation groups by a **key** that is equal exactly when the values' bits are, and carries
each value itself through the grouping (every row of a group holds the same bits, so any row's will do:
pyarrow takes the first row's, Spark ``any_value``, DuckDB the group's own value, grouped by beside the
key):

==========  ==========================================  =========================================  =============
engine      float, double                               struct, list, map (holding one of those)   other types
==========  ==========================================  =========================================  =============
pyarrow     the value (``group_by`` compares bits)      :func:`encode`: a binary encoding of the    the value
                                                        whole value, every float by its bits
Spark       ``struct(v, raw bits where v is 0 or NaN)``  the same inside ``transform`` /            the value
            (:func:`spark_key`)                          ``struct``; a map as its entries, always
DuckDB      ``v`` and ``v::BIT where v is 0 or NaN``    ``v`` and the same bits inside              the value
            (:func:`duckdb_key`)                        ``list_transform`` / ``struct_pack``
==========  ==========================================  =========================================  =============

Only zeros and NaNs need their bits in the Spark and DuckDB keys: every other float is equal to another
exactly when its bits are, and SQL equality tells those apart already. Spark has no vectorised way to a
double's bits (no bit cast, and its hashes normalise too); ``java_method('java.lang.Double',
'doubleToRawLongBits', v)`` is a reflective call per value, so it runs only on the zeros and NaNs. DuckDB's
``CAST(v AS BIT)`` is the value's 64 (or 32) bits, NaN payloads and all.

Strings, binaries, decimals (of one column's scale), integers, booleans, dates and timestamps compare by
their bits in every engine already (nulls are one key everywhere). Pure: pyarrow here, Spark's and DuckDB's
pieces build expressions only (``pyspark`` imported when :func:`spark_key` is called).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["needs_key", "encode", "spark_key", "spark_raw_bits", "duckdb_key", "noncanonical_nans",
           "CANONICAL_NAN_BITS"]

_B = pa.large_binary()
_NULL = pa.scalar(b"\x00", _B)
_VALID = pa.scalar(b"\x01", _B)
_EMPTY = pa.scalar(b"", _B)


def _is_float(t: pa.DataType) -> bool:
    return pa.types.is_floating(t)


def needs_key(t: pa.DataType) -> bool:
    """Whether pyarrow's ``group_by`` cannot take a column of type ``t`` as it is: a nested type (struct,
    list, map), which it refuses. Flat columns, floats included, it groups by their bits."""
    return pa.types.is_nested(t)


# -- pyarrow ---------------------------------------------------------------------------------------------------

def encode(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Each value of ``values`` as ``large_binary`` bytes (never null) that are equal exactly when the values
    are bit for bit: null, a float's raw bits (``-0.0`` is not ``0.0``, each NaN payload its own), a
    string's bytes, a struct's fields, a list's or map's entries in their order. Vectorised: Arrow kernels
    over each level of the type, no Python object per value.

    The encoding of a type is prefix-free (a null is ``00``; a value ``01`` and then: fixed-width values
    their bytes, strings and binaries their length in 8 bytes and their bytes, structs their fields'
    encodings, lists and maps their length in 8 bytes and their entries' encodings), so concatenations of
    encodings are equal exactly when their parts are."""
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array([_encode(c) for c in values.chunks], _B)
    return _encode(values)


def _tagged(valid: pa.Array, payload: pa.Array) -> pa.Array:
    """``01`` + payload where ``valid``, ``00`` where not."""
    return pc.if_else(valid, pc.binary_join_element_wise(_VALID, payload, _EMPTY), _NULL)


def _raw(arr: pa.Array, width: int) -> pa.Array:
    """The ``width`` bytes each value of a fixed-width array is stored as (whatever lies under a null)."""
    fixed = pa.Array.from_buffers(pa.binary(width), len(arr), [None, arr.buffers()[1]], offset=arr.offset)
    return fixed.cast(_B)


def _counts(n: pa.Array) -> pa.Array:
    """Non-negative integers as 8 little-endian bytes each."""
    ints = pc.fill_null(n, 0).cast(pa.int64())
    return _raw(pa.array(np.ascontiguousarray(ints.to_numpy(zero_copy_only=False), dtype="<i8")), 8)


def _encode(arr: pa.Array) -> pa.Array:
    t = arr.type
    n = len(arr)
    if n == 0:
        return pa.array([], _B)
    valid = arr.is_valid()
    if pa.types.is_dictionary(t):
        return _encode(arr.dictionary_decode())
    if isinstance(t, pa.ExtensionType):
        return _encode(arr.storage)
    if pa.types.is_null(t):
        return pa.array([b"\x00"] * n, _B)
    if pa.types.is_boolean(t):
        return _tagged(valid, _raw(pc.fill_null(arr, False).cast(pa.uint8()), 1))
    if pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return _tagged(valid, _raw(arr, t.byte_width))
    if pa.types.is_primitive(t) and t.bit_width % 8 == 0:  # integers, floats, dates, times, timestamps, durations
        return _tagged(valid, _raw(arr, t.bit_width // 8))
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t)):
        raw = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(t) else arr
        return _tagged(valid, pc.binary_join_element_wise(_counts(pc.binary_length(arr)), raw, _EMPTY))
    if pa.types.is_struct(t):
        fields = [_encode(child) for child in arr.flatten()]
        return _tagged(valid, pc.binary_join_element_wise(*fields, _EMPTY) if fields else
                       pa.array([b""] * n, _B))
    if pa.types.is_map(t):
        entries = pa.struct([t.key_field, t.item_field])
        return _encode(arr.view(pa.list_(pa.field("entries", entries, nullable=False))))
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        lengths = pc.fill_null(pc.list_value_length(arr), 0).cast(pa.int64())
        items = _encode(arr.flatten())
        offsets = np.concatenate(([0], np.cumsum(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)))
        joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), items), _EMPTY)
        return _tagged(valid, pc.binary_join_element_wise(_counts(lengths), joined, _EMPTY))
    raise TypeError(f"cannot compare values of type {t} bit for bit (a column of this type cannot be "
                    "consolidated)")


CANONICAL_NAN_BITS = {64: 0x7FF8000000000000, 32: 0x7FC00000, 16: 0x7E00}
"""The NaN that ``NaN`` in JSON (and Python's ``float('nan')``, Java's ``Double.NaN``) reads back as, per
float width."""


def noncanonical_nans(values: pa.Array | pa.ChunkedArray) -> int:
    """How many floats in ``values`` (at any depth of a nested type) are a NaN of other bits than
    :data:`CANONICAL_NAN_BITS` (another payload, or the sign bit set): what a text encoding that has one
    ``NaN`` cannot carry."""
    if isinstance(values, pa.ChunkedArray):
        return sum(noncanonical_nans(c) for c in values.chunks)
    t = values.type
    if pa.types.is_dictionary(t):
        return noncanonical_nans(values.dictionary_decode())
    if isinstance(t, pa.ExtensionType):
        return noncanonical_nans(values.storage)
    if _is_float(t):
        if len(values) == 0:
            return 0
        isnan = pc.fill_null(pc.is_nan(values), False).to_numpy(zero_copy_only=False)
        if not isnan.any():
            return 0
        width = t.bit_width
        bits = np.frombuffer(values.buffers()[1], dtype=f"<u{width // 8}",
                             count=len(values), offset=values.offset * width // 8)
        return int(np.count_nonzero(isnan & (bits != CANONICAL_NAN_BITS[width])))
    if pa.types.is_struct(t):
        return sum(noncanonical_nans(child) for child in values.flatten())
    if pa.types.is_map(t):
        return noncanonical_nans(values.keys) + noncanonical_nans(values.items)
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t)):
        return noncanonical_nans(values.flatten())
    return 0


def group_keys(table: pa.Table, names: list[str]) -> tuple[pa.Table, list[str]]:
    """``table`` with a bit-exact grouping key for each of ``names``: the column itself where pyarrow groups
    by its bits, else (:func:`needs_key`) its :func:`encode` as a new column ``_reclock_key_<i>``; and the
    key columns' names, in ``names``' order."""
    keys = []
    for i, name in enumerate(names):
        if needs_key(table.schema.field(name).type):
            key = f"_reclock_key_{i}"
            table = table.append_column(key, encode(table[name]))
            keys.append(key)
        else:
            keys.append(name)
    return table, keys


# -- Spark -----------------------------------------------------------------------------------------------------

def _spark_inexact(dtype: Any) -> bool:
    """Whether Spark's grouping by a value of type ``dtype`` is not bit for bit (or impossible): a float, a
    double or a map in it."""
    from pyspark.sql import types as T

    if isinstance(dtype, (T.DoubleType, T.FloatType, T.MapType)):
        return True
    if isinstance(dtype, T.StructType):
        return any(_spark_inexact(f.dataType) for f in dtype.fields)
    if isinstance(dtype, T.ArrayType):
        return _spark_inexact(dtype.elementType)
    return False


def spark_key(col: Any, dtype: Any) -> Any:
    """A Spark ``Column`` that groups exactly as ``col`` (of Spark type ``dtype``) does bit for bit, or None
    when grouping by ``col`` itself already does (no float, double or map inside)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not _spark_inexact(dtype):
        return None
    if isinstance(dtype, (T.DoubleType, T.FloatType)):
        return F.struct(col.alias("v"), F.when((col == 0) | F.isnan(col), spark_raw_bits(col, dtype)).alias("bits"))
    if isinstance(dtype, T.StructType):
        fields = [_keyed(col[f.name], f.dataType).alias(f"f{i}") for i, f in enumerate(dtype.fields)]
        return F.when(col.isNotNull(), F.struct(*fields))
    if isinstance(dtype, T.ArrayType):
        return F.transform(col, lambda x: spark_key(x, dtype.elementType))
    # a map (Spark cannot group by one): its entries, in their order

    def entry(e: Any) -> Any:
        k, v = e["key"], e["value"]
        return F.struct(_keyed(k, dtype.keyType).alias("k"), _keyed(v, dtype.valueType).alias("v"))

    return F.transform(F.map_entries(col), entry)


def spark_raw_bits(col: Any, dtype: Any) -> Any:
    """A Spark ``Column``: the float or double ``col``'s raw bits (``floatToRawIntBits`` /
    ``doubleToRawLongBits``, NaN payloads kept), as the decimal string ``java_method`` returns. A reflective
    call per value: evaluate it only where it matters (zeros, NaNs)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    cls, method = (("java.lang.Double", "doubleToRawLongBits") if isinstance(dtype, T.DoubleType)
                   else ("java.lang.Float", "floatToRawIntBits"))
    return F.call_function("java_method", F.lit(cls), F.lit(method), col)


def _keyed(col: Any, dtype: Any) -> Any:
    """:func:`spark_key` of ``col``, or ``col`` itself where it groups bit for bit (a ``Column`` has no truth
    value, so no ``or``)."""
    key = spark_key(col, dtype)
    return col if key is None else key


# -- DuckDB ----------------------------------------------------------------------------------------------------

def duckdb_key(expr: str, dtype: Any) -> str | None:
    """A DuckDB SQL expression that, grouped by beside ``expr`` itself (of the ``DuckDBPyType`` ``dtype``, as
    a relation's ``types`` give it), makes the grouping bit for bit: the bits of every float in the value, in
    the value's shape; or None when grouping by ``expr`` alone already is bit for bit (no float or double
    inside). Every float's bits, not only a zero's or a NaN's (where DuckDB's equality is not bit for bit):
    DuckDB 2.0.1 gives ``isnan(x)`` false for every NaN of a double read from Parquet (a ``CASE WHEN x = 0 OR
    isnan(x) THEN ...`` key was null for NaNs of different payloads, so their groups merged).

    Group by both and select ``expr`` itself: DuckDB gives each group's value as its first row held it,
    bits and all. (Its ``any_value``, ``first`` and ``arg_min`` of a nested value normalise the floats in
    it, so they cannot carry it.)"""
    return _duck(expr, dtype, 0)


def _duck(expr: str, t: Any, depth: int) -> str | None:
    kind = t.id
    if kind in ("double", "float"):
        return f"CAST({expr} AS BIT)"
    var = f"_reclock_x{depth}"
    if kind == "struct":
        keys = [_duck(f"struct_extract({expr}, {_sql_str(name)})", sub, depth + 1) for name, sub in t.children]
        if all(k is None for k in keys):
            return None
        return f"struct_pack({', '.join(f'f{i} := {k}' for i, k in enumerate(keys) if k is not None)})"
    if kind in ("list", "array"):
        inner = _duck(var, t.children[0][1], depth + 1)
        return None if inner is None else f"list_transform({expr}, lambda {var}: {inner})"
    if kind == "map":
        (_, key_t), (_, value_t) = t.children
        k = _duck(f"{var}.key", key_t, depth + 1)
        v = _duck(f"{var}.value", value_t, depth + 1)
        if k is None and v is None:
            return None
        fields = ", ".join(f"{n} := {e}" for n, e in (("k", k), ("v", v)) if e is not None)
        return f"list_transform(map_entries({expr}), lambda {var}: struct_pack({fields}))"
    return None


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"
