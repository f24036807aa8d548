"""The S3 source's catalog in Postgres: the object versions it knows (``reclock.s3_objects``) and its
listing position (``reclock.s3_sources``); see migration ``0009_s3_objects.sql``.

A mint's discovery writes it *before* it appends the binding that covers the new objects (the binding's
frontier is :func:`reclock.sources.s3.discovery.frontier_of` the catalog, joined with the last one): a
binding whose append fails leaves rows that the next mint binds. Concurrent discoveries of one source
serialise on its ``s3_sources`` row; each reconciles against what the other left.

Rows are dropped (*forgotten*) in resume, once the remap collection's frontier at its since seals them
(no description reads them again) and no listing or notification can name them again
(:func:`reclock.sources.s3.discovery.forgettable`); the source row keeps their count, bytes and a digest
of their ``(key, ETag, size)``, so a full listing can be checked against what was ingested
(:func:`digest`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Sequence

from reclock.sources.s3.discovery import Known, Plan, State

_COLS = "id, key, etag, size, modified_ms, seen_ms, state, complete, version, previous_etag, base, own"


@dataclass(frozen=True)
class SourceRow:
    next_id: int = 1
    next_base: int = 0
    start_after: str | None = None
    backfilled: bool = False
    forgotten: int = 0
    forgotten_bytes: int = 0
    forgotten_digest: int = 0
    forgotten_upto: str | None = None


def _known(row) -> Known:
    i, key, etag, size, modified, seen, state, complete, version, previous, base, own = row
    return Known(i, key, etag, size, modified, seen, State(state), complete, version, previous, base, own)


def ensure(conn, source: str) -> None:
    conn.execute("INSERT INTO reclock.s3_sources (source) VALUES (%s) ON CONFLICT DO NOTHING", (source,))


def source_row(conn, source: str, lock: bool = False) -> SourceRow:
    row = conn.execute("SELECT next_id, next_base, start_after, backfilled, forgotten, forgotten_bytes, forgotten_digest, "
                       "forgotten_upto FROM reclock.s3_sources WHERE source = %s" + (" FOR UPDATE" if lock else ""),
                       (source,)).fetchone()
    return SourceRow() if row is None else SourceRow(*row)


def rows(conn, source: str, after: str | None = None) -> list[Known]:
    """Every catalog row of ``source`` (with a key after ``after``, if given), in id order."""
    if after is None:
        cur = conn.execute(f"SELECT {_COLS} FROM reclock.s3_objects WHERE source = %s ORDER BY id", (source,))
    else:
        cur = conn.execute(f"SELECT {_COLS} FROM reclock.s3_objects WHERE source = %s AND key > %s ORDER BY id",
                           (source, after))
    return [_known(r) for r in cur.fetchall()]


def rows_upto(conn, source: str, upto: str) -> list[Known]:
    """The rows with a key at or before ``upto`` (what a key frontier has passed)."""
    cur = conn.execute(f"SELECT {_COLS} FROM reclock.s3_objects WHERE source = %s AND key <= %s ORDER BY id",
                       (source, upto))
    return [_known(r) for r in cur.fetchall()]


def for_keys(conn, source: str, keys: Iterable[str]) -> list[Known]:
    """The rows of ``keys`` (every version kept)."""
    wanted = sorted(set(keys))
    if not wanted:
        return []
    cur = conn.execute(f"SELECT {_COLS} FROM reclock.s3_objects WHERE source = %s AND key = ANY(%s) ORDER BY id",
                       (source, wanted))
    return [_known(r) for r in cur.fetchall()]


def own_rows(conn, source: str) -> list[Known]:
    """The rows bound in partitions of their own (files bound while they grew)."""
    cur = conn.execute(f"SELECT {_COLS} FROM reclock.s3_objects WHERE source = %s AND own ORDER BY id", (source,))
    return [_known(r) for r in cur.fetchall()]


def in_log(conn, source: str, lo: int, hi: int) -> list[Known]:
    """The rows placed in the log at positions that meet ``[lo, hi)`` (what a description's log range
    reads), in log order."""
    cur = conn.execute(f"SELECT {_COLS} FROM reclock.s3_objects WHERE source = %s AND base < %s AND base >= "
                       "coalesce((SELECT max(base) FROM reclock.s3_objects WHERE source = %s AND base <= %s), 0) "
                       "ORDER BY base", (source, hi, source, lo))
    return [_known(r) for r in cur.fetchall()]


def by_ids(conn, source: str, ids: Iterable[int]) -> dict[int, Known]:
    """The rows of ``ids`` (a missing id is simply absent: the caller decides what that means)."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    cur = conn.execute(f"SELECT {_COLS} FROM reclock.s3_objects WHERE source = %s AND id = ANY(%s)",
                       (source, wanted))
    return {r.id: r for r in map(_known, cur.fetchall())}


def apply(conn, source: str, plan: Plan, backfilled: bool | None = None) -> None:
    """Write ``plan`` (in the caller's transaction, which holds the source row's lock)."""
    if plan.added:
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO reclock.s3_objects (source, {_COLS}) VALUES "
                            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            [(source, r.id, r.key, r.etag, r.size, r.modified_ms, r.seen_ms, r.state.value,
                              r.complete, r.version, r.previous_etag, r.base, r.own) for r in plan.added])
    if plan.changed:
        with conn.cursor() as cur:
            cur.executemany("UPDATE reclock.s3_objects SET size = %s, modified_ms = %s, state = %s, complete = %s, "
                            "base = %s, own = %s WHERE source = %s AND id = %s AND state = 'open'",
                            [(r.size, r.modified_ms, r.state.value, r.complete, r.base, r.own, source, r.id)
                             for r in plan.changed])
    conn.execute("UPDATE reclock.s3_sources SET next_id = %s, next_base = %s, start_after = %s, "
                 "backfilled = coalesce(%s, backfilled) WHERE source = %s",
                 (plan.next_id, plan.next_base, plan.start_after, backfilled, source))


def digest(objects: Iterable[tuple[str, str, int]]) -> int:
    """An order-free digest of ``(key, etag, size)`` triples: the sum of their 64-bit hashes (wrapping,
    as a signed bigint). Equal sets give equal digests; a set with one object more, less or different
    almost surely does not."""
    total = 0
    for key, etag, size in objects:
        h = hashlib.blake2b(f"{key}\0{etag}\0{size}".encode(), digest_size=8).digest()
        total = (total + int.from_bytes(h, "big")) % 2**64
    return total - 2**64 if total >= 2**63 else total


def forget(conn, source: str, gone: Sequence[Known]) -> int:
    """Drop ``gone`` from the catalog, folding their count, bytes and digest into the source row."""
    if not gone:
        return 0
    row = source_row(conn, source, lock=True)
    add = digest((r.key, r.etag, r.size) for r in gone)
    total = (row.forgotten_digest + add) % 2**64
    total = total - 2**64 if total >= 2**63 else total
    upto = max([r.key for r in gone] + ([row.forgotten_upto] if row.forgotten_upto else []))
    conn.execute("DELETE FROM reclock.s3_objects WHERE source = %s AND id = ANY(%s)", (source, [r.id for r in gone]))
    conn.execute("UPDATE reclock.s3_sources SET forgotten = forgotten + %s, forgotten_bytes = forgotten_bytes + %s, "
                 "forgotten_digest = %s, forgotten_upto = %s WHERE source = %s",
                 (len(gone), sum(r.bound_size for r in gone), total, upto, source))
    return len(gone)


def counts(conn, source: str) -> dict[str, int]:
    """Catalog rows by state, and what was forgotten (for statistics and the bounded-state benchmark)."""
    out = {s.value: 0 for s in State}
    for state, n in conn.execute("SELECT state, count(*) FROM reclock.s3_objects WHERE source = %s GROUP BY state",
                                 (source,)).fetchall():
        out[state] = n
    row = source_row(conn, source)
    out["forgotten"] = row.forgotten
    return out
