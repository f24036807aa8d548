"""Reclock as a package: the wheel, installed into a fresh venv (no checkout, no PYTHONPATH, a cwd of its
own), runs a real cycle with explicit settings and reads it back; every missing setting is a clear error.

The venv sees the project venv's dependencies through a ``.pth`` line (reinstalling Airflow and pyspark would
cost minutes); the wheel itself is installed with ``--no-deps``. A ``.pth`` line adds a folder to the path but
processes none of that folder's own ``.pth`` files, so the checkout's editable install stays out of sight.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer

from benchmarks.release import build_wheel, install_alone
from reclock.dev.jars import spark_kafka_jars
from reclock.settings import NO_BLOB, NO_DSN, NO_SPARK
from reclock.spark.session import NO_CONNECTOR
from reclock.config import NO_CONFIG

REPO = Path(__file__).resolve().parents[2]
RECORDS = 500


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """The wheel built from the checkout's sources and installed, alone, into a new venv."""
    root = tmp_path_factory.mktemp("package")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "include" / "reclock", src / "include" / "reclock",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wheel = build_wheel(src, root / "dist")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    migrations = sorted(p.name for p in (REPO / "include/reclock/persist/migrations").glob("*.sql"))
    assert migrations and {f"reclock/persist/migrations/{m}" for m in migrations} <= shipped

    return install_alone(wheel, root / "venv")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """A clean environment: no PYTHONPATH, no RECLOCK_* or Airflow settings of the test session."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECLOCK_", "AIRFLOW", "PYTHON", "PYSPARK", "SPARK_HOME"))}
    env.update({"AIRFLOW_HOME": str(tmp / "airflow"), "SPARK_LOCAL_IP": "127.0.0.1", **extra})
    return env


def _run(venv: Path, cwd: Path, *argv: str, env: dict[str, str], timeout: float = 300):
    exe = venv / "bin" / argv[0]
    return subprocess.run([str(exe), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_runs_a_cycle_with_explicit_settings(venv, fresh_db, kafka, topic, stack_state, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = _env(tmp_path)

    # the installed package is the wheel's, and the library never imports the dev stack
    probe = _run(venv, cwd, "python", "-c", """
import pkgutil, sys
import reclock, reclock.cycle, reclock.read, reclock.orchestration
for m in pkgutil.iter_modules(reclock.orchestration.__path__):
    __import__(f"reclock.orchestration.{m.name}")
print(json.dumps({"file": reclock.__file__, "dev": sorted(m for m in sys.modules if m.startswith("reclock.dev")),
                  "orchestration": sorted(m for m in sys.modules if m.startswith("reclock.orchestration."))}))
""".replace("import pkgutil, sys", "import json, pkgutil, sys"), env=env)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen["file"].startswith(str(venv)), seen
    assert seen["dev"] == [] and "reclock.orchestration.contexts" in seen["orchestration"], seen

    # migrations ship in the wheel and apply
    migrated = _run(venv, cwd, "reclock", "migrate", "--dsn", fresh_db, env=env)
    from reclock.persist.migrate import available

    every = [m.version for m in available()]  # the checkout's migrations: the wheel must ship all of them
    assert migrated.returncode == 0 and f"applied {every}" in migrated.stdout, migrated.stderr[-3000:]

    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(RECORDS):
        producer.produce(name, value=json.dumps({"id": i}).encode(), partition=i % 2)
    assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
    config = tmp_path / "reclock.yaml"
    source = {"kafka": {"topic": name, "connection": "reclock_kafka"}, "format": {"type": "json", "schema": "id BIGINT"}}
    config.write_text(yaml.safe_dump({"sources": {"pk_orders": source, "pk_nojars": source}}))
    jars = ",".join(spark_kafka_jars(stack_state))
    settings = ["--config", str(config), "--dsn", fresh_db, "--blob-url", str(tmp_path / "blobs"),
                "--bootstrap", kafka.bootstrap, "--spark-master", "local[2]"]
    cycle = _run(venv, cwd, "reclock", "cycle", "pk_orders", *settings, env={**env, "RECLOCK_SPARK_JARS": jars})
    assert cycle.returncode == 0, cycle.stdout[-2000:] + cycle.stderr[-4000:]

    read = _run(venv, cwd, "reclock", "read", "pk_orders", "--limit", "0", env={
        **env, "RECLOCK_DSN": fresh_db, "RECLOCK_BLOB_URL": str(tmp_path / "blobs")})  # the environment serves too
    assert read.returncode == 0, read.stderr[-3000:]
    assert re.search(rf"-- {RECORDS} distinct rows, {RECORDS} in all", read.stdout), read.stdout[-500:]
    assert not (cwd / "blobs").exists() and not any(cwd.iterdir())  # nothing lands in the cwd

    # a missing setting: exit 1, one line naming it and how to give it, no traceback
    def without(option: str) -> list[str]:
        i = settings.index(option)
        return settings[:i] + settings[i + 2:]

    bootstrap_missing = ("source pk_orders: no Kafka brokers: define the Airflow connection reclock_kafka (its "
                         "extra gives bootstrap.servers and the security settings, e.g. AIRFLOW_CONN_RECLOCK_KAFKA), "
                         "or, for an unsecured cluster, set RECLOCK_BOOTSTRAP (host:port,...; reclock commands: "
                         "--bootstrap) or give it `bootstrap:` in the config")
    cases = [
        (["cycle", "pk_orders", *without("--config")], NO_CONFIG),
        (["cycle", "pk_orders", *without("--config"), "--config", str(tmp_path / "nowhere.yaml")],
         f"config file {tmp_path / 'nowhere.yaml'} does not exist"),
        (["cycle", "pk_orders", *without("--dsn")], NO_DSN),
        (["cycle", "pk_orders", *without("--blob-url")], NO_BLOB),
        (["cycle", "pk_orders", *without("--bootstrap")], bootstrap_missing),
        (["cycle", "pk_orders", *without("--spark-master")], NO_SPARK),
        (["rebuild", "pk_orders", *without("--spark-master")], NO_SPARK),
        (["read", "pk_orders", "--blob-url", str(tmp_path / "blobs")], NO_DSN),
        (["read", "pk_orders", "--dsn", fresh_db], NO_BLOB),
        (["progress", "pk_orders"], NO_DSN),
        (["migrate"], NO_DSN),
        (["cycle", "pk_nojars", *settings], NO_CONNECTOR),  # a local session without the Kafka connector
    ]
    with ThreadPoolExecutor(4) as pool:  # each case its own process: four at a time, checked in order
        outs = list(pool.map(lambda case: _run(venv, cwd, "reclock", *case[0], env=env), cases))
    for (argv, message), out in zip(cases, outs):
        assert out.returncode == 1, (argv, out.stdout[-1000:], out.stderr[-3000:])
        assert f"error: {message}" in out.stderr, (argv, out.stderr[-3000:])
        assert "Traceback" not in out.stderr + out.stdout, (argv, out.stderr[-3000:])
