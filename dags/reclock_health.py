"""Airflow DAG file: the stack's health DAG (see reclock.orchestration.health)."""

from reclock.orchestration.health import build_health_dag

dag = build_health_dag()
