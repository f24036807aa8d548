"""Migrations of the ``reclock`` schema: applied in order, each in its own transaction, recorded with a
checksum, serialized by an advisory lock so concurrent migrators are safe; idempotent."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

import psycopg

from reclock.errors import ReclockError

_LOCK_KEY = 0x7265636C6F636B  # "reclock"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(ReclockError):
    pass


def available() -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` of every migration shipped with the package, in order."""
    out = []
    for f in resources.files("reclock.persist").joinpath("migrations").iterdir():
        m = _FILE.match(f.name)
        if m:
            out.append((int(m.group(1)), m.group(2), f.read_text()))
    out.sort()
    versions = [v for v, _, _ in out]
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return out


def _checksum(sql: str) -> str:
    return hashlib.sha256(sql.encode()).hexdigest()


def migrate(target: str | psycopg.Connection) -> list[int]:
    """Apply pending migrations; return the versions applied (empty when up to date)."""
    if isinstance(target, str):
        with psycopg.connect(target, autocommit=True) as conn:
            return migrate(conn)
    conn = target
    conn.autocommit = True
    conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        conn.execute("CREATE SCHEMA IF NOT EXISTS reclock")
        conn.execute("""CREATE TABLE IF NOT EXISTS reclock.schema_migrations (
            version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now())""")
        done = {v: c for v, c in conn.execute("SELECT version, checksum FROM reclock.schema_migrations")}
        applied = []
        for version, name, sql in available():
            if version in done:
                if done[version] != _checksum(sql):
                    raise MigrationError(
                        f"migration {version:04d}_{name} was changed after it was applied; "
                        "add a new migration instead of editing an applied one")
                continue
            with conn.transaction():
                conn.execute(sql)
                conn.execute("INSERT INTO reclock.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                             (version, name, _checksum(sql)))
            applied.append(version)
        return applied
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
