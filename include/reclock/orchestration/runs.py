"""What a run of a Reclock DAG may be given, typed: each DAG's ``params`` (Airflow validates them in the UI's
trigger form and the REST API: a wrong type is refused before a run exists) and what the running task reads
back (:func:`current_run`), checked again in the task so a run made some other way (``dag.test()``, a run
conf written by hand) fails with a message naming the key, never a bare ``ValueError``.

==================  =================  ======================================================================
DAG                 param              meaning (null: the config's value)
==================  =================  ======================================================================
``ingest__*``       ``max_records``    upstream records per Spark job of this run (the source's ``budget``)
``sink__*``         ``max_messages``   a Kafka sink: messages per transaction (its ``budget``)
                    ``max_rows``       an Iceberg export: rows per commit (its ``budget``)
``rebuild__*``      ``window_start``   rebuild only the bindings at ``window_start <= ts < window_end``
                    ``window_end``     (ISO 8601 times; both null: everything). A backfill's run rebuilds its
                                       data interval instead.
==================  =================  ======================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from reclock.errors import ConfigError

def _positive(title: str, description: str):
    from airflow.sdk import Param

    return Param(None, type=["null", "integer"], minimum=1, title=title, description=description)


def ingest_params(spec) -> dict:
    """``ingest__<source>``'s params (and a continuous group's: they apply to every member)."""
    return {"max_records": _positive(
        "Records per Spark job",
        f"Upstream records one Spark job of this run reads (empty: the config's budget, {spec.budget.max_records:,}).")}


def sink_params(spec) -> dict:
    """``sink__<name>``'s params: the budget of one transaction (Kafka) or commit (Iceberg)."""
    if hasattr(spec, "table"):
        return {"max_rows": _positive("Rows per Iceberg commit",
                                      f"Empty: the config's budget, {spec.budget.max_rows:,}.")}
    return {"max_messages": _positive("Messages per Kafka transaction",
                                      f"Empty: the config's budget, {spec.budget.max_messages:,}.")}


def rebuild_params() -> dict:
    from airflow.sdk import Param

    def when(title: str, description: str):
        return Param(None, type=["null", "string"], format="date-time", title=title, description=description)

    return {
        "window_start": when("Rebuild from", "Rebuild the bindings at or after this time (empty: from the "
                                              "first). A backfill's run rebuilds its data interval."),
        "window_end": when("Rebuild until", "... and before this time (empty: up to the collection's upper)."),
    }


PARAMS = {"ingest": ("max_records",), "sink": ("max_messages", "max_rows"), "rebuild": ("window_start", "window_end")}


@dataclass(frozen=True)
class RunInfo:
    """The running task's DAG run as Reclock needs it."""

    dag_id: str
    run_id: str
    run_type: str
    data_interval: tuple[int, int] | None  # [start, end) in ms, when the run has one
    values: Mapping[str, Any]  # the run's values of the DAG's params (conf merged in), None where not given
    conf: Mapping[str, Any]

    @property
    def backfill(self) -> bool:
        return self.run_type == "backfill"


def _ms(dt: datetime | None) -> int | None:
    return None if dt is None else int(dt.timestamp() * 1000)


def current_run() -> RunInfo:
    """The running task's run (Airflow's task context)."""
    from airflow.sdk import get_current_context

    ctx = get_current_context()
    run = ctx.get("dag_run")
    start, end = ctx.get("data_interval_start"), ctx.get("data_interval_end")
    run_type = getattr(run, "run_type", None)
    return RunInfo(
        dag_id=ctx["dag"].dag_id, run_id=ctx.get("run_id") or getattr(run, "run_id", ""),
        run_type=str(getattr(run_type, "value", run_type) or "manual"),
        data_interval=(_ms(start), _ms(end)) if start is not None and end is not None else None,
        values=dict(ctx.get("params") or {}), conf=dict(getattr(run, "conf", None) or {}))


def positive_int(what: str, key: str, value: Any) -> int | None:
    """``value`` as a positive int (None stays None); ``ConfigError`` naming ``what`` and ``key`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{what}: run parameter {key} must be a positive integer, got {value!r}")
    return value


def check_conf(what: str, conf: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    """A run conf may only name the DAG's params: anything else would be silently ignored."""
    unknown = sorted(set(conf) - set(allowed))
    if unknown:
        raise ConfigError(f"{what}: run conf key(s) {', '.join(unknown)} are not known; a run takes "
                          + (", ".join(allowed) if allowed else "none"))


def parse_time_ms(what: str, key: str, value: Any) -> int | None:
    """An ISO 8601 time (or ms since the epoch) as ms; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if dt.tzinfo is None:
                raise ConfigError(f"{what}: {key} {value!r} has no time zone (write e.g. "
                                  "2026-01-02T03:04:05Z)")
            return int(dt.timestamp() * 1000)
    raise ConfigError(f"{what}: {key} must be an ISO 8601 time like 2026-01-02T03:04:05Z, got {value!r}")
