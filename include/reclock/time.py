"""Timestamps and frontiers: the two clocks of a source.

Reclock speaks of two kinds of time (DESIGN.md, "Vocabulary"):

* **IntoTime** -- our timestamp: milliseconds since the Unix epoch, a non-negative 64-bit integer.
  It is totally ordered, so a frontier over it is a single value, the *upper*: the least time not yet
  complete. :class:`TotalFrontier` models it; the empty frontier (``TotalFrontier.empty()``) means
  "complete forever" (nothing more will ever arrive).

* **FromTime** -- the source's own progress gauge. For Kafka it is ``(partition, offset)`` and a
  frontier is a map *partition -> next offset to read*; a partition that is absent is at offset 0.
  :class:`PartitionedFrontier` models it. Partitions are independent: the frontier is the product
  order of one total order per partition, so ``less_equal`` is pointwise, ``meet`` is the pointwise
  minimum and ``join`` the pointwise maximum.

Both are frozen value objects; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

MAX_TIMESTAMP = 2**63 - 1

Timestamp = int
"""Milliseconds since the Unix epoch, ``0 <= t <= MAX_TIMESTAMP``."""


def check_timestamp(t: int) -> int:
    """Return ``t`` if it is a valid timestamp, else raise ``ValueError`` naming it."""
    if isinstance(t, bool) or not isinstance(t, int):
        raise TypeError(f"timestamp must be an int, got {type(t).__name__}: {t!r}")
    if not 0 <= t <= MAX_TIMESTAMP:
        raise ValueError(f"timestamp {t} is outside [0, 2**63-1]")
    return t


@dataclass(frozen=True, order=False)
class TotalFrontier:
    """A frontier over a totally ordered time: ``upper`` is the least incomplete time.

    ``upper is None`` is the empty frontier: every time is complete.
    """

    upper: int | None

    def __post_init__(self) -> None:
        if self.upper is not None:
            check_timestamp(self.upper)

    @staticmethod
    def minimum() -> "TotalFrontier":
        """The frontier at time 0: nothing is complete yet."""
        return TotalFrontier(0)

    @staticmethod
    def empty() -> "TotalFrontier":
        return TotalFrontier(None)

    def is_empty(self) -> bool:
        return self.upper is None

    def less_than(self, t: int) -> bool:
        """True if ``t`` is not yet complete, i.e. ``upper <= t``.

        (Materialize's ``frontier.less_equal(&t)``: some element of the frontier is <= t.)
        """
        return self.upper is not None and self.upper <= t

    def is_complete(self, t: int) -> bool:
        """True if every update at time ``t`` is in, i.e. ``t < upper``."""
        return not self.less_than(t)

    def less_equal(self, other: "TotalFrontier") -> bool:
        """Frontier order: ``self`` is not ahead of ``other``."""
        if other.upper is None:
            return True
        if self.upper is None:
            return False
        return self.upper <= other.upper

    def meet(self, other: "TotalFrontier") -> "TotalFrontier":
        """The lesser of the two frontiers (the resumption frontier is the meet of uppers)."""
        return self if self.less_equal(other) else other

    def join(self, other: "TotalFrontier") -> "TotalFrontier":
        return other if self.less_equal(other) else self

    def __str__(self) -> str:
        return "[]" if self.upper is None else f"[{self.upper}]"


@dataclass(frozen=True)
class PartitionedFrontier:
    """A Kafka-style frontier: partition -> next offset; an absent partition is at offset 0.

    Stored canonically as a sorted tuple of ``(partition, offset)`` with every offset > 0, so two
    frontiers are equal exactly when they map every partition to the same offset.
    """

    items: tuple[tuple[int, int], ...] = field(default=())

    def __post_init__(self) -> None:
        canon: dict[int, int] = {}
        for p, o in self.items:
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise ValueError(f"partition must be a non-negative int, got {p!r}")
            if isinstance(o, bool) or not isinstance(o, int) or o < 0:
                raise ValueError(f"offset for partition {p} must be a non-negative int, got {o!r}")
            if p in canon:
                raise ValueError(f"partition {p} appears twice in a frontier")
            canon[p] = o
        object.__setattr__(self, "items", tuple(sorted((p, o) for p, o in canon.items() if o > 0)))

    @staticmethod
    def of(offsets: Mapping[int, int] | Iterable[tuple[int, int]] = ()) -> "PartitionedFrontier":
        pairs = offsets.items() if isinstance(offsets, Mapping) else offsets
        return PartitionedFrontier(tuple((int(p), int(o)) for p, o in pairs))

    def get(self, partition: int) -> int:
        """The next offset to read in ``partition`` (0 if the partition is absent)."""
        for p, o in self.items:
            if p == partition:
                return o
        return 0

    def as_dict(self) -> dict[int, int]:
        return dict(self.items)

    def partitions(self) -> tuple[int, ...]:
        return tuple(p for p, _ in self.items)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def is_minimum(self) -> bool:
        """True if no partition has progressed past offset 0."""
        return not self.items

    def covers(self, partition: int, offset: int) -> bool:
        """True if the record at ``(partition, offset)`` is before this frontier (already passed)."""
        return offset < self.get(partition)

    def less_equal(self, other: "PartitionedFrontier") -> bool:
        """Pointwise ``<=`` over every partition (absent partitions at 0)."""
        theirs = other.as_dict()
        return all(o <= theirs.get(p, 0) for p, o in self.items)

    def less_than(self, other: "PartitionedFrontier") -> bool:
        """``less_equal`` and not equal: ``other`` moved at least one partition forward."""
        return self != other and self.less_equal(other)

    def meet(self, other: "PartitionedFrontier") -> "PartitionedFrontier":
        """Pointwise minimum (a partition absent on either side is at 0, so it drops out)."""
        theirs = other.as_dict()
        return PartitionedFrontier.of((p, min(o, theirs[p])) for p, o in self.items if p in theirs)

    def join(self, other: "PartitionedFrontier") -> "PartitionedFrontier":
        """Pointwise maximum over the union of partitions."""
        merged = self.as_dict()
        for p, o in other.items:
            merged[p] = max(merged.get(p, 0), o)
        return PartitionedFrontier.of(merged)

    def record_count_since(self, earlier: "PartitionedFrontier") -> int:
        """Offsets between ``earlier`` and ``self`` summed over partitions (an upper bound on records:
        compaction and transaction markers leave gaps)."""
        before = earlier.as_dict()
        return sum(max(0, o - before.get(p, 0)) for p, o in self.items)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{p}: {o}" for p, o in self.items) + "}"
