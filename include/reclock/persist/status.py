"""Statistics and status history rows, per source, sink or shard (``name``).

``reclock.status_history(name, status, error, at, step, run_id, trace)``: status is one of starting,
running, stalled (with the error: one line, and a short trace beside it), failed, paused; the step it was
recorded at and the Airflow run that recorded it; the latest row is the current status. A row that would
repeat the newest one (the same status, error and run) updates it instead (its step and time), so a cycle
leaves one ``running`` row, not one per step. ``reclock.statistics(name, step, metrics,
at)``: what one step of a cycle did (records, bytes, updates staged and committed, offsets ...).

Both are history, kept for a while and then pruned (:func:`prune_history`, run by resume's garbage-collection
pass), so a source that cycles every second does not grow them without bound. The newest row of each name
(status) and of each name and step (statistics) is always kept: an idle sink's frontier and a stalled
source's error stay readable however old they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

from reclock.redaction import redact

STATUSES = ("starting", "running", "stalled", "failed", "paused")


@dataclass(frozen=True)
class Status:
    name: str
    status: str
    error: str | None
    at: datetime
    step: str | None = None
    run_id: str | None = None
    trace: str | None = None


@dataclass(frozen=True)
class Statistics:
    name: str
    step: str
    metrics: dict
    at: datetime


COLUMNS = "status, error, at, step, run_id, trace"
"""The columns a :class:`Status` is read from, after its name."""


def record_status(conn, name: str, status: str, error: str | None = None, *, step: str | None = None,
                  run_id: str | None = None, trace: str | None = None) -> None:
    """Record ``name``'s status: a new row, or, when the newest row has the same status, error and run, that
    row's step, trace and time updated; ``ValueError`` for a status not in :data:`STATUSES`. The error and
    trace are kept with any credential they quote masked (:func:`reclock.redaction.redact`)."""
    if status not in STATUSES:
        raise ValueError(f"{name}: status {status!r} is not one of {', '.join(STATUSES)}")
    error, trace = redact(error), redact(trace)
    with conn.transaction():
        updated = conn.execute(
            "UPDATE reclock.status_history SET step = %s, trace = %s, at = now() WHERE id = (SELECT id FROM "
            "reclock.status_history WHERE name = %s ORDER BY id DESC LIMIT 1) AND status = %s AND error IS NOT "
            "DISTINCT FROM %s AND run_id IS NOT DISTINCT FROM %s", (step, trace, name, status, error, run_id)).rowcount
        if not updated:
            conn.execute("INSERT INTO reclock.status_history (name, status, error, step, run_id, trace) "
                         "VALUES (%s, %s, %s, %s, %s, %s)", (name, status, error, step, run_id, trace))


def latest_status(conn, name: str) -> Status | None:
    """The newest status row of ``name`` (None if there is none)."""
    row = conn.execute(f"SELECT {COLUMNS} FROM reclock.status_history WHERE name = %s "
                       "ORDER BY id DESC LIMIT 1", (name,)).fetchone()
    return Status(name, *row) if row else None


def status_history(conn, name: str, limit: int = 20) -> list[Status]:
    """The newest ``limit`` status rows of ``name``, newest first."""
    return [Status(name, *r) for r in conn.execute(
        f"SELECT {COLUMNS} FROM reclock.status_history WHERE name = %s ORDER BY id DESC LIMIT %s",
        (name, limit))]


def record_statistics(conn, name: str, step: str, metrics: dict) -> None:
    """Append one step's metrics (any JSON-serializable dict)."""
    with conn.transaction():
        conn.execute("INSERT INTO reclock.statistics (name, step, metrics) VALUES (%s, %s, %s)",
                     (name, step, Jsonb(metrics)))


def latest_statistics(conn, name: str, step: str | None = None, limit: int = 20) -> list[Statistics]:
    """The newest ``limit`` statistics rows of ``name`` (of one ``step`` if given), newest first."""
    return [Statistics(name, *r) for r in conn.execute(
        "SELECT step, metrics, at FROM reclock.statistics WHERE name = %s AND (%s::text IS NULL OR step = %s) "
        "ORDER BY id DESC LIMIT %s", (name, step, step, limit))]


PRUNE_BATCH = 50_000
"""Rows of each table deleted at most per :func:`prune_history` call: the first pass over a long history
stays short, and the next passes take the rest."""


def prune_history(conn, keep_seconds: float, batch: int = PRUNE_BATCH) -> tuple[int, int]:
    """Delete statistics and status rows older than ``keep_seconds`` (at most ``batch`` of each), keeping the
    newest status row of every name and the newest statistics row of every name and step; returns the
    numbers of statistics and status rows deleted."""
    if keep_seconds < 0:
        raise ValueError(f"keep_seconds must not be negative, got {keep_seconds}")
    with conn.transaction():
        stats = conn.execute(
            "DELETE FROM reclock.statistics WHERE id IN (SELECT s.id FROM reclock.statistics s "
            "WHERE s.at < now() - make_interval(secs => %s) AND EXISTS (SELECT 1 FROM reclock.statistics n "
            "WHERE n.name = s.name AND n.step = s.step AND n.id > s.id) LIMIT %s)",
            (float(keep_seconds), batch)).rowcount
        status = conn.execute(
            "DELETE FROM reclock.status_history WHERE id IN (SELECT s.id FROM reclock.status_history s "
            "WHERE s.at < now() - make_interval(secs => %s) AND EXISTS (SELECT 1 FROM reclock.status_history n "
            "WHERE n.name = s.name AND n.id > s.id) LIMIT %s)",
            (float(keep_seconds), batch)).rowcount
    return stats, status
