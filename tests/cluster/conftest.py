"""Fixtures of the cluster tests: a Spark standalone cluster (a master, two workers of 1 core and 1g) with
a Spark Connect server on it, its S3A settings and keys for the session's moto endpoint; started once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# the ingestion tests' helpers (a controllable clock, a producer)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))


@pytest.fixture(scope="module")
def cluster(stack_state, s3):
    """The cluster, for the module's tests. A Connect session made in this process switches PySpark into
    Connect mode for the whole process (``SPARK_CONNECT_MODE_ENABLED``): the teardown switches it back, or
    every later test's classic local session would ask for a Connect URL."""
    from reclock.dev.cluster import LocalSparkCluster

    c = LocalSparkCluster(stack_state, workers=2, worker_cores=1, worker_memory="1g", s3=s3.settings())
    try:
        c.start()
        yield c
    finally:
        from pyspark.sql.connect.session import SparkSession

        session = SparkSession.getActiveSession()  # the tests' Connect session: release it while the server runs
        if session is not None:
            session.stop()
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        c.stop()
