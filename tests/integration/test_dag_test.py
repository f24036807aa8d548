"""``ingest__<source>``, ``sink__<sink>`` and ``rebuild__<source>`` run with ``dag.test()`` (one process,
Airflow metadata in the test Postgres), with a local Spark session: the same tasks the scheduler runs, outside
the scheduler. The rebuild is ``rebuild: spark_submit``: the Spark provider's SparkSubmitOperator runs
``spark_jobs/rebuild.py`` on a connection given as ``AIRFLOW_CONN_*``, and no secret reaches an argv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict
import yaml
from confluent_kafka import Producer

from reclock.dev.jars import spark_kafka_jars
from reclock.dev.state import REPO_ROOT
from reclock.persist import connect
from reclock.persist.shards import batches, shard_info
from reclock.read import read_updates
from reclock.persist.blob import LocalBlobStore
from reclock.sinks.iceberg import CatalogSettings, catalog_uri, load_catalog, read_frontier
from reclock.sinks.kafka import read_all, read_progress

SCRIPT = textwrap.dedent("""
    import sys
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    # dags/ parsed and its DAGs serialized as `airflow dags test` does (airflow.utils.cli.get_bagged_dag), once
    # for every DAG this process tests (get_bagged_dag parses and serializes the whole folder for each one)
    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    (bundle,) = manager.get_all_dag_bundles()
    bundle.initialize()
    bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
    sync_bag_to_db(bag, bundle.name, bundle.version)
    for dag_id in sys.argv[1:]:
        dag = bag.dags[dag_id]
        run = dag.test(run_conf={"max_records": 150} if dag_id.startswith("ingest") else None)
        print("RESULT", dag_id, run.state, flush=True)
        assert run.state == "success", (dag_id, run.state)
""")


def test_ingest_and_sink_dags_under_dag_test(db, postgres, airflow_db, kafka, topic, stack_state, tmp_path):
    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(400):
        producer.produce(name, value=json.dumps({"id": i}).encode(), partition=i % 2)
    assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
    config = tmp_path / "reclock.yaml"
    config.write_text(yaml.safe_dump({
        "sources": {"dt_orders": {"kafka": {"topic": name, "bootstrap": kafka.bootstrap},
                                  "format": {"type": "json", "schema": "id BIGINT"}, "rebuild": "spark_submit"},
                    "dt_cont": {"kafka": {"topic": name, "bootstrap": kafka.bootstrap},  # the same topic, continuously
                                "format": {"type": "json", "schema": "id BIGINT"}, "schedule": "continuous",
                                "lease": "4s", "poll": "200ms"},
                    **{f"dt_g{i}": {"kafka": {"topic": name, "bootstrap": kafka.bootstrap},  # a group of two
                                    "format": {"type": "json", "schema": "id BIGINT"}, "schedule": "continuous",
                                    "group": "dtg", "lease": "4s", "poll": "200ms"} for i in (1, 2)}},
        "sinks": {"dt_out": {"from": "dt_orders", "kafka": {"topic": f"{name}_out", "bootstrap": kafka.bootstrap},
                             "progress_topic": f"_progress_{name}"},
                  "dt_lake": {"from": "dt_orders", "iceberg": {"table": "lake.dt_orders"}}}}))
    blobs = tmp_path / "blobs"
    env = {**os.environ, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": db, "RECLOCK_BLOB_URL": str(blobs),
           "RECLOCK_SPARK_MASTER": "local[2]", "RECLOCK_SPARK_JARS": ",".join(spark_kafka_jars(stack_state)),
           "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.dsn(airflow_db).replace("postgresql://",
                                                                                  "postgresql+psycopg2://"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins")}  # registers Reclock's timetable
    # and the example query DAG: a @task.pyspark job reading the collection through reclock.tables
    query_env = {**env, "RECLOCK_QUERY_EXAMPLE": "dt_orders",
                 "AIRFLOW_CONN_RECLOCK_SPARK": json.dumps({"conn_type": "spark", "host": "local[2]"})}
    run = _run_script(["ingest__dt_orders", "ingest__dt_orders", "sink__dt_out", "sink__dt_lake", "query__dt_orders",
                       "ingest__dt_cont", "ingest_group__dtg"], query_env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    results = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert results == ["RESULT ingest__dt_orders success", "RESULT ingest__dt_orders success",
                       "RESULT sink__dt_out success", "RESULT sink__dt_lake success",
                       "RESULT query__dt_orders success", "RESULT ingest__dt_cont success",
                       "RESULT ingest_group__dtg success"]
    assert "query__dt_orders: 400 rows AS OF " in run.stdout + run.stderr, run.stdout[-3000:] + run.stderr[-3000:]

    with connect(db) as conn:
        rows = read_updates(conn, LocalBlobStore(blobs), "dt_orders").to_pylist()
        upper = shard_info(conn, "dt_orders").upper
    assert sorted(r["id"] for r in rows) == list(range(400))  # two runs of budget 150 slices, all once
    with connect(db) as conn:  # one continuous run: cycles for its 4 s lease (budget 150: several slices)
        cont = read_updates(conn, LocalBlobStore(blobs), "dt_cont").to_pylist()
        resumes = conn.execute("SELECT count(*) FROM reclock.statistics WHERE name = 'dt_cont' AND step = 'resume'"
                               ).fetchone()[0]
    assert sorted(r["id"] for r in cont) == list(range(400)) and resumes >= 2
    with connect(db) as conn:  # one run of the group's one task: both sources, each all of the topic
        for g in ("dt_g1", "dt_g2"):
            assert sorted(r["id"] for r in read_updates(conn, LocalBlobStore(blobs), g).to_pylist()) == list(range(400))
    assert read_progress(kafka.bootstrap, f"_progress_{name}", "dt_out").frontier == upper
    out = [json.loads(m.value())["after"]["id"] for m in read_all(kafka.bootstrap, f"{name}_out", "t")]
    assert sorted(out) == list(range(400))
    lake = load_catalog(CatalogSettings(catalog_uri(db), f"{blobs}/_iceberg"), "reclock").load_table("lake.dt_orders")
    assert read_frontier(lake, "dt_lake").frontier == upper  # the Iceberg export, on the default settings
    assert sorted(lake.scan().to_arrow()["id"].to_pylist()) == list(range(400))

    # rebuild__dt_orders through spark-submit: the DSN only in a connection (with its password), which the
    # task resolves and hands to the job in spark-submit's environment, never in an argv or a rendered field
    before = _updates(db, blobs)
    pg = conninfo_to_dict(db)
    env = {k: v for k, v in env.items() if k != "RECLOCK_DSN"}
    env.update({
        "AIRFLOW_CONN_RECLOCK_POSTGRES": json.dumps({"conn_type": "postgres", "host": pg["host"], "port": int(pg["port"]),
                                                     "login": pg["user"], "password": pg["password"],
                                                     "schema": pg["dbname"]}),
        "AIRFLOW_CONN_RECLOCK_SPARK_SUBMIT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),  # spark-submit
    })
    watcher = ArgvWatcher(pg["password"])
    with watcher:
        run = _run_script(["rebuild__dt_orders"], env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    assert "RESULT rebuild__dt_orders success" in run.stdout
    after = _updates(db, blobs)
    assert after[0] == before[0] and not after[1] & before[1]  # the same updates, in new parts
    assert watcher.job_seen, "the watcher saw spark-submit run spark_jobs/rebuild.py"
    assert watcher.leaks == [], "the DSN's password is in a process's argv"
    assert pg["password"] not in run.stdout + run.stderr  # the task's log: the submit command, the job's output
    with psycopg.connect(postgres.dsn(airflow_db)) as conn:
        rendered = conn.execute("SELECT rendered_fields::text FROM rendered_task_instance_fields "
                                "WHERE dag_id = 'rebuild__dt_orders'").fetchall()
    assert rendered and all(pg["password"] not in r[0] for r in rendered)


def _run_script(dag_ids: list[str], env: dict, timeout: float = 480) -> subprocess.CompletedProcess:
    """SCRIPT over ``dag_ids``; one that does not end within ``timeout`` fails with what it printed."""
    try:
        return subprocess.run([sys.executable, "-c", SCRIPT, *dag_ids], env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(f"{dag_ids} did not end in {timeout:.0f}s:\n{out[-3000:]}\n{err[-6000:]}") from None


def _updates(dsn: str, blobs) -> tuple[list, set[str]]:
    """dt_orders' updates (sorted) and its parts' paths."""
    with connect(dsn) as conn:
        rows = read_updates(conn, LocalBlobStore(blobs), "dt_orders").to_pylist()
        paths = {b.path for b in batches(conn, "dt_orders")}
    return sorted(rows, key=lambda r: (r["id"], r["ts"])), paths


class ArgvWatcher:
    """While the block runs, reads every process's argv (``/proc/*/cmdline``) every 20 ms: ``leaks`` are the
    argvs holding ``secret``; ``job_seen`` says whether spark-submit's run of ``spark_jobs/rebuild.py`` was
    seen (the watcher looked while the job ran)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.leaks: list[str] = []
        self.job_seen = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "ArgvWatcher":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        argv = f.read()
                except OSError:
                    continue
                if self.secret in argv:
                    self.leaks.append(argv.replace(b"\0", b" ").decode(errors="replace"))
                if b"spark_jobs/rebuild.py" in argv:
                    self.job_seen = True
