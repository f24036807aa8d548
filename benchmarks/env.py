"""The services one benchmark run owns: Postgres, Kafka and one local Spark session, in a temporary folder.

:func:`services` starts them, yields an :class:`Env`, and stops every one of them on the way out, also
when the run fails or is interrupted. The services keep all their state in the temporary folder
(``RECLOCK_HOME`` points into it; only the repo's resolved jars are read from ``.reclock/jars``), and every
server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import psutil

from benchmarks.memory import process_tree

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from reclock.dev.kafka import LocalKafka
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.state import StackState

SPARK_MASTER = "local[2]"
THROWAWAY_GRACE_S = 5
"""How long the run's broker may take over a controlled shutdown before it is SIGKILLed: its data goes with
the run's folder."""


@dataclass
class Env:
    """Where the services of a run live; every contender reads and writes through this."""

    root: Path  # the run's temporary folder
    state: StackState
    postgres: LocalPostgres
    kafka: LocalKafka
    spark: SparkSession  # shared by every Spark contender
    echo: Callable[[str], None]

    @property
    def dsn(self) -> str:
        return self.postgres.dsn()

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def work(self) -> Path:
        """Scratch space for the contenders' outputs (removed after each repetition)."""
        d = self.root / "work"
        d.mkdir(exist_ok=True)
        return d

    @property
    def jvm_pid(self) -> int:
        """The Spark driver JVM (a child of this process, started by py4j)."""
        return self.spark.sparkContext._gateway.proc.pid

    def memory_groups(self) -> dict[str, Callable[[], list[psutil.Process]]]:
        """What :class:`~benchmarks.memory.PeakRss` watches: this Python process, and the Spark JVM's tree."""
        me = psutil.Process()
        jvm = self.jvm_pid
        return {"python": lambda: [me], "jvm": lambda: process_tree(jvm)}


@contextlib.contextmanager
def services(echo: Callable[[str], None] = print, keep: bool = False) -> Iterator[Env]:
    """Start Postgres (migrated), Kafka and a local Spark session under a new temporary folder; stop them
    all (and remove the folder unless ``keep``) when the block ends, however it ends; the environment
    variables set inside the block are restored too."""
    saved_environ = dict(os.environ)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    root = Path(tempfile.mkdtemp(prefix="reclock-bench-"))
    root.chmod(0o755)  # the postgres user must reach the cluster's files
    os.environ["RECLOCK_HOME"] = str(root / "stack")  # anything that looks for "the" stack finds ours
    from reclock.dev.kafka import LocalKafka
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.state import StackState

    state = StackState(root / "stack")
    pg, kafka = LocalPostgres(state, fast=True), LocalKafka(state, heap="1g")
    from reclock.dev.procs import side_by_side

    started: dict[str, object] = {}
    try:
        def postgres() -> float:
            from reclock.persist.migrate import migrate

            t0 = time.perf_counter()
            pg.start()
            migrate(pg.dsn())
            return time.perf_counter() - t0

        def spark_session():
            from reclock.dev.spark import local_session

            session = local_session(state, app="reclock-bench", master=SPARK_MASTER)
            started["spark"] = session  # stopped on the way out even when another service failed
            session.sparkContext.setLogLevel("ERROR")
            return session

        # none of the three needs another to start: side by side, in the time of the slowest
        up, errors = side_by_side({"postgres": postgres, "kafka": kafka.start, "spark": spark_session})
        if errors:
            raise RuntimeError("services: " + "; ".join(f"{n} did not start: {type(e).__name__}: {e}"
                                                        for n, e in errors.items())) from next(iter(errors.values()))
        echo(f"services: postgres up and migrated ({up['postgres']:.1f}s), kafka up on {kafka.bootstrap} "
             f"({up['kafka']:.1f}s), spark session {SPARK_MASTER} up, side by side; work folder {root}")
        yield Env(root, state, pg, kafka, up["spark"], echo)
    finally:
        stops: list[tuple[str, Callable[[], object]]] = [
            ("kafka", lambda: kafka.stop(grace=THROWAWAY_GRACE_S)), ("postgres", pg.stop)]
        if "spark" in started:
            stops.insert(0, ("spark", lambda: _stop_spark(started["spark"])))
        stop_services(stops, echo)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        os.environ.clear()  # what the run set (RECLOCK_HOME, Airflow's and dag.test's settings) goes too
        os.environ.update(saved_environ)


def alternating(jobs: dict[str, Callable[[int], float]], reps: int, echo: Callable[[str], None]) -> dict[str, list[float]]:
    """Each job once as a warm-up (JIT, Python workers, the consumers' pool; called with 0), then ``reps``
    repetitions (called with 1, 2, ...) in which the jobs alternate which goes first: the seconds each
    job returned, per repetition."""
    for name, job in jobs.items():
        echo(f"warm-up {name}: {job(0):.2f}s")
    times: dict[str, list[float]] = {k: [] for k in jobs}
    for rep in range(reps):
        for name in (list(jobs) if rep % 2 == 0 else list(reversed(jobs))):
            times[name].append(jobs[name](rep + 1))
        echo(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    return times


def stop_services(stops: list[tuple[str, Callable[[], object]]], echo: Callable[[str], None]) -> None:
    """Call every ``(name, stop)`` at once, each in a thread of its own (the services need none of each other
    to stop: the time of the slowest, not the sum); one that fails is reported, the others still run."""
    from reclock.dev.procs import side_by_side

    _, errors = side_by_side(dict(stops))
    for name, e in errors.items():  # stop the others anyway, and say what is left
        echo(f"services: stopping {name} failed: {e}")
    echo("services: stopped " + ", ".join(name for name, _ in stops))


def _stop_spark(spark) -> None:
    for query in spark.streams.active:
        query.stop()
    spark.stop()
