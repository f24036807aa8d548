"""Batch descriptions and parts: what one write covers, and what ``compare_and_append`` adds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from reclock.remap import RemapCollection, source_upper_at
from reclock.time import check_timestamp


@dataclass(frozen=True)
class BatchDescription:
    """``(lower, upper)`` minted for a shard: the write covers updates at ``lower <= ts < upper``, and
    ``compare_and_append`` expects the shard's upper to be ``lower`` and moves it to ``upper``."""

    lower: int
    upper: int

    def __post_init__(self) -> None:
        check_timestamp(self.lower)
        check_timestamp(self.upper)
        if not self.lower < self.upper:
            raise ValueError(f"batch description needs lower < upper, got [{self.lower}, {self.upper})")


@dataclass(frozen=True)
class Part:
    """One immutable Parquet file of ``(data..., ts, diff)`` updates in the blob store."""

    path: str
    rows: int
    bytes: int
    min_ts: int | None = None
    max_ts: int | None = None


@dataclass(frozen=True)
class SliceWritten:
    """What one ``write_batches`` Spark job reports it did: how many upstream records it read from the
    slice's offset ranges and how many rows it wrote per output (``reclock.part_layout``), under ``url``.
    The parts collected for the slice must hold exactly these rows (``reclock.persist.staged``): what
    Spark read is what the shards get, or the step fails."""

    index: int  # the slice's number within its description
    url: str  # where Spark wrote (as Spark names it: a local path, ``s3a://...``)
    offsets: int  # how many offsets the slice's ranges span (records can be fewer: transaction markers)
    records_read: int
    rows: dict[int, int]  # output -> rows written


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one upstream partition (half-open, never empty)."""

    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.partition < 0:
            raise ValueError(f"offset range needs a non-negative partition, got {self.partition}")
        if not 0 <= self.start < self.end:
            raise ValueError(f"offset range of partition {self.partition} needs 0 <= start < end, "
                             f"got [{self.start}, {self.end})")

    @property
    def count(self) -> int:
        """How many offsets the range holds (an upper bound on its records)."""
        return self.end - self.start


def check_servable(rc: RemapCollection, shard_upper: int) -> None:
    """Raise ``ValueError`` unless ``rc`` still knows what a shard at ``shard_upper`` already holds.

    The shard holds the data bound at ``ts < shard_upper``, i.e. up to ``source_upper_at(rc,
    shard_upper)``, which compaction keeps exact only for ``shard_upper > since`` (see
    :func:`reclock.remap.compact`). So a shard below ``since`` cannot be served; neither can one exactly
    at ``since > 0`` when a binding sits at ``since`` (it may hold data compaction advanced from below
    ``since``, which the shard already has). A shard at 0 with ``since`` 0 is the normal start.
    """
    if shard_upper < rc.since:
        raise ValueError(f"source {rc.source}: the shard's upper {shard_upper} is below the remap since "
                         f"{rc.since}; the bindings it needs were compacted (rebuild the shard)")
    if shard_upper == rc.since > 0 and any(b.ts == rc.since for b in rc.bindings):
        raise ValueError(f"source {rc.source}: the shard's upper {shard_upper} equals the remap since "
                         f"{rc.since}; the binding at {rc.since} may hold compacted data the shard already "
                         "has (compaction must stay below every shard's upper; rebuild the shard)")


def mint_descriptions(shard_upper: int, rc: RemapCollection, max_records: int) -> list[BatchDescription]:
    """The descriptions that bring a shard from ``shard_upper`` to ``last binding ts + 1``.

    Laws: *contiguous* -- the first ``lower`` is ``shard_upper``, each ``upper`` is the next ``lower``,
    the last ``upper`` is the newest binding's ``ts + 1``; every description holds at least one binding;
    *budget* -- consecutive bindings are grouped so that a description covers at most ``max_records``
    offsets (``record_count_since`` between frontiers) unless one binding alone exceeds it, and then that
    binding is its own description; *exact cover* -- together their :func:`ranges_for` are exactly the
    offsets between ``source_upper_at(rc, shard_upper)`` and the newest frontier; *compaction-invariant*
    -- compacting ``rc`` to any ``since < shard_upper`` never changes the answer.

    Empty if the shard is caught up (no binding at ``ts >= shard_upper``, e.g. ``shard_upper >=
    rc.upper``). ``ValueError`` if the shard cannot be served (:func:`check_servable`) or
    ``max_records`` is not positive.
    """
    if max_records <= 0:
        raise ValueError(f"max_records must be positive, got {max_records}")
    pending = [b for b in rc.bindings if b.ts >= shard_upper]
    if not pending:
        return []
    check_servable(rc, shard_upper)
    descs: list[BatchDescription] = []
    lower = shard_upper
    prev = source_upper_at(rc, shard_upper)
    count, grouped = 0, 0
    for i, b in enumerate(pending):
        n = b.frontier.record_count_since(prev)
        if grouped and count + n > max_records:
            descs.append(BatchDescription(lower, pending[i - 1].ts + 1))
            lower, count, grouped = pending[i - 1].ts + 1, 0, 0
        count += n
        grouped += 1
        prev = b.frontier
    descs.append(BatchDescription(lower, pending[-1].ts + 1))
    return descs


def ranges_for(rc: RemapCollection, desc: BatchDescription) -> list[OffsetRange]:
    """The upstream ranges the bindings in ``[desc.lower, desc.upper)`` cover: from
    ``source_upper_at(rc, desc.lower)`` to ``source_upper_at(rc, desc.upper)``, per partition in partition
    order, non-empty only.

    Law: every record in the ranges reclocks into ``[desc.lower, desc.upper)`` and every record that does
    is in them. Exact only while ``desc.lower`` is servable (:func:`check_servable`).
    """
    start = source_upper_at(rc, desc.lower)
    end = source_upper_at(rc, desc.upper)
    before = start.as_dict()
    return [OffsetRange(p, before.get(p, 0), o) for p, o in end if o > before.get(p, 0)]


T = TypeVar("T")


def pack(items: Sequence[T], weight: Callable[[T], int], max_weight: int,
         max_items: int | None = None) -> list[list[T]]:
    """``items`` grouped, in order, into runs (a reader's slices: a Spark job each) of at most ``max_weight``
    (records, bytes) and ``max_items`` items; an item heavier than ``max_weight`` is a run alone. Laws: every
    item in exactly one run, in order; no run empty."""
    out: list[list[T]] = []
    current: list[T] = []
    total = 0
    for item in items:
        w = weight(item)
        if current and (total + w > max_weight or (max_items is not None and len(current) >= max_items)):
            out.append(current)
            current, total = [], 0
        current.append(item)
        total += w
    if current:
        out.append(current)
    return out


def split_ranges(ranges: Sequence[OffsetRange], max_records: int) -> list[list[OffsetRange]]:
    """Split a description's ranges into slices of at most ``max_records`` offsets each.

    Laws: the slices cover exactly the offsets of ``ranges`` (a partition's range is split where needed);
    no slice is empty; each holds at most ``max_records`` offsets and all but the last exactly that many,
    so there are ``ceil(total / max_records)`` slices; deterministic -- ranges are taken in
    ``(partition, start)`` order, so the same ranges in any order give the same slices.
    """
    if max_records <= 0:
        raise ValueError(f"max_records must be positive, got {max_records}")
    slices: list[list[OffsetRange]] = []
    current: list[OffsetRange] = []
    room = max_records
    for r in sorted(ranges, key=lambda r: (r.partition, r.start, r.end)):
        start = r.start
        while start < r.end:
            take = min(room, r.end - start)
            current.append(OffsetRange(r.partition, start, start + take))
            start += take
            room -= take
            if room == 0:
                slices.append(current)
                current, room = [], max_records
    if current:
        slices.append(current)
    return slices
