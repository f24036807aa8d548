"""Spark: a standing Spark Connect server for the stack, and local sessions for tests and benchmarks.

Both get Spark's Kafka connector jars (resolved by Maven) and the library's driver settings
(``reclock.spark.session``), and bind only to 127.0.0.1 (``SPARK_LOCAL_IP``, driver host and bind address,
the Connect gRPC address). A Connect server given :class:`~reclock.persist.objectstore.S3Settings` also
gets the S3A jars and settings, and the keys in its environment, so its jobs read and write ``s3a://``.

A Connect server with a ``token`` refuses every client that does not present it (Spark's
``spark.connect.authenticate.token``, given in the server's environment, never its command line); with
``tls`` it is reached through a TLS front (``reclock.dev.tls_front``) with the stack CA's certificate, and
:attr:`LocalSparkConnect.url` is ``sc://127.0.0.1:<tls port>/;use_ssl=true;token=...``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from reclock.dev import procs
from reclock.dev.jars import spark_kafka_jars, spark_s3a_jars
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, StackState
from reclock.persist.objectstore import S3Settings, jvm_env, jvm_trust_options, spark_s3a_conf
from reclock.spark.jobs import PARTS_COMMITTER_CONF
from reclock.spark.session import LOCAL_CONF, SPARK_CONF, classpath_conf, driver_session


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def spark_env() -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_LOCAL_IP"] = LOOPBACK
    env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", _python()))
    env["SPARK_HOME"] = str(spark_home())
    return env


def _python() -> str:
    import sys

    return sys.executable


LOOPBACK_CONF = {"spark.driver.host": LOOPBACK, "spark.driver.bindAddress": LOOPBACK}


def local_session(state: StackState, app: str = "reclock", master: str = "local[2]", ui: bool = False):
    """An in-process ``SparkSession`` with the Kafka connector (tests share one per session)."""
    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    return driver_session(master, app, {**LOOPBACK_CONF, "spark.jars": ",".join(spark_kafka_jars(state)),
                                        "spark.ui.enabled": "true" if ui else "false"})


ORPHANS_CONF = {"spark.connect.execute.manager.detachedTimeout": "60s"}
"""How long the server keeps running an operation whose client has gone (a killed task: no RPC attached to
it) before it interrupts it: a minute, not Spark's five. A live client is always attached (it reattaches at
once when a stream ends), so only orphans are cut. Issue 37's campaign: the jobs of killed tasks kept a
restarted server's single executor busy for minutes while new tries queued behind them. The source's next
write interrupts such work itself (``reclock.spark.orphans``); this is what ends what that cannot reach. The
deployment guide recommends the same setting (docs/deployment.md)."""


@dataclass
class LocalSparkConnect(LocalServer):
    """A Spark Connect server (``spark-submit ... SparkConnectServer``) on ``master`` (default ``local[*]``),
    its files under ``state``'s folder ``name`` and its ports named ``<name>_connect`` and ``<name>_ui``.
    With ``s3``: S3A jars (shipped to executors too), settings and keys (in its environment); ``conf``:
    more Spark settings."""

    state: StackState
    master: str = "local[*]"
    driver_memory: str = "2g"
    name: str = "spark"
    s3: S3Settings | None = None
    conf: dict[str, str] = field(default_factory=dict)
    launcher: tuple[str, ...] = ()  # a command the server is started under (tests: a mount namespace)
    token: str | None = field(default=None, repr=False)  # clients must present it
    tls: bool = False  # clients reach it through a TLS front on the port ``<name>_tls``

    process: ClassVar[str] = "spark-connect"

    @property
    def port(self) -> int:
        return self.state.port(f"{self.name}_connect")

    @property
    def ui_port(self) -> int:
        return self.state.port(f"{self.name}_ui")

    @property
    def url(self) -> str:
        """The URL a client uses: the TLS front's with ``use_ssl`` when ``tls``, the token when one is set."""
        params = (["use_ssl=true"] if self.tls else []) + ([f"token={self.token}"] if self.token else [])
        if self.tls:
            return f"sc://{LOOPBACK}:{self._front().port}/;" + ";".join(params)
        return f"sc://{LOOPBACK}:{self.port}" + ("/;" + ";".join(params) if params else "")

    def _front(self):
        from reclock.dev.tls_front import LocalTlsFront

        return LocalTlsFront(self.state, f"{self.name}_tls", self.port)

    def start(self, timeout: float = 120) -> float:
        t0 = time.monotonic()
        if not self.running():
            jars = spark_kafka_jars(self.state) + (spark_s3a_jars(self.state) if self.s3 else [])
            env = {**spark_env(), **(jvm_env(self.s3) if self.s3 else {})}
            if self.token:
                env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = self.token  # the environment: not the command line
            java: dict[str, str] = {}
            if self.s3 is not None and self.s3.ca_bundle:
                from reclock.dev.tls import LocalCA

                trust = jvm_trust_options(str(LocalCA(self.state).java_truststore()))
                java = {"spark.driver.extraJavaOptions": trust, "spark.executor.extraJavaOptions": trust}
            conf = {
                **SPARK_CONF,
                **LOOPBACK_CONF,
                "spark.sql.shuffle.partitions": LOCAL_CONF["spark.sql.shuffle.partitions"],
                "spark.master": self.master,
                "spark.driver.memory": self.driver_memory,
                "spark.connect.grpc.binding.address": LOOPBACK,
                "spark.connect.grpc.binding.port": str(self.port),
                **ORPHANS_CONF,
                "spark.ui.port": str(self.ui_port),
                "spark.sql.warehouse.dir": str(self.home / "warehouse"),
                "spark.local.dir": str(self.home / "tmp"),
                **(spark_s3a_conf(self.s3) if self.s3 else {}),
                **({PARTS_COMMITTER_CONF: "direct"} if self.s3 else {}),  # its jar is among the S3 jars
                **java,
                **self.conf,
            }
            conf.update(classpath_conf(jars, conf))  # the raw-floats jar ahead of the wheel's parquet
            argv = [*self.launcher, str(spark_home() / "bin" / "spark-submit"),
                    "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                    "--name", "reclock-spark-connect", "--jars", ",".join(jars)]
            for k, v in conf.items():
                argv += ["--conf", f"{k}={v}"]
            argv.append("spark-internal")
            procs.spawn("spark-connect", argv, log=self.log, pidfile=self.pidfile, env=env, cwd=self.home)
        procs.wait_until("spark connect", lambda: procs.port_open(self.port), timeout, log=self.log,
                         alive=self.running)
        if self.tls:
            self._front().start()
        return time.monotonic() - t0

    def session(self, scope: str | None = None):
        """A Spark Connect client session to this server; on the server-side session ``scope``'s processes
        share when given (``reclock.spark.connect``)."""
        if scope is not None:
            from reclock.spark.connect import shared_session

            return shared_session(self.url, scope)
        from reclock.spark.connect import remote_session

        return remote_session(self.url)

    def stop(self) -> bool:
        if self.tls:
            self._front().stop()
        return procs.stop(self.pidfile, timeout=30)
