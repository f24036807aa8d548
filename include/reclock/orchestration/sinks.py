"""``sink__<name>``: one DAG per configured sink, scheduled on its collection's Asset (it runs when appends
land) and triggerable by hand; each run writes everything complete and returns (see ``reclock.sinks.kafka``).
``max_active_runs=1``; a second instance anyway only fences the first, never duplicates."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from reclock.config import SinkSpec


def sink_context(spec: SinkSpec, bootstrap: str | None = None, dsn: str | None = None, blob_url: str | None = None):
    """A :class:`~reclock.sinks.kafka.SinkContext` from the arguments, else as an ingest task finds them
    (``RECLOCK_DSN``, ``RECLOCK_BLOB_URL``, the Airflow connections)."""
    from reclock.orchestration.ingest import task_blob_store, task_bootstrap, task_dsn
    from reclock.persist.blob import blob_store_from_url
    from reclock.sinks.kafka import SinkContext

    return SinkContext(spec=spec, dsn=dsn or task_dsn(), bootstrap=bootstrap or task_bootstrap(spec.kafka),
                       blob=blob_store_from_url(blob_url) if blob_url else task_blob_store())


def build_sink_dag(spec: SinkSpec):
    from airflow.sdk import DAG, Asset, task

    from reclock.orchestration.ingest import shard_asset_uri

    with DAG(
        dag_id=f"sink__{spec.name}",
        description=f"Write {spec.collection} to Kafka topic {spec.kafka.topic} exactly once",
        schedule=[Asset(shard_asset_uri(spec.collection))],
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "sink"],
        default_args={"retries": 0},
    ) as dag:

        @task(task_id="write")
        def write_task() -> dict:
            from reclock.sinks.kafka import run_once

            r = run_once(sink_context(spec))
            return {"frontier": r.frontier, "version": r.version, "transactions": r.transactions,
                    "messages": r.messages, "bytes": r.bytes}

        write_task()
    return dag


def build_all_sinks(config=None) -> dict[str, Any]:
    from reclock.config import load_config

    cfg = config or load_config()
    return {f"sink__{name}": build_sink_dag(spec) for name, spec in cfg.sinks.items()}
