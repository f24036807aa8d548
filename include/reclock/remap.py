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


def validate(rc: RemapCollection) -> None:
    """Raise ``ValueError`` unless ``rc`` is well formed: bindings strictly increasing in ``ts``, frontiers
    never going backwards (*definite*), every ``ts`` in ``[since, upper)``."""
    if rc.since > rc.upper:
        raise ValueError(f"source {rc.source}: since {rc.since} is beyond upper {rc.upper}")
    prev: Binding | None = None
    for b in rc.bindings:
        if not rc.since <= b.ts < rc.upper:
            raise ValueError(f"source {rc.source}: binding at {b.ts} is outside [since {rc.since}, upper {rc.upper})")
        if prev is not None:
            if b.ts <= prev.ts:
                raise ValueError(f"source {rc.source}: binding at {b.ts} does not follow {prev.ts}")
            if not prev.frontier.less_equal(b.frontier):
                raise ValueError(f"source {rc.source}: frontier at {b.ts} goes backwards from {prev.ts}")
        prev = b


def last_frontier(rc: RemapCollection) -> PartitionedFrontier:
    """The frontier of the newest binding (the minimum frontier if there is none)."""
    return rc.bindings[-1].frontier if rc.bindings else PartitionedFrontier()


def next_binding_ts(rc: RemapCollection, now_ms: int) -> int:
    """``max(now, last binding + 1, upper)``: never backwards, never at a time already closed."""
    t = max(now_ms, rc.upper)
    if rc.bindings:
        t = max(t, rc.bindings[-1].ts + 1)
    return t


def mint(rc: RemapCollection, now_ms: int, source_upper: PartitionedFrontier) -> Binding | None:
    """The binding to append after probing ``source_upper``, or None if upstream did not move.

    A new source's first binding is minted whatever upstream holds (possibly nothing), so its initial
    snapshot lands at one timestamp. The frontier is joined with the last one, so a probe that went
    backwards on some partition (a stale replica) never moves a binding backwards.
    """
    frontier = last_frontier(rc).join(source_upper)
    if rc.bindings and frontier == last_frontier(rc):
        return None
    return Binding(next_binding_ts(rc, now_ms), frontier)


def append(rc: RemapCollection, binding: Binding) -> RemapCollection:
    """``rc`` with ``binding`` added and ``upper = binding.ts + 1``; refuses a binding in the past or
    one whose frontier goes backwards."""
    if binding.ts < rc.upper:
        raise ValueError(f"source {rc.source}: binding at {binding.ts} is below the remap upper {rc.upper}")
    if not last_frontier(rc).less_equal(binding.frontier):
        raise ValueError(f"source {rc.source}: binding at {binding.ts} moves the frontier backwards")
    return RemapCollection(rc.source, rc.bindings + (binding,), rc.since, binding.ts + 1)


def reclock(rc: RemapCollection, partition: int, offset: int) -> int | None:
    """The least binding ``ts`` whose frontier covers ``(partition, offset)``; None if none does yet.

    *Local*: the answer depends only on the bindings' offsets for ``partition``.
    """
    for b in rc.bindings:
        if b.frontier.covers(partition, offset):
            return b.ts
    return None


def reclock_ranges(rc: RemapCollection, partition: int) -> list[tuple[int, int, int]]:
    """For ``partition``, the ``(from_offset, until_offset, ts)`` half-open ranges each binding adds, in
    order, non-empty only: the table the vectorised range join on Spark uses. Agrees with ``reclock``."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for b in rc.bindings:
        end = b.frontier.get(partition)
        if end > start:
            out.append((start, end, b.ts))
            start = end
    return out


def source_upper_at(rc: RemapCollection, t: int) -> PartitionedFrontier:
    """The source frontier of all data at timestamps ``< t``: the frontier of the last binding with
    ``ts < t`` (the minimum frontier if none). Used to turn the resumption frontier into offsets.

    Law: a record bound at ``r`` has ``r < t`` iff ``source_upper_at(rc, t).covers(record)``.
    """
    frontier = PartitionedFrontier()
    for b in rc.bindings:
        if b.ts >= t:
            break
        frontier = b.frontier
    return frontier


def compact(rc: RemapCollection, since: int) -> RemapCollection:
    """Advance ``since`` (never backwards; below ``upper`` once anything is bound, so the last readable
    time stays readable): the bindings at ``ts <= since`` collapse into one binding at ``since`` carrying
    the last of their frontiers; later bindings are unchanged.

    Laws: ``source_upper_at`` is unchanged at every ``t > since`` (at ``t == since`` it may only have
    moved forward, to include what compaction advanced to ``since``); a record's reclocked time becomes
    ``max(original, since)``; at most one binding at or below ``since`` remains.
    """
    if since > rc.upper or (since == rc.upper and rc.bindings):
        raise ValueError(f"source {rc.source}: cannot compact to {since}: it must stay below the remap "
                         f"upper {rc.upper}")
    if since <= rc.since:
        return rc
    older = [b for b in rc.bindings if b.ts <= since]
    newer = tuple(b for b in rc.bindings if b.ts > since)
    head = (Binding(since, older[-1].frontier),) if older else ()
    return RemapCollection(rc.source, head + newer, since, rc.upper)


def progress_rows(rc: RemapCollection) -> list[tuple[int, int, int]]:
    """``(ts, partition, offset)`` rows: the exposed progress relation (like ``EXPOSE PROGRESS``)."""
    return [(b.ts, p, o) for b in rc.bindings for p, o in b.frontier]
