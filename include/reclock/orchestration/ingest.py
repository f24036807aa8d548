"""``ingest__<source>``: one DAG per configured source; each run is one cycle (see ``reclock.cycle``).

    mint_write >> append        (mint, then write_batches; append, then resume)

The tasks only translate between Airflow (connections, XCom, run conf) and the plain cycle functions.
Four steps run in two tasks because a task costs about a second of scheduling and process start-up
(measured under the scheduler: 0.4 s of scheduler gap and 0.6 s in the task process around its step).
Each step still records its own statistics and status rows. Mint runs first in the write task: its
binding is durable before anything is written (*bindings before data*), and a retried task mints again
(a no-op unless upstream moved) and writes again to fresh paths. Resume runs in the append task: it is
short and safe to repeat, a retried task replays the append (a no-op) and resumes again. Append stays a
task of its own, the one place that makes a cycle's parts visible.
``append`` has the source's shards as outlets (Assets ``reclock://<shard>``), so sinks can be scheduled
on the appends. ``max_active_runs=1`` and ``catchup=False``; a backfill or a manual run is safe anyway:
minting never goes back in time and an append whose range is in the shards is a no-op.
"""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from reclock.config import BudgetSpec, SourceSpec


def shard_asset_uri(shard: str) -> str:
    return f"reclock://{shard}"


def with_run_conf(spec: SourceSpec, conf: dict[str, Any] | None) -> SourceSpec:
    """``spec`` with the budget a run's conf overrides (``max_records``, ``max_bytes``)."""
    conf = conf or {}
    if "max_records" not in conf and "max_bytes" not in conf:
        return spec
    mr = int(conf.get("max_records", spec.budget.max_records))
    if mr <= 0:
        raise ValueError(f"source {spec.name}: run conf max_records must be positive, got {mr}")
    return replace(spec, budget=BudgetSpec(max_records=mr, max_bytes=conf.get("max_bytes", spec.budget.max_bytes)))


def retain_history_ms() -> int:
    """How much history compaction keeps: ``RECLOCK_RETAIN_HISTORY_S`` seconds (default an hour)."""
    return int(float(os.environ.get("RECLOCK_RETAIN_HISTORY_S", "3600")) * 1000)


def task_dsn() -> str:
    """The consensus Postgres of a task: ``RECLOCK_DSN``, else the ``reclock_postgres`` connection."""
    from reclock.orchestration import connections

    return os.environ.get("RECLOCK_DSN") or connections.postgres_dsn()


def task_bootstrap(kafka) -> str:
    """A source's or sink's brokers: its ``bootstrap:``, else its Airflow connection."""
    from reclock.orchestration import connections

    return kafka.bootstrap or connections.kafka_bootstrap(kafka.connection)


def task_blob_store():
    """The blob store of a task: ``RECLOCK_BLOB_URL``, else the local stack's ``.reclock/blobs``."""
    from reclock.dev.state import default_state_dir
    from reclock.persist.blob import blob_store_from_url

    return blob_store_from_url(os.environ.get("RECLOCK_BLOB_URL") or str(default_state_dir() / "blobs"))


def context_for(spec: SourceSpec, conf: dict[str, Any] | None = None):
    """A :class:`~reclock.cycle.CycleContext` from Airflow connections and the environment.

    Run conf may override the budget: ``{"max_records": 1000}``.
    """
    from reclock.cycle import CycleContext

    spec = with_run_conf(spec, conf)
    return CycleContext(
        spec=spec,
        dsn=task_dsn(),
        bootstrap=task_bootstrap(spec.kafka),
        blob=task_blob_store(),
        spark_factory=lambda: spark_session(spec.name),
        retain_history_ms=retain_history_ms(),
    )


def spark_session(scope: str):
    """Spark for a task: a local session when ``RECLOCK_SPARK_MASTER`` is set (``local[2]``), else a Spark
    Connect client to the ``reclock_spark`` connection (no JVM start-up per cycle), attached to the
    server-side session the tasks of ``scope`` (a source) share (``reclock.spark.connect``)."""
    master = os.environ.get("RECLOCK_SPARK_MASTER")
    if master:
        from reclock.dev.spark import local_session
        from reclock.dev.state import StackState, default_state_dir

        return local_session(StackState(default_state_dir()), app="reclock-task", master=master)
    from reclock.orchestration import connections
    from reclock.spark.connect import shared_session

    return shared_session(connections.spark_connect_url(), scope)


def _part_to_x(p) -> list:
    return [p.path, p.rows, p.bytes, p.min_ts, p.max_ts]


def _written_to_x(w) -> dict:
    return {"desc": [w.desc.lower, w.desc.upper],
            "parts": {s: [_part_to_x(p) for p in ps] for s, ps in w.parts.items()},
            "state": [_part_to_x(p) for p in w.state], "prefix": w.prefix}


def _written_from_x(x: dict):
    from reclock.batch import BatchDescription, Part
    from reclock.cycle import WrittenBatch

    return WrittenBatch(BatchDescription(*x["desc"]),
                        {s: tuple(Part(*p) for p in ps) for s, ps in x["parts"].items()},
                        tuple(Part(*p) for p in x.get("state", ())), x.get("prefix"))


def build_ingest_dag(spec: SourceSpec):
    from airflow.sdk import DAG, Asset, get_current_context, task

    from reclock import cycle

    def conf() -> dict:
        ctx = get_current_context()
        run = ctx.get("dag_run")
        return dict(run.conf or {}) if run is not None else {}

    with DAG(
        dag_id=f"ingest__{spec.name}",
        description=f"Ingest Kafka topic {spec.kafka.topic} into {spec.name} exactly once (one run = one cycle)",
        schedule=timedelta(seconds=spec.interval_s),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "ingest"],
        default_args={"retries": 0},
        params={},
    ) as dag:

        @task(task_id="mint_write")
        def write_task() -> list[dict]:
            ctx = context_for(spec, conf())
            return [_written_to_x(cycle.write_batches(ctx, d)) for d in cycle.mint(ctx).descriptions]

        @task(task_id="append", outlets=[Asset(shard_asset_uri(s)) for s in spec.shards])
        def append_task(written: list[dict]) -> dict:
            ctx = context_for(spec, conf())
            outcomes = [str(o) for w in written for o in cycle.append(ctx, _written_from_x(w))]
            res = cycle.resume(ctx)
            return {"outcomes": outcomes, "resumption": res.resumption,
                    "offsets": {str(k): v for k, v in res.offsets.items()}, "since": res.since}

        append_task(write_task())
    return dag


def build_rebuild_dag(spec: SourceSpec):
    """``rebuild__<source>``: triggered by hand; rebuilds the source's shards from the recorded bindings."""
    from airflow.sdk import DAG, Asset, task

    from reclock import cycle

    with DAG(
        dag_id=f"rebuild__{spec.name}",
        description=f"Rebuild {spec.name}'s shards from its bindings (same updates, same timestamps)",
        schedule=None,
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "rebuild"],
    ) as dag:

        @task(task_id="rebuild", outlets=[Asset(shard_asset_uri(s)) for s in spec.shards])
        def rebuild_task() -> dict:
            import logging

            log = logging.getLogger("reclock.rebuild")
            return cycle.rebuild(context_for(spec), on_slice=lambda d, t: log.info("slice %d of %d written", d, t))

        rebuild_task()
    return dag


def build_all(config=None) -> dict[str, Any]:
    """Every configured source's and sink's DAGs, keyed by dag_id (what ``dags/reclock_ingest.py`` exposes)."""
    from reclock.config import load_config

    cfg = config or load_config()
    dags = {f"ingest__{name}": build_ingest_dag(spec) for name, spec in cfg.sources.items()}
    dags.update({f"rebuild__{name}": build_rebuild_dag(spec) for name, spec in cfg.sources.items()})
    from reclock.orchestration.sinks import build_all_sinks

    dags.update(build_all_sinks(cfg))
    return dags


def local_context(spec: SourceSpec, stack, conf: dict[str, Any] | None = None):
    """A context from the local stack directly (the ``reclock cycle`` command), Spark over Connect."""
    from reclock.cycle import CycleContext
    from reclock.persist.blob import blob_store_from_url

    spec = with_run_conf(spec, conf)
    return CycleContext(
        spec=spec, dsn=stack.postgres.dsn(), bootstrap=spec.kafka.bootstrap or stack.kafka.bootstrap,
        blob=blob_store_from_url(str(stack.state.root / "blobs")),
        spark_factory=lambda: stack.spark.session(scope=spec.name),
        retain_history_ms=retain_history_ms(),
    )
