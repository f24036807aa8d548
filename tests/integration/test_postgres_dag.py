"""``ingest__<source>`` of a Postgres source under ``dag.test()``: the same two tasks the scheduler runs,
the upstream DSN taken from the environment variable the config names."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import yaml
from pg_support import upstream_database, writer

from reclock.dev.state import REPO_ROOT
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.read import read_as_of

SCRIPT = textwrap.dedent("""
    import sys
    from airflow.utils.cli import get_bagged_dag

    for dag_id in sys.argv[1:]:
        run = get_bagged_dag(None, dag_id).test()
        print("RESULT", dag_id, run.state, flush=True)
        assert run.state == "success", (dag_id, run.state)
""")


def test_postgres_ingest_dag_under_dag_test(db, postgres, airflow_db, tmp_path):
    with upstream_database(postgres) as up:
        with writer(up) as conn:
            conn.execute("CREATE TABLE orders (id int8 PRIMARY KEY, amount numeric(10,2))")
            conn.execute("CREATE TABLE items (id int8 PRIMARY KEY, sku text)")
            for t in ("orders", "items"):
                conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
            conn.execute("CREATE PUBLICATION shop_pub FOR TABLE orders, items")
            conn.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 100) g")
        source = f"shop{os.getpid() % 10000}"
        config = tmp_path / "reclock.yaml"
        config.write_text(yaml.safe_dump({"sources": {source: {
            "postgres": {"dsn_env": "SHOP_DSN", "publication": "shop_pub"}, "budget": {"max_records": 30}}}}))
        blobs = tmp_path / "blobs"
        env = {**os.environ, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": db, "RECLOCK_BLOB_URL": str(blobs),
               "SHOP_DSN": up, "RECLOCK_SPARK_MASTER": "local[1]", "AIRFLOW_HOME": str(tmp_path / "airflow"),
               "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.dsn(airflow_db).replace("postgresql://",
                                                                                      "postgresql+psycopg2://"),
               "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
               "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins")}  # registers Reclock's timetable
        dag = f"ingest__{source}"
        first = subprocess.run([sys.executable, "-c", SCRIPT, dag], env=env, capture_output=True, text=True,
                               timeout=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-5000:]
        with writer(up) as conn:
            with conn.transaction():
                conn.execute("DELETE FROM orders WHERE id > 90")
                conn.execute("INSERT INTO items VALUES (1, 'sku-1')")
        second = subprocess.run([sys.executable, "-c", SCRIPT, dag], env=env, capture_output=True, text=True,
                                timeout=600)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-5000:]
        with connect(db) as conn:
            orders = read_as_of(conn, LocalBlobStore(blobs), f"{source}__orders")
            items = read_as_of(conn, LocalBlobStore(blobs), f"{source}__items")
        assert sorted(orders.column("id").to_pylist()) == list(range(1, 91))
        assert items.column("sku").to_pylist() == ["sku-1"]
