"""Discovery: which objects an S3 source has, given what upstream lists or notifies (pure; no I/O).

The source's catalog (``reclock.sources.s3.catalog``) holds one :class:`Known` row per object version it
discovered and still needs to know. Each cycle's mint reconciles it with upstream
(:func:`reconcile`): a new key gets the next dense id; a local file that grew moves its complete-lines
offset; an object that settled is sealed; an object whose identity changed is an *overwrite*, handled as
the source's ``on_overwrite`` says (:class:`OnOverwrite`). A sealed object is placed in the source's log
(``reclock.sources.s3.log``) at the next free position, in id order; an open file with complete lines is
bound in a partition of its own. The frontier the mint binds is then :func:`frontier_of` the catalog.

Discovery modes (:class:`Discovery`)::

    listing, keys: any         every cycle lists the whole prefix; the catalog keeps every key ever seen
                               (state and listing cost grow with the bucket: measured in benchmarks/)
    listing, keys: increasing  keys arrive in increasing order (date/time-partitioned paths), a late key at
                               most `lookback` after greater ones: the listing starts after `start_after`,
                               which trails the newest keys by `lookback`; keys at or before it are
                               forgotten (bounded: a key frontier plus the lookback's keys)
    notifications              S3 event notifications through SQS name the new objects; the catalog keeps
                               each for `dedupe` (the queue's retention: a message may come again within
                               it), then forgets it

Law (tests/unit/test_s3_discovery.py): under the mode's contract, every object version upstream holds is
given exactly one id, once, whatever the cycles' timing; nothing is skipped; the catalog stays bounded by
the contract's window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Iterable, Sequence

from reclock.errors import ObjectChanged, ObjectLost
from reclock.sources.s3.client import ObjectInfo
from reclock.sources.s3.log import LOG, Placed
from reclock.sources.s3.log import frontier_of as log_frontier
from reclock.time import PartitionedFrontier


class Discovery(str, Enum):
    LISTING = "listing"
    NOTIFICATIONS = "notifications"


class OnOverwrite(str, Enum):
    """What an object overwritten after it was discovered (a new ETag or version under its key) does."""

    STALL = "stall"  # the cycle fails with ObjectChanged naming the object; nothing is bound past it
    COLLECT = "collect"  # a row in <source>_errors names the object and both versions; the new one is not read
    REINGEST = "reingest"  # the new version is a new object: read in full (its rows are added)


class State(str, Enum):
    OPEN = "open"  # a local file that may still grow: bound up to its complete lines
    SEALED = "sealed"  # complete: bound whole at `size`
    OVERWRITE = "overwrite"  # a new version seen under on_overwrite: collect (an error row; no bytes read)


@dataclass(frozen=True)
class Known:
    """One catalog row: object version ``id`` under ``key``; ``size`` is its length (fixed once sealed);
    ``complete`` for an open object the end of its last complete line (what a binding may cover)."""

    id: int
    key: str
    etag: str
    size: int
    modified_ms: int
    seen_ms: int
    state: State
    complete: int = 0
    version: str | None = None
    previous_etag: str | None = None  # an overwrite row: the ETag of the version it replaced
    base: int | None = None  # its first position in the log, once placed there
    own: bool = False  # bound in a partition of its own (its id): a file bound while it grew

    def info(self) -> ObjectInfo:
        return ObjectInfo(self.key, self.size, self.etag, self.modified_ms, self.version)

    @property
    def partition(self) -> int:
        return self.id if self.own else LOG

    def placed(self) -> Placed | None:
        """Where its bytes are bound (None: nowhere yet)."""
        if self.own:
            return Placed(self.id, None, self.size, own=True)
        if self.base is None:
            return None
        return Placed(self.id, self.base, self.bound_size)

    @property
    def bound_size(self) -> int:
        """The bytes a sealed row's binding covers (an overwrite row: none)."""
        return 0 if self.state == State.OVERWRITE else self.size


@dataclass(frozen=True)
class Rules:
    """How a source reconciles: ``mutable`` (local files: they grow, and are sealed once unchanged for
    ``settle_ms``; S3 objects are immutable and sealed on sight), ``whole`` (a whole-object format or a
    gzip'd object: bound only once sealed), the overwrite policy, and for ``keys: increasing`` the
    ``lookback_ms`` (None: keys in any order)."""

    mutable: bool = False
    settle_ms: int = 0
    on_overwrite: OnOverwrite = OnOverwrite.STALL
    lookback_ms: int | None = None
    whole: Callable[[str], bool] = lambda key: False


@dataclass(frozen=True)
class Plan:
    """What a reconcile changes in the catalog: rows to insert (``added``: new objects, with their new
    ids) and to update (``changed``: open objects that grew or sealed), the new ``start_after`` and
    ``next_id``."""

    added: tuple[Known, ...] = ()
    changed: tuple[Known, ...] = ()
    start_after: str | None = None
    next_id: int = 1
    next_base: int = 0
    overwrites: int = 0


def latest_by_key(rows: Iterable[Known]) -> dict[str, Known]:
    """Each key's newest version among ``rows`` (the greatest id)."""
    out: dict[str, Known] = {}
    for r in rows:
        if r.key not in out or r.id > out[r.key].id:
            out[r.key] = r
    return out


def _describe(k: Known | ObjectInfo) -> str:
    etag = k.etag if isinstance(k, ObjectInfo) else k.etag
    return f"ETag {etag}, {k.size} bytes"


def reconcile(source: str, url_of: Callable[[str], str], known: Sequence[Known], listed: Iterable[ObjectInfo],
              now_ms: int, next_id: int, start_after: str | None, rules: Rules,
              complete_of: Callable[[ObjectInfo, int], int], complete_listing: bool = True,
              next_base: int = 0) -> Plan:
    """The catalog changes that bring ``known`` (the catalog's rows) up to ``listed`` (what upstream holds
    after ``start_after``, or the objects an event named), at ``now_ms`` (the listing's start).

    ``complete_of(obj, from_offset)``: the end of ``obj``'s last complete line at or after ``from_offset``
    (reads the file's tail; only asked for open objects of line formats). ``complete_listing``: ``listed``
    is everything after ``start_after`` (a listing), so a known key missing from it is gone upstream (an
    open file gone before it settled is :class:`ObjectLost` if bytes past its complete lines are lost);
    False for notifications. Raises :class:`ObjectChanged` for an overwrite under ``on_overwrite: stall``.
    ``next_id``, ``next_base``: the next object id (from 1) and the next free log position.
    """
    latest = latest_by_key(known)
    added: list[Known] = []
    changed: dict[int, Known] = {}
    overwrites = 0
    seen_keys: set[str] = set()
    fresh: list[ObjectInfo] = []
    for obj in listed:
        if obj.key in seen_keys:
            continue  # a notification batch may name a key twice; the first look decides
        seen_keys.add(obj.key)
        k = latest.get(obj.key)
        if k is None:
            fresh.append(obj)
            continue
        if k.state == State.OPEN:
            if obj.etag != k.etag or obj.size < k.complete:
                overwrites += _overwrite(source, url_of, k, obj, rules)
                if rules.on_overwrite != OnOverwrite.STALL:
                    fresh.append(obj)
                continue
            grown = _settle_or_grow(k, obj, now_ms, rules, complete_of)
            if grown != k:
                changed[k.id] = grown
            continue
        if obj.etag == (k.etag) and (obj.size == k.size or k.state == State.OVERWRITE):
            continue  # unchanged (an overwrite row is compared by its ETag: its size is the new version's)
        if obj.etag == k.etag and not rules.mutable:
            continue
        overwrites += _overwrite(source, url_of, k, obj, rules)
        if rules.on_overwrite != OnOverwrite.STALL:
            fresh.append(obj)
    if complete_listing:
        for key, k in latest.items():
            if k.state == State.OPEN and key not in seen_keys and (start_after is None or key > start_after):
                if k.size > k.complete:
                    raise ObjectLost(source, url_of(key), k.complete, k.size,
                                     "the file is gone before it was complete (it was growing)")
                changed[k.id] = replace(k, state=State.SEALED, size=k.complete)
    for obj in sorted(fresh, key=lambda o: o.key):
        k = latest.get(obj.key)
        overwrite = k is not None and rules.on_overwrite == OnOverwrite.COLLECT
        row = Known(next_id, obj.key, obj.etag, obj.size, obj.modified_ms, now_ms,
                    State.OVERWRITE if overwrite else State.OPEN, 0, obj.version,
                    previous_etag=k.etag if k is not None else None)
        if not overwrite:
            row = _settle_or_grow(row, obj, now_ms, rules, complete_of)
        added.append(row)
        next_id += 1
    # place what is sealed now in the log (in id order), and give a file with complete lines its partition
    placed: list[Known] = []
    for row in sorted([*changed.values(), *added], key=lambda r: r.id):
        if row.state != State.OPEN and not row.own and row.base is None:
            row = replace(row, base=next_base)
            next_base += row.bound_size + 1
        elif row.state == State.OPEN and row.complete > 0 and not row.own:
            row = replace(row, own=True)
        placed.append(row)
    new_ids = {r.id for r in added}
    added = [r for r in placed if r.id in new_ids]
    changed = {r.id: r for r in placed if r.id not in new_ids}
    new_after = start_after
    if rules.lookback_ms is not None:
        new_after = advance_start_after(start_after, [*known, *added], changed, now_ms - rules.lookback_ms)
    return Plan(tuple(added), tuple(changed.values()), new_after, next_id, next_base, overwrites)


def _settle_or_grow(k: Known, obj: ObjectInfo, now_ms: int, rules: Rules,
                    complete_of: Callable[[ObjectInfo, int], int]) -> Known:
    """``k`` seen now as ``obj`` (same identity): sealed if immutable or settled, else open with its
    complete lines (none for a whole-object format or a gzip'd object)."""
    if not rules.mutable or obj.modified_ms <= now_ms - rules.settle_ms:
        return replace(k, size=obj.size, modified_ms=obj.modified_ms, state=State.SEALED, complete=obj.size)
    complete = k.complete
    if not rules.whole(obj.key) and obj.size > k.complete:
        complete = max(k.complete, complete_of(obj, k.complete))
    return replace(k, size=obj.size, modified_ms=obj.modified_ms, complete=complete)


def _overwrite(source: str, url_of: Callable[[str], str], k: Known, obj: ObjectInfo, rules: Rules) -> int:
    if rules.on_overwrite == OnOverwrite.STALL:
        raise ObjectChanged(source, url_of(k.key), _describe(k), _describe(obj),
                            "set the source's `on_overwrite:` to `collect` (the overwrite lands in its errors "
                            "collection, the new version is not read) or `reingest` (the new version is read as a "
                            "new object), or restore the object (see docs/s3.md, 'Overwritten objects')")
    return 1


def advance_start_after(start_after: str | None, rows: Iterable[Known], changed: dict[int, Known],
                        horizon_ms: int) -> str | None:
    """The greatest key ``k`` such that every row with a key in ``(start_after, k]`` is complete (sealed or
    an overwrite) and was first seen at or before ``horizon_ms`` (now - lookback): the next listing may
    start after it. Never goes backwards."""
    current = [changed.get(r.id, r) for r in rows if start_after is None or r.key > start_after]
    out = start_after
    for r in sorted(current, key=lambda r: (r.key, r.id)):
        if r.state == State.OPEN or r.seen_ms > horizon_ms:
            break
        out = r.key
    return out


def frontier_of(rows: Iterable[Known], next_base: int) -> PartitionedFrontier:
    """The frontier the catalog says is complete: the log up to ``next_base`` (every sealed object placed)
    and each own partition up to its complete lines (its size once sealed)."""
    own = [(r.id, r.size if r.state != State.OPEN else r.complete) for r in rows if r.own]
    return log_frontier(next_base, [(i, o) for i, o in own if o > 0])


def forgettable(rows: Iterable[Known], compacted: PartitionedFrontier, start_after: str | None,
                mode: Discovery, keys_increasing: bool, dedupe_before_ms: int | None) -> list[Known]:
    """The rows the catalog may drop: placed in the log wholly below ``compacted`` (the remap collection's
    frontier at its since: no description reads them again), and never needed to recognise a key again:
    at or before ``start_after`` (listing, keys increasing), or first seen before ``dedupe_before_ms``
    (notifications). With keys in any order a listing needs every key: nothing is dropped. An
    own-partition object stays (its partition stays in the bindings)."""
    out = []
    for r in rows:
        p = r.placed()
        if p is None or p.own or p.span[1] > compacted.get(LOG):
            continue
        if mode == Discovery.LISTING and keys_increasing and start_after is not None and r.key <= start_after:
            out.append(r)
        elif mode == Discovery.NOTIFICATIONS and dedupe_before_ms is not None and r.seen_ms < dedupe_before_ms:
            out.append(r)
    return out
