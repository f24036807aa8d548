"""``sink__<name>``: one DAG per configured sink, scheduled on its collection's Asset (it runs when appends
land) and triggerable by hand; each run writes everything complete and returns (see ``reclock.sinks.kafka``).
``max_active_runs=1``; a second instance anyway only fences the first, never duplicates."""

from __future__ import annotations

from datetime import datetime, timezone

from reclock.config import SinkSpec
from reclock.orchestration.assets import shard_assets
from reclock.orchestration.settings import sink_context
from reclock.sinks.kafka import run_once


def build_sink_dag(spec: SinkSpec):
    from airflow.sdk import DAG, task

    with DAG(
        dag_id=f"sink__{spec.name}",
        description=f"Write {spec.collection} to Kafka topic {spec.kafka.topic} exactly once",
        schedule=shard_assets((spec.collection,)),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "sink"],
    ) as dag:

        @task(task_id="write")
        def write_task() -> dict:
            r = run_once(sink_context(spec))
            return {"frontier": r.frontier, "version": r.version, "transactions": r.transactions,
                    "messages": r.messages, "bytes": r.bytes}

        write_task()
    return dag
