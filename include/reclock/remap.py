"""Bindings and the remap collection: reclocking FromTime to IntoTime.

A *binding* says "at timestamp ``ts`` the source frontier was ``frontier``". The remap collection is a
source's bindings in timestamp order, plus its ``since`` and ``upper``.
"""

from __future__ import annotations

from dataclasses import dataclass

from reclock.time import PartitionedFrontier, check_timestamp


@dataclass(frozen=True)
class Binding:
    """At timestamp ``ts`` the source frontier was ``frontier`` (every offset below it is bound at
    ``ts`` or earlier)."""

    ts: int
    frontier: PartitionedFrontier

    def __post_init__(self) -> None:
        check_timestamp(self.ts)


@dataclass(frozen=True)
class RemapCollection:
    """A source's bindings in strictly increasing ``ts`` order, with its ``since`` and ``upper``.

    ``upper`` is the least timestamp at which no binding exists yet (the next binding's ``ts`` must be
    ``>= upper``); ``since`` is the compaction frontier: answers at times ``>= since`` are exact.
    """

    source: str
    bindings: tuple[Binding, ...] = ()
    since: int = 0
    upper: int = 0
