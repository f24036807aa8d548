"""``rebuild__<source>``: re-derives the updates of the source's bindings from upstream with today's decode
and swaps them in while cycles go on (``reclock.cycle.rebuild``: same offsets, same timestamps).

- ``airflow backfill create --dag-id rebuild__<source> --from-date A --to-date B``: one run (whatever the
  backfill's ``max_active_runs``, ``reclock.orchestration.timetables``) that rebuilds the bindings at
  ``A <= ts < B``, widened to whole batches. Records that landed in ``<source>_errors`` under a decode bug,
  now fixed, come back in the collection at their original timestamps.
- a manual run: the window its params ``window_start`` / ``window_end`` give, else every binding.

Never a binding minted, never an asset event (nothing is appended, no upper moves).

The source's ``rebuild:`` option says where the work runs:

- ``task`` (the default): in the Airflow task, on the Spark the task finds (``RECLOCK_SPARK_MASTER``,
  ``RECLOCK_SPARK_REMOTE`` or the ``reclock_spark`` connection), like a cycle.
- ``spark_submit``: ``spark_jobs/rebuild.py <source>`` through spark-submit, on the Airflow connection
  ``reclock_spark_submit`` (type ``spark``; its host is the master: ``local[4]``, ``spark://host:7077``),
  jars from ``RECLOCK_SPARK_JARS``. The job's driver runs beside the task (client deploy mode); its settings
  are found in the task, as an in-process rebuild finds them, and reach the job in spark-submit's
  environment when the task runs: never its argv (process lists and the logged command show argv) and
  never a templated field (the UI shows rendered fields).
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from reclock import cycle
from reclock.specs import SourceSpec
from reclock.connections import DEFAULT_SPARK_SUBMIT
from reclock.errors import ConfigError
from reclock.kafka_client import KafkaClientConfig
from reclock.orchestration.contexts import cycle_context
from reclock.orchestration.lineage import ReclockTask, collection, reads, writes
from reclock.orchestration.runs import PARAMS, RunInfo, check_conf, current_run, parse_time_ms, rebuild_params
from reclock.orchestration.timetables import ReclockTimetable
from reclock.settings import check_connections, find_blob_url, find_dsn
from reclock.sources.registry import kind_of
from reclock.spark.session import spark_jars

log = logging.getLogger("reclock.rebuild")

JOB = "rebuild.py"
"""The job's file in the project's ``spark_jobs/`` folder."""


def _resolved_upstream(spec: SourceSpec) -> dict[str, str]:
    """``RECLOCK_UPSTREAM``: an address the task resolved (a DSN; an unsecured Kafka cluster's brokers), which
    the job takes as given; a secured cluster reaches the job as its connection (the kind's job_environment)."""
    up = kind_of(spec).find_upstream(spec)
    if isinstance(up, str):
        return {"RECLOCK_UPSTREAM": up}
    if isinstance(up, KafkaClientConfig) and up.protocol == "PLAINTEXT":
        return {"RECLOCK_UPSTREAM": up.bootstrap}
    return {}


def job_environment(spec: SourceSpec, config_file: Path) -> dict[str, str]:
    """What ``spark_jobs/rebuild.py`` reads: the settings as this process finds them, resolved."""
    return {
        "RECLOCK_CONFIG": str(config_file),
        "RECLOCK_DSN": find_dsn(),
        "RECLOCK_BLOB_URL": find_blob_url(),
        **kind_of(spec).job_environment(spec),  # where the upstream is (Kafka: RECLOCK_BOOTSTRAP)
        # ... as resolved here, which the job takes as given (it has no Airflow connections to look up)
        **_resolved_upstream(spec),
        # the driver runs beside the task, in the task's interpreter (where reclock is installed)
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable,
    }


def run_window(spec: SourceSpec, run: RunInfo) -> tuple[int | None, int | None]:
    """The window a run rebuilds: a backfill's data interval, else its params (None: unbounded)."""
    what = f"source {spec.name}"
    check_conf(what, run.conf, PARAMS["rebuild"])
    if run.backfill and run.data_interval is not None:
        return run.data_interval
    lo = parse_time_ms(what, "window_start", run.values.get("window_start"))
    hi = parse_time_ms(what, "window_end", run.values.get("window_end"))
    if lo is not None and hi is not None and lo >= hi:
        raise ConfigError(f"{what}: window_start must be before window_end")
    return lo, hi


def window_args(window: tuple[int | None, int | None]) -> list[str]:
    """``spark_jobs/rebuild.py``'s arguments after the source for ``window`` (a time range is no secret)."""
    return [opt for flag, v in zip(("--from-ms", "--to-ms"), window) if v is not None for opt in (flag, str(v))]


def _result(out: Mapping[str, Any]) -> dict:
    log.info("rebuilt %s", "nothing: the window holds no time below the upper" if out.get("window") is None
             else f"[{out['window'][0]}, {out['window'][1]}): {out['parts']} parts, records {out['records']}")
    return dict(out)


class RebuildSubmitOperator(SparkSubmitOperator):
    """``spark_jobs/rebuild.py <source>`` through spark-submit, its settings in the environment (module doc)."""

    def __init__(self, *, spec: SourceSpec, config_file: Path, application: Path, **kwargs) -> None:
        super().__init__(application=str(application), conn_id=DEFAULT_SPARK_SUBMIT, application_args=[spec.name],
                         name=f"reclock-rebuild-{spec.name}", **kwargs)
        self.spec = spec
        self.config_file = Path(config_file)

    def execute(self, context) -> None:
        check_connections(sources=[self.spec])
        self.application_args = [self.spec.name, *window_args(run_window(self.spec, current_run()))]
        self.env_vars = {**(self.env_vars or {}), **job_environment(self.spec, self.config_file)}
        self.jars = self.jars or spark_jars()
        return super().execute(context)


def build_rebuild_dag(spec: SourceSpec, config_file: Path, spark_jobs: Path):
    """The DAG; ``config_file`` (what ``spec`` came from) and ``spark_jobs`` (the folder holding the job) serve
    ``rebuild: spark_submit``."""
    from airflow.sdk import DAG

    with DAG(
        dag_id=f"rebuild__{spec.name}",
        description=f"Rebuild {spec.name}'s shards from its bindings (same updates, same timestamps)",
        schedule=ReclockTimetable(),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "rebuild"],
        params=rebuild_params(),
        # it never runs on its own (triggers and backfills only), and Airflow starts no run of a paused DAG, a
        # backfill's included: created unpaused, a backfill of it just runs
        is_paused_upon_creation=False,
    ) as dag:
        if spec.rebuild == "spark_submit":
            job = Path(spark_jobs) / JOB
            if not job.is_file():
                raise ConfigError(f"source {spec.name}: rebuild: spark_submit runs {job}, which does not exist "
                                  "(spark_jobs/ belongs beside the DAGs folder)")
            RebuildSubmitOperator(task_id="rebuild", spec=spec, config_file=config_file, application=job)
        else:

            def rebuild_task() -> dict:
                run = current_run()
                check_connections(sources=[spec])
                ctx = cycle_context(spec, run_id=run.run_id)
                try:
                    reads(*ctx.source().lineage_inputs())
                    writes(*(collection(ctx.dsn, s) for s in ctx.shards()))
                    return _result(cycle.rebuild(ctx, window=run_window(spec, run),
                                                 on_slice=lambda d, t: log.info("slice %d of %d written", d, t)))
                finally:
                    ctx.close()

            ReclockTask(task_id="rebuild", python_callable=rebuild_task)
    return dag
