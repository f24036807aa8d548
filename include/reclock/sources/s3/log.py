"""The S3 source's gauge: FromTime ``(key, byte_offset)`` mapped onto the remap collection's
``(partition, offset)`` (pure; no I/O).

The seed's S3 remap data is ``object_key: text, byte_offset``: "at t, every object key below/at this
frontier up to byte_offset is in"; the mapping keeps the byte order within each object and no order across
objects. One row per object per binding would not stay bounded (frontiers are cumulative: after a million
objects every binding would carry a million rows), so objects are laid end to end in a **log**:

* Partition :data:`LOG` (0) is the concatenation of the objects that are *sealed* (complete: S3 objects
  are immutable, so at once; a local file once it stopped changing) in the order they were bound. An object
  of ``size`` bytes takes the positions ``[base, base + size + 1)``: its bytes, then one position that
  marks its end (so a zero-byte object has a place, and a whole-object format is read when its end is
  bound). The catalog (``reclock.sources.s3.catalog``) keeps each object's ``base``. A frontier ``{0: L}``
  says every object placed below ``L`` is in, however many there are: one row.
* A local file bound while it still grows (only its complete lines: ``reclock.sources.s3.lines``) gets a
  partition of its own, its object id (ids start at 1), the byte offset as the offset; it stays there when
  it is sealed.

:func:`bound_ranges` turns a description's bindings back into per-object byte ranges with their ts: what
the readers read. Law (tests/unit/test_s3_log.py): every byte of every object, and every object's end, is
in exactly one range, at the ts of the least binding whose frontier covers its position.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence

from reclock.time import PartitionedFrontier

LOG = 0
"""The partition of sealed objects laid end to end."""


@dataclass(frozen=True)
class Placed:
    """Where object ``id``'s bytes are: in the log from ``base`` (``own`` False), or in partition ``id``
    (``own``); ``size`` its length (of a log object; an own-partition object's bytes are its partition's
    offsets)."""

    id: int
    base: int | None
    size: int
    own: bool = False

    def __post_init__(self) -> None:
        if self.id < 1:
            raise ValueError(f"object ids start at 1 (0 is the log), got {self.id}")
        if not self.own and (self.base is None or self.base < 0):
            raise ValueError(f"object {self.id}: a log object needs a base >= 0, got {self.base}")

    @property
    def span(self) -> tuple[int, int]:
        """The log positions the object takes: its bytes and its end mark."""
        return self.base, self.base + self.size + 1


@dataclass(frozen=True)
class BoundRange:
    """Bytes ``[start, end)`` of object ``id`` are bound at ``ts``; ``ends``: the object's end is bound with
    them (its last line needs no line end; a whole-object format is read in this range)."""

    id: int
    start: int
    end: int
    ts: int
    ends: bool = False

    @property
    def bytes(self) -> int:
        return self.end - self.start


class Layout:
    """The placed objects a description may touch, looked up by log position."""

    def __init__(self, placed: Iterable[Placed]) -> None:
        objs = list(placed)
        self.log = sorted((p for p in objs if not p.own), key=lambda p: p.base)
        self.bases = [p.base for p in self.log]
        self.own = {p.id for p in objs if p.own}
        for a, b in zip(self.log, self.log[1:]):
            if a.span[1] > b.base:
                raise ValueError(f"objects {a.id} and {b.id} overlap in the log ({a.span}, {b.span})")

    def log_ranges(self, lo: int, hi: int, ts: int, forgotten_below: int = 0) -> list[BoundRange]:
        """The objects' bytes at log positions ``[lo, hi)``; a position no object takes is a
        ``ValueError`` (the catalog must know every object a binding placed), except below
        ``forgotten_below``, where the catalog may have forgotten objects (a rebuild finds them again)."""
        out: list[BoundRange] = []
        at = lo
        while at < hi:
            k = bisect.bisect_right(self.bases, at) - 1  # the last object starting at or before `at`
            if k >= 0 and at < self.log[k].span[1]:
                p = self.log[k]
                b0, b1 = p.span
                upto = min(hi, b1)
                out.append(BoundRange(p.id, at - b0, min(upto, b0 + p.size) - b0, ts, ends=upto == b1))
                at = upto
                continue
            if at < forgotten_below:  # forgotten objects, up to the next known one
                nxt = self.log[k + 1].base if k + 1 < len(self.log) else hi
                at = min(hi, forgotten_below, nxt)
                continue
            raise ValueError(f"log position {at} is bound but no object in the catalog takes it")
        return out


def bound_ranges(bindings: Sequence[tuple[int, PartitionedFrontier]], before: PartitionedFrontier,
                 layout: Layout, forgotten_below: int = 0) -> list[BoundRange]:
    """The byte ranges each of ``bindings`` (``(ts, frontier)`` in ts order) binds after ``before``, per
    object, with its binding's ts: a description's reads, already reclocked. Own partitions not in
    ``layout`` are a ``ValueError``; so are log positions no object takes, except below
    ``forgotten_below`` (objects the catalog forgot, which the caller reads itself)."""
    out: list[BoundRange] = []
    prev = before
    for ts, f in bindings:
        lo, hi = prev.get(LOG), f.get(LOG)
        if hi > lo:
            out += layout.log_ranges(lo, hi, ts, forgotten_below)
        for p, o in f:
            if p == LOG:
                continue
            start = prev.get(p)
            if o > start:
                if p not in layout.own:
                    raise ValueError(f"partition {p} is bound but object {p} is not an own-partition object "
                                     "of the catalog")
                out.append(BoundRange(p, start, o, ts))
        prev = f
    return out


def frontier_of(next_base: int, own: Iterable[tuple[int, int]]) -> PartitionedFrontier:
    """The frontier that binds the log up to ``next_base`` and each own partition up to its offset."""
    return PartitionedFrontier.of([(LOG, next_base), *own])
