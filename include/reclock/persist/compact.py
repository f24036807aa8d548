"""Compaction of a shard's parts: merge the small parts at or below ``since`` so a shard's batch rows stay
bounded however many cycles append to it (DESIGN.md, "bounded state").

::

    batch rows (lower, path order)                 since
    [0,5) a  [5,9) b  [5,9) c  [9,12) d  ...  [40,44) x | [44,50) y  [50,57) z
    \\____________ candidates: upper <= since + 1, bytes < target ___/   untouched
                        |  read own columns, advance ts to upper - 1 (<= since),
                        v  consolidate (sum diff by row and ts, drop zeros)
    [0,44) m  (one new part under a fresh path, <= ~target_bytes)  | [44,50) y  [50,57) z

The plan and the consolidation are pure (:mod:`reclock.compaction`); this module does the I/O: read a run
of candidate parts (at most ``target_bytes`` of them at once), write the merged part, then swap the batch
rows in ONE transaction with :func:`reclock.persist.shards.merge_batches`. A rebuild or another
compaction that replaced any candidate in between makes the swap a ``conflict`` that changes nothing.

Reads cannot tell: AS OF every ``t >= since`` a read takes all of a merged part's updates, as it took all
of the candidates'; ``read_updates`` from above ``since`` (what a sink reads) skips both. Below ``since``
reads were never exact.

The merged part keeps the column names the parts carry in their files (an error collection's columns keep
their ``_reclock_err_`` prefix), so every reader reads it like the parts it replaces. It is written under
``<shard>/<lower>-<upper>/`` (:func:`reclock.persist.blob.new_part_path`): garbage collection of a source's
parts must cover that folder for every shard, not only the cycle's ``<source>/`` folder. The replaced parts
become garbage: the swap records them in ``reclock.retired_parts``, and
:func:`reclock.persist.gc.collect_garbage` deletes them once its grace period has passed since then (a
reader that listed the batches just before the swap may still be opening them).
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from reclock.batch import Part
from reclock.compaction import advance, consolidate, has_retractions, merged_description, plan_compaction
from reclock.failpoints import failpoint
from reclock.persist.blob import BlobStore, new_part_path
from reclock.persist.shards import CONFLICT, MERGED, BatchRow, Merge, batches, merge_batches, shard_info
from reclock.read import _own_columns

__all__ = ["CompactReport", "compact_parts", "DEFAULT_TARGET_BYTES", "DEFAULT_SMALL_BYTES", "DEFAULT_MIN_PARTS",
           "MERGED", "NOTHING_TO_DO", "CONFLICT"]

DEFAULT_TARGET_BYTES = 64 * 2**20
"""A merge reads and writes at most about this much at once."""
DEFAULT_SMALL_BYTES = 8 * 2**20
"""Only parts smaller than this are merged: a big cycle's parts are left as they are (rewriting them would
cost a cycle's worth of I/O again and save few rows), so batch rows grow with the data, not the cycles."""
DEFAULT_MIN_PARTS = 8
"""Merge only when at least this many candidates wait: fewer stay as they are (the bound on their number)."""
NOTHING_TO_DO = "nothing_to_do"


@dataclass(frozen=True)
class CompactReport:
    """What one :func:`compact_parts` did to ``shard``."""

    shard: str
    status: str  # MERGED | NOTHING_TO_DO | CONFLICT (a concurrent rebuild or compaction won: nothing changed)
    since: int  # the since the candidates were chosen by
    parts_before: int  # the shard's batch rows before
    parts_after: int  # ... and after (the same unless merged)
    parts_merged: int  # candidate parts replaced (0 unless merged)
    parts_written: int  # merged parts written (also on conflict: they are garbage then)
    rows_before: int  # updates in the merged candidates
    rows_after: int  # updates in the merged parts (consolidated)
    bytes_read: int
    bytes_written: int
    seconds: float


def _read_run(blob: BlobStore, shard: str, run: Sequence[BatchRow]) -> tuple[pa.Table, bool]:
    """The run's updates with the shard's own columns, named as in the files; and whether the files keep
    timestamps as INT96 (Spark's default), so the merged part can keep them the same way."""
    tables, int96 = [], False
    for row in run:
        with blob.open(row.path) as f:
            pf = pq.ParquetFile(f)
            own, _ = _own_columns(shard, pf.schema_arrow.names)  # no rename: keep the on-file names
            int96 |= uses_int96(pf)
            tables.append(pf.read(columns=own))
    return pa.concat_tables(tables, promote_options="default"), int96


def uses_int96(pf: pq.ParquetFile) -> bool:
    """Whether the file keeps timestamps as INT96 (Spark's default)."""
    return any(pf.schema.column(i).physical_type == "INT96" for i in range(len(pf.schema)))


def parquet_bytes(table: pa.Table, int96: bool, what: str) -> bytes:
    """``table`` as a Parquet file whose columns read back with the same types (timestamps as INT96 when the
    files it comes from keep them so: Spark reads those, and pyarrow reads them as it read the originals)."""
    buf = io.BytesIO()
    pq.write_table(table, buf, use_deprecated_int96_timestamps=int96)
    data = buf.getvalue()
    written = pq.ParquetFile(io.BytesIO(data)).schema_arrow
    if [(f.name, f.type) for f in written] != [(f.name, f.type) for f in table.schema]:
        raise ValueError(f"{what} would read back as {written}, not as the parts it comes from ({table.schema})")
    return data


def _write_part(blob: BlobStore, shard: str, run: Sequence[BatchRow], table: pa.Table, int96: bool) -> Part:
    desc = merged_description(run)
    data = parquet_bytes(table, int96, f"shard {shard}: a merged part (nothing was merged)")
    path = new_part_path(shard, desc)
    blob.put_bytes(path, data)
    ts = desc.upper - 1  # every update of the run is there now
    return Part(path, table.num_rows, len(data), ts, ts)


def compact_parts(conn, blob: BlobStore, shard: str, *, target_bytes: int = DEFAULT_TARGET_BYTES,
                  small_bytes: int = DEFAULT_SMALL_BYTES, min_parts: int = DEFAULT_MIN_PARTS,
                  before_swap: Callable[[], None] | None = None) -> CompactReport:
    """Merge ``shard``'s small parts at or below its since, if at least ``min_parts`` of them wait.

    Candidates are the batch rows whose description ends at or below ``since + 1`` (all their updates lie at
    ``ts <= since``) and whose part is smaller than ``small_bytes``; in ``(lower, path)`` order they are
    packed into runs of at most ``target_bytes``, and each run of two or more becomes one part: its updates
    advanced to the run's last time (``upper - 1 <= since``) and, when the run holds retractions,
    consolidated (a run that cancels out entirely becomes no part at all; an append-only run has nothing
    to cancel and is only advanced). The merged parts replace the runs in one transaction (``merged``),
    unless a rebuild or another compaction replaced any of them first (``conflict``: nothing changes, the
    written parts are garbage). Reads AS OF any ``t >= since``, and reads of the updates above ``since``,
    give what they gave before.

    ``before_swap``, when given, runs after the merged parts are written and before the swap (tests use it
    to race a rebuild); the fail point ``compact:before_swap`` sits at the same place.
    """
    t0 = time.monotonic()
    since = shard_info(conn, shard).since
    rows = batches(conn, shard)
    runs = plan_compaction(rows, since, target_bytes=target_bytes, min_parts=min_parts, small_bytes=small_bytes)
    merges: list[Merge] = []
    rows_before = rows_after = 0
    for run in runs:  # one run in memory at a time: at most ~target_bytes of parts
        table, int96 = _read_run(blob, shard, run)
        rows_before += table.num_rows
        to = merged_description(run).upper - 1
        merged = consolidate(table, advance_to=to) if has_retractions(table) else advance(table, to)
        del table
        rows_after += merged.num_rows
        parts = (_write_part(blob, shard, run, merged, int96),) if merged.num_rows else ()
        merges.append(Merge(run, merged_description(run), parts))
    status = NOTHING_TO_DO
    if merges:
        failpoint("compact:before_swap")
        if before_swap is not None:
            before_swap()
        status = merge_batches(conn, shard, merges)
    merged_away = sum(len(mg.old) - len(mg.parts) for mg in merges) if status == MERGED else 0
    return CompactReport(
        shard=shard, status=status, since=since, parts_before=len(rows), parts_after=len(rows) - merged_away,
        parts_merged=sum(len(mg.old) for mg in merges) if status == MERGED else 0,
        parts_written=sum(len(mg.parts) for mg in merges), rows_before=rows_before, rows_after=rows_after,
        bytes_read=sum(r.bytes for mg in merges for r in mg.old),
        bytes_written=sum(p.bytes for mg in merges for p in mg.parts),
        seconds=round(time.monotonic() - t0, 3))
