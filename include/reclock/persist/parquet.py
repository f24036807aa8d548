"""Parquet part files: what their footers tell (row counts, ts bounds, whether a part may retract) and how
a table becomes a part's bytes that read back as the parts it comes from.

The collector of staged parts (``reclock.persist.staged``), compaction (``reclock.persist.compact``) and
the readers (``reclock.read``) share these; none of them imports another for them.
"""

from __future__ import annotations

import io
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from reclock.batch import Part
from reclock.errors import PartDamaged


def check_rows(md: pq.FileMetaData, shard: str, path: str, rows: int) -> None:
    """``PartDamaged`` unless the footer of the part at ``path`` holds the ``rows`` its shard recorded (a
    part's rows are its file's, from the footer, when it is appended): every reader of parts checks, so a
    replaced or truncated file fails the read instead of going on with other data."""
    if md.num_rows != rows:
        raise PartDamaged(shard, path, rows, md.num_rows)


def column_stats(md: pq.FileMetaData, column: str) -> list | None:
    """Each row group's footer statistics of the top-level column ``column`` (an entry None where none were
    kept; None: no such column). Found by its leaf path, not its Arrow field index, which differs once a
    nested column comes before it."""
    idx = next((i for i in range(md.num_columns) if md.schema.column(i).path == column), None)
    if idx is None:
        return None
    return [md.row_group(rg).column(idx).statistics for rg in range(md.num_row_groups)]


def null_count(md: pq.FileMetaData, column: str) -> int | None:
    """Nulls in ``column`` over the file's row groups, from the footer (None: no such column; -1: unknown)."""
    stats = column_stats(md, column)
    if stats is None:
        return None
    if any(st is None or st.null_count is None for st in stats):
        return -1
    return sum(st.null_count for st in stats)


def column_range(md: pq.FileMetaData, column: str) -> tuple | None:
    """``(min, max)`` of ``column`` over the file's row groups, from the footer (None: no such column;
    ``(None, None)``: unknown)."""
    stats = column_stats(md, column)
    if stats is None:
        return None
    if not stats or any(st is None or not st.has_min_max for st in stats):
        return (None, None)
    return min(st.min for st in stats), max(st.max for st in stats)


def part_from_footer(path: str, size: int, md: pq.FileMetaData) -> Part:
    """The :class:`~reclock.batch.Part` a file is: its rows and ts bounds as the footer tells them."""
    lo, hi = column_range(md, "ts") or (None, None)
    return Part(path, md.num_rows, size, lo, hi)


def may_retract(md: pq.FileMetaData) -> bool:
    """Whether a part may hold an update with ``diff <= 0``, by its footer's statistics of ``diff``."""
    stats = column_stats(md, "diff")
    return stats is None or any(st is None or not st.has_min_max or st.min <= 0 for st in stats)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` with ``schema``'s columns in its order: missing ones null, others cast where they differ; a
    dictionary-encoded column of ``schema``'s type stays encoded (its field then has the dictionary type)."""
    cols = []
    for field in schema:
        i = batch.schema.get_field_index(field.name)
        col = batch.column(i) if i >= 0 else pa.nulls(batch.num_rows, field.type)
        cols.append(col if holds_type(col.type, field.type) else col.cast(field.type))
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(
        [f if c.type == f.type else f.with_type(c.type) for f, c in zip(schema, cols)], schema.metadata))


def holds_type(actual: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column of type ``actual`` holds values of type ``wanted``: the same type, or a dictionary of
    it (for strings and binaries, of either offset width: Parquet stores them alike)."""
    return actual == wanted or (pa.types.is_dictionary(actual) and _wide(actual.value_type) == _wide(wanted))


def _wide(t: pa.DataType) -> pa.DataType:
    return pa.large_string() if t == pa.string() else pa.large_binary() if t == pa.binary() else t


DICTIONARY_BYTES_PER_VALUE = 2
"""A string column chunk read as a dictionary stores fewer bytes a value than this (see :func:`dictionary_columns`)."""


def dictionary_columns(md: pq.FileMetaData, row_groups: Sequence[int]) -> set[str]:
    """The top-level string and binary columns whose chunks in ``row_groups`` are worth reading as
    dictionary arrays: each has a dictionary page and stores fewer than :data:`DICTIONARY_BYTES_PER_VALUE`
    bytes a value before compression, so nearly every value is an index into a small dictionary (a value
    written plain takes 4 bytes for its length alone). Decoding them dense would copy each value out of
    the dictionary (a long repeated string costs its length in every row), and a writer would hash each
    copy back into a dictionary; read as dictionaries, neither happens."""
    found = set()
    for i in range(md.num_columns):
        col = md.schema.column(i)
        if ("." in col.path or col.max_repetition_level or col.physical_type != "BYTE_ARRAY"
                or col.logical_type.type not in ("STRING", "NONE")):
            continue
        chunks = [md.row_group(rg).column(i) for rg in row_groups]
        if chunks and all(c.has_dictionary_page and c.total_uncompressed_size < DICTIONARY_BYTES_PER_VALUE
                          * max(c.num_values, 1) for c in chunks):
            found.add(col.path)
    return found


def uses_int96(pf: pq.ParquetFile) -> bool:
    """Whether the file keeps timestamps as INT96 (Spark's default)."""
    return any(pf.schema.column(i).physical_type == "INT96" for i in range(len(pf.schema)))


def parquet_bytes(table: pa.Table, int96: bool, what: str) -> bytes:
    """``table`` as a Parquet file whose columns read back with the same types (timestamps as INT96 when the
    files it comes from keep them so: Spark reads those, and pyarrow reads them as it read the originals)."""
    buf = io.BytesIO()
    pq.write_table(table, buf, use_deprecated_int96_timestamps=int96)
    data = buf.getvalue()
    check_reads_back(data, table.schema, what)
    return data


def check_reads_back(data: bytes, schema: pa.Schema, what: str) -> None:
    """Refuse Parquet ``data`` whose columns would not read back as ``schema``'s."""
    written = pq.ParquetFile(pa.BufferReader(data)).schema_arrow  # not a Python file: see blob.native_file
    if [(f.name, f.type) for f in written] != [(f.name, f.type) for f in schema]:
        raise ValueError(f"{what} would read back as {written}, not as the parts it comes from ({schema})")
