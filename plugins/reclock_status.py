"""Reclock in the Airflow UI: the status report (``reclock.status_report``) as pages and JSON, mounted on the
api-server at ``/reclock`` and linked from the navigation ("Browse" > "Reclock").

    GET /reclock/                      every source and sink          (HTML)
    GET /reclock/source/<source>       one source: plots, bindings, status history
    GET /reclock/api/overview          the same as JSON
    GET /reclock/api/source/<source>
    GET /reclock/metrics               per source and sink, in Prometheus's text format (reclock.metrics)
    GET /reclock                       redirects to /reclock/

Every route needs a logged-in Airflow user allowed to read DAGs: the app's one dependency is Airflow's own
``requires_access_dag("GET")`` (the JWT of the UI's cookie or an ``Authorization: Bearer`` token, checked by
the configured auth manager); an anonymous request gets 401, or, from a browser asking for a page, a
redirect to Airflow's login page that comes back here. A user sees only the sources whose ingest DAG
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

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from fastapi.exception_handlers import http_exception_handler

from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.plugins_manager import AirflowPlugin

from reclock import metrics, status_page, status_report
from reclock.config import load_config
from reclock import settings
from reclock.orchestration.airflow_state import all_dag_ids, dag_states
from reclock.orchestration.timetables import ReclockTimetable

PREFIX = "/reclock"
PROJECT = Path(__file__).resolve().parent.parent

app = FastAPI(title="Reclock status", dependencies=[Depends(requires_access_dag("GET"))],
              docs_url=None, redoc_url=None, openapi_url=None)


def readable_dags(user: GetUserDep) -> frozenset[str]:
    """The DAG ids the request's user may read, as Airflow's auth manager says."""
    from airflow.api_fastapi.app import get_auth_manager

    return frozenset(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


Readable = Annotated[frozenset[str], Depends(readable_dags)]


def _inputs():
    config = load_config(default=PROJECT / "include" / "reclock.yaml")
    blob = settings.find_blob_store() if os.environ.get("RECLOCK_BLOB_URL") else None
    lag = status_report.lag_probe(config, dsn=settings.find_dsn())
    return config, blob, lag, dag_states(all_dag_ids(config))


def _overview(readable: frozenset[str]) -> status_report.Overview:
    config, blob, lag, dags = _inputs()
    with status_report.open_readonly(settings.find_dsn()) as conn:
        return status_report.overview(conn, config, lag, blob=blob, dags=dags, readable=readable)


def _detail(source: str, readable: frozenset[str]) -> status_report.SourceDetail:
    config, blob, lag, dags = _inputs()
    with status_report.open_readonly(settings.find_dsn()) as conn:
        detail = status_report.source_detail(conn, source, config, lag, blob=blob, dags=dags, readable=readable)
    if detail is None:  # the same answer whether it does not exist or the user may not read it
        raise HTTPException(404, f"source {source!r} is neither registered nor configured, or not yours to read")
    return detail


@app.exception_handler(StarletteHTTPException)
async def _login_first(request: Request, exc: StarletteHTTPException):
    """An anonymous browser asking for a page goes to Airflow's login, and comes back here after it; an API
    client (no ``text/html`` in its Accept header) gets the 401 itself."""
    wants_page = "text/html" in request.headers.get("accept", "")
    if exc.status_code == 401 and wants_page and request.method in ("GET", "HEAD"):
        from airflow.api_fastapi.app import get_auth_manager

        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
    return await http_exception_handler(request, exc)


class SlashRedirect:
    """``/reclock`` (no slash) to ``/reclock/``: the plugin's app is mounted below the prefix, so the bare
    prefix would be a 404 of the api-server."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("path") == PREFIX and scope.get("method") in ("GET", "HEAD"):
            query = scope.get("query_string", b"").decode()
            await RedirectResponse(f"{scope.get('root_path', '')}{PREFIX}/" + (f"?{query}" if query else ""),
                                   status_code=307)(scope, receive, send)
            return
        await self.app(scope, receive, send)


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


@app.get("/metrics", response_class=PlainTextResponse)
def prometheus_metrics(readable: Readable) -> PlainTextResponse:
    """The figures of what the scraper's user may read."""
    return PlainTextResponse(metrics.prometheus_text(_overview(readable)), media_type=metrics.CONTENT_TYPE)


class ReclockStatusPlugin(AirflowPlugin):
    name = "reclock_status"
    timetables = [ReclockTimetable]  # every Reclock DAG's schedule (Airflow deserializes it only from a plugin)
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Reclock status"}]
    fastapi_root_middlewares = [{"middleware": SlashRedirect, "name": "Reclock: /reclock to /reclock/"}]
    external_views = [{"name": "Reclock", "href": f"{PREFIX}/", "url_route": "reclock", "destination": "nav",
                       "category": "browse"}]
