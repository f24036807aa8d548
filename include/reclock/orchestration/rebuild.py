"""``rebuild__<source>``: triggered by hand; rebuilds the source's shards from the recorded bindings (same
updates, same timestamps) and swaps them in (``reclock.cycle.rebuild``), in the Airflow task, on the Spark
the task finds (``RECLOCK_SPARK_MASTER``, ``RECLOCK_SPARK_REMOTE`` or the ``reclock_spark`` connection), like
a cycle.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from reclock import cycle
from reclock.config import SourceSpec
from reclock.orchestration.assets import shard_assets
from reclock.orchestration.settings import cycle_context


def build_rebuild_dag(spec: SourceSpec):
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

        @task(task_id="rebuild", outlets=shard_assets(spec.shards))
        def rebuild_task() -> dict:
            log = logging.getLogger("reclock.rebuild")
            return cycle.rebuild(cycle_context(spec), on_slice=lambda d, t: log.info("slice %d of %d written", d, t))

        rebuild_task()
    return dag
