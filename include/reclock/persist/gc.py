"""Garbage collection of parts no batch references (failed or superseded writes), after a grace period
that lets in-flight writes reach their ``compare_and_append``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from reclock.persist.blob import BlobStore


@dataclass(frozen=True)
class GcReport:
    scanned: int
    referenced: int
    deleted: int
    deleted_bytes: int
    kept_young: int


def collect_garbage(conn, blob: BlobStore, prefix: str, grace_seconds: float, now: float | None = None) -> GcReport:
    """Delete blobs under ``prefix`` that no batch row references and that are older than the grace
    period. A referenced part is never deleted. ``prefix`` is a source's (or shard's) folder."""
    now = time.time() if now is None else now
    blobs = blob.list(prefix)
    referenced = {p for (p,) in conn.execute("SELECT path FROM reclock.shard_batches WHERE path LIKE %s",
                                              (prefix.rstrip("/") + "/%",))}
    deleted = deleted_bytes = young = ref = 0
    for b in blobs:
        if b.path in referenced:
            ref += 1
        elif now - b.mtime < grace_seconds:
            young += 1
        else:
            blob.delete(b.path)
            deleted += 1
            deleted_bytes += b.size
    return GcReport(len(blobs), ref, deleted, deleted_bytes, young)
