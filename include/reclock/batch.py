"""Batch descriptions and parts: what one write covers, and what ``compare_and_append`` adds."""

from __future__ import annotations

from dataclasses import dataclass

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
