"""Airflow DAG file: ``ingest__<source>``, ``rebuild__<source>`` and ``sink__<sink>`` for the Reclock config
(``$RECLOCK_CONFIG``, else ``include/reclock.yaml`` beside this folder)."""

from pathlib import Path

from reclock.orchestration.dags import build_all

globals().update(build_all(project=Path(__file__).resolve().parents[1]))
