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
from typing import Sequence

DATA_OUTPUT = 0
ERRORS_OUTPUT = 1
STATE_OUTPUT = 2

INTERNAL_PREFIX = "_reclock_"
"""Columns of the parts that belong to no collection's data carry this prefix."""
ERROR_COLUMNS = ("partition", "offset", "key", "raw", "reason")
ERR_PREFIX = "_reclock_err_"
"""Parts of all outputs come from one Spark job and carry the union of columns; the error collection's
columns carry this prefix in the files (readers of each shard keep only their own columns)."""
STATE_COLUMNS = ("key", "value", "partition", "offset", "timestamp_us")
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


def unpack_rejected(packed: Sequence[str]):
    """The error collection's columns (``_reclock_err_*``, named and typed as an upsert slice writes them)
    of the rejected rows :data:`REJECTED_COLUMN` holds, as an Arrow table (no ``ts``, ``diff``)."""
    import pyarrow as pa

    rows = [json.loads(p) for p in packed]
    types = {"partition": pa.int32(), "offset": pa.int64(), "key": pa.binary(), "raw": pa.binary(),
             "reason": pa.string()}
    cols = {}
    for c in ERROR_COLUMNS:
        values = [r.get(c) for r in rows]
        if c in PACKED_BASE64:
            values = [None if v is None else base64.b64decode(v) for v in values]
        cols[ERR_PREFIX + c] = pa.array(values, types[c])
    return pa.table(cols)


def state_schema():
    """The Arrow schema of the upsert state's changes, named as the state table names them."""
    import pyarrow as pa

    return pa.schema(list(zip(STATE_COLUMNS, (pa.binary(), pa.binary(), pa.int32(), pa.int64(), pa.int64()))))
