"""Migrations of the ``reclock`` schema: versioned, idempotent, safe to run concurrently, and refusing to
run over an edited or unknown migration. Also the status and statistics helpers on the migrated schema."""

from __future__ import annotations

import threading

import psycopg
import pytest

from reclock.errors import MigrationError
from reclock.persist import connect
from reclock.persist import migrate as migrations
from reclock.persist.status import (latest_statistics, latest_status, record_statistics, record_status,
                                    status_history)

ALL = [m.version for m in migrations.available()]

TABLES = {
    "sources": ["name", "kind", "config", "created_at", "gc_at"],
    "write_leases": ["prefix", "source", "renewed_at"],
    "remap_collections": ["source", "upper", "since"],
    "remap_bindings": ["source", "ts"],
    "remap_offsets": ["source", "ts", "partition", "offset"],
    "shards": ["id", "source", "output", "upper", "since", "created_at", "kind"],
    "shard_batches": ["id", "shard", "lower", "upper", "path", "rows", "bytes", "min_ts", "max_ts", "created_at"],
    "read_holds": ["shard", "holder", "ts", "created_at", "updated_at", "expires_at"],
    "statistics": ["id", "name", "step", "metrics", "at"],
    "status_history": ["id", "name", "status", "error", "at", "step", "run_id", "trace"],
    "schema_migrations": ["version", "name", "checksum", "applied_at"],
}


def test_migrations_are_numbered_and_apply_once(fresh_db):
    assert ALL == list(range(1, len(ALL) + 1)) and len(ALL) >= 2
    assert migrations.migrate(fresh_db) == ALL
    assert migrations.migrate(fresh_db) == []  # idempotent
    with connect(fresh_db) as conn:
        rows = conn.execute("SELECT version, name, checksum, applied_at FROM reclock.schema_migrations "
                            "ORDER BY version").fetchall()
        assert [(v, n, c) for v, n, c, _ in rows] == [(m.version, m.name, m.checksum) for m in migrations.available()]
        assert all(at is not None for *_, at in rows)
        for table, columns in TABLES.items():
            got = [c for (c,) in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'reclock' "
                "AND table_name = %s ORDER BY ordinal_position", (table,))]
            assert got == columns, table


def test_pending_migrations_apply_in_order(fresh_db, monkeypatch):
    shipped = migrations.available()
    monkeypatch.setattr(migrations, "available", lambda: shipped[:1])
    assert migrations.migrate(fresh_db) == [1]
    monkeypatch.setattr(migrations, "available", lambda: shipped)
    assert migrations.migrate(fresh_db) == ALL[1:]
    assert migrations.migrate(fresh_db) == []


def test_numeric_offsets_keep_the_progress_views_that_exist(fresh_db, monkeypatch):
    """Migration 9 widens ``remap_offsets."offset"`` to an integral numeric under the progress views of the sources
    registered before it (a view's column cannot change type): each is created again as it was, and shows
    the same rows."""
    from reclock.persist.remap_store import append_binding, register_source
    from reclock.remap import Binding
    from reclock.time import PartitionedFrontier as F

    shipped = migrations.available()
    monkeypatch.setattr(migrations, "available", lambda: shipped[:8])
    assert migrations.migrate(fresh_db) == list(range(1, 9))
    lsn_view = ("SELECT ts, '0/0'::pg_lsn + \"offset\" AS lsn FROM reclock.remap_offsets WHERE partition = 0 "
                "AND source = {}")
    with connect(fresh_db) as conn:
        register_source(conn, "orders")
        register_source(conn, "shop", kind="postgres", progress=lsn_view)
        append_binding(conn, "orders", 0, Binding(5, F.of({0: 3, 1: 9})))
        append_binding(conn, "shop", 0, Binding(6, F.of({0: 0x16B3748})))
        kafka_rows = conn.execute('SELECT * FROM reclock.orders_progress ORDER BY 1, 2').fetchall()
        assert conn.execute("SELECT lsn::text FROM reclock.shop_progress").fetchall() == [("0/16B3748",)]
    monkeypatch.setattr(migrations, "available", lambda: shipped)
    assert migrations.migrate(fresh_db) == ALL[8:]
    with connect(fresh_db) as conn:
        assert conn.execute('SELECT * FROM reclock.orders_progress ORDER BY 1, 2').fetchall() == kafka_rows
        assert conn.execute("SELECT lsn::text FROM reclock.shop_progress").fetchall() == [("0/16B3748",)]
        types = dict(conn.execute("SELECT table_name || '.' || column_name, data_type FROM information_schema.columns "
                                  "WHERE table_schema = 'reclock' AND column_name IN ('offset', 'lsn')").fetchall())
        assert types == {"remap_offsets.offset": "numeric", "orders_progress.offset": "numeric",
                         "shop_progress.lsn": "pg_lsn", "upsert_state.offset": "text"}  # text: 0011_kinesis


def test_concurrent_migrators_apply_each_migration_once(fresh_db):
    results: list[list[int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def run() -> None:
        try:
            start.wait(10)
            results.append(migrations.migrate(fresh_db))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(results) == [[], [], [], ALL]  # one migrator applied everything, the others found it done
    with connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM reclock.schema_migrations").fetchone()[0] == len(ALL)


def test_an_edited_migration_is_refused(db):
    with connect(db) as conn:
        conn.execute("UPDATE reclock.schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(MigrationError, match="0001_init was changed after it was applied"):
        migrations.migrate(db)


def test_a_database_newer_than_the_code_is_refused(db):
    with connect(db) as conn:
        conn.execute("INSERT INTO reclock.schema_migrations (version, name, checksum) VALUES (999, 'future', 'x')")
    with pytest.raises(MigrationError, match="0999_future.*newer than the code"):
        migrations.migrate(db)


def test_cycles_and_sinks_run_only_on_the_schema_of_their_release(fresh_db, tmp_path):
    """``check_schema`` (what a cycle's mint and a sink's start call, once per process and database): a
    database not migrated yet, or missing one of this release's migrations, is refused with "run `reclock
    migrate`"; one migrated by a newer release is refused as newer (a rollback is refused, not attempted);
    the current one passes, and a cycle on a newer one writes nothing."""
    from reclock import cycle
    from reclock.config import parse_source
    from reclock.errors import SchemaVersionMismatch
    from reclock.persist.blob import LocalBlobStore

    with connect(fresh_db) as conn:
        with pytest.raises(SchemaVersionMismatch, match=r"older than this release.*0001_init.*run `reclock migrate`"):
            migrations.check_schema(conn)
    migrations.migrate(fresh_db)
    with connect(fresh_db) as conn:
        migrations.check_schema(conn)
        last = ALL[-1]
        name = conn.execute("SELECT name FROM reclock.schema_migrations WHERE version = %s", (last,)).fetchone()[0]
        conn.execute("DELETE FROM reclock.schema_migrations WHERE version = %s", (last,))
        with pytest.raises(SchemaVersionMismatch, match=f"{last:04d}_{name} are not applied"):
            migrations.check_schema(conn)
        conn.execute("INSERT INTO reclock.schema_migrations (version, name, checksum) VALUES (%s, %s, 'x'), "
                     "(999, 'future', 'x')", (last, name))
        with pytest.raises(SchemaVersionMismatch, match="newer than this release.*0999_future.*does not ship"):
            migrations.check_schema(conn)
    spec = parse_source("schemaless", {"kafka": {"topic": "t", "bootstrap": "127.0.0.1:1"},
                                       "format": {"type": "json", "schema": "id BIGINT"}})
    ctx = cycle.CycleContext(spec=spec, dsn=fresh_db, upstream="127.0.0.1:1", blob=LocalBlobStore(tmp_path))
    with pytest.raises(SchemaVersionMismatch, match="0999_future"):
        cycle.mint(ctx)
    with connect(fresh_db) as conn:
        assert conn.execute("SELECT count(*) FROM reclock.sources").fetchone()[0] == 0


def test_migrate_takes_an_idle_connection_and_restores_it(fresh_db):
    with psycopg.connect(fresh_db) as conn:  # not autocommit
        assert migrations.migrate(conn) == ALL
        assert conn.autocommit is False
        conn.execute("SELECT 1")  # now inside a transaction
        with pytest.raises(MigrationError, match="no open transaction"):
            migrations.migrate(conn)


def test_uppers_and_sinces_never_go_backwards_even_in_raw_sql(conn):
    conn.execute("INSERT INTO reclock.shards (id, upper, since) VALUES ('s', 10, 5)")
    with pytest.raises(psycopg.errors.CheckViolation, match="s: upper may not go backwards"):
        conn.execute("UPDATE reclock.shards SET upper = 9 WHERE id = 's'")
    with pytest.raises(psycopg.errors.CheckViolation, match="s: since may not go backwards"):
        conn.execute("UPDATE reclock.shards SET since = 4 WHERE id = 's'")
    conn.execute("UPDATE reclock.shards SET upper = 11, since = 6 WHERE id = 's'")
    with pytest.raises(psycopg.errors.CheckViolation):  # a part's ts outside its description
        conn.execute("INSERT INTO reclock.shard_batches (shard, lower, upper, path, rows, bytes, min_ts, max_ts) "
                     "VALUES ('s', 10, 11, 'p', 1, 1, 10, 11)")


def test_status_and_statistics_helpers(conn):
    assert latest_status(conn, "orders") is None
    record_status(conn, "orders", "starting")
    record_status(conn, "orders", "stalled", error="append: shard orders_0: upper is 7, append expected 5")
    record_status(conn, "other", "running")
    s = latest_status(conn, "orders")
    assert (s.name, s.status, s.error) == ("orders", "stalled", "append: shard orders_0: upper is 7, append expected 5")
    assert [h.status for h in status_history(conn, "orders")] == ["stalled", "starting"]
    # a run's steps leave one row (its newest step), a new run or a new status a new one
    for step in ("mint", "write_batches", "append", "resume"):
        record_status(conn, "orders", "running", step=step, run_id="manual__1")
    record_status(conn, "orders", "running", step="mint", run_id="manual__2")
    record_status(conn, "orders", "stalled", error="x", step="append", run_id="manual__2", trace="cycle.py:1 in f")
    hist = status_history(conn, "orders")
    assert [(h.status, h.step, h.run_id, h.trace) for h in hist[:3]] == [
        ("stalled", "append", "manual__2", "cycle.py:1 in f"), ("running", "mint", "manual__2", None),
        ("running", "resume", "manual__1", None)]
    with pytest.raises(ValueError, match="not one of"):
        record_status(conn, "orders", "sleeping")
    record_statistics(conn, "orders", "mint", {"minted_ts": 100, "offsets_known": 12})
    record_statistics(conn, "orders", "append", {"committed": {"orders_0": 12}})
    assert [x.metrics for x in latest_statistics(conn, "orders")] == [{"committed": {"orders_0": 12}},
                                                                      {"minted_ts": 100, "offsets_known": 12}]
    assert [x.step for x in latest_statistics(conn, "orders", step="mint")] == ["mint"]


def test_prune_history_keeps_recent_rows_and_the_newest_of_each_kind(conn):
    from reclock.persist.status import prune_history

    for step in ("mint", "resume"):  # nine days of history, oldest first (ids grow with time)
        conn.execute("INSERT INTO reclock.statistics (name, step, metrics, at) SELECT 'prune_a', %s, '{}', "
                     "now() - make_interval(days => d) FROM generate_series(9, 1, -1) d", (step,))
    conn.execute("INSERT INTO reclock.status_history (name, status, at) SELECT 'prune_a', 'running', "
                 "now() - make_interval(days => d) FROM generate_series(9, 1, -1) d")
    record_statistics(conn, "prune_a", "mint", {"recent": 1})
    keep = 3.5 * 86400
    assert prune_history(conn, keep, batch=4) == (4, 4)  # a batch bounds one call's work
    assert prune_history(conn, keep) == (12 - 4, 6 - 4)
    left = conn.execute("SELECT step, round(extract(epoch FROM now() - at) / 86400)::int FROM reclock.statistics "
                        "WHERE name = 'prune_a' ORDER BY step, at").fetchall()
    assert left == [("mint", 3), ("mint", 2), ("mint", 1), ("mint", 0), ("resume", 3), ("resume", 2), ("resume", 1)]
    assert len(status_history(conn, "prune_a")) == 3
    assert prune_history(conn, 0) == (3 + 2, 2)  # nothing old kept but the newest of each name and step
    assert [x.metrics for x in latest_statistics(conn, "prune_a")] == [{"recent": 1}, {}]
    assert latest_status(conn, "prune_a") is not None
    with pytest.raises(ValueError, match="negative"):
        prune_history(conn, -1)
