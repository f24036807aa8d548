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
``append`` has the source's shards as outlets (Assets ``reclock://<shard>``), so sinks can be scheduled
on the appends. ``max_active_runs=1`` and ``catchup=False``; a backfill or a manual run is safe anyway:
minting never goes back in time and an append whose range is in the shards is a no-op. A source with
``schedule: upstream`` runs when its upstream moves (its kind's trigger, ``reclock.orchestration.triggers``)
instead of every ``interval``, its four steps in one task ``cycle`` (a run exists because upstream moved, and the second
task's scheduling and start-up would be most of the data's wait: the event-driven mode is chosen for
freshness); one with ``schedule: continuous`` runs cycles back to back in one task a run
(``reclock.continuous``), and a continuous ``group:`` shares that task with its other sources (one running
task supervised instead of one per source). Retries are
Airflow's ``[core] default_task_retries`` and ``default_task_retry_delay``: a task may be retried after a
failure at any point (the fault campaign kills task processes and lets Airflow retry them).
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta, timezone
from typing import Iterator, Sequence

from reclock import continuous, cycle
from reclock.batch import BatchDescription, Part
from reclock.specs import SourceSpec
from reclock.orchestration.assets import shard_assets
from reclock.orchestration.contexts import cycle_context
from reclock.schema_evolution import CollectionSchema, SchemaVersion
from reclock.sources.registry import kind_of


def _part_to_x(p) -> list:
    return [p.path, p.rows, p.bytes, p.min_ts, p.max_ts]


def _written_to_x(w) -> dict:
    return {"desc": [w.desc.lower, w.desc.upper],
            "parts": {s: [_part_to_x(p) for p in ps] for s, ps in w.parts.items()},
            "state": [_part_to_x(p) for p in w.state], "prefix": w.prefix,
            "schemas": {s: [[v.since_ts, v.schema.to_json(), v.upstream, v.cause] for v in vs]
                        for s, vs in w.schemas.items()}}


def _written_from_x(x: dict) -> cycle.WrittenBatch:
    return cycle.WrittenBatch(BatchDescription(*x["desc"]),
                        {s: tuple(Part(*p) for p in ps) for s, ps in x["parts"].items()},
                        tuple(Part(*p) for p in x.get("state", ())), x.get("prefix"),
                        {s: tuple(SchemaVersion(ts, CollectionSchema.from_json(cols), up, cause)
                                  for ts, cols, up, cause in vs) for s, vs in x.get("schemas", {}).items()})


@contextlib.contextmanager
def _context(spec: SourceSpec) -> Iterator[cycle.CycleContext]:
    """The running task's cycle context, closed when the task's work ends (``CycleContext.close``)."""
    ctx = cycle_context(spec, conf())
    try:
        yield ctx
    finally:
        ctx.close()


def conf() -> dict:
    """The running task's DAG run conf (``{}`` without one)."""
    from airflow.sdk import get_current_context

    run = get_current_context().get("dag_run")
    return dict(run.conf or {}) if run is not None else {}


def build_ingest_dag(spec: SourceSpec):
    from airflow.sdk import DAG, task

    from reclock.orchestration.triggers import upstream_asset

    if spec.schedule == "continuous":
        return _continuous_dag(spec)
    with DAG(
        dag_id=f"ingest__{spec.name}",
        description=f"Ingest {kind_of(spec).describe(spec)} exactly once (one run = one cycle)",
        schedule=(timedelta(seconds=spec.interval_s) if spec.schedule == "interval" else [upstream_asset(spec)]),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "ingest"],
        params={},
    ) as dag:

        if spec.schedule == "upstream":
            @task(task_id="cycle", outlets=shard_assets(spec.shards))
            def cycle_task() -> dict:
                with _context(spec) as ctx:
                    out = cycle.run_cycle(ctx)
                return {**out, "offsets": {str(k): v for k, v in out["offsets"].items()}}

            cycle_task()
        else:
            @task(task_id="mint_write")
            def write_task() -> list[dict]:
                with _context(spec) as ctx:
                    return [_written_to_x(w) for w in cycle.mint_and_write(ctx, run_s=spec.interval_s)]

            @task(task_id="append", outlets=shard_assets(spec.shards))
            def append_task(written: list[dict]) -> dict:
                with _context(spec) as ctx:
                    outcomes = [str(o) for w in written for o in cycle.append(ctx, _written_from_x(w))]
                    res = cycle.resume(ctx)
                return {"outcomes": outcomes, "resumption": res.resumption,
                        "offsets": {str(k): v for k, v in res.offsets.items()}, "since": res.since}

            append_task(write_task())
    return dag


def _continuous_dag(spec: SourceSpec):
    """``schedule: continuous``: each run is one task that runs cycles back to back for the lease
    (``continuous.run_cycles``); the DAG is scheduled every lease with one active run, so the next run takes
    over when this one ends (after its last cycle). A killed task is retried, or the next run takes over:
    cycles are safe to repeat and to run two at once, so nothing is lost or doubled."""
    from airflow.sdk import DAG, task

    with DAG(
        dag_id=f"ingest__{spec.name}",
        description=f"Ingest {kind_of(spec).describe(spec)} exactly once, continuously "
                    f"(one run = cycles back to back for {spec.lease_s:.0f}s)",
        schedule=timedelta(seconds=spec.lease_s),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "ingest", "continuous"],
        params={},
    ) as dag:

        @task(task_id="cycles", outlets=shard_assets(spec.shards),
              execution_timeout=timedelta(seconds=2 * spec.lease_s + 600))
        def cycles_task() -> dict:
            with _context(spec) as ctx:
                return continuous.run_cycles(ctx, spec.lease_s, idle_s=spec.poll_s, resume_s=spec.resume_s)

        cycles_task()
    return dag


def build_group_dag(group: str, specs: Sequence[SourceSpec]):
    """``ingest_group__<group>``: each run is one task ``cycles`` that runs every source of the continuous
    group for the lease, a thread each (``continuous.run_group``); scheduled every lease with one active run,
    like a single continuous source. Its outlets are every member's shards. A run's conf (``max_records``)
    applies to every member."""
    from airflow.sdk import DAG, task

    lease_s = specs[0].lease_s
    names = ", ".join(s.name for s in specs)
    titles = " or ".join(dict.fromkeys(kind_of(s).title for s in specs))
    with DAG(
        dag_id=f"ingest_group__{group}",
        description=f"Ingest {len(specs)} {titles} sources ({names}) exactly once, continuously, in one task "
                    f"(one run = each source's cycles back to back for {lease_s:.0f}s)",
        schedule=timedelta(seconds=lease_s),
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["reclock", "ingest", "continuous", "group"],
        params={},
    ) as dag:

        @task(task_id="cycles", outlets=[a for s in specs for a in shard_assets(s.shards)],
              execution_timeout=timedelta(seconds=2 * lease_s + 600))
        def cycles_task() -> dict:
            run_conf = conf()
            members = [continuous.Member(cycle_context(s, run_conf), idle_s=s.poll_s, resume_s=s.resume_s)
                       for s in specs]
            try:
                return continuous.run_group(group, members, lease_s)
            finally:
                for m in members:
                    m.ctx.close()

        cycles_task()
    return dag
