"""The Airflow settings every deployment of Reclock's DAGs runs with: the dev stack sets them,
``docker-compose.yaml`` too (``tests/unit/test_compose.py`` checks it), and
``docs/operations.md`` says so. A task that fails or is killed anywhere is retried: every task is safe to run
again from any point (a cycle re-mints and writes to fresh paths, an append replays as a no-op)."""

from __future__ import annotations

TASK_RETRIES = 3
TASK_RETRY_DELAY_S = 10

AIRFLOW_ENV = {"AIRFLOW__CORE__DEFAULT_TASK_RETRIES": str(TASK_RETRIES),
               "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": str(TASK_RETRY_DELAY_S)}


def metadata_db_env(dsn: str) -> dict[str, str]:
    """Airflow's settings for a Postgres metadata database at ``dsn`` (``postgresql://...``, libpq's TLS
    parameters in its query): the synchronous URL (psycopg2, which takes libpq's parameters) and the
    asynchronous one. Airflow derives the latter by swapping in asyncpg, which refuses libpq's ``sslmode`` /
    ``sslrootcert`` keywords: every async session (the execution API's team lookup in multi-team mode, a run's
    ``wait`` endpoint) then fails, and a task's connection lookups answer "not defined". So the async URL takes
    ``ssl=<sslmode>`` and the certificate files go to ``PGSSLROOTCERT``/``PGSSLCERT``/``PGSSLKEY`` (which both
    drivers read)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    u = urlsplit(dsn)
    scheme = u.scheme.split("+", 1)[0]
    query = dict(parse_qsl(u.query))
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": urlunsplit(u._replace(scheme=f"{scheme}+psycopg2"))}
    files = {"sslrootcert": "PGSSLROOTCERT", "sslcert": "PGSSLCERT", "sslkey": "PGSSLKEY"}
    env.update({var: query.pop(key) for key, var in files.items() if key in query})
    if "sslmode" in query:
        query["ssl"] = query.pop("sslmode")
    env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC"] = urlunsplit(
        u._replace(scheme=f"{scheme}+asyncpg", query=urlencode(query)))
    return env
