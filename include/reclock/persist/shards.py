"""Shards in Postgres: ``upper``, ``since``, batches of immutable parts, read holds, and
``compare_and_append`` over several shards in one transaction.

A shard is the durable store of one collection. Its row in ``reclock.shards`` holds ``upper`` (every
update at ``ts < upper`` is in; none will ever be added there) and ``since`` (reads are exact at
``ts >= since``); each Parquet part it holds is one row of ``reclock.shard_batches`` tagged with the
batch description ``[lower, upper)`` it was appended under.

``compare_and_append`` of a description ``[lower, upper)`` (DESIGN.md, "The cycle", step 3):

=======================  ===============================================  ==============================
shard's actual upper     meaning                                          outcome
=======================  ===============================================  ==============================
``== lower``             the expected case                                ``appended``: parts added,
                                                                          upper set to ``upper``
``>= upper``             another run already wrote this range (replays    ``already_present``: no-op;
                         are deterministic: the same data)                our parts become garbage
``lower < u < upper``    another run wrote part of it                     ``UpperMismatch``; nothing
                                                                          changes in any shard
``< lower``              the shard was modified under us                  ``ShardModified``; nothing
                                                                          changes in any shard
=======================  ===============================================  ==============================

``swap_batches`` swaps the batches whose descriptions meet a window ``[lower, upper)`` below the upper for
a rebuild's, while appends go on above it; ``merge_batches`` swaps some of them (parts at or below ``since``) for the merged parts compaction
wrote (``reclock.persist.compact``). The last two change nothing if any of the rows they replace is gone or
changed (``conflict``). A rebuild holds its source's rebuild lock (:func:`holding_rebuild_lock`) while it
writes, and compaction leaves the source's shards alone meanwhile (:func:`compacting`).

Concurrency: every writer locks the shard rows it touches (``SELECT ... FOR UPDATE``) in one fixed order,
sorted by id, so concurrent appenders over overlapping sets of shards serialize and never deadlock.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterator, Sequence

import psycopg

from reclock.part_layout import DATA_KIND, SHARD_KINDS
from reclock.batch import BatchDescription, Part
from reclock.errors import (BeyondUpper, ConfigError, PartAlreadyReferenced, ShardModified, SinceViolation,
                            UnknownReadHold, UnknownShard, UnknownSource, UpperMismatch)
from reclock.persist.names import validate_shard_id, validate_source_name
from reclock.persist.schemas import check_versions, insert_versions
from reclock.schema_evolution import SchemaVersion
from reclock.time import check_timestamp

__all__ = ["UnknownShard", "ShardInfo", "Append", "AppendOutcome", "BatchRow", "ReadHold", "register_shard",
           "shard_info", "compare_and_append", "batches", "acquire_read_hold", "downgrade_read_hold",
           "release_read_hold", "renew_read_hold", "drop_lapsed_holds", "read_holds", "advance_since", "Merge", "merge_batches", "Swap", "swap_batches",
           "window_rows", "holding_rebuild_lock", "compacting"]

APPENDED = "appended"
ALREADY_PRESENT = "already_present"
MERGED = "merged"
SWAPPED = "swapped"
CONFLICT = "conflict"


@dataclass(frozen=True)
class ShardInfo:
    shard: str
    upper: int
    since: int
    source: str | None = None
    output: int = 0
    kind: str = "data"  # reclock.part_layout.SHARD_KINDS: which columns of its parts are its own


@dataclass(frozen=True)
class Append:
    """Add ``parts`` to ``shard`` under ``desc`` (zero parts: just advance the upper), and record ``schemas``:
    the versions of the collection's schema that begin in ``desc`` (``reclock.persist.schemas``)."""

    shard: str
    desc: BatchDescription
    parts: tuple[Part, ...] = ()
    schemas: tuple[SchemaVersion, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))
        object.__setattr__(self, "schemas", tuple(self.schemas))


@dataclass(frozen=True)
class AppendOutcome:
    shard: str
    status: str  # APPENDED | ALREADY_PRESENT
    upper: int  # the shard's upper after the append

    def __str__(self) -> str:
        return f"{self.shard}: {self.status} (upper {self.upper})"


@dataclass(frozen=True)
class BatchRow:
    shard: str
    lower: int
    upper: int
    path: str
    rows: int
    bytes: int
    min_ts: int | None
    max_ts: int | None


@dataclass(frozen=True)
class Merge:
    """Replace the batch rows ``old`` of a shard by ``parts`` under ``desc`` (no parts: the old rows'
    updates all cancelled out)."""

    old: tuple[BatchRow, ...]
    desc: BatchDescription
    parts: tuple[Part, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "old", tuple(self.old))
        object.__setattr__(self, "parts", tuple(self.parts))


@dataclass(frozen=True)
class ReadHold:
    shard: str
    holder: str
    ts: int
    updated_at: datetime
    expires_at: datetime | None = None  # a reader's lease (None: held until released, as a sink's)


def register_shard(conn, shard: str, source: str | None = None, output: int = 0, kind: str = DATA_KIND) -> ShardInfo:
    """Create the shard (upper 0, since 0) of ``kind`` if it does not exist; return its info.

    Idempotent; registering an existing shard for another source, output or kind is a ``ConfigError``,
    and naming a source that is not registered is ``UnknownSource``.
    """
    validate_shard_id(shard)
    if source is not None:
        validate_source_name(source)
    if isinstance(output, bool) or not isinstance(output, int) or output < 0:
        raise ValueError(f"shard {shard}: output must be a non-negative int, got {output!r}")
    if kind not in SHARD_KINDS:
        raise ValueError(f"shard {shard}: kind must be one of {', '.join(SHARD_KINDS)}, got {kind!r}")
    with conn.transaction():
        if source is not None and conn.execute("SELECT 1 FROM reclock.sources WHERE name = %s",
                                               (source,)).fetchone() is None:
            raise UnknownSource(source)
        conn.execute("INSERT INTO reclock.shards (id, source, output, kind) VALUES (%s, %s, %s, %s) "
                     "ON CONFLICT DO NOTHING", (shard, source, output, kind))
        info = shard_info(conn, shard)
    if (info.source, info.output, info.kind) != (source, output, kind):
        raise ConfigError(f"shard {shard}: already registered as the {info.kind} output {info.output} of source "
                          f"{info.source}, not the {kind} output {output} of source {source} (a shard belongs "
                          "to one output)")
    return info


def shard_info(conn, shard: str) -> ShardInfo:
    row = conn.execute("SELECT upper, since, source, output, kind FROM reclock.shards WHERE id = %s",
                       (shard,)).fetchone()
    if row is None:
        raise UnknownShard(shard)
    return ShardInfo(shard, *row)


def _check_parts(a: Append) -> None:
    d = a.desc
    for p in a.parts:
        if not isinstance(p.path, str) or not p.path or p.path.startswith("/") or ".." in p.path.split("/"):
            raise ValueError(f"shard {a.shard}: part path {p.path!r} must be a relative blob path")
        if p.rows < 0 or p.bytes < 0:
            raise ValueError(f"shard {a.shard}: part {p.path} has negative rows or bytes ({p.rows}, {p.bytes})")
        for what, t in (("min_ts", p.min_ts), ("max_ts", p.max_ts)):
            if t is not None and not d.lower <= t < d.upper:
                raise ValueError(f"shard {a.shard}: part {p.path} has {what} {t} outside its description "
                                 f"[{d.lower}, {d.upper}) (an update at a time not covered by the binding)")
        if p.min_ts is not None and p.max_ts is not None and p.min_ts > p.max_ts:
            raise ValueError(f"shard {a.shard}: part {p.path} has min_ts {p.min_ts} > max_ts {p.max_ts}")


def _batch_rows(a: Append) -> list[tuple]:
    """The ``reclock.shard_batches`` rows of an append's parts."""
    d = a.desc
    return [(a.shard, d.lower, d.upper, p.path, p.rows, p.bytes, p.min_ts, p.max_ts) for p in a.parts]


def _insert_batch_rows(conn, new_rows: Sequence[tuple]) -> None:
    """Insert :func:`_batch_rows` rows in the caller's transaction. A path that a batch already references
    (of any shard, or taken by a concurrent writer) raises ``PartAlreadyReferenced``."""
    if not new_rows:
        return
    taken = conn.execute("SELECT path, shard FROM reclock.shard_batches WHERE path = ANY(%s) LIMIT 1",
                         ([r[3] for r in new_rows],)).fetchone()
    if taken is not None:
        path, other = taken
        raise PartAlreadyReferenced(next(r[0] for r in new_rows if r[3] == path), path, other)
    try:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reclock.shard_batches (shard, lower, upper, path, rows, bytes, "
                            "min_ts, max_ts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", new_rows)
    except psycopg.errors.UniqueViolation as e:  # a concurrent writer took one of our paths
        m = re.search(r"\(path\)=\((.*)\) already exists", e.diag.message_detail or "")
        path = m.group(1) if m else "(one of the new parts)"
        shard = next((r[0] for r in new_rows if r[3] == path), new_rows[0][0])
        raise PartAlreadyReferenced(shard, path, None, concurrent=True) from e


def compare_and_append(conn, appends: Sequence[Append],
                       also: Callable[[psycopg.Connection], None] | None = None) -> list[AppendOutcome]:
    """Atomically apply every append -- over several shards, in ONE transaction -- or none of them.

    Per shard, with ``actual`` its upper when locked: ``actual == lower`` adds one batch row per part and
    sets the upper to ``desc.upper``; ``actual >= desc.upper`` is a no-op success (``already_present``: a
    retried append of the same description succeeds); ``lower < actual < desc.upper`` raises
    ``UpperMismatch`` and ``actual < lower`` raises ``ShardModified``, both carrying ``actual`` and
    changing nothing in any shard. Several appends to one shard apply in the order given. A part path
    that a batch already references raises ``PartAlreadyReferenced``. Returns one outcome per append,
    in the order given. ``also(conn)``, when given, runs inside the same transaction if any append
    applied (state that must move with the shards, like the upsert state); if it raises, nothing changes.
    """
    appends = list(appends)
    seen: set[str] = set()
    for a in appends:
        validate_shard_id(a.shard)
        _check_parts(a)
        check_versions(a.shard, a.schemas, a.desc.lower, a.desc.upper)
        for p in a.parts:
            if p.path in seen:
                raise PartAlreadyReferenced(a.shard, p.path, None)
            seen.add(p.path)
    if not appends:
        return []
    ids = sorted({a.shard for a in appends})
    outcomes: list[AppendOutcome] = []
    with conn.transaction():
        # lock in one fixed order (byte order of the ids), so concurrent appenders never deadlock
        rows = conn.execute('SELECT id, upper FROM reclock.shards WHERE id = ANY(%s) ORDER BY id COLLATE "C" '
                            "FOR UPDATE", (ids,)).fetchall()
        uppers = dict(rows)
        for s in ids:
            if s not in uppers:
                raise UnknownShard(s)
        before = dict(uppers)
        new_rows = []
        for a in appends:
            actual, d = uppers[a.shard], a.desc
            if actual == d.lower:
                uppers[a.shard] = d.upper
                new_rows += _batch_rows(a)
                outcomes.append(AppendOutcome(a.shard, APPENDED, d.upper))
            elif actual >= d.upper:
                outcomes.append(AppendOutcome(a.shard, ALREADY_PRESENT, actual))
            elif actual > d.lower:
                raise UpperMismatch(a.shard, d.lower, actual, "another writer advanced it part of the way; "
                                    "nothing was appended to any shard, the next cycle re-mints from the actual upper")
            else:
                raise ShardModified(a.shard, d.lower, actual, "the shard is behind the description: it was "
                                    "modified under us; nothing was appended to any shard")
        _insert_batch_rows(conn, new_rows)
        for a, o in zip(appends, outcomes):
            if o.status == APPENDED:
                insert_versions(conn, a.shard, a.schemas)  # with the parts that need them, or not at all
        for s in ids:
            if uppers[s] != before[s]:
                conn.execute("UPDATE reclock.shards SET upper = %s WHERE id = %s", (uppers[s], s))
        if also is not None and any(o.status == APPENDED for o in outcomes):
            also(conn)
    return outcomes


def batches(conn, shard: str, as_of: int | None = None) -> list[BatchRow]:
    """The batch rows (parts) of ``shard`` in ``(lower, path)`` order.

    With ``as_of = t``, the parts a read AS OF ``t`` needs: those appended under a description with
    ``lower <= t`` (a part holds updates at ``ts >= lower`` only) whose earliest update is at or before
    ``t``. ``since <= t < upper`` is required:
    ``SinceViolation`` below since, ``BeyondUpper`` at or above the upper. Read in one statement, so
    the bounds and the parts come from one snapshot.
    """
    if as_of is not None:
        check_timestamp(as_of)
    rows = conn.execute(
        "SELECT s.upper, s.since, b.shard, b.lower, b.upper, b.path, b.rows, b.bytes, b.min_ts, b.max_ts "
        "FROM reclock.shards s LEFT JOIN reclock.shard_batches b "
        "  ON b.shard = s.id AND (%(t)s::bigint IS NULL OR (b.lower <= %(t)s::bigint "
        "                                          AND (b.min_ts IS NULL OR b.min_ts <= %(t)s::bigint))) "
        'WHERE s.id = %(s)s ORDER BY b.lower, b.path COLLATE "C"', {"s": shard, "t": as_of}).fetchall()
    if not rows:
        raise UnknownShard(shard)
    upper, since = rows[0][0], rows[0][1]
    if as_of is not None:
        if as_of < since:
            raise SinceViolation(shard, as_of, since)
        if as_of >= upper:
            raise BeyondUpper(shard, as_of, upper)
    return [BatchRow(*r[2:]) for r in rows if r[2] is not None]


def _lock_shard(conn, shard: str) -> tuple[int, int]:
    row = conn.execute("SELECT upper, since FROM reclock.shards WHERE id = %s FOR UPDATE", (shard,)).fetchone()
    if row is None:
        raise UnknownShard(shard)
    return row


_LIVE = "(expires_at IS NULL OR expires_at > now())"
"""A hold in effect: no expiry, or a lease not yet lapsed."""


def _hold(conn, shard: str, holder: str) -> ReadHold | None:
    row = conn.execute("SELECT shard, holder, ts, updated_at, expires_at FROM reclock.read_holds "
                       f"WHERE shard = %s AND holder = %s AND {_LIVE}", (shard, holder)).fetchone()
    return ReadHold(*row) if row else None


def acquire_read_hold(conn, shard: str, holder: str, ts: int, lease_s: float | None = None) -> ReadHold:
    """Pin ``shard``'s since at or below ``ts`` for ``holder`` (``ts >= since`` is required, else
    ``SinceViolation``). Acquiring again replaces the holder's hold (still at or above since). With
    ``lease_s`` the hold lapses that many seconds from now unless renewed (:func:`renew_read_hold`): a
    reader that dies pins nothing for long."""
    check_timestamp(ts)
    if not holder:
        raise ValueError(f"shard {shard}: a read hold needs a holder name")
    if lease_s is not None and lease_s <= 0:
        raise ValueError(f"shard {shard}: a read hold's lease must be positive, got {lease_s}")
    with conn.transaction():
        _, since = _lock_shard(conn, shard)  # serializes with advance_since
        if ts < since:
            raise SinceViolation(shard, ts, since)
        conn.execute("INSERT INTO reclock.read_holds (shard, holder, ts, expires_at) VALUES (%s, %s, %s, "
                     "now() + make_interval(secs => %s)) ON CONFLICT (shard, holder) DO UPDATE "
                     "SET ts = excluded.ts, updated_at = now(), created_at = now(), expires_at = excluded.expires_at",
                     (shard, holder, ts, lease_s))
        return _hold(conn, shard, holder)


def renew_read_hold(conn, shard: str, holder: str, lease_s: float) -> ReadHold:
    """Extend ``holder``'s leased hold to ``lease_s`` seconds from now; ``UnknownReadHold`` if it has none in
    effect (released, or lapsed: since may have passed it, and the reader must start again)."""
    with conn.transaction():
        row = conn.execute("UPDATE reclock.read_holds SET expires_at = now() + make_interval(secs => %s) "
                           f"WHERE shard = %s AND holder = %s AND expires_at IS NOT NULL AND {_LIVE} RETURNING 1",
                           (lease_s, shard, holder)).fetchone()
        if row is None:
            raise UnknownReadHold(shard, holder)
        return _hold(conn, shard, holder)


def drop_lapsed_holds(conn) -> int:
    """Delete the leased holds that lapsed (their readers stopped renewing them); return how many."""
    with conn.transaction():
        return conn.execute("DELETE FROM reclock.read_holds WHERE expires_at <= now()").rowcount


def downgrade_read_hold(conn, shard: str, holder: str, ts: int) -> ReadHold:
    """Move ``holder``'s hold forward to ``ts`` (a hold only moves forward: an earlier ``ts`` leaves it
    where it is); return the hold in effect. ``UnknownReadHold`` if ``holder`` has none."""
    check_timestamp(ts)
    with conn.transaction():
        conn.execute("UPDATE reclock.read_holds SET ts = %s, updated_at = now() "
                     f"WHERE shard = %s AND holder = %s AND ts < %s AND {_LIVE}", (ts, shard, holder, ts))
        hold = _hold(conn, shard, holder)
        if hold is None:
            raise UnknownReadHold(shard, holder)
        return hold


def release_read_hold(conn, shard: str, holder: str) -> bool:
    """Drop ``holder``'s hold; True if there was one."""
    with conn.transaction():
        return conn.execute("DELETE FROM reclock.read_holds WHERE shard = %s AND holder = %s",
                            (shard, holder)).rowcount > 0


def read_holds(conn, shard: str) -> list[ReadHold]:
    """Every read hold in effect on ``shard`` (lapsed leases are not), by holder."""
    return [ReadHold(*r) for r in conn.execute(
        "SELECT shard, holder, ts, updated_at, expires_at FROM reclock.read_holds "
        f"WHERE shard = %s AND {_LIVE} ORDER BY holder", (shard,))]


def advance_since(conn, shard: str, since: int) -> int:
    """Advance ``shard``'s since towards ``since``: the new since is ``min(since, every hold's ts,
    upper)``, and never below the current one. Returns the since in effect."""
    check_timestamp(since)
    with conn.transaction():
        upper, current = _lock_shard(conn, shard)
        (hold,) = conn.execute(f"SELECT min(ts) FROM reclock.read_holds WHERE shard = %s AND {_LIVE}",
                               (shard,)).fetchone()
        target = min(since, upper) if hold is None else min(since, upper, hold)
        target = max(target, current)
        if target != current:
            conn.execute("UPDATE reclock.shards SET since = %s WHERE id = %s", (target, shard))
    return target


@dataclass(frozen=True)
class Swap:
    """Replace ``old`` -- exactly ``shard``'s batch rows whose descriptions meet ``[desc.lower, desc.upper)``
    -- by ``parts`` under ``desc`` (a windowed rebuild; no parts: the window holds no updates)."""

    shard: str
    old: tuple[BatchRow, ...]
    desc: BatchDescription
    parts: tuple[Part, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "old", tuple(self.old))
        object.__setattr__(self, "parts", tuple(self.parts))


def window_rows(conn, shard: str, lower: int, upper: int) -> list[BatchRow]:
    """``shard``'s batch rows whose descriptions meet ``[lower, upper)`` (``b.lower < upper and b.upper >
    lower``), in ``(lower, path)`` order."""
    return [BatchRow(shard, *r) for r in conn.execute(
        "SELECT lower, upper, path, rows, bytes, min_ts, max_ts FROM reclock.shard_batches "
        'WHERE shard = %s AND lower < %s AND upper > %s ORDER BY lower, path COLLATE "C"', (shard, upper, lower))]


def swap_batches(conn, swaps: Sequence[Swap]) -> str:
    """Swap, in ONE transaction over every listed shard, each swap's ``old`` rows for its parts.

    A swap's window must lie below its shard's upper (the updates there are final; appends above it go on
    meanwhile) and cover its old rows' descriptions whole; a window's parts must hold updates in the window
    only. Locks the shard rows in the fixed order; if any shard's rows meeting its window are no longer
    exactly ``old`` (a compaction or another rebuild replaced some), nothing changes and the result is
    ``"conflict"``; else ``"swapped"``. The old parts are retired (garbage after the grace period).
    """
    swaps = list(swaps)
    ids = sorted({s.shard for s in swaps})
    if len(ids) != len(swaps):
        raise ValueError("swap_batches takes one swap per shard")
    for s in swaps:
        validate_shard_id(s.shard)
        _check_parts(Append(s.shard, s.desc, s.parts))
        for r in s.old:
            if r.shard != s.shard or r.lower < s.desc.lower or r.upper > s.desc.upper:
                raise ValueError(f"shard {s.shard}: batch row [{r.lower}, {r.upper}) {r.path} is not inside the "
                                 f"window [{s.desc.lower}, {s.desc.upper}) that replaces it")
    with conn.transaction():
        uppers = dict(conn.execute('SELECT id, upper FROM reclock.shards WHERE id = ANY(%s) ORDER BY id COLLATE "C" '
                                   "FOR UPDATE", (ids,)).fetchall())
        for s in swaps:
            if s.shard not in uppers:
                raise UnknownShard(s.shard)
            if s.desc.upper > uppers[s.shard]:
                raise ValueError(f"shard {s.shard}: window [{s.desc.lower}, {s.desc.upper}) reaches beyond the "
                                 f"upper {uppers[s.shard]}")
            if set(window_rows(conn, s.shard, s.desc.lower, s.desc.upper)) != set(s.old):
                return CONFLICT
        for s in swaps:
            conn.execute("DELETE FROM reclock.shard_batches WHERE shard = %s AND path = ANY(%s)",
                         (s.shard, [r.path for r in s.old]))
            _retire(conn, [r.path for r in s.old])
        _insert_batch_rows(conn, [r for s in swaps for r in _batch_rows(Append(s.shard, s.desc, s.parts))])
    return SWAPPED


def _rebuild_key(source: str) -> str:
    return f"reclock.rebuild:{source}"


@contextlib.contextmanager
def holding_rebuild_lock(dsn: str, source: str) -> Iterator[None]:
    """Hold ``source``'s rebuild lock (a Postgres advisory lock on a connection of its own, so a rebuild that
    dies releases it with its connection) while the block runs: compaction of the source's shards waits, and
    a second rebuild of the source waits for this one. Waits for a compaction under way to end."""
    from reclock.persist import connect

    with connect(dsn) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (_rebuild_key(source),))
        try:
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_rebuild_key(source),))


class WriteLock:
    """``source``'s write lock (a Postgres advisory lock on a connection of its own): a writer holds it while
    its ``write_batches`` step runs, so a process that dies mid-write releases it with its connection, and a
    writer that gets it knows no live writer of the source is writing (``reclock.spark.orphans``). Taken on
    demand (:meth:`take`), never waited for; released by :meth:`release`."""

    def __init__(self, dsn: str, source: str) -> None:
        self.dsn = dsn
        self.source = source
        self._conn: psycopg.Connection | None = None

    def take(self) -> bool:
        """Try the lock; whether this writer holds it now. A consensus store that cannot be reached says no
        (the step's own work then finds out)."""
        from reclock.persist import connect

        if self._conn is not None:
            return True
        try:
            conn = connect(self.dsn)
        except psycopg.Error:
            return False
        try:
            (got,) = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (_write_key(self.source),)).fetchone()
        except psycopg.Error:
            got = False
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        """Release the lock (closing its connection releases it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _write_key(source: str) -> str:
    return f"reclock.write:{source}"


@contextlib.contextmanager
def compacting(conn, source: str | None) -> Iterator[bool]:
    """While the block runs, hold ``source``'s rebuild lock shared, if no rebuild holds it; yields whether it
    got it (False: a rebuild of the source is under way, and compaction leaves its shards alone)."""
    if source is None:
        yield True
        return
    (got,) = conn.execute("SELECT pg_try_advisory_lock_shared(hashtext(%s))", (_rebuild_key(source),)).fetchone()
    try:
        yield bool(got)
    finally:
        if got:
            conn.execute("SELECT pg_advisory_unlock_shared(hashtext(%s))", (_rebuild_key(source),))


def _retire(conn, paths: Sequence[str]) -> None:
    """Record that ``paths`` lost their batch rows now: garbage collection waits its grace period from here."""
    if paths:
        conn.execute("INSERT INTO reclock.retired_parts (path) SELECT unnest(%s::text[]) "
                     "ON CONFLICT (path) DO UPDATE SET retired_at = now()", (list(paths),))


def merge_batches(conn, shard: str, merges: Sequence[Merge]) -> str:
    """Swap batch rows of ``shard`` for the parts that merge them, in ONE transaction (what compaction does).

    Each merge replaces its ``old`` rows by its ``parts``, appended under ``desc``, which must be
    ``[min lower, max upper)`` of the old rows with ``upper <= since + 1``: only parts whose updates all lie
    at or below the shard's since are merged (their times may be advanced to ``desc.upper - 1``, and no read
    at or after since can tell). Locks the shard row; if any old row is no longer there exactly as given (a
    rebuild's ``swap_batches`` or another compaction replaced it), nothing changes and the result is
    ``"conflict"`` (the merged parts become garbage); else ``"merged"``. The old parts are no longer
    referenced; garbage collection removes them after its grace period.
    """
    validate_shard_id(shard)
    merges = list(merges)
    old = [r for mg in merges for r in mg.old]
    if not merges:
        raise ValueError(f"shard {shard}: nothing to merge")
    if len({r.path for r in old}) != len(old):
        raise ValueError(f"shard {shard}: a batch row can be merged once, not twice")
    for mg in merges:
        if not mg.old:
            raise ValueError(f"shard {shard}: a merge needs the batch rows it replaces")
        if any(r.shard != shard for r in mg.old):
            raise ValueError(f"shard {shard}: a merge can only replace the shard's own batch rows")
        want = (min(r.lower for r in mg.old), max(r.upper for r in mg.old))
        if (mg.desc.lower, mg.desc.upper) != want:
            raise ValueError(f"shard {shard}: merged parts go under [{want[0]}, {want[1]}), the span of the rows "
                             f"they replace, not [{mg.desc.lower}, {mg.desc.upper})")
        _check_parts(Append(shard, mg.desc, mg.parts))
    with conn.transaction():
        _, since = _lock_shard(conn, shard)  # serializes with appends, rebuilds and other merges
        for mg in merges:
            if mg.desc.upper > since + 1:
                raise ValueError(f"shard {shard}: cannot merge parts under [{mg.desc.lower}, {mg.desc.upper}): "
                                 f"their updates are not all at or below since {since}")
        current = {BatchRow(shard, *r) for r in conn.execute(
            "SELECT lower, upper, path, rows, bytes, min_ts, max_ts FROM reclock.shard_batches "
            "WHERE shard = %s AND path = ANY(%s)", (shard, [r.path for r in old]))}
        if current != set(old):
            return CONFLICT
        conn.execute("DELETE FROM reclock.shard_batches WHERE shard = %s AND path = ANY(%s)",
                     (shard, [r.path for r in old]))
        _retire(conn, [r.path for r in old])
        _insert_batch_rows(conn, [r for mg in merges for r in _batch_rows(Append(shard, mg.desc, mg.parts))])
    return MERGED
