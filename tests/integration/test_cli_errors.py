"""Every ``reclock`` command given a wrong source, sink or collection name, or a wrong time, prints one clear
line (``error: ...``), exits 1 and shows no traceback or raw SQL error (issue 15)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reclock.batch import BatchDescription
from reclock.persist import connect
from reclock.persist.remap_store import register_source
from reclock.persist.shards import Append, advance_since, compare_and_append, register_shard


@pytest.fixture
def cli(db: str, tmp_path: Path):
    """Run ``reclock ARGS`` against ``db`` with a config of one source and one sink (neither registered
    under the wrong names the tests use); return ``(exit code, stderr, stdout)``."""
    config = tmp_path / "reclock.yaml"
    config.write_text(yaml.safe_dump({
        "sources": {"orders": {"kafka": {"topic": "orders", "bootstrap": "127.0.0.1:9"},
                               "format": {"type": "json", "schema": "id BIGINT"}}},
        "sinks": {"out": {"from": "orders", "format": "upsert", "key": ["id"],
                          "kafka": {"topic": "orders_out", "bootstrap": "127.0.0.1:9"}}}}))
    env = {**os.environ, "RECLOCK_DSN": db, "RECLOCK_BLOB_URL": str(tmp_path / "blobs"),
           "RECLOCK_CONFIG": str(config), "RECLOCK_SPARK_MASTER": "local[1]"}

    def run(*args: str) -> tuple[int, str, str]:
        p = subprocess.run([sys.executable, "-m", "reclock.cli", *args], env=env, capture_output=True,
                           text=True, timeout=120)
        return p.returncode, p.stderr, p.stdout

    return run


def assert_one_clear_line(result: tuple[int, str, str], *words: str) -> None:
    code, err, out = result
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, (code, err, out)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "psycopg" not in err and "does not exist" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_wrong_source_names(cli):
    assert_one_clear_line(cli("progress", "nosuch"), "nosuch")
    assert_one_clear_line(cli("progress", "Bad-Name"), "Bad-Name")
    assert_one_clear_line(cli("cycle", "nosuch"), "nosuch")
    assert_one_clear_line(cli("rebuild", "nosuch"), "nosuch")


def test_wrong_sink_names(cli):
    assert_one_clear_line(cli("sink", "status", "nosuch"), "nosuch")
    assert_one_clear_line(cli("sink", "run", "nosuch"), "nosuch")
    assert_one_clear_line(cli("sink", "drop", "nosuch"), "nosuch")


def test_wrong_collection_and_times(cli, db):
    assert_one_clear_line(cli("read", "nosuch"), "nosuch")
    with connect(db) as conn:
        register_source(conn, "orders")
        register_shard(conn, "orders", source="orders")
    assert_one_clear_line(cli("read", "orders"), "orders", "nothing is complete")
    with connect(db) as conn:
        compare_and_append(conn, [Append("orders", BatchDescription(0, 100), ())])
        advance_since(conn, "orders", 50)
    assert_one_clear_line(cli("read", "orders", "--as-of", "10"), "below since 50")
    assert_one_clear_line(cli("read", "orders", "--as-of", "100"), "upper is 100")
    assert_one_clear_line(cli("read", "orders", "--as-of", "1000"), "upper is 100")
    code, err, out = cli("read", "orders", "--as-of", "60")
    assert code == 0 and "(empty)" in out, (code, err, out)
    code, err, out = cli("progress", "orders")
    assert code == 0 and "shard orders: upper 100, since 50" in out, (code, err, out)
