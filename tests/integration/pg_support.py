"""What the Postgres source tests share: an upstream database, its writers, a cycle context over it, table
contents."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
import time
from pathlib import Path
from typing import Iterator

import psycopg
from ingest_support import Clock  # the Kafka tests' controllable clock

from reclock import cycle
from reclock.config import parse_source
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.remap_store import load_remap
from reclock.read import read_as_of
from reclock.sources.postgres.upstream import slot_name

_names = itertools.count()


@contextlib.contextmanager
def upstream_database(postgres) -> Iterator[str]:
    """A fresh upstream database (wal_level=logical); every slot made on it is dropped afterwards."""
    name = f"up{os.getpid()}_{next(_names)}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = postgres.dsn(name)
    yield dsn
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)).fetchall():
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def writer(dsn: str) -> psycopg.Connection:
    """An upstream session whose commits are flushed before they return (the test cluster runs with
    ``synchronous_commit = off``, so otherwise the flush LSN a cycle binds may lag a commit just made)."""
    return psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on")


class WriterThread(threading.Thread):
    """A test's upstream writer: :meth:`step` (its ``n``-th transaction) in a loop on one :func:`writer`
    connection until ``stop`` is set, a random pause of up to :attr:`pause` seconds (``rng``) after each;
    whatever it raises ends it and is kept in ``error``, for the test to report."""

    pause = 0.01

    def __init__(self, dsn: str, stop: threading.Event, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.dsn, self.stop, self.rng = dsn, stop, rng
        self.error: BaseException | None = None

    def step(self, conn: psycopg.Connection, n: int) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            with writer(self.dsn) as conn:
                n = 0
                while not self.stop.is_set():
                    self.step(conn, n)
                    n += 1
                    time.sleep(self.rng.random() * self.pause)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def source_name(prefix: str = "cdc") -> str:
    return f"{prefix}{os.getpid() % 10000}_{next(_names)}"


def make_ctx(db: str, upstream_dsn: str, tmp_path: Path, name: str, tables: list[str] | None,
             max_records: int = 1000, publication: str = "pub", spark=None,
             spark_snapshot_min_bytes: int = 0, postgres: dict | None = None) -> cycle.CycleContext:
    """A cycle context over the upstream; with ``spark``, tables of at least ``spark_snapshot_min_bytes``
    have their snapshot read by Spark; ``postgres``: more of the source's ``postgres:`` settings."""
    raw: dict = {"postgres": {"dsn_env": "UNUSED", "publication": publication, **(postgres or {})},
                 "budget": {"max_records": max_records}}
    if spark is not None:
        raw["postgres"]["spark_snapshot_min_bytes"] = spark_snapshot_min_bytes
    if tables is not None:
        raw["tables"] = tables
    return cycle.CycleContext(spec=parse_source(name, raw), dsn=db,
                              blob=LocalBlobStore(tmp_path / "blobs"), clock=Clock(),
                              upstream=upstream_dsn, retain_history_ms=10**12,
                              spark_factory=None if spark is None else (lambda: spark))


def contents(ctx: cycle.CycleContext, shard: str, t: int, key: str = "id") -> dict:
    """``{key: (row, diff)}`` of ``shard`` AS OF ``t`` (every diff must be 1: a table has set semantics)."""
    with connect(ctx.dsn) as conn:
        table = read_as_of(conn, ctx.blob, shard, t)
    out = {}
    for row in table.to_pylist():
        diff = row.pop("diff")
        assert diff == 1, f"{shard} AS OF {t}: {row} has multiplicity {diff}"
        assert row[key] not in out, f"{shard} AS OF {t}: key {row[key]} twice"
        out[row[key]] = row
    return out


def bindings(ctx: cycle.CycleContext) -> list[tuple[int, int]]:
    with connect(ctx.dsn) as conn:
        rc = load_remap(conn, ctx.spec.name)
    return [(b.ts, b.frontier.get(0)) for b in rc.bindings]


def slot_confirmed(upstream_dsn: str, source: str) -> int | None:
    from reclock.sources.postgres.pgoutput import lsn_to_int

    with psycopg.connect(upstream_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                           (slot_name(source),)).fetchone()
    return None if row is None else lsn_to_int(row[0])


def commit_lsns(dsn: str, slot: str = "observer", publication: str = "pub") -> dict[int, int]:
    """xid -> commit LSN of every transaction of ``publication`` that logical slot ``slot`` (made by the test
    before its writes, never consumed) holds."""
    from reclock.sources.postgres import pgoutput as po

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', "
                            "'1', 'publication_names', %s) WHERE get_byte(data, 0) = 66",
                            (slot, publication)).fetchall()
    return {m.xid: m.final_lsn for m in (po.decode(d) for (d,) in rows)}
