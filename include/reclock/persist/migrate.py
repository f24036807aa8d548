"""Migrations of the ``reclock`` schema.

Files ``migrations/NNNN_name.sql`` are numbered 1..n without gaps. :func:`migrate` applies the pending
ones in order, each in its own transaction together with its row in ``reclock.schema_migrations(version,
name, checksum, applied_at)``. It is idempotent (nothing pending: nothing happens, ``[]`` is returned)
and safe to run concurrently: every migrator first takes one session-level advisory lock, so a second one
waits and then finds nothing left to do. It refuses to run when an applied migration's file changed
(checksum) or the database holds a migration this code does not know (it is newer than the code).

The role that migrates needs to own the ``reclock`` schema, nothing more: when the schema exists (an
administrator created it, ``CREATE SCHEMA reclock AUTHORIZATION <role>``), no ``CREATE SCHEMA`` is run, since
Postgres checks the database's CREATE privilege even for ``CREATE SCHEMA IF NOT EXISTS`` of an existing
schema (docs/security.md lists the grants).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

import psycopg
from psycopg.pq import TransactionStatus

from reclock.errors import MigrationError, SchemaVersionMismatch

__all__ = ["Migration", "MigrationError", "SchemaVersionMismatch", "available", "applied", "check_schema",
           "migrate"]

LOCK_KEY = 0x7265636C6F636B  # "reclock" as a bigint: the advisory lock every migrator takes
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    def __iter__(self):  # unpacks as (version, name, sql)
        return iter((self.version, self.name, self.sql))


def available() -> list[Migration]:
    """Every migration shipped with the package, in version order."""
    out = []
    for f in resources.files("reclock.persist").joinpath("migrations").iterdir():
        m = _FILE.match(f.name)
        if m:
            out.append(Migration(int(m.group(1)), m.group(2), f.read_text(encoding="utf-8")))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationError(f"migrations must be numbered 0001..n without gaps or duplicates, found {versions}")
    return out


def applied(conn: psycopg.Connection) -> dict[int, tuple[str, str]]:
    """``version -> (name, checksum)`` of the migrations recorded in the database ({} before the first)."""
    exists = conn.execute("SELECT to_regclass('reclock.schema_migrations') IS NOT NULL").fetchone()[0]
    if not exists:
        return {}
    return {v: (n, c) for v, n, c in conn.execute("SELECT version, name, checksum FROM reclock.schema_migrations")}


def _check_applied(done: dict[int, tuple[str, str]], shipped: list[Migration]) -> None:
    known = {m.version: m for m in shipped}
    for version, (name, checksum) in sorted(done.items()):
        m = known.get(version)
        if m is None:
            raise MigrationError(
                f"the database has migration {version:04d}_{name}, which this code does not ship: the schema "
                "is newer than the code (upgrade reclock, or use the database the code was built for)")
        if checksum != m.checksum:
            raise MigrationError(
                f"migration {version:04d}_{m.name} was changed after it was applied (checksum "
                f"{checksum[:12]} in the database, {m.checksum[:12]} in the file); restore the file and add "
                "a new migration instead of editing an applied one")


_CHECKED: set[str] = set()
"""The databases (by DSN) whose schema :func:`check_schema` found current in this process."""


def check_schema(conn: psycopg.Connection, key: str | None = None) -> None:
    """Raise :class:`~reclock.errors.SchemaVersionMismatch` unless the database holds exactly the migrations
    this release ships: an older schema needs ``reclock migrate``; a newer one was migrated by a newer release
    and must not be run by this one (a rollback is refused, not attempted). With ``key`` (the DSN), a
    database found current is not asked again in this process: cycles and sinks call it as they start."""
    if key is not None and key in _CHECKED:
        return
    done = applied(conn)
    shipped = {m.version: m for m in available()}
    unknown = [f"{v:04d}_{n}" for v, (n, _) in sorted(done.items()) if v not in shipped]
    missing = [f"{m.version:04d}_{m.name}" for v, m in sorted(shipped.items()) if v not in done]
    if unknown or missing:
        raise SchemaVersionMismatch(missing, unknown)
    if key is not None:
        _CHECKED.add(key)


def migrate(target: str | psycopg.Connection) -> list[int]:
    """Apply the pending migrations in order; return the versions applied (``[]`` when up to date).

    ``target`` is a DSN or a connection with no transaction open (its autocommit setting is restored).
    """
    if isinstance(target, str):
        with psycopg.connect(target, autocommit=True) as conn:
            return _migrate(conn)
    conn = target
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise MigrationError("migrate needs a connection with no open transaction (each migration runs in a "
                             "transaction of its own); commit or roll back first")
    was = conn.autocommit
    conn.autocommit = True
    try:
        return _migrate(conn)
    finally:
        conn.autocommit = was


_CREATE_SCHEMA = re.compile(r"^CREATE SCHEMA IF NOT EXISTS reclock;$", re.M)


def _without_create_schema(sql: str) -> str:
    """``sql`` without its ``CREATE SCHEMA IF NOT EXISTS reclock;`` line (a no-op when the schema exists, but
    one that a role without CREATE on the database may not run). The checksum stays the file's."""
    return _CREATE_SCHEMA.sub("-- (the reclock schema exists)", sql)


def _migrate(conn: psycopg.Connection) -> list[int]:
    shipped = available()
    conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
    try:
        schema_exists = conn.execute("SELECT to_regnamespace('reclock') IS NOT NULL").fetchone()[0]
        if not schema_exists:
            conn.execute("CREATE SCHEMA reclock")
        conn.execute("""CREATE TABLE IF NOT EXISTS reclock.schema_migrations (
            version     integer PRIMARY KEY,
            name        text NOT NULL,
            checksum    text NOT NULL,
            applied_at  timestamptz NOT NULL DEFAULT now())""")
        done = applied(conn)
        _check_applied(done, shipped)
        versions = []
        for m in shipped:
            if m.version in done:
                continue
            with conn.transaction():
                conn.execute(_without_create_schema(m.sql) if schema_exists else m.sql)
                conn.execute("INSERT INTO reclock.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                             (m.version, m.name, m.checksum))
            versions.append(m.version)
        return versions
    finally:
        if not conn.closed:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
