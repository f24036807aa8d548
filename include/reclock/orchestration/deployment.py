"""The Airflow settings every deployment of Reclock's DAGs runs with: the dev stack sets them,
``docker-compose.yaml`` too (``tests/unit/test_compose.py`` checks it), and
``docs/operations.md`` says so. A task that fails or is killed anywhere is retried: every task is safe to run
again from any point (a cycle re-mints and writes to fresh paths, an append replays as a no-op)."""

from __future__ import annotations

TASK_RETRIES = 3
TASK_RETRY_DELAY_S = 10

AIRFLOW_ENV = {"AIRFLOW__CORE__DEFAULT_TASK_RETRIES": str(TASK_RETRIES),
               "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": str(TASK_RETRY_DELAY_S)}
