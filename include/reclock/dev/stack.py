"""The whole local stack: ``up`` starts what is not running, ``down`` stops what ``up`` started.

Start order: Postgres (migrated) -> Kafka -> S3 (moto's S3 + SQS server) -> Spark Connect -> Airflow (metadata
DB in Postgres, with the connections ``reclock_postgres``, ``reclock_kafka``, ``reclock_s3``, ``reclock_spark``
and ``reclock_spark_submit``, and the
settings no connection carries in its processes' environment: ``RECLOCK_CONFIG``, ``RECLOCK_BLOB_URL``,
``RECLOCK_SPARK_JARS``). :meth:`Stack.settings` gives every setting to the ``reclock`` commands
(``reclock dev env``); the library never looks for the stack itself.

``Stack(state, secure=True)`` (``reclock dev up --secure``; a state folder remembers it) is the deployment's
security in miniature, every certificate signed by the stack's own CA (``reclock.dev.tls``):

- Postgres accepts only TLS with SCRAM; Reclock connects as ``reclock_app``, which owns the ``reclock``
  schema and nothing else; Airflow as ``airflow``, the owner of its database; a Postgres source's upstream
  as ``reclock_cdc`` (REPLICATION, SELECT on the published tables): ``reclock.grants``.
- Kafka takes SASL/SCRAM-SHA-512 over TLS (and mutual TLS) with ACLs; the user ``reclock`` gets exactly the
  ACLs of the config's sources and sinks (``reclock.grants.kafka_acls``), the stack itself acts as
  ``admin`` (a client certificate).
- Parts live in S3 (moto) over TLS; Spark Connect asks for a token and is reached over TLS.
- The Airflow connections carry the TLS settings and the CA; Airflow's processes trust the CA for Spark
  Connect (``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``).
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
from reclock.dev.tls import LocalCA

SERVICES = ("postgres", "kafka", "s3", "spark", "airflow")
CONSENSUS_ROLE, AIRFLOW_ROLE, CDC_ROLE, KAFKA_USER = "reclock_app", "airflow", "reclock_cdc", "reclock"


@dataclass
class Stack:
    state: StackState = field(default_factory=lambda: StackState(default_state_dir()))
    secure: bool | None = None  # None: as the state folder was first brought up (default: not secured)

    def __post_init__(self) -> None:
        data = self.state.load()
        if self.secure is None:
            self.secure = bool(data.get("secure", False))
        elif data.get("secure", self.secure) != self.secure and (self.state.root / "postgres").exists():
            from reclock.errors import StackError

            raise StackError(f"the stack in {self.state.root} was set up {'with' if data['secure'] else 'without'} "
                             "--secure; bring it down and remove the folder to change that")
        if data.get("secure") != self.secure:
            data["secure"] = self.secure
            self.state.save(data)
        self.postgres = LocalPostgres(self.state, tls=self.secure)
        self.kafka = LocalKafka(self.state, secure=self.secure)
        self.s3 = LocalS3(self.state, bucket="landing", tls=self.secure)
        self.spark = LocalSparkConnect(self.state, s3=self.s3.settings() if self.secure else None,
                                       token=self.state.secret("spark_connect_token") if self.secure else None,
                                       tls=self.secure)
        self.airflow = LocalAirflow(self.state, self.airflow_dsn, self.airflow_settings())

    def password(self, role: str) -> str:
        """The password of a role or user the secured stack made (kept in ``stack.json``)."""
        return self.state.secret(f"password_{role}")

    @property
    def ca(self) -> LocalCA:
        return LocalCA(self.state)

    @property
    def dsn(self) -> str:
        """Reclock's consensus database: as ``reclock_app`` over TLS when secured."""
        return (self.postgres.dsn("reclock", CONSENSUS_ROLE, self.password(CONSENSUS_ROLE)) if self.secure
                else self.postgres.dsn())

    @property
    def airflow_dsn(self) -> str:
        return (self.postgres.dsn("airflow", AIRFLOW_ROLE, self.password(AIRFLOW_ROLE)) if self.secure
                else self.postgres.dsn("airflow"))

    def kafka_config(self):
        """Reclock's Kafka client config: the ``reclock`` user over SCRAM/TLS when secured."""
        return (self.kafka.scram_config(KAFKA_USER, self.password(KAFKA_USER)) if self.secure
                else self.kafka.admin_config())

    @property
    def config_file(self) -> Path:
        """The stack's Reclock config: ``$RECLOCK_CONFIG``, else the repo's ``include/reclock.yaml``."""
        return Path(os.environ.get("RECLOCK_CONFIG") or REPO_ROOT / "include" / "reclock.yaml").resolve()

    @property
    def blob_url(self) -> str:
        return self.s3.url("parts") if self.secure else str(self.state.root / "blobs")

    def spark_jars(self) -> str:
        """Spark's Kafka connector jars (resolved by ``reclock dev install``), comma-separated."""
        return ",".join(sorted(str(p) for p in (self.state.jars / "spark").glob("*.jar")))

    def airflow_settings(self) -> dict[str, str]:
        """What the Airflow processes get beyond the connections: the settings no connection carries, and
        this interpreter's folder first on PATH (the Spark provider runs ``spark-submit`` from PATH)."""
        out = {"RECLOCK_CONFIG": str(self.config_file), "RECLOCK_BLOB_URL": self.blob_url,
               "RECLOCK_SPARK_JARS": self.spark_jars(),
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        if self.secure:
            out["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(self.ca.cert)  # Spark Connect's TLS front
        return out

    def settings(self) -> dict[str, str]:
        """Every setting of the ``reclock`` commands for this stack (``reclock dev env`` prints them). A
        secured stack gives Kafka and S3 as connections (``AIRFLOW_CONN_*``: no Airflow needed to read them)."""
        import json

        out = {"RECLOCK_CONFIG": str(self.config_file), "RECLOCK_DSN": self.dsn,
               "RECLOCK_BLOB_URL": self.blob_url, "RECLOCK_SPARK_REMOTE": self.spark.url,
               "RECLOCK_SPARK_JARS": self.spark_jars()}
        if not self.secure:
            return {**out, "RECLOCK_BOOTSTRAP": self.kafka.bootstrap, "AIRFLOW_CONN_RECLOCK_S3": self.s3_connection_uri()}
        conns = self.connections()
        for conn_id in ("reclock_kafka", "reclock_s3"):
            out[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(
                {k: v for k, v in conns[conn_id].items() if k != "description"})
        out["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(self.ca.cert)
        return out

    def _check_spark(self) -> str:
        """The smoke query over Spark Connect; a secured stack's TLS front is signed by the stack's CA, which
        the client trusts for this query whatever CA file the environment names (a system bundle would not)."""
        from reclock.dev import smoke
        from reclock.spark.connect import ROOTS

        if not self.secure:
            return smoke.check_spark_connect(self.spark.url)
        before = os.environ.get(ROOTS)
        os.environ[ROOTS] = str(self.ca.cert)
        try:
            return smoke.check_spark_connect(self.spark.url)
        finally:
            if before is None:
                os.environ.pop(ROOTS, None)
            else:
                os.environ[ROOTS] = before

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
        if self.secure:
            return self._secure_connections()
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

    def _secure_connections(self) -> dict[str, dict]:
        import json

        ca = str(self.ca.cert)
        tls = json.dumps({"sslmode": "verify-full", "sslrootcert": ca})
        s3 = self.s3.settings()
        return {
            "reclock_postgres": {
                "conn_type": "postgres", "host": LOOPBACK, "port": self.postgres.port, "login": CONSENSUS_ROLE,
                "password": self.password(CONSENSUS_ROLE), "schema": "reclock", "extra": tls,
                "description": "Reclock consensus and remap store (local stack, TLS)"},
            "reclock_kafka": {
                "conn_type": "kafka", "login": KAFKA_USER, "password": self.password(KAFKA_USER),
                "extra": json.dumps({"bootstrap.servers": self.kafka.bootstrap, "security.protocol": "SASL_SSL",
                                     "sasl.mechanism": "SCRAM-SHA-512", "ssl.ca.location": ca}),
                "description": "Kafka (local stack, SASL/SCRAM-SHA-512 over TLS)"},
            "reclock_spark": {
                "conn_type": "spark_connect", "host": LOOPBACK, "port": self.spark._front().port,
                "password": self.spark.token, "extra": json.dumps({"use_ssl": True}),
                "description": "Spark Connect (local stack, token over TLS)"},
            "reclock_s3": {
                "conn_type": "aws", "login": s3.access_key, "password": s3.secret_key,
                "extra": json.dumps({"endpoint_url": s3.endpoint_url, "region_name": s3.region, "verify": ca}),
                "description": "S3 (local stack, TLS)"},
            "reclock_demo_shop": {
                "conn_type": "postgres", "host": LOOPBACK, "port": self.postgres.port, "login": CDC_ROLE,
                "password": self.password(CDC_ROLE), "schema": "demo_shop", "extra": tls,
                "description": "The demo_shop source's upstream database (local stack, TLS)"},
            "reclock_spark_submit": {
                "conn_type": "spark", "host": "local[2]",
                "description": "spark-submit master of spark_jobs/ (local stack: a driver beside the task)"},
        }

    def _secure_postgres(self) -> None:
        """The roles of a secured stack: ``reclock_app`` with :func:`reclock.grants.consensus_grants`,
        ``airflow`` owning its database, ``reclock_cdc`` (granted per upstream by the demo)."""
        import psycopg

        from reclock.grants import consensus_grants

        for role in (CONSENSUS_ROLE, AIRFLOW_ROLE, CDC_ROLE):
            self.postgres.create_role(role, self.password(role))
        with psycopg.connect(self.postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE airflow OWNER TO "{AIRFLOW_ROLE}"')
        with psycopg.connect(self.postgres.dsn("reclock"), autocommit=True) as conn:
            if conn.execute("SELECT to_regnamespace('reclock') IS NULL").fetchone()[0]:
                for sql in consensus_grants(CONSENSUS_ROLE, "reclock"):
                    conn.execute(sql)

    def _secure_kafka(self) -> None:
        """The user ``reclock`` and exactly the ACLs of the stack's config."""
        from reclock.config import load_config
        from reclock.grants import kafka_acls

        self.kafka.add_user(KAFKA_USER, self.password(KAFKA_USER))
        for acl in kafka_acls(load_config(self.config_file)):
            self.kafka.grant(KAFKA_USER, acl.operation, acl.resource_type, acl.name)

    def up(self, services: tuple[str, ...] = SERVICES, echo: Callable[[str], None] = print) -> dict[str, float]:
        """Start ``services`` (and what they depend on), idempotently; return seconds per service. Postgres
        comes first (it holds Airflow's metadata); the others then start side by side, each waiting on its own
        health (a JVM's start-up, Airflow's migration) rather than on the ones before it. A service that fails
        to start fails ``up`` (after the others' starts ended)."""
        from concurrent.futures import ThreadPoolExecutor

        from reclock.persist.migrate import migrate

        timings: dict[str, float] = {}
        wanted = set(services)
        if "airflow" in wanted:
            wanted.add("postgres")
        if self.secure and "spark" in wanted:
            wanted.add("s3")  # the parts, and Spark's S3A
        if "postgres" in wanted:
            timings["postgres"] = self.postgres.start()
            if self.secure:
                self._secure_postgres()
            applied = migrate(self.dsn)
            echo(f"postgres   up on {LOOPBACK}:{self.postgres.port} ({timings['postgres']:.1f}s)"
                 + (f", applied migrations {applied}" if applied else ""))

        def kafka() -> None:
            timings["kafka"] = self.kafka.start()
            if self.secure:
                self._secure_kafka()
            echo(f"kafka      up on {self.kafka.bootstrap} ({timings['kafka']:.1f}s)"
                 + (" SASL_SSL; mutual TLS on " + self.kafka.mtls_bootstrap if self.secure else ""))

        def s3() -> None:
            timings["s3"] = self.s3.start()
            echo(f"s3         S3 and SQS (moto) on {self.s3.endpoint_url} ({timings['s3']:.1f}s)")

        def spark() -> None:
            if self.secure:
                s3()  # before the Connect server that writes parts to it
            timings["spark"] = self.spark.start()
            where = self.spark.url.split(";token=")[0]  # never the token
            echo(f"spark      Spark Connect on {where} ({timings['spark']:.1f}s)")

        def airflow() -> None:
            ensure_jars(self.state, "spark")  # RECLOCK_SPARK_JARS of the Airflow processes
            self.airflow.extra_env = self.airflow_settings()
            timings["airflow"] = self.airflow.start(self.connections())
            echo(f"airflow    API/UI on {self.airflow.url} ({timings['airflow']:.1f}s)")

        starts = [start for name, start in (("kafka", kafka), ("s3", s3), ("spark", spark), ("airflow", airflow))
                  if name in wanted and not (name == "s3" and self.secure and "spark" in wanted)]
        if starts:
            with ThreadPoolExecutor(len(starts)) as pool:
                ended = [pool.submit(start) for start in starts]
            for start in ended:
                start.result()  # the first failure, raised
        return timings

    def down(self, echo: Callable[[str], None] = print) -> None:
        """Stop Airflow, then Spark Connect, the S3 endpoint and Kafka side by side, then Postgres (which
        Airflow's processes use until they end)."""
        from concurrent.futures import ThreadPoolExecutor

        for name in self.airflow.stop():
            echo(f"stopped airflow {name}")
        with ThreadPoolExecutor(3) as pool:
            stops = [(name, pool.submit(server.stop)) for name, server in
                     (("spark connect", self.spark), ("s3", self.s3), ("kafka", self.kafka))]
        for name, stopped in stops:
            if stopped.result():
                echo(f"stopped {name}")
        if self.postgres.stop():
            echo("stopped postgres")

    def status(self) -> dict[str, str]:
        out = {
            "postgres": f"up {LOOPBACK}:{self.postgres.port}" if self.postgres.running() else "down",
            "kafka": f"up {self.kafka.bootstrap}" if self.kafka.running() else "down",
            "s3": f"up {self.s3.endpoint_url}" if self.s3.running() else "down",
            "spark": f"up {self.spark.url.split(';token=')[0]}" if self.spark.running() else "down",
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
            ("postgres", lambda: smoke.check_postgres(self.dsn)),
            ("kafka", lambda: smoke.check_kafka(self.kafka.admin_config())),
            ("s3", lambda: smoke.check_s3(self.s3)),
            ("spark", self._check_spark),
            ("airflow", lambda: smoke.check_airflow(self.airflow)),
        ):
            t0 = time.monotonic()
            echo(f"check {name:9s} ok: {check()} ({time.monotonic() - t0:.1f}s)")
