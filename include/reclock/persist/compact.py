"""Compaction of a shard's parts: merge the small parts at or below ``since`` so a shard's batch rows stay
bounded however many cycles append to it (DESIGN.md, "bounded state").

::

    batch rows (lower, path order)                 since
    [0,5) a  [5,9) b  [5,9) c  [9,12) d  ...  [40,44) x | [44,50) y  [50,57) z
    \\____________ candidates: upper <= since + 1, bytes < target ___/   untouched
                        |  read own columns, advance ts to upper - 1 (<= since),
                        v  consolidate (sum diff by row and ts, drop zeros)
    [0,44) m  (one new part under a fresh path, <= ~target_bytes)  | [44,50) y  [50,57) z

The plan and the consolidation are pure (:mod:`reclock.compaction`); this module does the I/O: merge each run
of candidate parts (at most ``target_bytes`` of them) into one part, then swap the batch rows in ONE
transaction with :func:`reclock.persist.shards.merge_batches`. A rebuild or another
compaction that replaced any candidate in between makes the swap a ``conflict`` that changes nothing.

Memory: an append-only run (every part's footer shows ``diff > 0``: every Kafka append envelope) is
streamed, a batch of rows at a time, so a merge holds about one batch and its compressed output. A run
with retractions (upsert) is consolidated in memory, so it is cut to the parts whose decoded size stays
under ``decoded_limit``.

Reads cannot tell: AS OF every ``t >= since`` a read takes all of a merged part's updates, as it took all
of the candidates'; ``read_updates`` from above ``since`` (what a sink reads) skips both. Below ``since``
reads were never exact.

A collection whose schema evolved (``reclock.persist.schemas``) has each part of a run read as the schema in
force at the run's last time (``reclock.schema_projection``), the newest of its parts' schemas, so a merged
part holds one schema like any other part.

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
from reclock.persist.shards import CONFLICT, MERGED, BatchRow, Merge, batches, compacting, merge_batches, shard_info
from reclock.part_layout import DATA_KIND, own_columns
from reclock.persist.parquet import (check_reads_back, check_rows, conform, may_retract, parquet_bytes,
                                     uses_int96)
from reclock.persist.schemas import load_history
from reclock.schema_evolution import CollectionSchema
from reclock.schema_projection import project_part, target_arrow_schema

__all__ = ["CompactReport", "compact_parts", "DEFAULT_TARGET_BYTES", "DEFAULT_SMALL_BYTES", "DEFAULT_MIN_PARTS",
           "MERGED", "NOTHING_TO_DO", "CONFLICT"]

DEFAULT_TARGET_BYTES = 64 * 2**20
"""A merge reads and writes at most about this much at once."""
DEFAULT_SMALL_BYTES = 8 * 2**20
"""Only parts smaller than this are merged: a big cycle's parts are left as they are (rewriting them would
cost a cycle's worth of I/O again and save few rows), so batch rows grow with the data, not the cycles."""
DEFAULT_MIN_PARTS = 8
"""Merge only when at least this many candidates wait: fewer stay as they are (the bound on their number)."""
DEFAULT_DECODED_LIMIT = 256 * 2**20
"""A run holding retractions is consolidated in memory: it is cut to the parts whose data, decoded, stays
under this (the rest wait for the next compaction). Append-only runs are streamed and need no limit."""
STREAM_BATCH_ROWS = 65_536
"""Rows an append-only merge holds at once."""
NOTHING_TO_DO = "nothing_to_do"


def _within(decoded: Sequence[int], limit: int) -> int:
    """How many of the leading parts (decoded sizes ``decoded``) fit in ``limit`` together (at least one)."""
    total, n = 0, 0
    for size in decoded:
        if n and total + size > limit:
            break
        total, n = total + size, n + 1
    return n


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


@dataclass(frozen=True)
class _Footer:
    """What one part's footer tells before any data is read."""

    schema: pa.Schema  # the shard's own columns, named as in the file
    int96: bool  # the file keeps timestamps as INT96 (Spark's default)
    may_retract: bool  # it may hold an update with diff <= 0 (no statistics: assume so)
    decoded_bytes: int  # its data decoded (the row groups' uncompressed sizes)


@dataclass(frozen=True)
class _RunFiles:
    """What a run's footers tell together."""

    schema: pa.Schema  # the run's own columns, unified over its parts (or its recorded schema's)
    int96: bool  # some file keeps timestamps as INT96: the merged part keeps them so
    retractions: bool  # some part may hold an update with diff <= 0
    target: CollectionSchema | None = None  # the recorded schema every part is read as

    @classmethod
    def of(cls, footers: Sequence[_Footer], target: CollectionSchema | None = None) -> "_RunFiles":
        schemas = [f.schema for f in footers]
        schema = pa.unify_schemas(schemas) if target is None else target_arrow_schema(target, schemas)
        return cls(schema, any(f.int96 for f in footers), any(f.may_retract for f in footers), target)

    def read_as(self, table: pa.Table) -> pa.Table:
        """A part's table (its own columns) with the run's columns."""
        return table if self.target is None else project_part(table, self.target)


def _footer(blob: BlobStore, kind: str, row: BatchRow) -> _Footer:
    with blob.open(row.path) as f:
        pf = pq.ParquetFile(f)
        own, _ = own_columns(kind, pf.schema_arrow.names)  # no rename: keep the on-file names
        md = pf.metadata
        check_rows(md, row.shard, row.path, row.rows)  # a damaged part is never merged into a new one
        return _Footer(pa.schema([pf.schema_arrow.field(n) for n in own]), uses_int96(pf), may_retract(md),
                       sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)))


def _read_run(blob: BlobStore, shard: str, run: Sequence[BatchRow], files: _RunFiles) -> pa.Table:
    """The run's updates with the shard's own columns, named as in the files, all in memory."""
    schema = files.schema
    tables = []
    for row in run:
        with blob.open(row.path) as f:
            pf = pq.ParquetFile(f)
            if files.target is None:
                tables.append(pf.read(columns=[n for n in schema.names if n in pf.schema_arrow.names]))
            else:
                own, _ = own_columns(DATA_KIND, pf.schema_arrow.names)
                tables.append(files.read_as(pf.read(columns=own)).cast(schema))
    return pa.concat_tables(tables, promote_options="default").select(schema.names).cast(schema)


def _stream_advanced(blob: BlobStore, run: Sequence[BatchRow], files: _RunFiles, to: int) -> tuple[bytes, int]:
    """An append-only run merged without holding it: each part is read a batch at a time, its updates
    advanced to ``to`` and written on into one Parquet file; the file's bytes and its row count. Memory
    stays at about one batch and the (compressed) output, whatever the run's size."""
    buf, rows = io.BytesIO(), 0
    with pq.ParquetWriter(buf, files.schema, use_deprecated_int96_timestamps=files.int96) as writer:
        for row in run:
            with blob.open(row.path) as f:
                pf = pq.ParquetFile(f)
                names = files.schema.names if files.target is None else own_columns(DATA_KIND, pf.schema_arrow.names)[0]
                for batch in pf.iter_batches(batch_size=STREAM_BATCH_ROWS, columns=names):
                    if files.target is not None:
                        batch = files.read_as(pa.Table.from_batches([batch])).combine_chunks().to_batches()[0] \
                            if batch.num_rows else batch
                    batch = conform(batch, files.schema)
                    writer.write_table(advance(pa.Table.from_batches([batch]), to))
                    rows += batch.num_rows
    return buf.getvalue(), rows


def _merge_run(blob: BlobStore, shard: str, run: Sequence[BatchRow], files: _RunFiles) -> tuple[Merge, int, int]:
    """Merge one run into at most one part (written, not yet swapped in); with its rows before and after."""
    desc = merged_description(run)
    to = desc.upper - 1  # every update of the run is there now (<= since)
    what = f"shard {shard}: a merged part (nothing was merged)"
    if files.retractions:  # consolidation groups the whole run: in memory (its decoded size is capped)
        table = _read_run(blob, shard, run, files)
        before = table.num_rows
        merged = consolidate(table, advance_to=to) if has_retractions(table) else advance(table, to)
        del table
        data, after = (parquet_bytes(merged, files.int96, what), merged.num_rows) if merged.num_rows else (b"", 0)
    else:  # append-only (the common case): nothing cancels, so stream
        data, after = _stream_advanced(blob, run, files, to)
        before = after
        check_reads_back(data, files.schema, what)
    parts: tuple[Part, ...] = ()
    if after:
        path = new_part_path(shard, desc)
        blob.put_bytes(path, data)
        parts = (Part(path, after, len(data), to, to),)
    return Merge(tuple(run), desc, parts), before, after


def compact_parts(conn, blob: BlobStore, shard: str, *, target_bytes: int = DEFAULT_TARGET_BYTES,
                  small_bytes: int = DEFAULT_SMALL_BYTES, min_parts: int = DEFAULT_MIN_PARTS,
                  decoded_limit: int = DEFAULT_DECODED_LIMIT,
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
    give what they gave before. An append-only run is streamed; a run with retractions is first cut to the
    parts whose decoded size stays under ``decoded_limit`` (fewer than two left: it waits).

    ``before_swap``, when given, runs after the merged parts are written and before the swap (tests use it
    to race a rebuild); the fail point ``compact:before_swap`` sits at the same place. While a rebuild of
    the shard's source holds its rebuild lock, nothing is merged (``nothing_to_do``).
    """
    t0 = time.monotonic()
    info = shard_info(conn, shard)
    with compacting(conn, info.source) as free:
        if not free:  # a rebuild of the source is writing: its window's rows stay as it read them
            n = len(batches(conn, shard))
            return CompactReport(shard, NOTHING_TO_DO, info.since, n, n, 0, 0, 0, 0, 0, 0,
                                 round(time.monotonic() - t0, 3))
        return _compact(conn, blob, shard, info, t0, target_bytes, small_bytes, min_parts, decoded_limit, before_swap)


def _compact(conn, blob: BlobStore, shard: str, info, t0: float, target_bytes: int, small_bytes: int, min_parts: int,
             decoded_limit: int, before_swap: Callable[[], None] | None) -> CompactReport:
    since = info.since
    rows = batches(conn, shard)
    history = load_history(conn, shard)
    runs = plan_compaction(rows, since, target_bytes=target_bytes, min_parts=min_parts, small_bytes=small_bytes)
    merges: list[Merge] = []
    rows_before = rows_after = 0
    for run in runs:  # one run at a time
        footers = [_footer(blob, info.kind, r) for r in run]
        if any(f.may_retract for f in footers):  # consolidated in memory: keep its decoded size under the limit
            n = _within([f.decoded_bytes for f in footers], decoded_limit)
            if n < 2:
                continue
            run, footers = run[:n], footers[:n]
        target = history.read_as(merged_description(run).upper - 1)
        merge, before, after = _merge_run(blob, shard, run, _RunFiles.of(footers, target))
        merges.append(merge)
        rows_before, rows_after = rows_before + before, rows_after + after
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
