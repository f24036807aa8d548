"""What Airflow knows of Reclock's DAGs -- pause flags and newest runs, with the tasks that failed -- read from
its metadata database through its own ORM (in the api-server's process for the page, or in a ``reclock``
command whose environment configures the database: ``eval "$(reclock dev env)"`` does). Empty when it cannot
say: the status report then shows Reclock's own records alone."""

from __future__ import annotations

import os
from typing import Sequence

from reclock.status_report import DagRunState, DagState

RUNS_PER_DAG = 10


def all_dag_ids(config) -> list[str]:
    """Every DAG a config's sources and sinks may have."""
    if config is None:
        return []
    out = [d for n, s in config.sources.items() for d in (s.ingest_dag, f"rebuild__{n}")]
    return out + [f"sink__{n}" for n in config.sinks]


def configured() -> bool:
    """Whether this process can reach Airflow's metadata database (a command outside Airflow would otherwise
    open Airflow's default SQLite file)."""
    home = os.environ.get("AIRFLOW_HOME")
    return bool(os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
                or (home and os.path.isfile(os.path.join(home, "airflow.cfg"))))


def dag_states(dag_ids: Sequence[str], runs: int = RUNS_PER_DAG) -> dict[str, DagState]:
    """``dag_id -> DagState`` for the DAGs Airflow has among ``dag_ids``; ``{}`` if it cannot say."""
    if not dag_ids:
        return {}
    try:
        from sqlalchemy import func, select

        from airflow.models.dag import DagModel
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        with create_session() as session:
            paused = dict(session.execute(select(DagModel.dag_id, DagModel.is_paused)
                                          .where(DagModel.dag_id.in_(list(dag_ids)))).all())
            ranked = (select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.run_type, DagRun.start_date,
                             DagRun.end_date, func.row_number().over(partition_by=DagRun.dag_id,
                                                                     order_by=DagRun.id.desc()).label("n"))
                      .where(DagRun.dag_id.in_(list(paused))).subquery())
            rows = session.execute(select(ranked).where(ranked.c.n <= runs).order_by(ranked.c.dag_id, ranked.c.n)).all()
            failed_runs = [(r.dag_id, r.run_id) for r in rows if str(r.state) == "failed"]
            failed_tasks: dict[tuple[str, str], list[str]] = {}
            if failed_runs:
                for d, run_id, task_id in session.execute(
                        select(TaskInstance.dag_id, TaskInstance.run_id, TaskInstance.task_id)
                        .where(TaskInstance.dag_id.in_({d for d, _ in failed_runs}),
                               TaskInstance.run_id.in_({r for _, r in failed_runs}),
                               TaskInstance.state == "failed")).all():  # not upstream_failed
                    failed_tasks.setdefault((d, run_id), []).append(task_id)
    except Exception:  # noqa: BLE001 - no Airflow here, or its database does not answer: the page degrades
        return {}
    by_dag: dict[str, list[DagRunState]] = {}
    for r in rows:
        state = getattr(r.state, "value", r.state)
        by_dag.setdefault(r.dag_id, []).append(DagRunState(
            r.dag_id, r.run_id, str(state), str(getattr(r.run_type, "value", r.run_type)), r.start_date, r.end_date,
            tuple(sorted(failed_tasks.get((r.dag_id, r.run_id), ())))))
    return {d: DagState(d, p, tuple(by_dag.get(d, ()))) for d, p in paused.items()}
