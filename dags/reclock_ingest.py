"""Airflow DAG file: one ``ingest__<source>`` DAG per source in the Reclock config (include/reclock.yaml)."""

from reclock.orchestration.ingest import build_all

globals().update(build_all())
