"""Garbage collection of parts no batch references: failed writes, the parts of a replay whose
range was ``already_present``, and the parts a rebuild (``replace_batches``) or a compaction
(``merge_batches``) replaced.

A part is written before its ``compare_and_append``, so an unreferenced part may be one that is about to
be appended: only blobs older than the grace period are deleted. The grace period must exceed the
longest time from writing a part to appending it (a cycle's write_batches + append, a compaction's merge).
A part that any batch row references -- of any shard -- is never deleted. The age is the blob's own
(mtime): a replaced part is usually old already when it loses its last reference, so it may go at the next
collection, and a reader that listed a shard's parts just before the swap must finish within the grace
period too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from reclock.persist.blob import BlobStore, _check_rel


@dataclass(frozen=True)
class GcReport:
    scanned: int  # blobs found under the prefix
    referenced: int  # kept: a batch references them
    kept_young: int  # kept: unreferenced but younger than the grace period
    deleted: int
    deleted_bytes: int


def _referenced(conn, prefix: str) -> set[str]:
    # paths p with prefix <= p < prefix' where prefix' is prefix with its last byte ('/') bumped to '0'
    lo, hi = prefix, prefix[:-1] + "0"
    return {p for (p,) in conn.execute(
        'SELECT path FROM reclock.shard_batches WHERE path COLLATE "C" >= %s AND path COLLATE "C" < %s', (lo, hi))}


def collect_garbage(conn, blob: BlobStore, prefix: str, grace_seconds: float,
                    now: float | None = None) -> GcReport:
    """Delete the blobs under the folder ``prefix`` that no batch row references and whose mtime is more
    than ``grace_seconds`` before ``now`` (default: the current time).

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
    referenced = _referenced(conn, prefix)
    deleted = deleted_bytes = young = ref = 0
    for b in blobs:
        parents = b.path.split("/")
        if b.path in referenced or any("/".join(parents[:i]) in referenced for i in range(1, len(parents))):
            ref += 1
        elif now - b.mtime < grace_seconds:
            young += 1
        else:
            blob.delete(b.path)
            deleted += 1
            deleted_bytes += b.size
    return GcReport(scanned=len(blobs), referenced=ref, kept_young=young, deleted=deleted,
                    deleted_bytes=deleted_bytes)
