"""The ingest-throughput contenders: each reads a whole :class:`~benchmarks.workload.Backlog` from offset 0
and makes it durable, and reports the seconds that took.

- ``reclock``: ``reclock.cycle.run_cycle`` on a new source (its first binding covers the backlog; one
  description): mint, write_batches, append, resume. Timed from the cycle's start to the append's commit
  (the cycle minus its resume step).
- ``reclock_dag_test``: the ``ingest__<source>`` DAG under ``dag.test()`` in this process (the tasks get
  this process's Spark session). Timed from the ``mint`` task's start to the ``append`` task's end, minus
  the resume step that task runs after the append.
- ``structured_streaming``: Kafka source -> the same decode -> Parquet file sink,
  ``trigger(availableNow=True)``, a fresh checkpoint. Timed from ``start()`` to the query's end.
- ``spark_batch``: Spark's Kafka batch source over the same offset ranges -> the same decode -> Parquet;
  no reclocking, no consensus. Timed from the job's start to the files written.
- ``kafka_consumer``: a confluent-kafka consumer that only consumes the records. Timed from ``assign``
  to the last record.

Every Spark contender shares one local session (``local[2]``), the Kafka options Reclock uses
(``kafka.isolation.level=read_committed``, ``kafka.fetch.max.wait.ms=10``, ``assign`` with explicit
starting offsets, a group id of its own per repetition; :func:`reclock.sources.kafka.spark_job.kafka_read_options`)
and the same decode: ``from_json`` of :data:`~benchmarks.workload.SCHEMA`, PERMISSIVE, with Reclock's
corrupt-record column. Every contender's output is counted afterwards (outside the timing) and must hold
exactly the backlog's records.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from benchmarks import stop
from benchmarks.env import SPARK_MASTER, Env
from benchmarks.workload import FIELDS, SCHEMA, Backlog

if TYPE_CHECKING:
    from reclock.specs import SourceSpec


@dataclass(frozen=True)
class Run:
    """One repetition: ``seconds`` to make ``records`` durable; ``extra`` holds contender-specific seconds."""

    seconds: float
    records: int
    extra: dict[str, float] = field(default_factory=dict)


Contender = Callable[[Env, Backlog, int], Run]


def source_spec(name: str, backlog: Backlog, bootstrap: str) -> SourceSpec:
    """A Reclock source over the backlog's topic: JSON of :data:`SCHEMA`, a budget of the whole backlog."""
    from reclock.config import parse_source

    return parse_source(name, source_config(backlog, bootstrap))


def source_config(backlog: Backlog, bootstrap: str) -> dict:
    """The source's config, as it would stand under ``sources.<name>`` in ``reclock.yaml``."""
    return {"kafka": {"topic": backlog.topic, "bootstrap": bootstrap},
            "format": {"type": "json", "schema": SCHEMA},
            "budget": {"max_records": max(1, backlog.records)}}


def _check(contender: str, backlog: Backlog, records: int) -> None:
    if records != backlog.records:
        raise RuntimeError(f"{contender} on {backlog.topic}: wrote {records} records, the backlog holds "
                           f"{backlog.records}")


# --- Reclock -------------------------------------------------------------------------------------------


def step_seconds(dsn: str, source: str, after_id: int = 0) -> tuple[dict[str, float], int]:
    """Seconds per cycle step (summed) that ``reclock.statistics`` recorded for ``source`` after row
    ``after_id``, and the last row id seen."""
    from reclock.persist import connect

    with connect(dsn) as conn:
        rows = conn.execute("SELECT id, step, metrics FROM reclock.statistics WHERE name = %s AND id > %s "
                            "ORDER BY id", (source, after_id)).fetchall()
    out: dict[str, float] = {}
    for _, step, metrics in rows:
        out[step] = out.get(step, 0.0) + float(metrics.get("seconds", 0.0))
    return out, max([after_id, *(r[0] for r in rows)])


def committed_records(dsn: str, source: str) -> int:
    """Records the source's append steps committed to its data shard."""
    from reclock.persist import connect

    with connect(dsn) as conn:
        rows = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'append'",
                            (source,)).fetchall()
    return sum(int((m.get("committed") or {}).get(source, 0)) for (m,) in rows)


def run_reclock(env: Env, backlog: Backlog, rep: int) -> Run:
    """``run_cycle`` on a new source: throughput up to the durable append (the cycle minus resume)."""
    from reclock.cycle import CycleContext, run_cycle
    from reclock.persist.blob import LocalBlobStore

    name = f"rc_{backlog.label}_{rep}"
    blob = LocalBlobStore(env.work / "blobs")
    ctx = CycleContext(spec=source_spec(name, backlog, env.bootstrap), dsn=env.dsn, upstream=env.bootstrap,
                       blob=blob, spark_factory=lambda: env.spark)
    t0 = time.perf_counter()
    out = run_cycle(ctx)
    total = time.perf_counter() - t0
    steps, _ = step_seconds(env.dsn, name)
    if out["descriptions"] != 1:
        raise RuntimeError(f"reclock {name}: expected one description, got {out['descriptions']}")
    records = committed_records(env.dsn, name)
    _check("reclock", backlog, records)
    shutil.rmtree(blob.root / name, ignore_errors=True)
    return Run(total - steps.get("resume", 0.0), records, {"cycle": total, **steps})


class DagTest:
    """``ingest__<source>`` under ``dag.test()`` in this process, its metadata in the run's Postgres.

    Airflow reads its settings when it is first imported, so :meth:`prepare` sets the environment and
    starts the migration of the metadata database (``airflow db migrate``, a subprocess, in ``pool``: the
    other contenders' warm-ups run meanwhile) before anything imports it; the first run waits for it.
    ``dag.test()`` parses the repo's ``dags/`` (which reads ``RECLOCK_CONFIG``: the file this class
    rewrites for each repetition's new source), serializes the DAG and runs its two tasks in-process;
    ``RECLOCK_SPARK_MASTER`` makes the tasks use a local session, which is this process's shared one.
    Airflow's and the tasks' console output goes to ``dag_test.log`` in the run's folder.
    """

    def __init__(self, env: Env) -> None:
        self.env = env
        self.home = env.root / "airflow"
        self.config = self.home / "reclock.yaml"
        self.log = env.root / "dag_test.log"
        self._migrating: Future[float] | None = None
        self._migrate_s: float | None = None

    def prepare(self, pool: Executor) -> None:
        """Set Airflow's environment, and start migrating its metadata DB in ``pool`` (:attr:`migrate_s`)."""
        from reclock.dev.state import REPO_ROOT

        self.home.mkdir(parents=True, exist_ok=True)
        self.config.write_text("sources: {}\n")
        self.env.postgres.create_database("airflow_bench")
        os.environ.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.env.postgres.dsn("airflow_bench").replace(
                "postgresql://", "postgresql+psycopg2://", 1),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),  # registers Reclock's timetable
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "RECLOCK_CONFIG": str(self.config),
            "RECLOCK_DSN": self.env.dsn,
            "RECLOCK_BLOB_URL": str(self.env.work / "blobs"),
            "RECLOCK_SPARK_MASTER": SPARK_MASTER,
        })
        self._migrating = pool.submit(self._migrate, dict(os.environ))

    @staticmethod
    def _migrate(environ: dict[str, str]) -> float:
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=environ,
                             capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed (exit {res.returncode}):\n{res.stdout[-2000:]}"
                               f"\n{res.stderr[-3000:]}")
        return time.perf_counter() - t0

    @property
    def migrate_s(self) -> float:
        """The seconds the migration took: waits for it (raises what it raised); the first wait says so."""
        if self._migrate_s is None:
            self._migrate_s = self._migrating.result()
            self.env.echo(f"dag.test: Airflow's metadata DB migrated in {self._migrate_s:.1f}s (beside the other "
                          f"contenders' warm-ups); output in {self.log}")
        return self._migrate_s

    def __call__(self, env: Env, backlog: Backlog, rep: int) -> Run:
        import yaml

        from reclock.config import load_config
        from reclock.orchestration.ingest import build_ingest_dag

        self.migrate_s  # nothing imports Airflow before its database is migrated
        name = f"dt_{backlog.label}_{rep}"
        self.config.write_text(yaml.safe_dump({"sources": {name: source_config(backlog, env.bootstrap)}}))
        dag = build_ingest_dag(load_config(self.config).source(name))
        t0 = time.perf_counter()
        with stop.kept(), _output_to(self.log):  # its task runner takes SIGTERM over (benchmarks/stop.py)
            run = dag.test()
        call = time.perf_counter() - t0
        if run.state != "success":
            raise RuntimeError(f"dag.test() of {dag.dag_id} ended {run.state}; see {self.log}")
        times = self._task_times(dag.dag_id, run.run_id)
        steps, _ = step_seconds(env.dsn, name)
        # the append task runs the resume step after the append: its seconds are not the append's
        seconds = (times["append"][1] - times["mint_write"][0]).total_seconds() - steps.get("resume", 0.0)
        records = committed_records(env.dsn, name)
        _check("reclock_dag_test", backlog, records)
        shutil.rmtree(env.work / "blobs" / name, ignore_errors=True)
        return Run(seconds, records, {"dag_test_call": call, "resume": steps.get("resume", 0.0)})

    @staticmethod
    def _task_times(dag_id: str, run_id: str) -> dict:
        """task_id -> (start, end) of the run's task instances, from the metadata DB."""
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(select(TaskInstance.task_id, TaskInstance.start_date, TaskInstance.end_date)
                                   .where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)).all()
        return {task: (start, end) for task, start, end in rows}


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors 1 and 2, so the JVM's too) to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


# --- Spark baselines -----------------------------------------------------------------------------------


def _kafka_options(backlog: Backlog, bootstrap: str, name: str) -> dict[str, str]:
    """Exactly the options Reclock's write_batches reads the backlog with (offsets 0 to the ends), as if for
    a source called ``name``: each repetition of each contender reads under a group id of its own, as
    Reclock's contenders (a new source each) do, so none finds consumers pooled by an earlier one."""
    from reclock.batch import OffsetRange
    from reclock.sources.kafka.spark_job import kafka_read_options

    spec = source_spec(name, backlog, bootstrap)
    ranges = [OffsetRange(p, 0, end) for p, end in sorted(backlog.ends.items()) if end > 0]
    return kafka_read_options(spec, bootstrap, ranges)


def decode(df):
    """Reclock's JSON decode: ``from_json`` PERMISSIVE with its corrupt-record column, then the fields.

    The schema goes in as DDL text, so the same code runs on a classic and on a Spark Connect session."""
    from pyspark.sql import functions as F

    from reclock.sources.kafka.spark_job import CORRUPT

    parsed = F.from_json(F.col("value").cast("string"), f"{SCHEMA}, {CORRUPT} STRING",
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    return df.select(parsed.alias("_d")).select(*[F.col("_d").getField(f).alias(f) for f in FIELDS])


def parquet_rows(folder: Path) -> int:
    """Rows in the Parquet files under ``folder`` (footers only), skipping Spark's metadata folders."""
    import pyarrow.parquet as pq

    total = 0
    for path in folder.rglob("*.parquet"):
        if not any(part.startswith("_") for part in path.relative_to(folder).parts):
            total += pq.ParquetFile(path).metadata.num_rows
    return total


def run_spark_batch(env: Env, backlog: Backlog, rep: int) -> Run:
    """The engine's limit: the same offset ranges, the same decode, Parquet; nothing else."""
    out = env.work / f"batch_{backlog.label}_{rep}"
    t0 = time.perf_counter()
    decode(env.spark.read.format("kafka").options(**_kafka_options(backlog, env.bootstrap, out.name)).load()) \
        .write.mode("error").parquet(str(out))
    seconds = time.perf_counter() - t0
    records = parquet_rows(out)
    _check("spark_batch", backlog, records)
    shutil.rmtree(out, ignore_errors=True)
    return Run(seconds, records)


def run_structured_streaming(env: Env, backlog: Backlog, rep: int) -> Run:
    """Kafka source -> the same decode -> Parquet file sink, ``availableNow``, a fresh checkpoint."""
    out = env.work / f"ss_{backlog.label}_{rep}"
    checkpoint = env.work / f"ss_{backlog.label}_{rep}_checkpoint"
    opts = _kafka_options(backlog, env.bootstrap, out.name)
    opts.pop("endingOffsets")  # a stream reads to what is available when it starts
    stream = decode(env.spark.readStream.format("kafka").options(**opts).load())
    seconds, records = stream_to_parquet(stream, out, checkpoint, f"structured streaming on {backlog.topic}")
    _check("structured_streaming", backlog, records)
    return Run(seconds, records)


def stream_to_parquet(stream, out: Path, checkpoint: Path, what: str) -> tuple[float, int]:
    """``stream`` into a Parquet file sink at ``out``, ``trigger(availableNow=True)``, a fresh ``checkpoint``:
    the seconds from ``start()`` to the query's end and the rows written (both folders removed after)."""
    t0 = time.perf_counter()
    query = (stream.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"{what} failed: {query.exception()}")
    rows = parquet_rows(out)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return seconds, rows


# --- the read limit ------------------------------------------------------------------------------------


def run_kafka_consumer(env: Env, backlog: Backlog, rep: int) -> Run:
    """A confluent-kafka consumer (``read_committed``, ``fetch.wait.max.ms=10``) that only consumes."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": env.bootstrap, "group.id": f"bench-read-{backlog.label}-{rep}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 10, "enable.partition.eof": True, "log_level": 2})
    remaining = {p for p, end in backlog.ends.items() if end > 0}
    records = nbytes = 0
    deadline = time.monotonic() + 3600
    try:
        t0 = time.perf_counter()
        consumer.assign([TopicPartition(backlog.topic, p, 0) for p in sorted(backlog.ends)])
        while remaining:
            # consume() waits for a full batch or the timeout: keep the timeout short so a drained
            # queue costs at most a few ms at the tail
            for msg in consumer.consume(10_000, timeout=0.01):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        remaining.discard(msg.partition())
                        continue
                    raise RuntimeError(f"kafka consumer on {backlog.topic}: {err}")
                records += 1
                nbytes += len(msg.value())
                if msg.offset() + 1 >= backlog.ends[msg.partition()]:
                    remaining.discard(msg.partition())
            if time.monotonic() > deadline:
                raise RuntimeError(f"kafka consumer on {backlog.topic}: not done after an hour")
        seconds = time.perf_counter() - t0
    finally:
        consumer.close()
    _check("kafka_consumer", backlog, records)
    return Run(seconds, records)


def contenders(env: Env, dag_test: DagTest | None) -> dict[str, Contender]:
    """Name -> contender, in the order each repetition runs them."""
    out: dict[str, Contender] = {"reclock": run_reclock}
    if dag_test is not None:
        out["reclock_dag_test"] = dag_test
    out.update({"structured_streaming": run_structured_streaming, "spark_batch": run_spark_batch,
                "kafka_consumer": run_kafka_consumer})
    return out
