"""Fixtures of the integration tests: a persist connection to a migrated database (``db``, tests/conftest.py),
a migrated Airflow metadata database for ``dag.test()`` runs."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from reclock.persist import connect


@pytest.fixture
def conn(db: str):
    """An autocommit connection to ``db``, as the persist functions expect (``reclock.persist.connect``)."""
    with connect(db) as c:
        yield c


@pytest.fixture(scope="session")
def s3_auth(stack_state, stops):
    """A second moto server that checks keys as AWS does (IAM): for wrong credentials."""
    from reclock.dev.s3 import LocalS3

    server = LocalS3(stack_state, name="s3auth", auth=True)
    server.start()
    yield server
    stops.later("s3auth", server.stop)  # at the session's end, beside the others (tests/conftest.py)


@pytest.fixture(scope="session")
def airflow_db(postgres, tmp_path_factory) -> str:
    """An Airflow metadata database in the test Postgres, migrated once (``airflow db migrate``) for the tests
    that run DAGs under ``dag.test()`` (each with DAG ids of its own); returns its name."""
    name = f"airflow_{os.getpid()}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path_factory.mktemp("airflow")),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.dsn(name).replace("postgresql://",
                                                                             "postgresql+psycopg2://"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
    return name
