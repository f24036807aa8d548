"""Statistics and status history rows (per source, sink or shard)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

STATUSES = ("starting", "running", "stalled", "failed", "paused")


@dataclass(frozen=True)
class Status:
    name: str
    status: str
    error: str | None
    at: datetime


def record_status(conn, name: str, status: str, error: str | None = None) -> None:
    if status not in STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    with conn.transaction():
        conn.execute("INSERT INTO reclock.status_history (name, status, error) VALUES (%s, %s, %s)",
                     (name, status, error))


def latest_status(conn, name: str) -> Status | None:
    row = conn.execute("SELECT status, error, at FROM reclock.status_history WHERE name = %s "
                       "ORDER BY id DESC LIMIT 1", (name,)).fetchone()
    return Status(name, *row) if row else None


def record_statistics(conn, name: str, step: str, metrics: dict) -> None:
    with conn.transaction():
        conn.execute("INSERT INTO reclock.statistics (name, step, metrics) VALUES (%s, %s, %s)",
                     (name, step, Jsonb(metrics)))
