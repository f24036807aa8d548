"""The whole local stack: ``up`` starts what is not running, ``down`` stops what ``up`` started.

Start order: Postgres (migrated) -> Kafka -> S3 (moto's S3 + SQS server) -> Spark Connect -> Airflow (metadata
DB in Postgres, with the connections ``reclock_postgres``, ``reclock_kafka``, ``reclock_s3``, ``reclock_spark``
and ``reclock_spark_submit``, and the
settings no connection carries in its processes' environment: ``RECLOCK_CONFIG``, ``RECLOCK_BLOB_URL``,
``RECLOCK_SPARK_JARS``). :meth:`Stack.settings` gives every setting to the ``reclock`` commands
(``reclock dev env``); the library never looks for the stack itself.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reclock.dev.airflow import COMPONENTS, LocalAirflow
from reclock.dev.jars import ensure_jars
from reclock.dev.kafka import LocalKafka
from reclock.dev.postgres import LocalPostgres
from reclock.dev.procs import LOOPBACK
from reclock.dev.s3 import LocalS3
from reclock.dev.spark import LocalSparkConnect
from reclock.dev.state import REPO_ROOT, StackState, default_state_dir

SERVICES = ("postgres", "kafka", "s3", "spark", "airflow")


@dataclass
class Stack:
    state: StackState = field(default_factory=lambda: StackState(default_state_dir()))

    def __post_init__(self) -> None:
        self.postgres = LocalPostgres(self.state)
        self.kafka = LocalKafka(self.state)
        self.s3 = LocalS3(self.state, bucket="landing")
        self.spark = LocalSparkConnect(self.state)
        self.airflow = LocalAirflow(self.state, self.postgres.dsn("airflow"), self.airflow_settings())

    @property
    def config_file(self) -> Path:
        """The stack's Reclock config: ``$RECLOCK_CONFIG``, else the repo's ``include/reclock.yaml``."""
        return Path(os.environ.get("RECLOCK_CONFIG") or REPO_ROOT / "include" / "reclock.yaml").resolve()

    @property
    def blob_url(self) -> str:
        return str(self.state.root / "blobs")

    def spark_jars(self) -> str:
        """Spark's Kafka connector jars (resolved by ``reclock dev install``), comma-separated."""
        return ",".join(sorted(str(p) for p in (self.state.jars / "spark").glob("*.jar")))

    def airflow_settings(self) -> dict[str, str]:
        """What the Airflow processes get beyond the connections: the settings no connection carries, and
        this interpreter's folder first on PATH (the Spark provider runs ``spark-submit`` from PATH)."""
        return {"RECLOCK_CONFIG": str(self.config_file), "RECLOCK_BLOB_URL": self.blob_url,
                "RECLOCK_SPARK_JARS": self.spark_jars(),
                "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}

    def settings(self) -> dict[str, str]:
        """Every setting of the ``reclock`` commands for this stack (``reclock dev env`` prints them)."""
        return {"RECLOCK_CONFIG": str(self.config_file), "RECLOCK_DSN": self.postgres.dsn(),
                "RECLOCK_BLOB_URL": self.blob_url, "RECLOCK_BOOTSTRAP": self.kafka.bootstrap,
                "RECLOCK_SPARK_REMOTE": self.spark.url, "RECLOCK_SPARK_JARS": self.spark_jars(),
                "AIRFLOW_CONN_RECLOCK_S3": self.s3_connection_uri()}

    def s3_connection_uri(self) -> str:
        """The ``reclock_s3`` connection as an Airflow connection URI (what the commands find it by)."""
        from urllib.parse import quote

        st = self.s3.settings()
        return (f"aws://{quote(st.access_key, safe='')}:{quote(st.secret_key, safe='')}@/?endpoint_url="
                f"{quote(self.s3.endpoint_url, safe='')}&region_name={st.region}")

    def shell_env(self) -> tuple[dict[str, str], list[str]]:
        """What ``reclock dev env`` exports: :meth:`settings`, the Airflow settings an ``airflow`` command
        needs to act on this stack, and ``AIRFLOW_CONN_<ID>`` for every connection the stack defines (all
        those the demo config names), so a ``reclock`` command finds a source's ``connection:`` as a task
        does. Also the connections the stack's config names but the stack does not define (to warn of)."""
        from reclock.config import load_config

        conns = self.connections()
        env = {**self.settings(), **self.airflow.settings()}
        env.update({f"AIRFLOW_CONN_{cid.upper()}": json.dumps({k: v for k, v in c.items() if k != "description"})
                    for cid, c in sorted(conns.items())})
        named = load_config(self.config_file).connections() if self.config_file.is_file() else set()
        return env, sorted(named - set(conns))

    def connections(self) -> dict[str, dict]:
        """Airflow connections for the stack's services (the credentials come from ``stack.json``)."""
        return {
            "reclock_postgres": {
                "conn_type": "postgres", "host": LOOPBACK, "port": self.postgres.port, "login": "reclock",
                "password": self.postgres.password, "schema": "reclock",
                "description": "Reclock consensus and remap store (local stack)",
            },
            "reclock_kafka": {
                "conn_type": "generic", "host": LOOPBACK, "port": self.kafka.port,
                "extra": '{"bootstrap.servers": "%s"}' % self.kafka.bootstrap,
                "description": "Kafka broker (local stack)",
            },
            "reclock_s3": {
                "conn_type": "aws", "login": self.s3.settings().access_key, "password": self.s3.settings().secret_key,
                "extra": '{"endpoint_url": "%s", "region_name": "us-east-1"}' % self.s3.endpoint_url,
                "description": "S3 API and SQS of the S3 sources (local stack: moto's server)",
            },
            "reclock_spark": {
                "conn_type": "spark_connect", "host": LOOPBACK, "port": self.spark.port,
                "description": "Spark Connect server (local stack)",
            },
            "reclock_demo_shop": {
                "conn_type": "postgres", "host": LOOPBACK, "port": self.postgres.port, "login": "reclock",
                "password": self.postgres.password, "schema": "demo_shop",
                "description": "The demo_shop source's upstream database (local stack)",
            },
            "reclock_spark_submit": {
                "conn_type": "spark", "host": "local[2]",
                "description": "spark-submit master of spark_jobs/ (local stack: a driver beside the task)",
            },
        }

    def up(self, services: tuple[str, ...] = SERVICES, echo: Callable[[str], None] = print) -> dict[str, float]:
        """Start ``services`` (and what they depend on), idempotently; return seconds per service."""
        from reclock.persist.migrate import migrate

        timings: dict[str, float] = {}
        wanted = set(services)
        if "airflow" in wanted:
            wanted.add("postgres")
        if "postgres" in wanted:
            timings["postgres"] = self.postgres.start()
            applied = migrate(self.postgres.dsn())
            echo(f"postgres   up on {LOOPBACK}:{self.postgres.port} ({timings['postgres']:.1f}s)"
                 + (f", applied migrations {applied}" if applied else ""))
        if "kafka" in wanted:
            timings["kafka"] = self.kafka.start()
            echo(f"kafka      up on {self.kafka.bootstrap} ({timings['kafka']:.1f}s)")
        if "s3" in wanted:
            timings["s3"] = self.s3.start()
            echo(f"s3         S3 and SQS (moto) on {self.s3.endpoint_url} ({timings['s3']:.1f}s)")
        if "spark" in wanted:
            timings["spark"] = self.spark.start()
            echo(f"spark      Spark Connect on {self.spark.url} ({timings['spark']:.1f}s)")
        if "airflow" in wanted:
            ensure_jars(self.state, "spark")  # RECLOCK_SPARK_JARS of the Airflow processes
            self.airflow.extra_env = self.airflow_settings()
            timings["airflow"] = self.airflow.start(self.connections())
            echo(f"airflow    API/UI on {self.airflow.url} ({timings['airflow']:.1f}s)")
        return timings

    def down(self, echo: Callable[[str], None] = print) -> None:
        for name in self.airflow.stop():
            echo(f"stopped airflow {name}")
        if self.spark.stop():
            echo("stopped spark connect")
        if self.s3.stop():
            echo("stopped s3")
        if self.kafka.stop():
            echo("stopped kafka")
        if self.postgres.stop():
            echo("stopped postgres")

    def status(self) -> dict[str, str]:
        out = {
            "postgres": f"up {LOOPBACK}:{self.postgres.port}" if self.postgres.running() else "down",
            "kafka": f"up {self.kafka.bootstrap}" if self.kafka.running() else "down",
            "s3": f"up {self.s3.endpoint_url}" if self.s3.running() else "down",
            "spark": f"up {self.spark.url}" if self.spark.running() else "down",
        }
        for c in COMPONENTS:
            out[f"airflow {c}"] = "up" + (f" {self.airflow.url}" if c == "api-server" else "") \
                if self.airflow.running(c) else "down"
        return out

    def logs(self) -> dict[str, Path]:
        files = {"postgres": self.postgres.log, "kafka": self.kafka.log, "kafka-server": self.kafka.home / "server.log",
                 "s3": self.s3.log,
                 "spark": self.spark.log}
        files.update({f"airflow-{c}": self.airflow.logfile(c) for c in COMPONENTS})
        return files

    def smoke(self, echo: Callable[[str], None] = print) -> None:
        from reclock.dev import smoke

        for name, check in (
            ("postgres", lambda: smoke.check_postgres(self.postgres.dsn())),
            ("kafka", lambda: smoke.check_kafka(self.kafka.bootstrap)),
            ("s3", lambda: smoke.check_s3(self.s3)),
            ("spark", lambda: smoke.check_spark_connect(self.spark.url)),
            ("airflow", lambda: smoke.check_airflow(self.airflow)),
        ):
            t0 = time.monotonic()
            echo(f"check {name:9s} ok: {check()} ({time.monotonic() - t0:.1f}s)")
