"""Spark: a standing Spark Connect server for the stack, and local sessions for tests and benchmarks.

Both get Spark's Kafka connector jars (resolved by Maven) and the library's driver settings
(``reclock.spark.session``), and bind only to 127.0.0.1 (``SPARK_LOCAL_IP``, driver host and bind address,
the Connect gRPC address).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from reclock.dev import procs
from reclock.dev.jars import spark_kafka_jars
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import StackState
from reclock.spark.session import LOCAL_CONF, SPARK_CONF, driver_session


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


@dataclass
class LocalSparkConnect:
    """A Spark Connect server (``spark-submit ... SparkConnectServer``) on ``local[*]``."""

    state: StackState
    master: str = "local[*]"
    driver_memory: str = "2g"
    launcher: tuple[str, ...] = ()  # a command the server is started under (tests: a mount namespace)

    @property
    def home(self) -> Path:
        return self.state.dir("spark")

    @property
    def port(self) -> int:
        return self.state.port("spark_connect")

    @property
    def ui_port(self) -> int:
        return self.state.port("spark_ui")

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    @property
    def pidfile(self) -> Path:
        return self.home / "spark-connect.pid"

    @property
    def log(self) -> Path:
        return self.home / "spark-connect.log"

    def running(self) -> bool:
        return procs.read_pid(self.pidfile) is not None

    def start(self, timeout: float = 120) -> float:
        t0 = time.monotonic()
        if not self.running():
            jars = spark_kafka_jars(self.state)
            conf = {
                **SPARK_CONF,
                **LOOPBACK_CONF,
                "spark.sql.shuffle.partitions": LOCAL_CONF["spark.sql.shuffle.partitions"],
                "spark.master": self.master,
                "spark.driver.memory": self.driver_memory,
                "spark.connect.grpc.binding.address": LOOPBACK,
                "spark.connect.grpc.binding.port": str(self.port),
                "spark.ui.port": str(self.ui_port),
                "spark.sql.warehouse.dir": str(self.home / "warehouse"),
                "spark.local.dir": str(self.home / "tmp"),
            }
            argv = [*self.launcher, str(spark_home() / "bin" / "spark-submit"),
                    "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                    "--name", "reclock-spark-connect", "--jars", ",".join(jars)]
            for k, v in conf.items():
                argv += ["--conf", f"{k}={v}"]
            argv.append("spark-internal")
            procs.spawn("spark-connect", argv, log=self.log, pidfile=self.pidfile, env=spark_env(),
                        cwd=self.home)
        procs.wait_until("spark connect", lambda: procs.port_open(self.port), timeout, log=self.log,
                         alive=self.running)
        return time.monotonic() - t0

    def session(self, scope: str | None = None):
        """A Spark Connect client session to this server; on the server-side session ``scope``'s processes
        share when given (``reclock.spark.connect``)."""
        from pyspark.sql import SparkSession

        if scope is not None:
            from reclock.spark.connect import shared_session

            return shared_session(self.url, scope)
        return SparkSession.builder.remote(self.url).getOrCreate()

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=30)
