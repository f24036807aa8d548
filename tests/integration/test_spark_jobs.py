"""``spark_jobs/rebuild.py`` under a real ``spark-submit`` (master ``local[2]`` from the submit, settings from
the environment) rebuilds the shards a cycle wrote: the same updates at the same timestamps, in new parts.
The DAG side (``rebuild: spark_submit`` under ``dag.test()``, no secret in any argv) is in test_dag_test."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from reclock import cycle
from reclock.config import load_config
from reclock.dev.jars import spark_kafka_jars
from reclock.errors import ConfigError
from reclock.settings import NO_DSN
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.shards import batches
from reclock.read import read_updates

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "spark_jobs" / "rebuild.py"


def contents(dsn: str, blob: LocalBlobStore, shard: str) -> tuple[list, set[str]]:
    """The shard's updates (sorted) and its parts' paths."""
    with connect(dsn) as conn:
        rows = read_updates(conn, blob, shard).to_pylist()
        paths = {b.path for b in batches(conn, shard)}
    return sorted(rows, key=lambda r: (r["_partition"], r["_offset"])), paths


def test_spark_submit_rebuilds_what_a_cycle_wrote(db, kafka, topic, spark, stack_state, tmp_path):
    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    config = tmp_path / "reclock.yaml"
    config.write_text(yaml.safe_dump({"sources": {"sj_orders": {
        "kafka": {"topic": name, "bootstrap": kafka.bootstrap}, "format": {"type": "json", "schema": "id BIGINT"},
        "include": ["partition", "offset"], "budget": {"max_records": 120}}}}))
    blob = LocalBlobStore(tmp_path / "blobs")
    ctx = cycle.CycleContext(spec=load_config(config).source("sj_orders"), dsn=db, upstream=kafka.bootstrap,
                             blob=blob, spark_factory=lambda: spark, retain_history_ms=3_600_000)
    for wave in range(2):
        for i in range(wave * 200, wave * 200 + 200):
            producer.produce(name, value=json.dumps({"id": i}).encode(), partition=i % 2)
        assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
        cycle.run_cycle(ctx)
    before, parts_before = contents(db, blob, "sj_orders")
    assert sorted(r["id"] for r in before) == list(range(400))

    env = {**os.environ, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": db, "RECLOCK_BLOB_URL": str(blob.root),
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    for key in ("RECLOCK_SPARK_MASTER", "RECLOCK_SPARK_REMOTE", "RECLOCK_SPARK_JARS"):
        env.pop(key, None)  # the master and the jars come from spark-submit only
    submit = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
              "--jars", ",".join(spark_kafka_jars(stack_state)), "--conf", "spark.ui.enabled=false",
              str(JOB), "sj_orders"]
    run = subprocess.run(submit, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{\"source\"")))
    after, parts_after = contents(db, blob, "sj_orders")
    assert result["source"] == "sj_orders" and result["upper"] > 0 and result["records"]["sj_orders"] == 400
    assert after == before  # replayable: the same (data, ts, diff) updates (since stayed at 0: history kept)
    assert parts_after and not parts_after & parts_before  # ... in the rebuild's own parts


def test_the_job_names_a_missing_setting(monkeypatch, tmp_path, capsys):
    config = tmp_path / "reclock.yaml"
    config.write_text("sources: {x: {kafka: {topic: x, bootstrap: '127.0.0.1:1'}, format: bytes}}\n")
    monkeypatch.setenv("RECLOCK_CONFIG", str(config))
    monkeypatch.delenv("RECLOCK_DSN", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    main = runpy.run_path(str(JOB))["main"]
    assert main(["x"]) == 1
    assert capsys.readouterr().err.strip() == f"error: {NO_DSN}"
    assert main([]) == 2


def test_the_rebuild_dag_submits_the_job_when_the_source_says_so(tmp_path):
    from reclock.config import parse_source
    from reclock.orchestration.rebuild import RebuildSubmitOperator, build_rebuild_dag

    raw = {"kafka": {"topic": "t"}, "format": "bytes"}
    in_task = build_rebuild_dag(parse_source("a", raw), tmp_path / "c.yaml", REPO / "spark_jobs")
    assert not isinstance(in_task.get_task("rebuild"), RebuildSubmitOperator)
    submitted = build_rebuild_dag(parse_source("b", {**raw, "rebuild": "spark_submit"}), tmp_path / "c.yaml",
                                  REPO / "spark_jobs")
    op = submitted.get_task("rebuild")
    assert isinstance(op, RebuildSubmitOperator)
    assert (op._conn_id, op.application, op.application_args) == ("reclock_spark_submit", str(JOB), ["b"])
    assert not op.env_vars  # found when the task runs, never a templated field
    with pytest.raises(ConfigError, match="spark_jobs/rebuild.py, which does not exist"):
        build_rebuild_dag(parse_source("c", {**raw, "rebuild": "spark_submit"}), tmp_path / "c.yaml",
                          tmp_path / "spark_jobs")
