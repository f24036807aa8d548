"""Reclock in the Airflow UI: the status report (``reclock.status_report``) as pages and JSON, mounted on the
api-server at ``/reclock`` and linked from the navigation ("Browse" > "Reclock").

    GET /reclock/                      every source and sink          (HTML)
    GET /reclock/source/<source>       one source: plots, bindings, status history
    GET /reclock/api/overview          the same as JSON
    GET /reclock/api/source/<source>

Every route needs a logged-in Airflow user allowed to read DAGs: the app's one dependency is Airflow's own
``requires_access_dag("GET")`` (the JWT of the UI's cookie or an ``Authorization: Bearer`` token, checked by
the configured auth manager); an anonymous request gets 401. Settings as for any Reclock process:
``RECLOCK_DSN`` or the ``reclock_postgres`` connection, ``RECLOCK_CONFIG`` (else the project's
include/reclock.yaml), brokers as the sources' cycles find them, ``RECLOCK_BLOB_URL`` for the newest error rows.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from airflow.api_fastapi.core_api.security import requires_access_dag
from airflow.plugins_manager import AirflowPlugin

from reclock import status_page, status_report
from reclock.config import load_config
from reclock.orchestration import settings
from reclock.orchestration.timetables import ReclockTimetable

PREFIX = "/reclock"
PROJECT = Path(__file__).resolve().parent.parent

app = FastAPI(title="Reclock status", dependencies=[Depends(requires_access_dag("GET"))],
              docs_url=None, redoc_url=None, openapi_url=None)


def _paused(dag_ids: list[str]) -> dict[str, bool]:
    """The pause flags of ``dag_ids`` from Airflow's metadata database (empty if it cannot say)."""
    try:
        from sqlalchemy import select

        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        with create_session() as session:
            return dict(session.execute(select(DagModel.dag_id, DagModel.is_paused)
                                        .where(DagModel.dag_id.in_(dag_ids))).all())
    except Exception:
        return {}


def _inputs():
    config = load_config(default=PROJECT / "include" / "reclock.yaml")
    blob = settings.find_blob_store() if os.environ.get("RECLOCK_BLOB_URL") else None
    lag = status_report.kafka_lag_probe(config, lambda kafka, what: settings.find_bootstrap(kafka, what))
    dags = [d for n, spec in config.sources.items() for d in (spec.ingest_dag, f"rebuild__{n}")]
    dags += [f"sink__{n}" for n in config.sinks]
    return config, blob, lag, _paused(dags)


def _overview() -> status_report.Overview:
    config, blob, lag, paused = _inputs()
    with status_report.open_readonly(settings.find_dsn()) as conn:
        return status_report.overview(conn, config, lag, paused, blob)


def _detail(source: str) -> status_report.SourceDetail:
    config, blob, lag, paused = _inputs()
    with status_report.open_readonly(settings.find_dsn()) as conn:
        detail = status_report.source_detail(conn, source, config, lag, paused, blob)
    if detail is None:
        raise HTTPException(404, f"source {source!r} is neither registered nor configured")
    return detail


@app.get("/", response_class=HTMLResponse)
def overview_page() -> str:
    return status_page.overview_html(_overview())


@app.get("/source/{source}", response_class=HTMLResponse)
def source_page(source: str) -> str:
    return status_page.source_html(_detail(source))


@app.get("/api/overview")
def overview_json() -> dict:
    return status_report.to_json(_overview())


@app.get("/api/source/{source}")
def source_json(source: str) -> dict:
    return status_report.to_json(_detail(source))


class ReclockStatusPlugin(AirflowPlugin):
    name = "reclock_status"
    timetables = [ReclockTimetable]  # every Reclock DAG's schedule (Airflow deserializes it only from a plugin)
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Reclock status"}]
    external_views = [{"name": "Reclock", "href": f"{PREFIX}/", "url_route": "reclock", "destination": "nav",
                       "category": "browse"}]
