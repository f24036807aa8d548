"""Shard lineage: which Kinesis shards a source may read, and how a scan of them becomes bindings.

A Kinesis stream reshards: ``SplitShard`` closes a shard and opens two children over its hash range,
``MergeShards`` closes two adjacent shards and opens one child. A closed shard keeps its records until
retention trims them; the children start empty. Records of one partition key go to the parent, then to the
child, so a reader keeps their order only if it reads a child after its parents are read to their ends
(the KCL's rule). Here, *read* means *bound*: a child's records are bound only in a binding strictly after
the one that binds its parents' ends, so per partition key the records' order is ``(ts, sequence number)``
(within one binding a key's records are all in one shard: shards that overlap in hash range are ancestors
and descendants of each other, and those never share a binding).

Positions (``reclock.sources.kinesis.sequence``): a frontier maps shard number -> position, an upper; an
absent shard is at 0. Three positions are special:

* ``0``: nothing read; a shard read from here starts at ``TRIM_HORIZON`` (a shard that was there when the
  source started, or whose parents expired before it);
* the shard's ``StartingSequenceNumber``: a child whose parents the source read to their ends, put into
  the frontier by the binding after theirs (nothing of it read yet; it is read from
  ``AT_SEQUENCE_NUMBER``);
* :data:`FINISHED` (``10**129``, beyond every sequence number): a closed shard read to its end.

Any other position is ``last + 1`` for the last record read, read on from ``AFTER_SEQUENCE_NUMBER last``.

A shard is *done* when it is :data:`FINISHED`, or when a child of it is in the frontier or done (a child
starts only after its parents are done). That lets compaction drop a finished shard from the frontier
once its children are in it (:func:`droppable`): closed shards do not pile up across reshardings.

Pure: nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Literal, Mapping, Sequence

from reclock.sources.kinesis.sequence import MAX_SEQUENCE, check_position

if TYPE_CHECKING:
    from reclock.sources.kinesis.marks import Mark

FINISHED = MAX_SEQUENCE + 1
"""The position of a closed shard read to its end (``SHARD_END`` in a KCL checkpoint)."""

IteratorType = Literal["TRIM_HORIZON", "AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"]


@dataclass(frozen=True)
class ShardInfo:
    """One shard as ``ListShards`` describes it: its number, its parents' numbers (none, one after a split,
    two after a merge), its ``StartingSequenceNumber`` and, once closed, its ``EndingSequenceNumber``."""

    number: int
    parents: tuple[int, ...] = ()
    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        if self.number < 0 or any(p < 0 for p in self.parents) or len(self.parents) > 2:
            raise ValueError(f"shard {self.number}: needs a non-negative number and at most two parents, "
                             f"got parents {self.parents}")
        if self.number in self.parents:
            raise ValueError(f"shard {self.number} cannot be its own parent")
        check_position(self.start)
        if self.end is not None and self.end < self.start:
            raise ValueError(f"shard {self.number}: EndingSequenceNumber {self.end} is below its "
                             f"StartingSequenceNumber {self.start}")

    @property
    def closed(self) -> bool:
        return self.end is not None


def iterator_for(shard: ShardInfo, position: int) -> tuple[IteratorType, int | None]:
    """The ``GetShardIterator`` request that reads ``shard`` from ``position`` on: its type and sequence
    number (see the module docstring). ``ValueError`` for :data:`FINISHED` (nothing is left to read).

    Law: reading from the answer yields exactly the records of ``shard`` whose sequence number is
    ``>= position`` (of those the stream still holds)."""
    check_position(position)
    if position >= FINISHED:
        raise ValueError(f"shard {shard.number} is read to its end; there is nothing after it")
    if position == 0:
        return "TRIM_HORIZON", None
    if position == shard.start:
        return "AT_SEQUENCE_NUMBER", position
    return "AFTER_SEQUENCE_NUMBER", position - 1


def children_of(shards: Iterable[ShardInfo]) -> dict[int, list[int]]:
    """Shard number -> the numbers of its children among ``shards``."""
    out: dict[int, list[int]] = {}
    for s in shards:
        for p in s.parents:
            out.setdefault(p, []).append(s.number)
    return out


def done_shards(shards: Sequence[ShardInfo], positions: Mapping[int, int]) -> set[int]:
    """The numbers of the listed shards that are done under ``positions``: :data:`FINISHED`, or with a
    child that is in ``positions`` (non-zero) or done itself."""
    kids = children_of(shards)
    done: set[int] = set()
    # children have higher numbers than their parents in every stream (Kinesis numbers shards in order of
    # creation), but do not rely on it: iterate to a fixed point
    changed = True
    while changed:
        changed = False
        for s in shards:
            if s.number in done:
                continue
            if positions.get(s.number, 0) >= FINISHED or any(
                    positions.get(c, 0) > 0 or c in done for c in kids.get(s.number, ())):
                done.add(s.number)
                changed = True
    return done


def readable(shards: Sequence[ShardInfo], positions: Mapping[int, int]) -> list[ShardInfo]:
    """The listed shards the source may read now, in shard order: not done, and every parent done or no
    longer listed (expired before the source read it, or the source never knew it).

    Law (the KCL rule): no readable shard has a listed parent that is not done."""
    listed = {s.number for s in shards}
    done = done_shards(shards, positions)
    return sorted((s for s in shards if s.number not in done
                   and all(p not in listed or p in done for p in s.parents)), key=lambda s: s.number)


def entry_position(shard: ShardInfo, shards: Sequence[ShardInfo]) -> int:
    """Where a readable shard at position 0 is read from: a child whose parents are all listed (so the
    source read them to their ends) at its ``StartingSequenceNumber``; any other shard (there when the
    source started, or its parents expired) at 0, ``TRIM_HORIZON``."""
    listed = {s.number for s in shards}
    return shard.start if shard.parents and all(p in listed for p in shard.parents) else 0


def lost_shards(shards: Sequence[ShardInfo], positions: Mapping[int, int]) -> list[int]:
    """Shards the frontier holds part way (neither 0 nor :data:`FINISHED`) that are no longer listed:
    retention removed them before the source read them to their end."""
    listed = {s.number for s in shards}
    return sorted(n for n, p in positions.items() if 0 < p < FINISHED and n not in listed)


def foreign_shards(shards: Sequence[ShardInfo], positions: Mapping[int, int]) -> list[ShardInfo]:
    """Listed shards that begin after the position the frontier holds for their number: a shard's first
    sequence number never changes, so the shard the source read under that number was another one (the
    stream was deleted and created again)."""
    return [s for s in shards if 0 < positions.get(s.number, 0) < s.start]


@dataclass(frozen=True)
class ShardScan:
    """What a scan of one shard found: from ``start`` on, ``points`` are ``(position, records)`` pairs,
    ``records`` counted from ``start`` (both increasing; the last is where the scan stopped), and
    ``ended`` says whether it read a closed shard to its end (then the last point is :data:`FINISHED`).

    A scan of a shard that found nothing has no points (and then ``ended`` only if the shard was closed
    and empty past ``start``: its only point is ``(FINISHED, 0)``)."""

    shard: int
    start: int
    points: tuple[tuple[int, int], ...] = ()
    ended: bool = False
    first_arrival_ms: int | None = None  # the first record's ApproximateArrivalTimestamp (lag in ms)
    marks: tuple[tuple[int, "Mark"], ...] = ()  # (position, the record just below it) for points a record made

    def __post_init__(self) -> None:
        prev_pos, prev_n = self.start, 0
        for pos, n in self.points:
            if not (pos > prev_pos and n >= prev_n):
                raise ValueError(f"shard {self.shard}: scan points must increase from {self.start}, "
                                 f"got {self.points}")
            prev_pos, prev_n = pos, n
        if self.ended and (not self.points or self.points[-1][0] != FINISHED):
            raise ValueError(f"shard {self.shard}: a scan that read to the end stops at FINISHED")

    @property
    def tip(self) -> int:
        return self.points[-1][0] if self.points else self.start

    @property
    def records(self) -> int:
        return self.points[-1][1] if self.points else 0


@dataclass(frozen=True)
class Segment:
    """``records`` records of ``shard`` have a sequence number in ``[start, stop)``: a fact about the
    stream that the scans establish and the reads of bound ranges are checked against."""

    shard: int
    start: int
    stop: int
    records: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop or self.records < 0:
            raise ValueError(f"segment of shard {self.shard}: needs 0 <= start < stop and records >= 0, got "
                             f"[{self.start}, {self.stop}) with {self.records}")


def scan_segments(scan: ShardScan) -> list[Segment]:
    """The segments a scan establishes: from its start through each of its points."""
    out, prev_pos, prev_n = [], scan.start, 0
    for pos, n in scan.points:
        out.append(Segment(scan.shard, prev_pos, pos, n - prev_n))
        prev_pos, prev_n = pos, n
    return out


@dataclass(frozen=True)
class Plan:
    """What a mint binds: ``frontiers`` in order (each to be appended at its own, later timestamp), and the
    ``segments`` that count the records between consecutive positions (written before the bindings)."""

    frontiers: tuple[dict[int, int], ...]
    segments: tuple[Segment, ...]


def plan_bindings(shards: Sequence[ShardInfo], positions: Mapping[int, int], scans: Mapping[int, ShardScan],
                  budget: int) -> Plan:
    """Cut what ``scans`` found beyond ``positions`` into frontiers to bind, in order.

    ``shards``: the stream's listing; ``positions``: the newest binding's frontier; ``scans``: per shard
    number, a scan from its position in ``positions`` (children's scans start at their
    ``StartingSequenceNumber``). ``budget``: records per binding.

    Laws:

    * *monotone*: each frontier is pointwise ``>=`` the one before (``positions`` first), and differs from it;
    * *KCL rule*: in each frontier, every shard that moved past its previous position is readable under the
      previous frontier; so a child moves (or appears) only in a binding after the one that finished its
      parents;
    * *budget*: each binding adds at most ``budget`` records, unless one scan point alone holds more (then
      that step is a binding of its own);
    * *everything*: the last frontier holds every readable shard at its scan's tip, unless a child cannot
      start because a parent's scan did not reach its end;
    * *children appear*: a child whose parents are all done appears at its ``StartingSequenceNumber`` (or
      beyond) in the binding after they are done, so that its parents can be dropped later;
    * *counted*: between consecutive positions of a shard the segments hold the records in between.
    """
    if budget <= 0:
        raise ValueError(f"budget must be positive, got {budget}")
    current = dict(positions)
    cursor = {n: 0 for n in scans}  # index of the next point of each scan not yet bound
    frontiers: list[dict[int, int]] = []
    segments: list[Segment] = []
    while True:
        nxt = dict(current)
        room = budget
        moved = False
        for s in readable(shards, current):
            n = s.number
            pos = current.get(n, 0)
            if pos == 0 and entry_position(s, shards) > 0:
                # a child whose listed parents the source finished: it enters the frontier at its start
                nxt[n] = s.start
                segments.append(Segment(n, 0, s.start, 0))
                moved = True
            scan = scans.get(n)
            if scan is None:
                continue
            i = cursor[n]
            if (scan.points[i - 1][0] if i else scan.start) != nxt.get(n, 0):
                continue  # a scan from another position than the frontier's (a stale one): not ours to bind
            base = scan.points[i - 1][1] if i else 0
            took = False
            while i < len(scan.points):
                p, count = scan.points[i]
                step = count - base
                if step > room and (took or room < budget):
                    break  # the next step does not fit; a step alone larger than the budget goes alone
                prev = scan.points[i - 1][0] if i else scan.start
                segments.append(Segment(n, prev, p, step))
                room -= step
                base = count
                nxt[n] = p
                i += 1
                took = moved = True
                if room <= 0:
                    break
            cursor[n] = i
            if room <= 0:
                break
        if not moved:
            break
        frontiers.append(nxt)
        current = nxt
    return Plan(tuple(frontiers), tuple(segments))


def droppable(shards: Sequence[ShardInfo], frontiers: Sequence[Mapping[int, int]]) -> set[int]:
    """Shards that compaction may drop from every one of ``frontiers`` (the bindings at and after since):
    FINISHED in each, and in each with a child of it present (so the frontier still says it is done, by
    :func:`done_shards`). A finished shard that is no longer listed is droppable once every listed child
    of it is present too (its children may have expired as well).

    Law: dropping them changes neither :func:`done_shards` nor :func:`readable` of any of ``frontiers``
    (over the same listing), nor any range a read of them needs (a FINISHED shard is read no more)."""
    if not frontiers:
        return set()
    kids = children_of(shards)
    out = set()
    candidates = set.intersection(*({n for n, p in f.items() if p >= FINISHED} for f in frontiers))
    for n in candidates:
        children = kids.get(n, [])
        if children and all(any(f.get(c, 0) > 0 for c in children) for f in frontiers):
            out.add(n)
        elif not children and all(s.number != n for s in shards):
            out.add(n)  # gone upstream, and no listed child needs it to be known as done
    return out


def kcl_checkpoint(shard: ShardInfo, position: int) -> str:
    """The KCL lease-table checkpoint of ``shard`` at ``position``: ``TRIM_HORIZON`` (nothing read: 0, or a
    child at its start), ``SHARD_END`` (:data:`FINISHED`), else the last record's sequence number (the KCL
    resumes ``AFTER_SEQUENCE_NUMBER`` its checkpoint).

    Law: :func:`position_of_checkpoint` gives ``position`` back (0 for a child at its start: both mean
    nothing read)."""
    check_position(position)
    if position >= FINISHED:
        return "SHARD_END"
    if position == 0 or position == shard.start:
        return "TRIM_HORIZON"
    return str(position - 1)


def position_of_checkpoint(checkpoint: str) -> int:
    """The position a KCL checkpoint stands for (see :func:`kcl_checkpoint`)."""
    if checkpoint == "SHARD_END":
        return FINISHED
    if checkpoint == "TRIM_HORIZON":
        return 0
    if checkpoint in ("LATEST", "AT_TIMESTAMP"):
        raise ValueError(f"checkpoint {checkpoint} names no position Reclock can resume from")
    from reclock.sources.kinesis.sequence import parse_sequence

    return parse_sequence(checkpoint) + 1
