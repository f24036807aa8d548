"""Postgres with TLS only (``sslmode=verify-full`` against the test's CA) and SCRAM, and roles with exactly
``reclock.grants``: the consensus role migrates and runs a Postgres source's cycles owning only the
``reclock`` schema; the CDC role runs the source (its slot, the snapshot, Spark's JDBC snapshot over TLS)
with REPLICATION and SELECT on the published tables only. Each refusal is tested: no TLS, an unknown CA,
a wrong password, a table outside the publication, a schema outside ``reclock``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import psycopg
import pytest

from reclock.config import parse_source
from reclock.cycle import run_cycle
from reclock.dev.state import StackState
from reclock.dev.tls import LocalCA
from reclock import settings
from reclock.orchestration import contexts
from reclock.persist import connect
from reclock.persist.migrate import migrate
from reclock.read import read_as_of

SHOP = """
CREATE TABLE orders (id bigint PRIMARY KEY, item text, amount numeric(10, 2));
ALTER TABLE orders REPLICA IDENTITY FULL;
CREATE TABLE salaries (id bigint PRIMARY KEY, amount numeric);  -- not published: not Reclock's to read
INSERT INTO salaries VALUES (1, 100000);
INSERT INTO orders SELECT g, 'item ' || g, g * 1.5 FROM generate_series(1, 500) g;
"""


def test_no_tls_no_unknown_ca_no_wrong_password(secured, tmp_path):
    dsn = secured.postgres.dsn("postgres")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
    plain = dsn.replace("sslmode=verify-full", "sslmode=disable")
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain)
    other = tempfile.mkdtemp(prefix="reclock-other-ca-")
    try:
        other_ca = LocalCA(StackState(Path(other))).cert  # a CA that signed nothing of the server's
        with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
            psycopg.connect(dsn.replace(str(secured.ca.cert), str(other_ca)))
    finally:
        import shutil

        shutil.rmtree(other, ignore_errors=True)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(secured.postgres.dsn("postgres", "reclock_app", "not-the-password"))


def test_consensus_role_owns_only_the_reclock_schema(secured):
    dsn = secured.consensus_db()
    assert migrate(dsn)  # every migration, run by the role itself
    with psycopg.connect(dsn, autocommit=True) as conn:
        owner = conn.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'reclock'").fetchone()
        assert owner == ("reclock_app",)
        for sql, refused in (("CREATE SCHEMA elsewhere", "permission denied for database"),
                             ("CREATE TABLE public.t (x int)", "permission denied for schema public"),
                             ("CREATE DATABASE other", "permission denied to create database"),
                             ("SELECT pg_create_logical_replication_slot('s', 'pgoutput')",
                              "superuser or replication role to use replication slots")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match=refused):
                conn.execute(sql)


def test_postgres_source_with_the_cdc_role_over_tls(secured, spark, tmp_path, monkeypatch):
    """A Postgres source's cycles through a connection with ``sslmode=verify-full`` (the upstream's CDC role
    and the consensus role), the first snapshot read by Spark over JDBC with TLS; the CDC role can read
    nothing the publication does not hold."""
    owner, cdc = secured.upstream_db(SHOP, ["public.orders"])
    consensus = secured.consensus_db()
    migrate(consensus)
    conn_uri = cdc.replace("postgresql://", "postgres://", 1)  # Airflow's URI form: query params -> extra
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_DB", conn_uri)
    spec = parse_source("shop", {"postgres": {"connection": "shop_db", "publication": "pub",
                                              "spark_snapshot_min_bytes": 0}})
    from reclock.sources.postgres.spec import find_upstream_dsn

    assert "sslmode=verify-full" in find_upstream_dsn(spec.upstream, "source shop")
    ctx = contexts.cycle_context(spec, dsn=consensus, blob_url=str(tmp_path / "blobs"),
                                 spark=settings.SparkTarget(master="local[2]"))
    ctx.spark_factory = lambda: spark
    run_cycle(ctx)  # the snapshot: 500 rows read by Spark's JDBC reader under TLS
    with psycopg.connect(owner, autocommit=True) as up:
        up.execute("INSERT INTO orders VALUES (501, 'late', 7.5)")
        up.execute("UPDATE orders SET amount = 0 WHERE id = 1")
    run_cycle(ctx)  # the stream: logical decoding by the REPLICATION role
    with connect(consensus) as conn:
        upper = conn.execute("SELECT upper FROM reclock.shards WHERE id = 'shop__orders'").fetchone()[0]
        table = read_as_of(conn, ctx.blob, "shop__orders", upper - 1)
    rows = {r["id"]: r for r in table.to_pylist()}
    assert len(rows) == 501 and str(rows[1]["amount"]) == "0.00" and rows[501]["item"] == "late"
    with psycopg.connect(cdc) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for table salaries"):
            conn.execute("SELECT * FROM salaries")
    with psycopg.connect(cdc) as conn:
        tls = conn.execute("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                           "WHERE a.usename = 'reclock_cdc' AND NOT s.ssl").fetchone()[0]
        assert tls == 0, "a connection of the CDC role without TLS"
