"""A Spark standalone cluster on this machine: a master, ``workers`` workers (each its own JVM and
``SPARK_WORKER_DIR``), and a Spark Connect server whose jobs run on them. For tests and benchmarks of
Spark beyond ``local[*]``: executors in other JVMs than the driver, fetching the jars they need from it,
writing parts where every one of them can (a shared folder, or an ``s3://`` store).

::

    Connect server (driver)  --spark://-->  master  <--register--  worker 0  --spawns-->  executor
      sc://127.0.0.1:P          (spark-class ...deploy.master.Master)  worker 1  --spawns-->  executor

With ``connects`` > 1 there are that many Connect servers (drivers), each its own application with an
executor on every worker (the workers' cores and memory are multiplied to hold them): servers that stand in
for each other (``reclock.spark.connect``, :attr:`LocalSparkCluster.remote`).

Everything comes from the pyspark wheel (``bin/spark-class``) and listens on 127.0.0.1 only: the master,
the workers and their web UIs on ports chosen free (kept in ``state``), the driver's RPC and block
manager ports likewise, and every executor's on ephemeral ports of ``SPARK_LOCAL_IP``. A worker's
executors inherit its environment, which is how the S3 keys reach them (never through Spark settings).
:meth:`LocalSparkCluster.stop` ends every process it started.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.spark import LocalSparkConnect, spark_env, spark_home
from reclock.dev.state import StackState
from reclock.persist.objectstore import S3Settings, jvm_env

DAEMON_MEMORY = "256m"
"""Heap of the master and worker daemons (they schedule; executors do the work)."""

SAVED_OUTPUT = re.compile(r"(?:Saved|Direct) output of task '(attempt_[0-9]+_[0-9]+_m_[0-9]+_[0-9]+)' to (\S+)")
"""What an executor logs (INFO) for a task's files: Hadoop's FileOutputCommitter when it commits them, or
Reclock's direct committer (parts on S3, ``jvm/committer``) when the task starts writing them in place."""


@dataclass
class LocalSparkCluster:
    """A standalone master, ``workers`` workers of ``worker_cores`` cores and ``worker_memory`` each (per
    Connect server), and ``connects`` Spark Connect servers on them (with the S3A jars, settings and keys when
    ``s3`` is given)."""

    state: StackState
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    executor_memory: str = "1g"
    driver_memory: str = "1g"
    s3: S3Settings | None = None
    connects: int = 1

    def __post_init__(self) -> None:
        if self.connects < 1:
            raise ValueError(f"a cluster needs a Connect server, got connects={self.connects}")
        self.connect_servers = [self._connect_server(i) for i in range(self.connects)]
        self.connect = self.connect_servers[0]

    def _connect_server(self, i: int) -> LocalSparkConnect:
        suffix = f"_{i}" if i else ""
        # each application its share of every worker: one executor of worker_cores there
        shares = {"spark.executor.cores": str(self.worker_cores),
                  "spark.cores.max": str(self.worker_cores * self.workers)} if self.connects > 1 else {}
        return LocalSparkConnect(
            self.state, master=self.master_url, driver_memory=self.driver_memory, name=f"cluster_connect{suffix}",
            s3=self.s3, conf={
                "spark.driver.port": str(self.state.port(f"cluster_driver{suffix}")),
                "spark.driver.blockManager.port": str(self.state.port(f"cluster_driver_block_manager{suffix}")),
                "spark.executor.memory": self.executor_memory,
                # a job starts once every worker's executor registered, not on the first one alone
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
                **shares,
            })

    @property
    def home(self) -> Path:
        return self.state.dir("cluster")

    @property
    def master_port(self) -> int:
        return self.state.port("cluster_master")

    @property
    def master_ui_port(self) -> int:
        return self.state.port("cluster_master_ui")

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.master_port}"

    @property
    def url(self) -> str:
        """The Spark Connect URL (``sc://``) of the cluster's (first) Connect server."""
        return self.connect.url

    @property
    def remote(self) -> str:
        """Every Connect server's URL, comma-separated (what ``RECLOCK_SPARK_REMOTE`` takes)."""
        return ",".join(c.url for c in self.connect_servers)

    def worker_dir(self, i: int) -> Path:
        """Worker ``i``'s ``SPARK_WORKER_DIR``: one folder per application, one per executor in it, holding
        the executor's ``stdout`` and ``stderr`` (its log)."""
        return self.state.dir(f"cluster/worker-{i}")

    def _pidfile(self, daemon: str) -> Path:
        return self.home / f"{daemon}.pid"

    def worker_pidfile(self, i: int) -> Path:
        """Worker ``i``'s pidfile: the leader of a process group that holds its executors too."""
        return self._pidfile(f"worker-{i}")

    def _log(self, daemon: str) -> Path:
        return self.home / f"{daemon}.log"

    def _env(self, worker_dir: Path | None = None) -> dict[str, str]:
        env = {**spark_env(), "SPARK_DAEMON_MEMORY": DAEMON_MEMORY, "SPARK_NO_DAEMONIZE": "1",
               "SPARK_LOG_DIR": str(self.home), "SPARK_PID_DIR": str(self.home)}
        if worker_dir is not None:
            env["SPARK_WORKER_DIR"] = str(worker_dir)
            env["SPARK_LOCAL_DIRS"] = str(worker_dir / "tmp")  # its executors' shuffle and jar files
            if self.s3 is not None:
                env.update(jvm_env(self.s3))  # the worker's executors inherit them
        return env

    def _spawn(self, daemon: str, argv: list[str], env: dict[str, str]) -> None:
        if procs.read_pid(self._pidfile(daemon)) is None:
            procs.spawn(daemon, [str(spark_home() / "bin" / "spark-class"), *argv], log=self._log(daemon),
                        pidfile=self._pidfile(daemon), env=env, cwd=self.home)

    def start(self, timeout: float = 180, executors: bool = True) -> float:
        """Start the master, the workers and the Connect server (what is not running yet), and wait until
        every worker registered and (``executors``) the Connect server's application has an executor on each.
        Without ``executors`` a worker started again is left to get its executor while the caller goes on
        (the master asks for it once the worker registered)."""
        t0 = time.monotonic()
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
                               "--port", str(self.master_port), "--webui-port", str(self.master_ui_port)],
                    self._env())
        procs.wait_until("spark master", lambda: procs.port_open(self.master_port), timeout,
                         log=self._log("master"), alive=lambda: procs.read_pid(self._pidfile("master")) is not None)
        for i in range(self.workers):
            d = self.worker_dir(i)
            self._spawn(f"worker-{i}", [
                "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
                "--port", str(self.state.port(f"cluster_worker{i}")),
                "--webui-port", str(self.state.port(f"cluster_worker{i}_ui")),
                "--cores", str(self.worker_cores * self.connects),
                "--memory", _times(self.worker_memory, self.connects), "--work-dir", str(d),
                self.master_url], self._env(d))
        procs.wait_until(f"{self.workers} spark workers registered", lambda: len(self.alive_workers()) >= self.workers,
                         timeout, log=self._log("worker-0"))
        _, errors = procs.side_by_side({c.name: lambda c=c: c.start(timeout) for c in self.connect_servers})
        for error in errors.values():
            raise error
        if executors:
            for c in self.connect_servers:
                procs.wait_until(f"an executor of {c.name} on each of {self.workers} workers",
                                 lambda c=c: len(self.executors(c)) >= self.workers, timeout, log=c.log,
                                 alive=c.running)
        return time.monotonic() - t0

    def _master_state(self) -> dict:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.master_ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def alive_workers(self) -> list[dict]:
        """The workers the master counts as alive (its web UI's JSON)."""
        return [w for w in self._master_state().get("workers", []) if w.get("state") == "ALIVE"]

    def executors(self, connect: LocalSparkConnect | None = None) -> list[dict]:
        """The active executors of a Connect server's application (default: the first; its REST API; the
        driver is none)."""
        base = f"http://{LOOPBACK}:{(connect or self.connect).ui_port}/api/v1/applications"
        with urllib.request.urlopen(base, timeout=5) as r:
            apps = json.load(r)
        with urllib.request.urlopen(f"{base}/{apps[0]['id']}/executors", timeout=5) as r:
            return [e for e in json.load(r) if e["id"] != "driver" and e.get("isActive", True)]

    def saved_task_outputs(self) -> dict[int, list[tuple[str, str]]]:
        """Per worker: ``(task attempt, output path)`` of every task whose files an executor of that worker
        wrote (its executors' logs: the FileOutputCommitter's "Saved output of task" lines, the direct committer's
        "Direct output of task")."""
        out: dict[int, list[tuple[str, str]]] = {}
        for i in range(self.workers):
            found = []
            for log in sorted(self.worker_dir(i).glob("*/*/stderr")):
                found += SAVED_OUTPUT.findall(log.read_text(errors="replace"))
            out[i] = found
        return out

    def running(self) -> bool:
        return any(procs.read_pid(self._pidfile(d)) is not None
                   for d in ("master", *(f"worker-{i}" for i in range(self.workers)))) or any(
                       c.running() for c in self.connect_servers)

    def stop(self) -> list[str]:
        """Stop the Connect servers, the workers (and so their executors) and the master, side by side; return
        what ran."""
        stops = {c.name: c.stop for c in self.connect_servers}
        for daemon in (*(f"worker-{i}" for i in range(self.workers)), "master"):
            stops[daemon] = lambda pidfile=self._pidfile(daemon): procs.stop(pidfile, timeout=20)
        ran, errors = procs.side_by_side(stops)
        for error in errors.values():
            raise error
        return [name for name in stops if ran[name]]


def _times(memory: str, n: int) -> str:
    """A JVM memory size (``768m``, ``1g``) times ``n``."""
    m = re.fullmatch(r"(\d+)([kKmMgGtT]?)", memory)
    if m is None:
        raise ValueError(f"not a memory size (e.g. 1g, 768m): {memory!r}")
    return f"{int(m.group(1)) * n}{m.group(2)}"
