"""Helpers of the stack tests."""

from __future__ import annotations

import time

from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.sinks.kafka import read_progress


def wait_sink_caught_up(stack, sink: str, collection: str, timeout: float = 180) -> None:
    """Until sink ``sink``'s progress record reaches ``collection``'s upper (as it is now); fails with the
    sink DAG's runs after ``timeout`` seconds."""
    with connect(stack.postgres.dsn()) as conn:
        upper = shard_info(conn, collection).upper
    deadline = time.monotonic() + timeout
    while (p := read_progress(stack.kafka.bootstrap, "_reclock_progress", sink)) is None or p.frontier < upper:
        assert time.monotonic() < deadline, stack.airflow.api("GET", f"dags/sink__{sink}/dagRuns")
        time.sleep(2)
