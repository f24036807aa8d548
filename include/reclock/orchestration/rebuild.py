"""``rebuild__<source>``: triggered by hand; rebuilds the source's shards from the recorded bindings (same
updates, same timestamps) and swaps them in (``reclock.cycle.rebuild``).

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

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from reclock import cycle
from reclock.specs import SourceSpec
from reclock.connections import DEFAULT_SPARK_SUBMIT
from reclock.errors import ConfigError
from reclock.orchestration.assets import shard_assets
from reclock.orchestration.contexts import cycle_context
from reclock.settings import find_blob_url, find_dsn
from reclock.sources.registry import kind_of
from reclock.spark.session import spark_jars

JOB = "rebuild.py"
"""The job's file in the project's ``spark_jobs/`` folder."""


def job_environment(spec: SourceSpec, config_file: Path) -> dict[str, str]:
    """What ``spark_jobs/rebuild.py`` reads: the settings as this process finds them, resolved."""
    return {
        "RECLOCK_CONFIG": str(config_file),
        "RECLOCK_DSN": find_dsn(),
        "RECLOCK_BLOB_URL": find_blob_url(),
        **kind_of(spec).job_environment(spec),  # where the upstream is (Kafka: RECLOCK_BOOTSTRAP)
        # the driver runs beside the task, in the task's interpreter (where reclock is installed)
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable,
    }


class RebuildSubmitOperator(SparkSubmitOperator):
    """``spark_jobs/rebuild.py <source>`` through spark-submit, its settings in the environment (module doc)."""

    def __init__(self, *, spec: SourceSpec, config_file: Path, application: Path, **kwargs) -> None:
        super().__init__(application=str(application), conn_id=DEFAULT_SPARK_SUBMIT, application_args=[spec.name],
                         name=f"reclock-rebuild-{spec.name}", **kwargs)
        self.spec = spec
        self.config_file = Path(config_file)

    def execute(self, context) -> None:
        self.env_vars = {**(self.env_vars or {}), **job_environment(self.spec, self.config_file)}
        self.jars = self.jars or spark_jars()
        return super().execute(context)


def build_rebuild_dag(spec: SourceSpec, config_file: Path, spark_jobs: Path):
    """The DAG; ``config_file`` (what ``spec`` came from) and ``spark_jobs`` (the folder holding the job) serve
    ``rebuild: spark_submit``."""
    from airflow.sdk import DAG, task

    with DAG(
        dag_id=f"rebuild__{spec.name}",
        description=f"Rebuild {spec.name}'s shards from its bindings (same updates, same timestamps)",
        schedule=None,
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "rebuild"],
    ) as dag:
        if spec.rebuild == "spark_submit":
            job = Path(spark_jobs) / JOB
            if not job.is_file():
                raise ConfigError(f"source {spec.name}: rebuild: spark_submit runs {job}, which does not exist "
                                  "(spark_jobs/ belongs beside the DAGs folder)")
            RebuildSubmitOperator(task_id="rebuild", spec=spec, config_file=config_file, application=job,
                                  outlets=shard_assets(spec.shards))
        else:

            @task(task_id="rebuild", outlets=shard_assets(spec.shards))
            def rebuild_task() -> dict:
                log = logging.getLogger("reclock.rebuild")
                return cycle.rebuild(cycle_context(spec),
                                     on_slice=lambda d, t: log.info("slice %d of %d written", d, t))

            rebuild_task()
    return dag
