"""The status report as Prometheus metrics (the text exposition format, version 0.0.4): what the plugin serves
at ``/reclock/metrics`` behind Airflow's authentication, so Prometheus alerts on freshness, lag and errors.

Per source (labels ``source``, ``kind``):

=======================================  ===========================================================
``reclock_source_upper_age_seconds``     now minus the resumption frontier: freshness (an idle source's
                                         upper advances, so it stays small while nothing is pending)
``reclock_source_lag``                   what upstream holds beyond the committed position, in the
                                         kind's own unit (label ``unit``: Kafka ``records``, Postgres
                                         ``bytes`` of WAL beyond the slot)
``reclock_source_cycle_seconds``         the last complete cycle's wall time, mint to resume
``reclock_source_step_seconds``          ... per step (label ``step``)
``reclock_source_cycle_records``         records the last cycle wrote (collections and error collection)
``reclock_source_error_records``         rows in the source's error collection
``reclock_source_stalled``               1 while the source is stalled or its newest Airflow run failed
``reclock_source_failed_runs``           failed Airflow runs since the newest successful one
=======================================  ===========================================================

Per sink (label ``sink``): ``reclock_sink_lag_seconds`` (the collection's upper minus the sink's frontier),
``reclock_sink_stalled``. A value Reclock does not know (a lag probe with no answer) is left out, as Prometheus
expects, never written as 0.
"""

from __future__ import annotations

from typing import Iterable

from reclock.status_report import Overview

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_HELP = {
    "reclock_source_upper_age_seconds": ("gauge", "Seconds since the source's upper (its freshness)."),
    "reclock_source_lag": ("gauge", "What upstream holds beyond the source's committed position, in the kind's unit."),
    "reclock_source_cycle_seconds": ("gauge", "Wall time of the source's last complete cycle."),
    "reclock_source_step_seconds": ("gauge", "Seconds of each step of the source's last complete cycle."),
    "reclock_source_cycle_records": ("gauge", "Records the source's last complete cycle wrote."),
    "reclock_source_error_records": ("gauge", "Rows in the source's error collection."),
    "reclock_source_stalled": ("gauge", "1 while the source is stalled or its newest Airflow run failed."),
    "reclock_source_failed_runs": ("gauge", "Failed Airflow runs of the source's ingest DAG since its last success."),
    "reclock_sink_lag_seconds": ("gauge", "The collection's upper minus the sink's frontier, in seconds."),
    "reclock_sink_stalled": ("gauge", "1 while the sink is stalled."),
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(name: str, labels: dict[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {float(value)!r}"


def _samples(ov: Overview) -> Iterable[tuple[str, dict[str, str], float]]:
    for s in ov.sources:
        base = {"source": s.name, "kind": s.kind}
        if s.upper_age_s is not None:
            yield "reclock_source_upper_age_seconds", base, s.upper_age_s
        if s.lag.value is not None:
            yield "reclock_source_lag", {**base, "unit": s.lag.unit}, s.lag.value
        c = s.last_cycle
        if c is not None:
            yield "reclock_source_cycle_seconds", base, c.total
            for step, secs in (("mint", c.mint), ("write_batches", c.write_batches), ("append", c.append),
                               ("resume", c.resume), ("scheduler_gap", c.scheduler_gap)):
                if secs is not None:
                    yield "reclock_source_step_seconds", {**base, "step": step}, secs
            yield "reclock_source_cycle_records", base, c.records
        yield "reclock_source_error_records", base, s.errors_count
        yield "reclock_source_stalled", base, 1 if s.status in ("stalled", "failed") else 0
        if s.airflow is not None:
            yield "reclock_source_failed_runs", base, s.airflow.failed_since_success
    for k in ov.sinks:
        if k.lag_ms is not None:
            yield "reclock_sink_lag_seconds", {"sink": k.name}, k.lag_ms / 1000
        yield "reclock_sink_stalled", {"sink": k.name}, 1 if k.status in ("stalled", "failed") else 0


def prometheus_text(ov: Overview) -> str:
    """The overview's figures in the Prometheus text format, each metric once with its HELP and TYPE."""
    by_metric: dict[str, list[str]] = {}
    for name, labels, value in _samples(ov):
        by_metric.setdefault(name, []).append(_sample(name, labels, value))
    out = []
    for name, (kind, text) in _HELP.items():
        if name in by_metric:
            out += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *by_metric[name]]
    return "\n".join(out) + "\n"
