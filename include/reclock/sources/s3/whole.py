"""Whole-object formats of the S3 source, read in a Spark task: Parquet files and Avro container files.

Each object is one increment: it is bound whole (``reclock.sources.s3.log``: its end position) and read by
one task, a row group (Parquet) or a block of records (Avro) at a time, so a task holds one row group,
whatever the object's size. A row's ``offset`` is its index in the object.

The collection's columns are the source's declared schema (``format.schema``: Spark DDL for Parquet; the
``.avsc`` for Avro, whose schema resolution fastavro applies). An object whose columns are not exactly
those (a column missing or extra, a type that does not convert without loss: only widenings such as int ->
bigint, float -> double, ms -> us timestamps) is not read: one error row names the object and every
difference (``on_decode_error: stall``: the cycle fails naming it). Values that turn out not to convert
exactly (a nanosecond timestamp) stop the object there: the rows before land, an error row says where.
An empty or damaged file is an error row too. Nothing is silently dropped or changed.

Reads of an S3 object go through :class:`PinnedFile`: every ranged GET carries the ETag that was bound.
"""

from __future__ import annotations

import io
from typing import Iterator

import pyarrow as pa

from reclock.sources.s3.client import ObjectInfo

BATCH_ROWS = 65_536
BUFFER = 4 << 20


class PinnedFile(io.RawIOBase):
    """A seekable read-only file over one object version of a store (every read a ranged read pinned to
    the recorded identity: ``ObjectStore.read``)."""

    def __init__(self, store, obj: ObjectInfo) -> None:
        self.store, self.obj, self.pos = store, obj, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.obj.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, b) -> int:
        end = min(self.obj.size, self.pos + len(b))
        if end <= self.pos:
            return 0
        at = 0
        for chunk in self.store.read(self.obj, self.pos, end):
            b[at:at + len(chunk)] = chunk
            at += len(chunk)
        self.pos += at
        return at


def open_object(store, obj: ObjectInfo):
    """A buffered, seekable file of ``obj`` pinned to its identity."""
    return io.BufferedReader(PinnedFile(store, obj), buffer_size=BUFFER)


_INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_UINTS = [pa.uint8(), pa.uint16(), pa.uint32()]


def conversion_problems(have: pa.Schema, want: pa.Schema) -> list[str]:
    """How the columns ``have`` differ from ``want`` in ways that cannot convert exactly (empty: they do)."""
    out = []
    names = set(want.names)
    for f in want:
        if f.name not in have.names:
            out.append(f"column {f.name} is missing")
            continue
        why = _type_problem(have.field(f.name).type, f.type)
        if why:
            out.append(f"column {f.name}: {why}")
    extra = [n for n in have.names if n not in names]
    if extra:
        out.append(f"column(s) {', '.join(extra)} are not in the declared schema")
    return out


def _type_problem(have: pa.DataType, want: pa.DataType) -> str | None:
    if have == want:
        return None
    t = pa.types
    if t.is_dictionary(have):
        return _type_problem(have.value_type, want)
    ok = False
    if t.is_integer(want) and t.is_integer(have) and want in _INTS:
        if have in _INTS:
            ok = _INTS.index(have) <= _INTS.index(want)
        elif have in _UINTS:
            ok = _UINTS.index(have) < _INTS.index(want)
    elif t.is_float64(want) and (t.is_float32(have) or t.is_float16(have)):
        ok = True
    elif (t.is_string(want) or t.is_large_string(want)) and (t.is_string(have) or t.is_large_string(have)):
        ok = True
    elif (t.is_binary(want) or t.is_large_binary(want)) and (t.is_binary(have) or t.is_large_binary(have)):
        ok = True
    elif t.is_timestamp(want) and t.is_timestamp(have):
        if (want.tz is None) != (have.tz is None):
            return f"{have} and {want} differ in time zone awareness"
        ok = True  # a unit change converts exactly or fails on the value that does not (safe cast)
    elif t.is_decimal(want) and t.is_decimal(have):
        ok = have.scale == want.scale and have.precision <= want.precision
    elif (t.is_list(want) or t.is_large_list(want)) and (t.is_list(have) or t.is_large_list(have)):
        return _type_problem(have.value_type, want.value_type)
    elif t.is_struct(want) and t.is_struct(have):
        probs = conversion_problems(pa.schema(list(have)), pa.schema(list(want)))
        return "; ".join(probs) or None
    elif t.is_map(want) and t.is_map(have):
        return _type_problem(have.key_type, want.key_type) or _type_problem(have.item_type, want.item_type)
    return None if ok else f"{have} does not convert exactly to {want}"


def read_parquet(f, want: pa.Schema) -> Iterator[pa.Table | str]:
    """The rows of a Parquet file as ``want`` (row group by row group), or a problem (a string) that stops
    the object: the first item if the file does not read or its columns differ."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
        have = pf.schema_arrow
    except Exception as e:  # noqa: BLE001 - any file that does not open is that object's error row
        yield f"not a readable Parquet file ({type(e).__name__}: {e})"
        return
    problems = conversion_problems(have, want)
    if problems:
        yield "its schema differs from the declared one: " + "; ".join(problems)
        return
    done = 0
    for i in range(pf.num_row_groups):
        try:
            table = pf.read_row_group(i, columns=want.names).select(want.names).cast(want, safe=True)
        except Exception as e:  # noqa: BLE001
            yield f"row group {i} (rows from {done} on) does not convert exactly ({type(e).__name__}: {e})"
            return
        done += table.num_rows
        yield table


def read_avro(f, reader_schema: dict, want: pa.Schema) -> Iterator[pa.Table | str]:
    """The records of an Avro container file resolved to ``reader_schema`` (Avro's schema resolution), as
    ``want``, in tables of up to :data:`BATCH_ROWS`; or a problem (a string) that stops the object."""
    import fastavro

    try:
        records = fastavro.reader(f, reader_schema=reader_schema)
    except Exception as e:  # noqa: BLE001
        yield f"not a readable Avro container file, or its schema does not resolve to the declared one " \
              f"({type(e).__name__}: {e})"
        return
    batch: list[dict] = []
    done = 0
    failure = None
    try:
        for rec in records:
            batch.append(rec)
            if len(batch) >= BATCH_ROWS:
                table = pa.Table.from_pylist(batch, schema=want)
                done, batch = done + len(batch), []
                yield table
    except Exception as e:  # noqa: BLE001 - a cut or damaged file: the records before it land
        failure = e
    if batch:
        try:
            table = pa.Table.from_pylist(batch, schema=want)
        except Exception as e:  # noqa: BLE001
            failure = failure or e
        else:
            done += len(batch)
            yield table
    if failure is not None:
        yield f"records from {done} on do not read or convert ({type(failure).__name__}: {failure})"
