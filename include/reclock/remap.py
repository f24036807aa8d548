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
    """Raise ``ValueError`` unless ``rc`` is well formed.

    Law: ``since <= upper``; bindings strictly increasing in ``ts``; each binding's frontier
    ``less_equal`` the next (the collection only moves forward, *definite*); every ``ts`` in
    ``[since, upper)``. Every function below keeps a valid collection valid.
    """
    if rc.since > rc.upper:
        raise ValueError(f"source {rc.source}: since {rc.since} is beyond upper {rc.upper}")
    prev: Binding | None = None
    for b in rc.bindings:
        if not rc.since <= b.ts < rc.upper:
            raise ValueError(f"source {rc.source}: binding at {b.ts} is outside [since {rc.since}, upper {rc.upper})")
        if prev is not None:
            if b.ts <= prev.ts:
                raise ValueError(f"source {rc.source}: binding at {b.ts} does not follow {prev.ts} "
                                 "(timestamps must strictly increase)")
            if not prev.frontier.less_equal(b.frontier):
                raise ValueError(f"source {rc.source}: frontier {b.frontier} at {b.ts} goes backwards from "
                                 f"{prev.frontier} at {prev.ts}")
        prev = b


def last_frontier(rc: RemapCollection) -> PartitionedFrontier:
    """The frontier of the newest binding (the minimum frontier if there is none)."""
    return rc.bindings[-1].frontier if rc.bindings else PartitionedFrontier()


def next_binding_ts(rc: RemapCollection, now_ms: int) -> int:
    """``max(now_ms, last binding ts + 1, upper)``.

    Law: the result is ``>= now_ms`` and ``>= rc.upper`` and beyond every binding: never backwards,
    never at a time already closed.
    """
    t = max(now_ms, rc.upper)
    if rc.bindings:
        t = max(t, rc.bindings[-1].ts + 1)
    return t


def mint(rc: RemapCollection, now_ms: int, source_upper: PartitionedFrontier) -> Binding | None:
    """The binding to append after probing ``source_upper``, or None if upstream did not move.

    The new binding sits at :func:`next_binding_ts` with frontier ``join(last frontier, source_upper)``.
    Laws: *monotone* -- the frontier never goes backwards, even if the probe did on some partition (a
    stale replica, a truncated partition): the join keeps the old offset; a binding is minted only if the
    frontier moved strictly forward. *First binding*: a collection with no binding always gets one,
    whatever upstream holds (possibly nothing), so a new source's initial snapshot lands at one timestamp.
    """
    frontier = last_frontier(rc).join(source_upper)
    if rc.bindings and frontier == last_frontier(rc):
        return None
    return Binding(next_binding_ts(rc, now_ms), frontier)


def append(rc: RemapCollection, binding: Binding) -> RemapCollection:
    """``rc`` with ``binding`` added and ``upper = binding.ts + 1``.

    Law (*definite*): earlier bindings, ``since`` and ``source`` are unchanged. Raises ``ValueError`` for
    a binding below the remap upper (a closed time) or one whose frontier goes backwards.
    """
    if binding.ts < rc.upper:
        raise ValueError(f"source {rc.source}: binding at {binding.ts} is below the remap upper {rc.upper} "
                         "(that time is closed; mint at next_binding_ts)")
    if not last_frontier(rc).less_equal(binding.frontier):
        raise ValueError(f"source {rc.source}: binding at {binding.ts} moves the frontier backwards, from "
                         f"{last_frontier(rc)} to {binding.frontier}")
    return RemapCollection(rc.source, rc.bindings + (binding,), rc.since, binding.ts + 1)


def advance_upper(rc: RemapCollection, upper: int) -> RemapCollection:
    """``rc`` with its upper moved forward to ``upper`` without a binding: a probe found upstream where the
    newest binding has it, so nothing is bound at ``[rc.upper, upper)`` and those times are complete (an idle
    source's upper follows the clock, so its age is its freshness).

    Laws: bindings and ``since`` unchanged, so :func:`reclock` and :func:`source_upper_at` give what they gave
    (for every ``t``); never backwards (``upper <= rc.upper`` returns ``rc``); the next binding is at or
    after ``upper`` (:func:`next_binding_ts`).
    """
    check_timestamp(upper)
    if upper <= rc.upper:
        return rc
    return RemapCollection(rc.source, rc.bindings, rc.since, upper)


def _check_record(partition: int, offset: int) -> None:
    if partition < 0 or offset < 0:
        raise ValueError(f"a record needs a non-negative partition and offset, got ({partition}, {offset})")


def reclock(rc: RemapCollection, partition: int, offset: int) -> int | None:
    """The least binding ``ts`` whose frontier covers ``(partition, offset)`` (``offset <
    frontier.get(partition)``); None if no binding covers it yet.

    Laws: *local* -- the answer depends only on the bindings' offsets for ``partition``; *definite* --
    once not None, appending bindings never changes it; it agrees with :func:`reclock_ranges`; after
    ``compact(rc, s)`` it is ``max(original answer, s)``.
    """
    _check_record(partition, offset)
    for b in rc.bindings:
        if b.frontier.covers(partition, offset):
            return b.ts
    return None


def reclock_ranges(rc: RemapCollection, partition: int) -> list[tuple[int, int, int]]:
    """For ``partition``, the ``(from_offset, until_offset, ts)`` half-open ranges each binding adds, in
    order, non-empty only: the table the vectorised range join on Spark uses.

    Law: the ranges are contiguous from offset 0, and ``reclock(rc, partition, o) == ts`` exactly when
    ``from_offset <= o < until_offset`` (None when no range holds ``o``).
    """
    _check_record(partition, 0)
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
    ``ts < t`` (the minimum frontier if none). Turns the resumption frontier into offsets.

    Law (round trip): a record bound at ``r`` has ``r < t`` iff ``source_upper_at(rc, t).covers(record)``;
    a record no binding covers yet is covered by no ``source_upper_at``. The answer is exact for
    ``t > since``; for ``t <= since`` of a compacted collection it is the minimum frontier (see
    :func:`compact`).
    """
    frontier = PartitionedFrontier()
    for b in rc.bindings:
        if b.ts >= t:
            break
        frontier = b.frontier
    return frontier


def compact(rc: RemapCollection, since: int) -> RemapCollection:
    """Advance ``since``: the bindings at ``ts <= since`` collapse into one binding at ``since`` carrying
    the last of their frontiers; later bindings, ``upper`` and ``source`` are unchanged.

    ``since`` never goes backwards (a ``since`` at or below the current one returns ``rc`` itself). It may
    not pass ``upper``; and once anything is bound it must stay *below* ``upper``, so the collapsed
    binding is still a valid binding and the last complete time stays readable (``ValueError``
    otherwise). Compacting an empty collection to its upper is allowed.

    Laws, with ``c = compact(rc, since)``:

    * ``source_upper_at(c, t) == source_upper_at(rc, t)`` for every ``t > since`` (a read "as of
      ``t - 1``", at or after ``since``, is exact);
    * ``source_upper_at(c, t)`` is the minimum frontier for every ``t <= since``: every time below
      ``since`` has been advanced to ``since``, so nothing is known to be bound strictly before it. At
      ``t == since`` this equals the original answer only if no binding below ``since`` held data;
      that is why a shard (or a resumption) must be served from a time ``> since``;
    * ``reclock(c, p, o) == max(reclock(rc, p, o), since)`` whenever the original is not None (and None
      stays None);
    * *bounded state*: ``len(c.bindings) <= #(bindings of rc at ts > since) + 1``.
    """
    if since > rc.upper:
        raise ValueError(f"source {rc.source}: cannot compact to {since}: it is beyond the remap upper "
                         f"{rc.upper}")
    if since == rc.upper and rc.bindings:
        raise ValueError(f"source {rc.source}: cannot compact to {since}: it must stay below the remap "
                         f"upper {rc.upper} once bindings exist (compact to at most {rc.upper - 1})")
    if since <= rc.since:
        return rc
    older = [b for b in rc.bindings if b.ts <= since]
    newer = tuple(b for b in rc.bindings if b.ts > since)
    head = (Binding(since, older[-1].frontier),) if older else ()
    return RemapCollection(rc.source, head + newer, since, rc.upper)


def progress_rows(rc: RemapCollection) -> list[tuple[int, int, int]]:
    """``(ts, partition, offset)`` rows, one per partition per binding, in ``(ts, partition)`` order: the
    exposed progress relation (like Materialize's ``EXPOSE PROGRESS``).

    Law: grouping the rows by ``ts`` gives back each binding's frontier (a binding with the minimum
    frontier has no rows).
    """
    return [(b.ts, p, o) for b in rc.bindings for p, o in b.frontier]
