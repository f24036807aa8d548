"""Smoke checks of a running dev stack: each proves its service does the real thing Reclock needs (the
service checks are the health DAG's, ``reclock.orchestration.health``; Airflow's is the stack's own)."""

from __future__ import annotations

from reclock.orchestration.health import check_kafka, check_postgres, check_spark_connect

__all__ = ["check_airflow", "check_kafka", "check_postgres", "check_spark_connect"]


def check_airflow(airflow) -> str:
    """The API answers with a login and lists the DAGs parsed from the project's folder."""
    dags = airflow.api("GET", "dags?limit=100")
    ids = sorted(d["dag_id"] for d in dags.get("dags", []))
    errors = airflow.api("GET", "importErrors").get("import_errors", [])
    if errors:
        raise RuntimeError(f"airflow: DAG import errors: {errors}")
    return f"API answered; DAGs: {', '.join(ids) or '(none yet)'}"
