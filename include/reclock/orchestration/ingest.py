"""``ingest__<source>``: one DAG per configured source; each run is one cycle (see ``reclock.cycle``).

    mint_write >> append        (mint, then write_batches; append, then resume)    ``interval``
    cycle                       (all four steps in one task)                       ``schedule: upstream``
    cycles                      (cycles back to back for a lease)                  ``schedule: continuous``

    ingest_group__<group>: cycles   (every source of a continuous ``group:``, a thread each, one task)

The tasks only translate between Airflow (connections, XCom, run conf) and the plain cycle functions.
Four steps run in two tasks because a task costs about a second of scheduling and process start-up
(measured under the scheduler: 0.4 s of scheduler gap and 0.6 s in the task process around its step).
Each step still records its own statistics and status rows. Mint runs first in the write task: its
binding is durable before anything is written (*bindings before data*), and a retried task mints again
(a no-op unless upstream moved) and writes again to fresh paths. The write task writes the pending
descriptions for about one ``interval`` (at least one; ``cycle.mint_and_write``), the rest in the next
run, so what a try risks stays bounded however many tries failed before it. Every task closes its
context's Spark Connect client when it ends (``CycleContext.close``). Resume runs in the append task: it is
short and safe to repeat, a retried task replays the append (a no-op) and resumes again. Append stays a
task of its own, the one place that makes a cycle's parts visible.
The task that appends emits an asset event ``reclock://<shard>`` for each shard an append of the run added
updates to, with the new ``[lower, upper)`` in its extra (``reclock.orchestration.assets``): sinks and
downstream DAGs scheduled on a collection run only when it changed. ``max_active_runs=1`` and
``catchup=False``; a manual run is safe anyway: minting never goes back in time and an append whose range is
in the shards is a no-op. ``airflow backfill create`` makes one run, one catch-up cycle at the current time,
whatever its range and ``max_active_runs`` (``reclock.orchestration.timetables``); the updates of a past
range are re-derived by a backfill of ``rebuild__<source>``. The run's ``params`` (``max_records``) are typed
(``reclock.orchestration.runs``). A source with
``schedule: upstream`` runs when its upstream moves (its kind's trigger, ``reclock.orchestration.triggers``) instead of every
``interval``, its four steps in one task ``cycle`` (a run exists because upstream moved, and the second
task's scheduling and start-up would be most of the data's wait: the event-driven mode is chosen for
freshness); one with ``schedule: continuous`` runs cycles back to back in one task a run
(``reclock.continuous``), and a continuous ``group:`` shares that task with its other sources (one running
task supervised instead of one per source). Retries are
Airflow's ``[core] default_task_retries`` and ``default_task_retry_delay``: a task may be retried after a
failure at any point (the fault campaign kills task processes and lets Airflow retry them).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta, timezone
from typing import Iterator, Sequence

from reclock import continuous, cycle
from reclock.batch import BatchDescription, Part
from reclock.specs import SourceSpec
from reclock.errors import ReclockError
from reclock.orchestration.assets import appends_alias, emit_added, event_extra
from reclock.orchestration.contexts import cycle_context
from reclock.orchestration.lineage import ReclockTask, collection, reads, writes
from reclock.orchestration.runs import PARAMS, check_conf, current_run, ingest_params, positive_int
from reclock.orchestration.timetables import ReclockTimetable
from reclock.schema_evolution import CollectionSchema, SchemaVersion
from reclock.settings import check_connections
from reclock.sources.registry import kind_of

log = logging.getLogger("reclock.ingest")

TRY_MARGIN_S = 300.0
"""What a ``mint_write`` try may take beyond its writes' deadlines (``interval`` + ``step_timeout``) before
Airflow fails it (its ``execution_timeout``): mint, attaching to Spark Connect (retried for about a minute
while the server is away: ``reclock.spark.connect.RETRY``) and what has no deadline of its own."""


def _part_to_x(p) -> list:
    return [p.path, p.rows, p.bytes, p.min_ts, p.max_ts]


def _written_to_x(w) -> dict:
    return {"desc": [w.desc.lower, w.desc.upper],
            "parts": {s: [_part_to_x(p) for p in ps] for s, ps in w.parts.items()},
            "state": [_part_to_x(p) for p in w.state], "prefix": w.prefix, "taken": list(w.taken),
            "schemas": {s: [[v.since_ts, v.schema.to_json(), v.upstream, v.cause] for v in vs]
                        for s, vs in w.schemas.items()}}


def _written_from_x(x: dict) -> cycle.WrittenBatch:
    return cycle.WrittenBatch(BatchDescription(*x["desc"]),
                        {s: tuple(Part(*p) for p in ps) for s, ps in x["parts"].items()},
                        tuple(Part(*p) for p in x.get("state", ())), x.get("prefix"),
                        {s: tuple(SchemaVersion(ts, CollectionSchema.from_json(cols), up, cause)
                                  for ts, cols, up, cause in vs) for s, vs in x.get("schemas", {}).items()},
                        tuple(x.get("taken", ())))


@contextlib.contextmanager
def _context(spec: SourceSpec, *, reads_upstream: bool = True,
             writes_collections: bool = True) -> Iterator[cycle.CycleContext]:
    """The task's cycle context: the settings, the run's ``max_records``; a backfill's run is told it is one
    catch-up (see the module). When the task's work ends (failed or not) the datasets it read and wrote are
    reported to OpenLineage and the context is closed (``CycleContext.close``)."""
    run = current_run()
    what = f"source {spec.name}"
    check_conf(what, run.conf, PARAMS["ingest"])
    max_records = positive_int(what, "max_records", run.values.get("max_records"))
    if run.backfill:
        refused = kind_of(spec).rebuild_refused(spec)
        rebuild = f"backfill rebuild__{spec.name} over it" if refused is None else f"none can: {refused}"
        log.info("%s: a backfill's run is one catch-up cycle at the current time (bindings are never minted in "
                 "the past); to re-derive the updates of a past range, %s", what, rebuild)
    check_connections(sources=[spec])  # a wrong `connection:` fails here, named; never at parse
    ctx = cycle_context(spec, {"max_records": max_records} if max_records else None, run_id=run.run_id)
    try:
        yield ctx
    finally:
        try:
            if reads_upstream:
                _read_upstream(ctx)
            if writes_collections:
                _write_collections(ctx)
        finally:
            ctx.close()


def _read_upstream(ctx: cycle.CycleContext) -> None:
    """Report the source's upstream to OpenLineage, as its kind names it (a topic, the published tables)."""
    reads(*ctx.source().lineage_inputs())


def _write_collections(ctx: cycle.CycleContext) -> None:
    with contextlib.suppress(ReclockError):
        writes(*(collection(ctx.dsn, s) for s in ctx.shards()))


def _emit(spec: SourceSpec, *contexts: cycle.CycleContext) -> dict:
    """Asset events for what the contexts' appends added (none when nothing moved); what XCom reports."""
    added = cycle.merge_added([a for ctx in contexts for a in ctx.added])
    emit_added(spec.name, added)
    return {s: event_extra(a) for s, a in sorted(added.items())}


def build_ingest_dag(spec: SourceSpec):
    from airflow.sdk import DAG, AssetOrTimeSchedule

    from reclock.orchestration.triggers import upstream_asset

    if spec.schedule == "continuous":
        return _continuous_dag(spec)
    with DAG(
        dag_id=f"ingest__{spec.name}",
        description=f"Ingest {kind_of(spec).describe(spec)} exactly once (one run = one cycle)",
        schedule=(ReclockTimetable(spec.interval_s) if spec.schedule == "interval" else
                  AssetOrTimeSchedule(timetable=ReclockTimetable(), assets=[upstream_asset(spec)])),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "ingest"],
        params=ingest_params(spec),
    ) as dag:

        if spec.schedule == "upstream":
            def cycle_task() -> dict:
                with _context(spec) as ctx:
                    out = cycle.run_cycle(ctx)
                return {**out, "offsets": {str(k): v for k, v in out["offsets"].items()}, "added": _emit(spec, ctx)}

            ReclockTask(task_id="cycle", python_callable=cycle_task, outlets=[appends_alias(spec.name)])
        else:
            def write_task() -> list[dict]:
                with _context(spec, writes_collections=False) as ctx:
                    return [_written_to_x(w) for w in cycle.mint_and_write(ctx, run_s=spec.interval_s)]

            def append_task(written: list[dict]) -> dict:
                with _context(spec, reads_upstream=False) as ctx:
                    outcomes = [str(o) for w in written for o in cycle.append(ctx, _written_from_x(w))]
                    res = cycle.resume(ctx)
                return {"outcomes": outcomes, "resumption": res.resumption,
                        "offsets": {str(k): v for k, v in res.offsets.items()}, "since": res.since,
                        "added": _emit(spec, ctx)}

            # a try's bound: mint, its writes (none started after interval_s, each's Spark work bounded by
            # step_timeout_s: reclock.spark.deadline) and a margin for what has no deadline of its own
            write = ReclockTask(task_id="mint_write", python_callable=write_task,
                                execution_timeout=timedelta(seconds=spec.interval_s + spec.step_timeout_s + TRY_MARGIN_S))
            ReclockTask(task_id="append", python_callable=append_task, op_args=[write.output],
                        outlets=[appends_alias(spec.name)])
    return dag


def _continuous_dag(spec: SourceSpec):
    """``schedule: continuous``: each run is one task that runs cycles back to back for the lease
    (``continuous.run_cycles``); the DAG is scheduled every lease with one active run, so the next run takes
    over when this one ends (after its last cycle). A killed task is retried, or the next run takes over:
    cycles are safe to repeat and to run two at once, so nothing is lost or doubled. Its asset events (what
    the lease's appends added) are emitted when the lease ends."""
    from airflow.sdk import DAG

    with DAG(
        dag_id=f"ingest__{spec.name}",
        description=f"Ingest {kind_of(spec).describe(spec)} exactly once, continuously "
                    f"(one run = cycles back to back for {spec.lease_s:.0f}s)",
        schedule=ReclockTimetable(spec.lease_s),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "ingest", "continuous"],
        params=ingest_params(spec),
    ) as dag:

        def cycles_task() -> dict:
            with _context(spec) as ctx:
                out = continuous.run_cycles(ctx, spec.lease_s, idle_s=spec.poll_s, resume_s=spec.resume_s)
            return {**out, "added": _emit(spec, ctx)}

        ReclockTask(task_id="cycles", python_callable=cycles_task, outlets=[appends_alias(spec.name)],
                    execution_timeout=timedelta(seconds=2 * spec.lease_s + 600))
    return dag


def build_group_dag(group: str, specs: Sequence[SourceSpec]):
    """``ingest_group__<group>``: each run is one task ``cycles`` that runs every source of the continuous
    group for the lease, a thread each (``continuous.run_group``); scheduled every lease with one active run,
    like a single continuous source. Its outlets are every member's aliases. A run's ``max_records`` applies
    to every member."""
    from airflow.sdk import DAG

    lease_s = specs[0].lease_s
    names = ", ".join(s.name for s in specs)
    titles = " or ".join(dict.fromkeys(kind_of(s).title for s in specs))
    with DAG(
        dag_id=f"ingest_group__{group}",
        description=f"Ingest {len(specs)} {titles} sources ({names}) exactly once, continuously, in one task "
                    f"(one run = each source's cycles back to back for {lease_s:.0f}s)",
        schedule=ReclockTimetable(lease_s),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "ingest", "continuous", "group"],
        params=ingest_params(specs[0]),
    ) as dag:

        def cycles_task() -> dict:
            with contextlib.ExitStack() as stack:
                contexts = [stack.enter_context(_context(s)) for s in specs]
                members = [continuous.Member(ctx, idle_s=s.poll_s, resume_s=s.resume_s)
                           for ctx, s in zip(contexts, specs)]
                out = continuous.run_group(group, members, lease_s)
            return {"sources": out, "added": {s.name: _emit(s, ctx) for ctx, s in zip(contexts, specs)}}

        ReclockTask(task_id="cycles", python_callable=cycles_task, outlets=[appends_alias(s.name) for s in specs],
                    execution_timeout=timedelta(seconds=2 * lease_s + 600))
    return dag
