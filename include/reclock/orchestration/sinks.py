"""``sink__<name>``: one DAG per configured sink -- a Kafka sink or an Iceberg export -- scheduled on its
collection's Asset (it runs when appends land) and triggerable by hand; each run writes everything complete
and returns (see ``reclock.sinks.kafka`` and ``reclock.sinks.iceberg``). ``max_active_runs=1``; a second
instance anyway only fences the first (Kafka) or loses its commit and re-reads the frontier (Iceberg), never
duplicates."""

from __future__ import annotations

from datetime import datetime, timezone

from reclock.config import IcebergSinkSpec, SinkSpec
from reclock.orchestration.assets import shard_assets
from reclock.orchestration.contexts import iceberg_sink_context, sink_context
from reclock.sinks import iceberg, kafka


def _write(spec: SinkSpec | IcebergSinkSpec) -> dict:
    """Run the sink once; what the task returns (XCom)."""
    if isinstance(spec, IcebergSinkSpec):
        r = iceberg.run_once(iceberg_sink_context(spec))
        return {"frontier": r.frontier, "commits": r.commits, "rows": r.rows, "bytes": r.bytes}
    k = kafka.run_once(sink_context(spec))
    return {"frontier": k.frontier, "version": k.version, "transactions": k.transactions,
            "messages": k.messages, "bytes": k.bytes}


def _description(spec: SinkSpec | IcebergSinkSpec) -> str:
    if isinstance(spec, IcebergSinkSpec):
        return f"Export {spec.collection} to Iceberg table {spec.table} ({spec.layout}) exactly once"
    return f"Write {spec.collection} to Kafka topic {spec.kafka.topic} exactly once"


def build_sink_dag(spec: SinkSpec | IcebergSinkSpec):
    from airflow.sdk import DAG, task

    with DAG(
        dag_id=f"sink__{spec.name}",
        description=_description(spec),
        schedule=shard_assets((spec.collection,)),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "sink"],
    ) as dag:

        @task(task_id="write")
        def write_task() -> dict:
            return _write(spec)

        write_task()
    return dag
