"""``ingest__<source>`` and ``sink__<sink>`` run with ``dag.test()`` (one process, Airflow metadata in the
test Postgres), with a local Spark session: the same tasks the scheduler runs, outside the scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psycopg
import yaml
from confluent_kafka import Producer

from reclock.dev.jars import spark_kafka_jars
from reclock.dev.state import REPO_ROOT
from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.read import read_updates
from reclock.persist.blob import LocalBlobStore
from reclock.sinks.kafka import read_all, read_progress

SCRIPT = textwrap.dedent("""
    import sys
    from airflow.utils.cli import get_bagged_dag  # parses dags/ and serializes the DAGs, as `airflow dags test`

    for dag_id in sys.argv[1:]:
        dag = get_bagged_dag(None, dag_id)
        run = dag.test(run_conf={"max_records": 150} if dag_id.startswith("ingest__") else None)
        print("RESULT", dag_id, run.state, flush=True)
        assert run.state == "success", (dag_id, run.state)
""")


def test_ingest_and_sink_dags_under_dag_test(db, postgres, kafka, topic, stack_state, tmp_path):
    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(400):
        producer.produce(name, value=json.dumps({"id": i}).encode(), partition=i % 2)
    producer.flush(30)
    config = tmp_path / "reclock.yaml"
    config.write_text(yaml.safe_dump({
        "sources": {"dt_orders": {"kafka": {"topic": name, "bootstrap": kafka.bootstrap},
                                  "format": {"type": "json", "schema": "id BIGINT"}}},
        "sinks": {"dt_out": {"from": "dt_orders", "kafka": {"topic": f"{name}_out", "bootstrap": kafka.bootstrap},
                             "progress_topic": f"_progress_{name}"}}}))
    airflow_db = f"airflow_{os.getpid()}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{airflow_db}"')
    blobs = tmp_path / "blobs"
    env = {**os.environ, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": db, "RECLOCK_BLOB_URL": str(blobs),
           "RECLOCK_SPARK_MASTER": "local[2]", "RECLOCK_SPARK_JARS": ",".join(spark_kafka_jars(stack_state)),
           "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.dsn(airflow_db).replace("postgresql://",
                                                                                  "postgresql+psycopg2://"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags")}
    migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    run = subprocess.run([sys.executable, "-c", SCRIPT, "ingest__dt_orders", "ingest__dt_orders", "sink__dt_out"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    results = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert results == ["RESULT ingest__dt_orders success", "RESULT ingest__dt_orders success",
                       "RESULT sink__dt_out success"]

    with connect(db) as conn:
        rows = read_updates(conn, LocalBlobStore(blobs), "dt_orders").to_pylist()
        upper = shard_info(conn, "dt_orders").upper
    assert sorted(r["id"] for r in rows) == list(range(400))  # two runs of budget 150 slices, all once
    assert read_progress(kafka.bootstrap, f"_progress_{name}", "dt_out").frontier == upper
    out = [json.loads(m.value())["after"]["id"] for m in read_all(kafka.bootstrap, f"{name}_out", "t")]
    assert sorted(out) == list(range(400))
