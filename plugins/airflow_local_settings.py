"""Airflow's local-settings hook (every Airflow process imports ``airflow_local_settings`` at start; the
plugins folder is on its path).

In the scheduler only: import what every Reclock task imports, the library's cycle and orchestration and
Spark Connect's client. The scheduler's LocalExecutor forks its workers and they fork the task processes,
so each task inherits these modules instead of importing them again: that import is most of a task's own
start-up (``benchmarks/freshness.py`` splits a cycle's time). Nothing is connected here (no Spark session,
no gRPC channel, no database connection), so nothing is shared across the fork but code. A failed import
is only logged: the tasks import what they need themselves anyway.
"""

from __future__ import annotations

import importlib
import logging
import sys


PRELOAD = ("pyspark.sql.connect.session", "pyspark.sql.connect.dataframe", "pyspark.sql.connect.functions",
           "reclock.cycle", "reclock.orchestration.dags", "reclock.orchestration.ingest",
           "reclock.orchestration.contexts", "reclock.orchestration.sinks")
"""What every Reclock task imports (Spark Connect's client, the cycle, the DAG factories)."""


def _preload() -> None:
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 - an optimisation only
        logging.getLogger(__name__).warning("Reclock: preloading the tasks' modules failed", exc_info=True)


if sys.argv[1:2] == ["scheduler"]:
    _preload()
