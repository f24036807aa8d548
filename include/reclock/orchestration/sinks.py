"""``sink__<name>``: one DAG per configured sink -- a Kafka sink or an Iceberg export -- scheduled on its
collection's Asset (it runs when an append added updates to it) and triggerable by hand; each run writes
everything complete and returns (see ``reclock.sinks.kafka`` and ``reclock.sinks.iceberg``).
``max_active_runs=1``; a second instance anyway only fences the first (Kafka) or loses its commit and re-reads
the frontier (Iceberg), never duplicates. A backfill is one run, one catch-up, whatever its range
(``reclock.orchestration.timetables``). A run's params set the budget of a transaction or commit
(``reclock.orchestration.runs``)."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timezone

from reclock.config import IcebergBudget, IcebergSinkSpec, SinkBudget, SinkSpec
from reclock.orchestration.assets import shard_assets
from reclock.orchestration.contexts import iceberg_sink_context, sink_context
from reclock.orchestration.lineage import ReclockTask, collection, iceberg_table, kafka_topic, reads, writes
from reclock.orchestration.runs import check_conf, current_run, positive_int, sink_params
from reclock.orchestration.timetables import ReclockTimetable
from reclock.sinks import iceberg, kafka
from reclock.settings import check_connections

log = logging.getLogger("reclock.sink")


def with_run_values(spec: SinkSpec | IcebergSinkSpec, values, conf) -> SinkSpec | IcebergSinkSpec:
    """``spec`` with the budget a run's params override (``max_messages`` / ``max_rows``)."""
    what = f"sink {spec.name}"
    if isinstance(spec, IcebergSinkSpec):
        check_conf(what, conf, ("max_rows",))
        n = positive_int(what, "max_rows", values.get("max_rows"))
        return spec if n is None else replace(spec, budget=IcebergBudget(n, spec.budget.max_bytes))
    check_conf(what, conf, ("max_messages",))
    n = positive_int(what, "max_messages", values.get("max_messages"))
    return spec if n is None else replace(spec, budget=SinkBudget(n, spec.budget.max_bytes))


def _write(spec: SinkSpec | IcebergSinkSpec) -> dict:
    """Run the sink once; what the task returns (XCom)."""
    run = current_run()
    spec = with_run_values(spec, run.values, run.conf)
    check_connections(sinks=[spec])
    if run.backfill:
        log.info("sink %s: a backfill's run is one run of the sink: it writes everything complete, once", spec.name)
    if isinstance(spec, IcebergSinkSpec):
        ctx = iceberg_sink_context(spec)
        reads(collection(ctx.dsn, spec.collection))
        writes(iceberg_table(ctx.catalog.warehouse, spec.table))
        r = iceberg.run_once(ctx)
        return {"frontier": r.frontier, "commits": r.commits, "rows": r.rows, "bytes": r.bytes}
    kctx = sink_context(spec)
    reads(collection(kctx.dsn, spec.collection))
    writes(kafka_topic(kctx.kafka.bootstrap, spec.kafka.topic))
    k = kafka.run_once(kctx)
    return {"frontier": k.frontier, "version": k.version, "transactions": k.transactions,
            "messages": k.messages, "bytes": k.bytes}


def _description(spec: SinkSpec | IcebergSinkSpec) -> str:
    if isinstance(spec, IcebergSinkSpec):
        return f"Export {spec.collection} to Iceberg table {spec.table} ({spec.layout}) exactly once"
    return f"Write {spec.collection} to Kafka topic {spec.kafka.topic} exactly once"


def build_sink_dag(spec: SinkSpec | IcebergSinkSpec):
    from airflow.sdk import DAG, AssetOrTimeSchedule

    with DAG(
        dag_id=f"sink__{spec.name}",
        description=_description(spec),
        schedule=AssetOrTimeSchedule(timetable=ReclockTimetable(), assets=shard_assets((spec.collection,))),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "sink"],
        params=sink_params(spec),
    ) as dag:

        def write_task() -> dict:
            return _write(spec)

        ReclockTask(task_id="write", python_callable=write_task)
    return dag
