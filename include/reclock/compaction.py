"""Compaction of a shard's parts, the pure half: which parts to merge, and what a merged part holds.

Every cycle appends parts to a shard; compaction keeps their number bounded (DESIGN.md, "bounded state").
Parts whose updates all lie at or below the shard's ``since`` are merged: their times are advanced, their
updates consolidated (summed by row and time, zeros dropped). Nobody can tell: a read AS OF any
``t >= since`` takes every one of those updates whatever time at or below ``since`` it carries, and a read
of the updates above ``since`` never sees them. The I/O half (reading and writing parts, swapping the batch
rows in Postgres) is :mod:`reclock.persist.compact`.

Consolidation groups bit for bit (:mod:`reclock.bitexact`): nulls are one key (``null == null``), floats
are compared by their bits (every NaN bit pattern is its own key, ``-0.0`` is not ``0.0``), nested values
(structs, lists, maps) by their encoding, every float in them by its bits. That is an equivalence, so
consolidating in two steps (compaction, then a read) sums exactly what one step would, and every row that
comes out holds the bits of the updates it sums.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reclock.batch import BatchDescription
from reclock.bitexact import group_keys

__all__ = ["compaction_candidates", "plan_compaction", "merged_description", "advance", "has_retractions",
           "consolidate", "contents_as_of", "sum_by_row"]


class PartRow(Protocol):
    """What planning needs of a batch row (``reclock.persist.shards.BatchRow`` is one)."""

    @property
    def lower(self) -> int: ...

    @property
    def upper(self) -> int: ...

    @property
    def path(self) -> str: ...

    @property
    def bytes(self) -> int: ...


R = TypeVar("R", bound=PartRow)


def compaction_candidates(rows: Iterable[R], since: int, target_bytes: int) -> list[R]:
    """The rows whose updates all lie at ``ts <= since`` (description ``upper <= since + 1``) and whose part
    is small (``bytes < target_bytes``), in ``(lower, path)`` order."""
    return sorted((r for r in rows if r.upper <= since + 1 and r.bytes < target_bytes),
                  key=lambda r: (r.lower, r.path.encode()))


def plan_compaction(rows: Iterable[R], since: int, *, target_bytes: int, min_parts: int,
                    small_bytes: int | None = None) -> list[tuple[R, ...]]:
    """The runs of parts to merge, each into one part: nothing unless there are at least ``min_parts``
    candidates (:func:`compaction_candidates`, parts smaller than ``small_bytes``, default ``target_bytes``);
    then the candidates, in order, packed greedily into runs of at most ``target_bytes`` together. A run of
    one part is left out (merging it alone saves no row).

    So a merge reads at most ``target_bytes`` of parts at once, and after it fewer than ``min_parts``
    candidates remain unless they are too big to pack in pairs.
    """
    if target_bytes <= 0:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    if min_parts < 2:
        raise ValueError(f"min_parts must be at least 2 (merging fewer saves nothing), got {min_parts}")
    if small_bytes is not None and small_bytes <= 0:
        raise ValueError(f"small_bytes must be positive, got {small_bytes}")
    candidates = compaction_candidates(rows, since, min(target_bytes, small_bytes or target_bytes))
    if len(candidates) < min_parts:
        return []
    runs: list[list[R]] = [[]]
    size = 0
    for r in candidates:
        if runs[-1] and size + r.bytes > target_bytes:
            runs.append([])
            size = 0
        runs[-1].append(r)
        size += r.bytes
    return [tuple(run) for run in runs if len(run) > 1]


def merged_description(run: Sequence[PartRow]) -> BatchDescription:
    """The description a run's merged part is appended under: ``[min lower, max upper)``. Its updates are
    advanced to ``upper - 1`` (at or below ``since``), the last time inside it."""
    if not run:
        raise ValueError("a run to merge needs at least one part")
    return BatchDescription(min(r.lower for r in run), max(r.upper for r in run))


def advance(updates: pa.Table, to: int) -> pa.Table:
    """``updates`` with every ``ts < to`` advanced to ``to``; nothing else changes."""
    i = updates.schema.get_field_index("ts")
    return updates.set_column(i, updates.schema.field(i), pc.max_element_wise(
        updates.column(i), pa.scalar(to, updates.schema.field(i).type)))


def sorted_by_ts(updates: pa.Table) -> pa.Table:
    """``updates`` sorted by ``ts`` (stable: rows keep their order within a ts); the same table, not a copy,
    when they already are (as parts written in offset order mostly are)."""
    if updates.num_rows > 1:
        ts = updates["ts"].to_numpy()
        if not (ts[1:] >= ts[:-1]).all():
            return updates.sort_by([("ts", "ascending")])
    return updates


def has_retractions(updates: pa.Table) -> bool:
    """Whether any update has ``diff <= 0`` (only then can consolidation cancel anything)."""
    return updates.num_rows > 0 and pc.min(updates["diff"]).as_py() <= 0


def consolidate(updates: pa.Table, advance_to: int | None = None) -> pa.Table:
    """``updates`` (data columns, ``ts``, ``diff``) with every ``ts < advance_to`` advanced to ``advance_to``,
    then summed by ``(data..., ts)`` bit for bit with the rows whose ``diff`` sums to 0 dropped. Same
    columns, same order, same types and metadata; the row order is unspecified.
    """
    schema = updates.schema
    if advance_to is not None:
        updates = advance(updates, advance_to)
    if updates.num_rows == 0:
        return updates
    summed = sum_by_row(updates, [n for n in schema.names if n != "diff"]).select(schema.names)
    summed = summed.filter(pc.not_equal(summed["diff"], 0))
    return summed.cast(schema)


def sum_by_row(updates: pa.Table, keys: list[str]) -> pa.Table:
    """``updates``' ``diff`` summed over the rows whose columns ``keys`` hold the same bits (nulls equal):
    one row per distinct ``keys``, the columns ``keys`` and ``diff``, each value the bits of the rows it
    sums. Columns pyarrow groups by their bits are grouped as they are; nested ones by their encoding
    (:func:`reclock.bitexact.group_keys`), their values taken from the first row of each group."""
    keyed, by = group_keys(updates.select([*keys, "diff"]), keys)
    if by == keys:
        summed = keyed.group_by(keys, use_threads=False).aggregate([("diff", "sum")])
        return pa.table({**{k: summed[k] for k in keys}, "diff": summed["diff_sum"]})
    keyed = keyed.append_column("_reclock_row", pa.array(np.arange(keyed.num_rows, dtype=np.int64)))
    summed = keyed.group_by(by, use_threads=False).aggregate([("diff", "sum"), ("_reclock_row", "min")])
    rows = summed["_reclock_row_min"]
    return pa.table({**{k: summed[k] if k == b else updates[k].take(rows) for k, b in zip(keys, by)},
                     "diff": summed["diff_sum"]})


def contents_as_of(updates: pa.Table | None, t: int) -> pa.Table:
    """A collection's contents AS OF ``t`` given its updates (every part a read AS OF ``t`` needs): the
    updates at ``ts <= t`` summed by row, zero rows dropped; data columns plus ``diff`` (with no update at or
    before ``t``, an empty table of those columns)."""
    if updates is None:
        return pa.table({"diff": pa.array([], pa.int64())})
    updates = updates.filter(pc.less_equal(updates["ts"], t))
    keys = [c for c in updates.column_names if c not in ("ts", "diff")]
    if updates.num_rows == 0:
        return updates.select([*keys, "diff"])
    if not keys:
        return pa.table({"diff": [pc.sum(updates["diff"]).as_py() or 0]})
    grouped = sum_by_row(updates, keys)
    return grouped.filter(pc.not_equal(grouped["diff"], 0))
