"""The S3 source's gauge: FromTime ``(object, byte_offset)`` and its frontier (pure; no I/O).

The seed's S3 remap data is ``object_key: text, byte_offset_increment``; the mapping keeps the byte order
within each object and no order across objects. Reclock gives every object *version* it discovers a dense
integer id (``reclock.sources.s3.catalog`` keeps id -> key, ETag or version, size), so FromTime is
``(object id, byte offset)`` and a record of a line format looks like a Kafka record: partition = object
id, offset = the byte offset where its line starts.

A frontier says, per object id, the next byte not yet bound. Frontiers are cumulative: every binding's
frontier covers every object bound so far. With one entry per object a binding would carry every object
ever ingested (a million rows each, after a million objects), so an object bound *whole* is **sealed**:
it leaves the entries and joins an interval of sealed ids, where its offset is past every byte
(:data:`WHOLE`). S3 objects are immutable, so an object is sealed the first time it is bound; only a
local file still being appended to, or a line format object whose last line is not complete yet, stays
open with a byte offset. A binding over a thousand new objects is then one interval, and the intervals
number at most the open objects plus one, however many objects were ever ingested (*bounded state*).

Its order is pointwise over ids, with sealed ids at :data:`WHOLE` (absent ids at 0), so
:class:`ObjectFrontier` is a lattice (meet, join, less_equal), like ``reclock.time.PartitionedFrontier``
whose laws it keeps. The ranges between two frontiers need the size of each id sealed in between, which
the catalog knows: :meth:`ObjectFrontier.ranges_since` takes it as a function.

Stored as ``(partition, offset)`` rows (the shared remap tables): an open id as ``(id, offset)``; a sealed
interval ``[lo, hi)`` as ``(lo, SEALED_ROW + hi)`` (:func:`to_rows`, :func:`from_rows`). Object ids fit
the rows' 32-bit ``partition``; byte offsets stay below ``SEALED_ROW`` (2**62 bytes).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

WHOLE = 2**63 - 1
"""The offset of a sealed id: beyond every byte of the object."""
SEALED_ROW = 2**62
"""A stored row ``(lo, SEALED_ROW + hi)`` is the sealed interval ``[lo, hi)``; a byte offset is below it."""
MAX_ID = 2**31 - 1
"""Object ids are 32-bit (the remap rows' ``partition`` column): ids ``0 .. MAX_ID - 1``."""


def _check_id(i: int) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < MAX_ID:
        raise ValueError(f"object id must be an int in [0, {MAX_ID}), got {i!r}")
    return i


def _merge(intervals: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, disjoint, non-adjacent half-open intervals covering the same ids (empty ones dropped)."""
    out: list[list[int]] = []
    for lo, hi in sorted((int(a), int(b)) for a, b in intervals):
        _check_id(lo)
        if hi > MAX_ID or hi < lo:
            raise ValueError(f"sealed interval [{lo}, {hi}) is not within [0, {MAX_ID}]")
        if lo == hi:
            continue
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def _intersect(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ids of intervals ``a`` not in intervals ``b`` (both merged)."""
    out = []
    for lo, hi in a:
        at = lo
        for blo, bhi in b:
            if bhi <= at or blo >= hi:
                continue
            if blo > at:
                out.append((at, blo))
            at = max(at, bhi)
            if at >= hi:
                break
        if at < hi:
            out.append((at, hi))
    return out


@dataclass(frozen=True)
class ObjectRange:
    """Bytes ``[start, end)`` of object ``id`` (half-open; ``start == end`` only for a zero-byte object)."""

    id: int
    start: int
    end: int

    def __post_init__(self) -> None:
        _check_id(self.id)
        if not 0 <= self.start <= self.end < SEALED_ROW:
            raise ValueError(f"object {self.id}: byte range needs 0 <= start <= end, got [{self.start}, {self.end})")

    @property
    def bytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ObjectFrontier:
    """Object id -> next byte offset not yet bound. Ids in ``sealed`` (merged half-open intervals) are
    bound whole (at :data:`WHOLE`); ``open`` holds ``(id, offset)`` for other ids with ``offset > 0``;
    every other id is at 0. Canonical, so two frontiers are equal exactly when they agree on every id."""

    sealed: tuple[tuple[int, int], ...] = ()
    open: tuple[tuple[int, int], ...] = field(default=())

    def __post_init__(self) -> None:
        sealed = _merge(self.sealed)
        entries: dict[int, int] = {}
        for i, o in self.open:
            _check_id(i)
            if isinstance(o, bool) or not isinstance(o, int) or not 0 <= o < SEALED_ROW:
                raise ValueError(f"object {i}: byte offset must be an int in [0, 2**62), got {o!r}")
            if i in entries:
                raise ValueError(f"object {i} appears twice in a frontier")
            entries[i] = o
        starts = [lo for lo, _ in sealed]
        kept = tuple(sorted((i, o) for i, o in entries.items() if o > 0 and not _inside(sealed, starts, i)))
        object.__setattr__(self, "sealed", sealed)
        object.__setattr__(self, "open", kept)

    @staticmethod
    def of(sealed: Iterable[tuple[int, int]] = (), open: Mapping[int, int] | Iterable[tuple[int, int]] = ()
           ) -> "ObjectFrontier":
        pairs = open.items() if isinstance(open, Mapping) else open
        return ObjectFrontier(tuple(sealed), tuple((int(i), int(o)) for i, o in pairs))

    def get(self, id: int) -> int:
        """The next byte of object ``id`` not yet bound: :data:`WHOLE` if sealed, 0 if absent."""
        if _inside(self.sealed, [lo for lo, _ in self.sealed], id):
            return WHOLE
        for i, o in self.open:
            if i == id:
                return o
        return 0

    def is_sealed(self, id: int) -> bool:
        return self.get(id) == WHOLE

    def covers(self, id: int, offset: int) -> bool:
        """True if the byte at ``(id, offset)`` is bound (before this frontier)."""
        return offset < self.get(id)

    def is_minimum(self) -> bool:
        return not self.sealed and not self.open

    def sealed_count(self) -> int:
        return sum(hi - lo for lo, hi in self.sealed)

    def ids(self) -> Iterator[int]:
        """Every id this frontier has moved past 0: sealed ones, then open ones."""
        for lo, hi in self.sealed:
            yield from range(lo, hi)
        for i, _ in self.open:
            yield i

    def next_id(self) -> int:
        """One past the greatest id this frontier has moved (0 for the minimum frontier)."""
        top = max([hi for _, hi in self.sealed] + [i + 1 for i, _ in self.open] + [0])
        return top

    def less_equal(self, other: "ObjectFrontier") -> bool:
        """Pointwise ``<=`` over every id (sealed ids at WHOLE, absent ids at 0)."""
        if _subtract(self.sealed, other.sealed):
            return False
        return all(o <= other.get(i) for i, o in self.open)

    def less_than(self, other: "ObjectFrontier") -> bool:
        return self != other and self.less_equal(other)

    def join(self, other: "ObjectFrontier") -> "ObjectFrontier":
        """Pointwise maximum: sealed in either is sealed; open offsets the larger."""
        merged = dict(self.open)
        for i, o in other.open:
            merged[i] = max(merged.get(i, 0), o)
        return ObjectFrontier(self.sealed + other.sealed, tuple(merged.items()))

    def meet(self, other: "ObjectFrontier") -> "ObjectFrontier":
        """Pointwise minimum: sealed in both is sealed; an id sealed on one side takes the other's offset."""
        out: dict[int, int] = {}
        for a, b in ((self, other), (other, self)):
            for i, o in a.open:
                out[i] = min(o, b.get(i))
        return ObjectFrontier(tuple(_intersect(self.sealed, other.sealed)), tuple(out.items()))

    def seal(self, ids: Iterable[int]) -> "ObjectFrontier":
        """This frontier with ``ids`` bound whole (the objects' last bytes are bound with them)."""
        return ObjectFrontier(self.sealed + tuple((i, i + 1) for i in ids), self.open)

    def advance(self, offsets: Mapping[int, int]) -> "ObjectFrontier":
        """This frontier with open objects moved to ``offsets`` (never backwards: the join)."""
        return self.join(ObjectFrontier.of(open=offsets))

    def ranges_since(self, earlier: "ObjectFrontier", size_of: Callable[[int], int]) -> list[ObjectRange]:
        """The byte ranges bound by ``self`` and not by ``earlier``, per id in id order; an id sealed here
        and not before ends at ``size_of(id)`` (its size when sealed). A zero-byte object sealed here gives
        an empty range ``[0, 0)``: it is in the frontier, and there is nothing to read.

        Law: for ``earlier <= self``, byte ``(i, o)`` is in a range exactly when ``self.covers(i, o)`` and
        not ``earlier.covers(i, o)`` (for sealed ids: ``o < size_of(i)``), and the ranges of ``a -> b`` and
        ``b -> c`` together are those of ``a -> c``. ``ValueError`` if ``earlier`` is not ``<= self`` or a
        size is below a bound offset.
        """
        if not earlier.less_equal(self):
            raise ValueError(f"frontier {earlier} is not at or before {self}")
        out: list[ObjectRange] = []
        for lo, hi in _subtract(self.sealed, earlier.sealed):
            for i in range(lo, hi):
                start, size = earlier.get(i), size_of(i)
                if size < start:
                    raise ValueError(f"object {i}: size {size} is below its bound offset {start}")
                out.append(ObjectRange(i, start, size))
        for i, o in self.open:
            start = earlier.get(i)
            if o > start:
                out.append(ObjectRange(i, start, o))
        return sorted(out, key=lambda r: r.id)

    def __str__(self) -> str:
        sealed = ", ".join(f"[{lo}, {hi})" for lo, hi in self.sealed)
        opened = ", ".join(f"{i}: {o}" for i, o in self.open)
        return "{sealed: " + (sealed or "-") + "; open: " + (opened or "-") + "}"


def _inside(sealed: Sequence[tuple[int, int]], starts: Sequence[int], id: int) -> bool:
    k = bisect.bisect_right(starts, id) - 1
    return k >= 0 and sealed[k][0] <= id < sealed[k][1]


def to_rows(f: ObjectFrontier) -> list[tuple[int, int]]:
    """``(partition, offset)`` rows of ``f`` for the remap tables: open ids as ``(id, offset)``, sealed
    intervals ``[lo, hi)`` as ``(lo, SEALED_ROW + hi)``. Law: ``from_rows(to_rows(f)) == f``."""
    rows = [(lo, SEALED_ROW + hi) for lo, hi in f.sealed] + list(f.open)
    return sorted(rows)


def from_rows(rows: Iterable[tuple[int, int]]) -> ObjectFrontier:
    """The frontier :func:`to_rows` stored."""
    sealed, opened = [], []
    for p, o in rows:
        if o >= SEALED_ROW:
            sealed.append((p, o - SEALED_ROW))
        else:
            opened.append((p, o))
    return ObjectFrontier(tuple(sealed), tuple(opened))


@dataclass(frozen=True)
class BoundRange:
    """Bytes ``[start, end)`` of object ``id`` are bound at ``ts`` (one binding's share of one object)."""

    id: int
    start: int
    end: int
    ts: int

    @property
    def bytes(self) -> int:
        return self.end - self.start


def bound_ranges(bindings: Sequence[tuple[int, ObjectFrontier]], before: ObjectFrontier,
                 size_of: Callable[[int], int]) -> list[BoundRange]:
    """The byte ranges each of ``bindings`` (``(ts, frontier)`` in ts order) adds after ``before``, each
    with its binding's ts: what a description over those bindings reads, already reclocked.

    Law: per id the ranges are contiguous from ``before``'s offset, in ts order; every byte bound after
    ``before`` is in exactly one range, at the ts of the least binding that covers it (what
    :meth:`ObjectFrontier.covers` says binding by binding).
    """
    out: list[BoundRange] = []
    prev = before
    for ts, f in bindings:
        out += [BoundRange(r.id, r.start, r.end, ts) for r in f.ranges_since(prev, size_of)]
        prev = f
    return out
