"""Reading a collection: its updates in a time range, or its contents AS OF a time (consolidated).

A read AS OF ``t`` (``since <= t < upper``) takes the shard's updates with ``ts <= t`` and sums ``diff``
by row, dropping rows whose sum is zero. Parts are read with pyarrow straight from the blob store, so
DuckDB, pandas or Spark can consume the result (``spark.createDataFrame(table.to_pandas())`` or read the
part paths directly).
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reclock.compaction import contents_as_of
from reclock.config import ERRORS_SUFFIX
from reclock.persist.blob import BlobStore
from reclock.persist.shards import batches, shard_info
from reclock.errors import SinceViolation
from reclock.spark.ingest import ERR_PREFIX, INTERNAL_PREFIX


def _own_columns(shard: str, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The columns of ``shard`` in its parts (both outputs of a source share files) and their renames."""
    if shard.endswith(ERRORS_SUFFIX):
        own = [n for n in names if n.startswith(ERR_PREFIX)] + ["ts", "diff"]
        return own, {n: n[len(ERR_PREFIX):] for n in own if n.startswith(ERR_PREFIX)}
    return [n for n in names if not n.startswith(INTERNAL_PREFIX)], {}


def _read_parts(blob: BlobStore, paths: Sequence[str], shard: str) -> pa.Table | None:
    tables = []
    for path in paths:
        with blob.open(path) as f:
            t = pq.read_table(f)
        own, renames = _own_columns(shard, t.column_names)
        t = t.select(own)
        if renames:
            t = t.rename_columns([renames.get(n, n) for n in t.column_names])
        tables.append(t)
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="default")


def read_updates(conn, blob: BlobStore, shard: str, lower: int = 0, upper: int | None = None) -> pa.Table | None:
    """Every ``(data..., ts, diff)`` update of ``shard`` with ``lower <= ts < upper`` (upper defaults to the
    shard's upper), sorted by ts; None if the shard has no parts."""
    info = shard_info(conn, shard)
    hi = info.upper if upper is None else min(upper, info.upper)
    rows = [b for b in batches(conn, shard) if b.max_ts is None or b.max_ts >= lower]
    rows = [b for b in rows if b.min_ts is None or b.min_ts < hi]
    table = _read_parts(blob, [b.path for b in rows], shard)
    if table is None:
        return None
    mask = pc.and_(pc.greater_equal(table["ts"], lower), pc.less(table["ts"], hi))
    return table.filter(mask).sort_by("ts")


def read_as_of(conn, blob: BlobStore, shard: str, t: int | None = None) -> pa.Table:
    """The contents of ``shard`` AS OF ``t`` (default: the latest complete time, ``upper - 1``):
    data columns plus ``diff`` (the multiplicity), zero rows dropped."""
    info = shard_info(conn, shard)
    if info.upper == 0:
        raise ValueError(f"shard {shard}: nothing is complete yet (upper is 0); run a cycle first")
    if t is None:
        t = info.upper - 1
    if t < info.since:
        raise SinceViolation(shard, t, info.since)
    if t >= info.upper:
        raise ValueError(f"shard {shard}: time {t} is not complete yet (upper is {info.upper}); "
                         f"read at most {info.upper - 1}")
    return contents_as_of(_read_parts(blob, [b.path for b in batches(conn, shard, as_of=t)], shard), t)
