"""Batch descriptions and parts: what one write covers, and what ``compare_and_append`` adds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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
class OffsetRange:
    """Offsets ``[start, end)`` of one upstream partition."""

    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"offset range of partition {self.partition} needs 0 <= start < end, "
                             f"got [{self.start}, {self.end})")

    @property
    def count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Budget:
    """How much one write slice may hold: records, and optionally bytes (estimated per record)."""

    max_records: int
    max_bytes: int | None = None
    avg_record_bytes: int = 200

    def __post_init__(self) -> None:
        if self.max_records <= 0:
            raise ValueError(f"budget max_records must be positive, got {self.max_records}")
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"budget max_bytes must be positive, got {self.max_bytes}")
        if self.avg_record_bytes <= 0:
            raise ValueError(f"budget avg_record_bytes must be positive, got {self.avg_record_bytes}")

    def records_per_slice(self) -> int:
        if self.max_bytes is None:
            return self.max_records
        return max(1, min(self.max_records, self.max_bytes // self.avg_record_bytes))


def mint_descriptions(shard_upper: int, rc: RemapCollection, max_records: int) -> list[BatchDescription]:
    """The descriptions that bring a shard from ``shard_upper`` to ``last binding ts + 1``.

    Contiguous (first ``lower`` is ``shard_upper``, each ``upper`` the next ``lower``), grouping
    consecutive bindings so that a description covers at most ``max_records`` offsets unless one binding
    alone exceeds it. Empty if the shard is caught up. A shard behind the remap collection's ``since``
    cannot be served: the bindings it needs were compacted away.
    """
    if max_records <= 0:
        raise ValueError(f"max_records must be positive, got {max_records}")
    pending = [b for b in rc.bindings if b.ts >= shard_upper]
    if not pending:
        return []
    if shard_upper < rc.since:
        raise ValueError(f"source {rc.source}: the shard's upper {shard_upper} is below the remap since "
                         f"{rc.since}; the bindings it needs were compacted (rebuild the shard)")
    descs: list[BatchDescription] = []
    lower = shard_upper
    prev = source_upper_at(rc, shard_upper)
    count = 0
    for i, b in enumerate(pending):
        n = b.frontier.record_count_since(prev)
        if count and count + n > max_records:
            descs.append(BatchDescription(lower, pending[i - 1].ts + 1))
            lower, count = pending[i - 1].ts + 1, 0
        count += n
        prev = b.frontier
    descs.append(BatchDescription(lower, pending[-1].ts + 1))
    return descs


def ranges_for(rc: RemapCollection, desc: BatchDescription) -> list[OffsetRange]:
    """The upstream ranges the bindings in ``[desc.lower, desc.upper)`` cover, per partition, non-empty."""
    start = source_upper_at(rc, desc.lower)
    end = source_upper_at(rc, desc.upper)
    before = start.as_dict()
    return [OffsetRange(p, before.get(p, 0), o) for p, o in end if o > before.get(p, 0)]


def split_ranges(ranges: Sequence[OffsetRange], max_records: int) -> list[list[OffsetRange]]:
    """Split ranges into slices of at most ``max_records`` offsets each, covering exactly the same offsets,
    deterministically (partition order, then offset order), with no empty slice."""
    if max_records <= 0:
        raise ValueError(f"max_records must be positive, got {max_records}")
    slices: list[list[OffsetRange]] = []
    current: list[OffsetRange] = []
    room = max_records
    for r in sorted(ranges, key=lambda r: (r.partition, r.start)):
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
