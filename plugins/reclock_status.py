"""Reclock in the Airflow UI: the status report (``reclock.status_report``) as pages and JSON, mounted on the
api-server at ``/reclock`` and linked from the navigation ("Browse" > "Reclock").

    GET /reclock/                      every source and sink          (HTML)
    GET /reclock/source/<source>       one source: plots, bindings, status history
    GET /reclock/api/overview          the same as JSON
    GET /reclock/api/source/<source>

Every route needs a logged-in Airflow user allowed to read DAGs: the app's one dependency is Airflow's own
``requires_access_dag("GET")`` (the JWT of the UI's cookie or an ``Authorization: Bearer`` token, checked by
the configured auth manager); an anonymous request gets 401. A user sees only the sources whose ingest DAG
and the sinks whose ``sink__<name>`` DAG the auth manager lets them read (Airflow's per-DAG permissions:
teams, or FAB's DAG-level roles); another source's page is a 404, as if it did not exist, and nothing of a
hidden source is read or probed. Settings as for any Reclock process:
``RECLOCK_DSN`` or the ``reclock_postgres`` connection, ``RECLOCK_CONFIG`` (else the project's
include/reclock.yaml), brokers as the sources' cycles find them, ``RECLOCK_BLOB_URL`` for the newest error rows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse

from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.plugins_manager import AirflowPlugin

from reclock import status_page, status_report
from reclock.config import load_config
from reclock import settings

PREFIX = "/reclock"
PROJECT = Path(__file__).resolve().parent.parent

app = FastAPI(title="Reclock status", dependencies=[Depends(requires_access_dag("GET"))],
              docs_url=None, redoc_url=None, openapi_url=None)


def readable_dags(user: GetUserDep) -> frozenset[str]:
    """The DAG ids the request's user may read, as Airflow's auth manager says."""
    from airflow.api_fastapi.app import get_auth_manager

    return frozenset(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


Readable = Annotated[frozenset[str], Depends(readable_dags)]


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
    lag = status_report.lag_probe(config, dsn=settings.find_dsn())
    dags = [d for n, spec in config.sources.items() for d in (spec.ingest_dag, f"rebuild__{n}")]
    dags += [f"sink__{n}" for n in config.sinks]
    return config, blob, lag, _paused(dags)


def _overview(readable: frozenset[str]) -> status_report.Overview:
    config, blob, lag, paused = _inputs()
    with status_report.open_readonly(settings.find_dsn()) as conn:
        return status_report.overview(conn, config, lag, paused, blob, readable=readable)


def _detail(source: str, readable: frozenset[str]) -> status_report.SourceDetail:
    config, blob, lag, paused = _inputs()
    with status_report.open_readonly(settings.find_dsn()) as conn:
        detail = status_report.source_detail(conn, source, config, lag, paused, blob, readable=readable)
    if detail is None:  # the same answer whether it does not exist or the user may not read it
        raise HTTPException(404, f"source {source!r} is neither registered nor configured, or not yours to read")
    return detail


@app.get("/", response_class=HTMLResponse)
def overview_page(readable: Readable) -> str:
    return status_page.overview_html(_overview(readable))


@app.get("/source/{source}", response_class=HTMLResponse)
def source_page(source: str, readable: Readable) -> str:
    return status_page.source_html(_detail(source, readable))


@app.get("/api/overview")
def overview_json(readable: Readable) -> dict:
    return status_report.to_json(_overview(readable))


@app.get("/api/source/{source}")
def source_json(source: str, readable: Readable) -> dict:
    return status_report.to_json(_detail(source, readable))


class ReclockStatusPlugin(AirflowPlugin):
    name = "reclock_status"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Reclock status"}]
    external_views = [{"name": "Reclock", "href": f"{PREFIX}/", "url_route": "reclock", "destination": "nav",
                       "category": "browse"}]
