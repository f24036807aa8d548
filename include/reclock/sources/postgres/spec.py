"""A Postgres source's config: its ``postgres:`` section (a publication, and where the upstream's DSN comes
from: an Airflow connection or an environment variable, never the file), its ``tables:`` and their
collections, and the keys beside them (``budget``, the schedule's).

A Postgres source's tables become the collections ``<source>__<table>`` (``shop__orders``; a table outside
the ``public`` schema: ``<source>__<schema>__<table>``), beside its error collection ``<source>_errors``
(:func:`pg_table_shard`). Without ``tables:``, the first cycle takes the publication's tables then and
keeps them (``reclock.sources.postgres.registration``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from reclock import connections
from reclock.errors import ConfigError, SettingError
from reclock.settings import from_connection
from reclock.specs import (NAME_RE_SHARD, SCHEDULE_KEYS, SourceSpec, parse_budget, parse_schedule, refuse_unknown,
                           require)

SCHEDULES = ("interval", "upstream", "continuous")
"""A Postgres source's schedules: a continuous one binds only what its upstream trigger would run for, since
its upper (the flush LSN) moves with any WAL the server writes (``PostgresSource.probe_upper``)."""


SPARK_SNAPSHOT_MIN_BYTES = 1 << 30
"""A table at least this large (``pg_table_size``) has its initial snapshot read by Spark
(``reclock.sources.postgres.spark_snapshot``); a smaller one is read in the task
(``reclock.sources.postgres.cdc.read_snapshot``), which on one host is the faster of the two (``benchmarks/pg_cdc.py``):
Spark pays off with executors on several hosts."""


SNAPSHOT_CHUNK_ROWS = 50_000
"""Rows per chunk of a table snapshotted online (``reclock.sources.postgres.chunks``): one ``REPEATABLE READ``
transaction each, between two watermarks."""
SNAPSHOT_CYCLE_ROWS = 500_000
"""Rows a cycle's mint reads of the tables snapshotted online, in whole chunks (at least one a cycle): the
chunks' work a cycle adds to its mint, while the other tables wait for the binding."""


@dataclass(frozen=True)
class PostgresSpec:
    """A Postgres source's upstream: a publication in the database an Airflow connection (or the DSN in an
    environment variable) reaches; ``tables`` (``schema.table``) are its outputs, in order (empty: every
    table of the publication, fixed at the first cycle)."""

    kind: ClassVar[str] = "postgres"
    publication: str
    connection: str | None = None  # an Airflow connection id
    dsn_env: str | None = None  # or the name of an environment variable holding the DSN
    tables: tuple[str, ...] = ()
    spark_snapshot_min_bytes: int | None = SPARK_SNAPSHOT_MIN_BYTES  # None: every snapshot in the task
    snapshot_chunk_rows: int = SNAPSHOT_CHUNK_ROWS  # an online snapshot's rows per chunk
    snapshot_cycle_rows: int = SNAPSHOT_CYCLE_ROWS  # an online snapshot's rows per cycle (whole chunks, one at least)

    def shards(self, source: SourceSpec) -> tuple[str, ...]:
        """The collections of the tables listed in the config, in order, and the error collection (a source
        without ``tables:`` learns its tables' collections at its first cycle)."""
        return (*(pg_table_shard(source.name, t) for t in self.tables), source.errors_shard)


PG_IDENT_RE = re.compile(r"^[a-z_][a-z0-9_$]{0,62}$")
"""A Postgres identifier Reclock accepts in config: lower case, unquoted (what ``CREATE TABLE t`` makes)."""


def pg_table_shard(source: str, table: str) -> str:
    """The collection (shard id) of table ``schema.table`` of a Postgres source: ``<source>__<table>`` for the
    ``public`` schema, ``<source>__<schema>__<table>`` otherwise."""
    schema, _, name = table.partition(".")
    return f"{source}__{name}" if schema == "public" else f"{source}__{schema}__{name}"


def parse_pg_table(source: str, raw: Any) -> str:
    """``schema.table`` (a bare ``table`` is in ``public``), validated so its collection name is valid."""
    what = f"source {source}.tables"
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{what}: {raw!r} is not a table name (schema.table)")
    schema, dot, name = raw.partition(".")
    if not dot:
        schema, name = "public", raw
    for part in (schema, name):
        if not PG_IDENT_RE.match(part):
            raise ConfigError(f"{what}: {raw!r}: {part!r} is not a lower-case unquoted identifier")
    table = f"{schema}.{name}"
    shard = pg_table_shard(source, table)
    if not NAME_RE_SHARD.match(shard):
        raise ConfigError(f"{what}: {raw!r} gives the collection name {shard!r}, which is not valid (at most 61 "
                          "characters of a-z, 0-9, _); rename the source or the table")
    return table


def _parse_postgres(source: str, raw: Any, tables_raw: Any) -> PostgresSpec:
    what = f"source {source}.postgres"
    p = require(raw, what)
    refuse_unknown(p, {"connection", "dsn_env", "dsn", "publication", "spark_snapshot_min_bytes", "snapshot_chunk_rows",
                       "snapshot_cycle_rows"}, what)
    if "dsn" in p:
        raise ConfigError(f"{what}: `dsn:` would put credentials in the config; give `dsn_env:` (the name of an "
                          "environment variable holding the DSN) or `connection:` (an Airflow connection id)")
    if ("connection" in p) == ("dsn_env" in p):
        raise ConfigError(f"{what}: give exactly one of `connection:` (an Airflow connection id) or `dsn_env:` "
                          "(an environment variable holding the DSN)")
    for key in ("connection", "dsn_env"):
        if key in p and (not isinstance(p[key], str) or not p[key]):
            raise ConfigError(f"{what}: `{key}` must be a non-empty string")
    pub = p.get("publication")
    if not isinstance(pub, str) or not PG_IDENT_RE.match(pub):
        raise ConfigError(f"{what}: `publication` is required, a lower-case unquoted identifier (got {pub!r})")
    if tables_raw is None:
        tables: tuple[str, ...] = ()
    elif isinstance(tables_raw, list) and tables_raw:
        tables = tuple(parse_pg_table(source, t) for t in tables_raw)
    else:
        raise ConfigError(f"source {source}.tables: a non-empty list of schema.table (or leave it out: every "
                          "table of the publication)")
    shards = [pg_table_shard(source, t) for t in tables]
    dup = sorted({s for s in shards if shards.count(s) > 1})
    if dup:
        raise ConfigError(f"source {source}.tables: listed twice: {', '.join(dup)}")
    spark_min = p.get("spark_snapshot_min_bytes", SPARK_SNAPSHOT_MIN_BYTES)
    if spark_min is not None and (isinstance(spark_min, bool) or not isinstance(spark_min, int) or spark_min < 0):
        raise ConfigError(f"{what}.spark_snapshot_min_bytes: a size in bytes >= 0 (tables at least this large are "
                          f"snapshotted on Spark), or null to read every snapshot in the task (got {spark_min!r})")
    sizes = {}
    for key, default in (("snapshot_chunk_rows", SNAPSHOT_CHUNK_ROWS), ("snapshot_cycle_rows", SNAPSHOT_CYCLE_ROWS)):
        v = p.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{what}.{key}: a number of rows >= 1 (got {v!r})")
        sizes[key] = v
    return PostgresSpec(publication=pub, connection=p.get("connection"), dsn_env=p.get("dsn_env"), tables=tables,
                        spark_snapshot_min_bytes=spark_min, **sizes)


def parse_postgres_source(name: str, d: dict, base: Path | None = None) -> SourceSpec:
    """A source with a ``postgres:`` section: ``tables``, ``budget`` and the schedule's keys besides it."""
    what = f"source {name}"
    refuse_unknown(d, {"postgres", "tables", "budget", *SCHEDULE_KEYS}, what)
    sched = parse_schedule(d, what, SCHEDULES)
    pg = _parse_postgres(name, d["postgres"], d.get("tables"))
    budget = parse_budget(d.get("budget"), f"{what}.budget", 100_000)
    return SourceSpec(name=name, upstream=pg, budget=budget, **sched)


def find_upstream_dsn(pg: PostgresSpec, what: str) -> str:
    """A Postgres source's upstream DSN: the environment variable its ``dsn_env:`` names, else its Airflow
    connection (``connection:``)."""
    if pg.dsn_env:
        dsn = os.environ.get(pg.dsn_env)
        if not dsn:
            raise SettingError(f"{what}: the environment variable {pg.dsn_env} (its `dsn_env:`) is not set; set it "
                               "to the upstream's DSN (postgresql://user:password@host:5432/db)")
        return dsn
    return from_connection(
        lambda: connections.postgres_dsn(pg.connection),
        f"{what}: the Airflow connection {pg.connection} (its `connection:`) is not defined (e.g. "
        f"AIRFLOW_CONN_{str(pg.connection).upper()}=postgresql://user:password@host:5432/db)")
