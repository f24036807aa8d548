"""What the Parquet files of one ``write_batches`` job hold: which output a row belongs to and how each
output's columns are named in the files.

One Spark job writes every output of a slice: output 0 the collection (its own column names), output 1
the error collection (``_reclock_err_*`` columns), output 2 the upsert state's changes (``_reclock_state_*``).
An append-only slice tells its rows apart by :data:`REJECTED_COLUMN` (null on the collection's rows); an
upsert slice by ``_output=N/`` folders. Readers of a shard keep only its own columns (:func:`own_columns`).

Pure: the Spark job (``reclock.sources.kafka.spark_job``), the collector of staged parts (``reclock.persist.staged``)
and the readers (``reclock.read``, ``reclock.persist.compact``) import these names from here.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Sequence

DATA_OUTPUT = 0
ERRORS_OUTPUT = 1
STATE_OUTPUT = 2

INTERNAL_PREFIX = "_reclock_"
"""Columns of the parts that belong to no collection's data carry this prefix."""


@dataclass(frozen=True)
class RecordShape:
    """How one kind's records look to the decode path every kind shares (``reclock.spark.decode``), and so
    to its error collection and upsert state: the two columns that say where a record is upstream
    (``positions``: name and Arrow type, the first coarse, the second ordered within it), how the second
    sorts in Spark SQL (``order_sql``, over the column ``_o``), the names the metadata columns a source
    includes get in its collection (``meta_names``: an include name -> column; others ``_<name>``), and
    how the ones not kept by the upsert state are derived (``derived``).

    A kind's records reach the decode path with the columns ``key`` (binary: the upsert key), ``value``
    (binary), ``timestamp``, ``ts``, the two position columns, and each included metadata column by its
    include name."""

    positions: tuple[tuple[str, str], tuple[str, str]]
    order_sql: str = "_o"
    meta_names: tuple[tuple[str, str], ...] = ()
    derived: tuple[tuple[str, str], ...] = ()
    """Metadata columns that are not among ``key, value, timestamp`` and the positions, as Spark SQL over
    those: how an upsert state row (which keeps only them) gives them back."""

    @property
    def error_columns(self) -> tuple[str, ...]:
        """The error collection's columns: where the record is, its key, raw bytes and why it failed."""
        return (self.positions[0][0], self.positions[1][0], "key", "raw", "reason")

    @property
    def state_columns(self) -> tuple[str, ...]:
        """The upsert state's columns: per key, its current record's value, where it is and its timestamp."""
        return ("key", "value", self.positions[0][0], self.positions[1][0], "timestamp_us")

    def meta_column(self, include: str) -> str:
        return dict(self.meta_names).get(include, f"_{include}")

    def arrow_type(self, column: str):
        import pyarrow as pa

        types = {"int32": pa.int32(), "int64": pa.int64(), "string": pa.string(), "binary": pa.binary()}
        named = dict(self.positions)
        if column in named:
            return types[named[column]]
        return {"key": pa.binary(), "value": pa.binary(), "raw": pa.binary(), "reason": pa.string(),
                "timestamp_us": pa.int64()}[column]


KAFKA_SHAPE = RecordShape((("partition", "int32"), ("offset", "int64")),
                          meta_names=(("key", "_key"), ("timestamp", "_kafka_timestamp")))
"""A Kafka record: ``(partition, offset)``; included ``key`` and ``timestamp`` become ``_key`` and
``_kafka_timestamp``."""
ERROR_COLUMNS = KAFKA_SHAPE.error_columns
ERR_PREFIX = "_reclock_err_"
"""Parts of all outputs come from one Spark job and carry the union of columns; the error collection's
columns carry this prefix in the files (readers of each shard keep only their own columns)."""
STATE_COLUMNS = KAFKA_SHAPE.state_columns
STATE_PREFIX = "_reclock_state_"
"""The upsert state's changes: per key touched, its last record (a null value: the key is deleted)."""
REJECTED_COLUMN = INTERNAL_PREFIX + "rejected"
"""In the files of an append-only slice: null on the collection's rows; on a record that does not decode,
its error row (``partition, offset, key, raw, reason``; bytes in base64) as a JSON object, unpacked into
the error collection's columns when the slice's parts are collected (:func:`unpack_rejected`)."""
PACKED_BASE64 = ("key", "raw")
"""The error columns :data:`REJECTED_COLUMN` carries in base64 (they are bytes)."""
OUTPUT_FOLDER = "_output={}"
"""The folder of an upsert slice's files of one output."""
MEMBER_COLUMN = INTERNAL_PREFIX + "member"
"""The partition column of a joint write (several sources' slices in one Spark job): the slice's number among
the job's slices (a folder ``_reclock_member=<i>``, not a column in the files)."""

DATA_KIND = "data"
ERRORS_KIND = "errors"
SHARD_KINDS = (DATA_KIND, ERRORS_KIND)
"""A shard's kind, registered with it (``reclock.shards.kind``): which of a part file's columns are its own."""


def own_columns(kind: str, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The columns of a shard of ``kind`` among a part file's column ``names`` (both outputs of a source
    share files), and their renames from file names to the shard's names."""
    if kind not in SHARD_KINDS:
        raise ValueError(f"shard kind {kind!r} is not one of {', '.join(SHARD_KINDS)}")
    if kind == ERRORS_KIND:
        own = [n for n in names if n.startswith(ERR_PREFIX)] + ["ts", "diff"]
        return own, {n: n[len(ERR_PREFIX):] for n in own if n.startswith(ERR_PREFIX)}
    return [n for n in names if not n.startswith(INTERNAL_PREFIX)], {}


def unpack_rejected(packed: Sequence[str], shape: RecordShape = KAFKA_SHAPE):
    """The error collection's columns (``_reclock_err_*``, named and typed as an upsert slice writes them)
    of the rejected rows :data:`REJECTED_COLUMN` holds, as an Arrow table (no ``ts``, ``diff``)."""
    import pyarrow as pa

    rows = [json.loads(p) for p in packed]
    cols = {}
    for c in shape.error_columns:
        values = [r.get(c) for r in rows]
        if c in PACKED_BASE64:
            values = [None if v is None else base64.b64decode(v) for v in values]
        cols[ERR_PREFIX + c] = pa.array(values, shape.arrow_type(c))
    return pa.table(cols)


def state_schema(shape: RecordShape = KAFKA_SHAPE):
    """The Arrow schema of the upsert state's changes, named as the state table names them."""
    import pyarrow as pa

    return pa.schema([(c, shape.arrow_type(c)) for c in shape.state_columns])
