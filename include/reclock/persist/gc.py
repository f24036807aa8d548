"""Garbage collection of parts no batch references: failed writes, the parts of a replay whose
range was ``already_present``, and the parts a rebuild (``swap_batches``) or a compaction
(``merge_batches``) replaced.

A part is written before its ``compare_and_append``, so an unreferenced part may be one that is about to
be appended: only blobs older than the grace period are deleted. The grace period must exceed the
longest time from writing a part to appending it (a cycle's write_batches + append, a compaction's merge).
A part that any batch row references -- of any shard -- is never deleted. A part that a rebuild or a
compaction replaced is recorded in ``reclock.retired_parts`` with the time it lost its batch row, and its
grace period counts from then (a reader that listed the shard's parts just before the swap may still be
opening it); any other unreferenced blob's counts from its write time (mtime).

A write leases the folder it writes under (:func:`lease_write`) until its parts are appended or swapped in
(:func:`release_write`), renewing the lease after each Spark job: a leased folder is left alone while its
lease is younger than the grace period, so a long write (a rebuild over a long history) never loses the
parts it wrote first. A lease its writer did not release (the process died) stops protecting anything once
:data:`LEASE_SECONDS` (or the grace period, if longer) have passed since its last renewal, and goes with
the next collection. A write that takes parts another write left (a retry taking an earlier write's slice)
leases their folder by a key of its own (:func:`lease_key`), so one holder's release leaves another's.

A reader of a collection (``reclock.tables``: Spark, DuckDB) takes a leased read hold and then lists the
parts it reads: a part retired after the oldest such hold in effect was taken may be on a reader's list,
so it stays while that hold does, however long the read takes.

Garbage collection runs in operations: the cycle's resume step runs :func:`collect_garbage` over a
source's folders at most every ``gc_interval`` (:func:`claim_gc`); it can also be run by hand.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, ContextManager

from reclock.persist.blob import BlobStore, _check_rel


LEASE_SECONDS = 3600.0
"""A write's lease protects its folder until this long after its last renewal (or the grace period, if
longer). A writer renews it after every Spark job, and no job of a budget-sized slice takes this long."""


@dataclass(frozen=True)
class GcReport:
    scanned: int  # blobs found under the prefix
    referenced: int  # kept: a batch references them
    kept_young: int  # kept: unreferenced but younger than the grace period
    kept_leased: int  # kept: under the folder of a write whose lease is fresh
    kept_read: int  # kept: retired after a reader's hold in effect was taken (the reader may be reading it)
    deleted: int
    deleted_bytes: int


def _referenced(conn, prefix: str) -> set[str]:
    # paths p with prefix <= p < prefix' where prefix' is prefix with its last byte ('/') bumped to '0'
    lo, hi = prefix, prefix[:-1] + "0"
    return {p for (p,) in conn.execute(
        'SELECT path FROM reclock.shard_batches WHERE path COLLATE "C" >= %s AND path COLLATE "C" < %s', (lo, hi))}


def _retired(conn, prefix: str) -> dict[str, float]:
    """Path -> when it lost its batch row (seconds since the epoch), for the retired parts under ``prefix``."""
    lo, hi = prefix, prefix[:-1] + "0"
    return {p: float(at) for p, at in conn.execute(
        'SELECT path, extract(epoch FROM retired_at) FROM reclock.retired_parts '
        'WHERE path COLLATE "C" >= %s AND path COLLATE "C" < %s', (lo, hi))}


def _oldest_reader(conn) -> float | None:
    """When the oldest reader's hold in effect was taken (seconds since the epoch), None if there is none."""
    (at,) = conn.execute("SELECT extract(epoch FROM min(created_at)) FROM reclock.read_holds "
                         "WHERE expires_at > now()").fetchone()
    return None if at is None else float(at)


HOLDER_MARK = "\\"
"""Between a folder and the write holding it in a lease's key (:func:`lease_key`): never in a blob path."""


def lease_key(folder: str, holder: str | None = None) -> str:
    """The key of a lease on ``folder``: the folder itself for the write that puts parts there, and
    ``folder\\holder`` for a write ``holder`` (its own folder) that takes parts another write left there (a
    retry taking an earlier write's slice, ``reclock.persist.staged``). Two writes taking the same parts (a
    try a fault left running and its retry) hold them by two leases: one's release leaves the other's."""
    return _check_rel(folder) if holder is None else f"{_check_rel(folder)}{HOLDER_MARK}{_check_rel(holder)}"


def leased_folder(key: str) -> str:
    """The folder a lease's ``key`` (:func:`lease_key`) protects."""
    return key.split(HOLDER_MARK, 1)[0]


def lease_write(conn, source: str, prefix: str, holder: str | None = None) -> None:
    """Lease the folder ``prefix`` for a write of ``source`` that is about to put parts there, or, with
    ``holder``, for the write whose folder is ``holder`` that takes parts already there (:func:`lease_key`);
    or renew the lease: :func:`collect_garbage` leaves the folder alone while a lease on it is fresh."""
    conn.execute("INSERT INTO reclock.write_leases (prefix, source) VALUES (%s, %s) "
                 "ON CONFLICT (prefix) DO UPDATE SET renewed_at = now()", (lease_key(prefix, holder), source))


def release_write(conn, *keys: str) -> None:
    """End the leases ``keys`` (:func:`lease_key`: a folder, for the write that wrote there) of a write whose
    parts are appended or swapped in (or became garbage)."""
    if keys:
        conn.execute("DELETE FROM reclock.write_leases WHERE prefix = ANY(%s)", (list(keys),))


def release_quietly(connect: Callable[[], ContextManager], *keys: str) -> None:
    """:func:`release_write` on a connection of its own (``connect()``), any error suppressed: a write whose
    parts became garbage on its way to failing lets them go; a lease left behind only keeps them until it
    goes stale."""
    if keys:
        with contextlib.suppress(Exception), connect() as conn:
            release_write(conn, *keys)


def claim_gc(conn, source: str, interval_seconds: float) -> bool:
    """Whether the caller should collect ``source``'s garbage now: true at most once every
    ``interval_seconds`` (the claim is one atomic update, so concurrent callers never both run)."""
    return conn.execute(
        "UPDATE reclock.sources SET gc_at = now() WHERE name = %s "
        "AND (gc_at IS NULL OR gc_at <= now() - make_interval(secs => %s)) RETURNING 1",
        (source, float(interval_seconds))).fetchone() is not None


def _leases(conn, prefix: str) -> dict[str, float]:
    """Lease key (:func:`lease_key`) -> when it was last renewed (seconds since the epoch), for the leases
    under ``prefix``."""
    lo, hi = prefix, prefix[:-1] + "0"
    return {p: float(at) for p, at in conn.execute(
        'SELECT prefix, extract(epoch FROM renewed_at) FROM reclock.write_leases '
        'WHERE prefix COLLATE "C" >= %s AND prefix COLLATE "C" < %s', (lo, hi))}


def collect_garbage(conn, blob: BlobStore, prefix: str, grace_seconds: float,
                    now: float | None = None) -> GcReport:
    """Delete the blobs under the folder ``prefix`` that no batch row references and that became garbage
    more than ``grace_seconds`` before ``now`` (default: the current time): a retired part (replaced by a
    rebuild or a compaction) when it was retired, any other blob when it was written (its mtime).

    ``prefix`` is the folder the parts were written under: a shard id for :func:`new_part_path` parts,
    or a source name for the cycle's parts (one Spark write holds the parts of all the source's shards).
    The blobs are listed *before* the references are read, so a part appended after the listing is
    never mistaken for garbage. A blob inside a referenced path (a part written as a folder) counts as
    referenced.
    """
    prefix = _check_rel(prefix.rstrip("/")) + "/"
    if grace_seconds < 0:
        raise ValueError(f"grace_seconds must not be negative, got {grace_seconds}")
    now = time.time() if now is None else now
    blobs = blob.list(prefix)
    leases = _leases(conn, prefix)  # read after the listing: a write leases its folder before writing
    referenced = _referenced(conn, prefix)
    retired = _retired(conn, prefix)
    reader = _oldest_reader(conn)
    live = {k for k, at in leases.items() if now - at < max(grace_seconds, LEASE_SECONDS)}
    fresh = {leased_folder(k) for k in live}
    deleted = deleted_bytes = young = leased = ref = read = 0
    gone: list[str] = []
    for b in blobs:
        parents = b.path.split("/")
        paths = [b.path, *("/".join(parents[:i]) for i in range(1, len(parents)))]
        since = max([b.mtime, *(retired[p] for p in paths if p in retired)])
        if any(p in referenced for p in paths):
            ref += 1
        elif any(p in fresh for p in paths):
            leased += 1
        elif now - since < grace_seconds:
            young += 1
        elif reader is not None and any(retired.get(p, -math.inf) >= reader for p in paths):
            read += 1
        else:
            blob.delete(b.path)
            gone.append(b.path)
            deleted += 1
            deleted_bytes += b.size
    # a retired part's row goes once no blob is left at or under its path
    left = {b.path for b in blobs} - set(gone)
    done = [r for r in retired if not any(p == r or p.startswith(r + "/") for p in left)]
    if done:
        conn.execute("DELETE FROM reclock.retired_parts WHERE path = ANY(%s)", (done,))
    stale = [k for k in leases if k not in live]
    if stale:
        conn.execute("DELETE FROM reclock.write_leases WHERE prefix = ANY(%s)", (stale,))
    return GcReport(scanned=len(blobs), referenced=ref, kept_young=young, kept_leased=leased, kept_read=read,
                    deleted=deleted, deleted_bytes=deleted_bytes)
