"""Airflow DAG file: ``ingest__<source>`` and ``rebuild__<source>`` per source, ``sink__<sink>`` per sink in the
Reclock config (include/reclock.yaml)."""

from reclock.orchestration.ingest import build_all

globals().update(build_all())
