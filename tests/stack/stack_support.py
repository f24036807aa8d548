"""Helpers of the stack tests."""

from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.sinks.kafka import read_progress

RECLOCK = [sys.executable, "-m", "reclock.cli"]


def wait_sink_caught_up(stack, sink: str, collection: str, timeout: float = 180) -> None:
    """Until sink ``sink``'s progress record reaches ``collection``'s upper (as it is now); fails with the
    sink DAG's runs after ``timeout`` seconds."""
    with connect(stack.postgres.dsn()) as conn:
        upper = shard_info(conn, collection).upper
    deadline = time.monotonic() + timeout
    while (p := read_progress(stack.kafka.bootstrap, "_reclock_progress", sink)) is None or p.frontier < upper:
        assert time.monotonic() < deadline, stack.airflow.api("GET", f"dags/sink__{sink}/dagRuns")
        time.sleep(2)


SHARED_CONFIG = """
# One Reclock config for the stack the stack tests share (tests/stack/conftest.py): each test's sources,
# sinks, topics, publications and tables carry its own prefix (it_: test_stack_up, ops_: test_airflow_ops,
# ui_: test_status_ui), so no test sees another's runs or records.
# `interval: 4000d`: longer than the time since the DAGs' start date (2024-01-01), so unpausing a DAG
# schedules no run of its own (catchup=False schedules the latest interval, here not due before 2034): a
# test's runs are the ones it triggers.
sources:
  it_orders:
    kafka: {connection: reclock_kafka, topic: it_orders}
    format: {type: json, schema: "id BIGINT"}
    include: [partition, offset]
    interval: 4000d
  it_events:
    kafka: {connection: reclock_kafka, topic: it_events}
    format: {type: json, schema: "id BIGINT"}
    schedule: upstream
    poll: 500ms
  it_shop:
    postgres: {connection: reclock_demo_shop, publication: it_shop_pub}
    tables: [public.it_orders]
    schedule: upstream
    poll: 500ms
  ops_orders:
    kafka: {connection: reclock_kafka, topic: ops_orders}
    format: {type: json, schema: "id BIGINT"}
    interval: 4000d
  ops_fix:
    kafka: {connection: reclock_kafka, topic: ops_fix}
    format: {type: json, schema: "id BIGINT, amount BIGINT"}
    include: [partition, offset]
    interval: 4000d
  ops_shop:
    postgres: {connection: reclock_demo_shop, publication: ops_shop_pub}
    tables: [public.ops_orders]
    interval: 4000d
  ui_orders:
    kafka: {connection: reclock_kafka, topic: ui_orders}
    format: {type: json, schema: "id BIGINT"}
    interval: 4000d
  ui_payments:
    kafka: {connection: reclock_kafka, topic: ui_payments}
    format: {type: json, schema: "id BIGINT"}
    interval: 4000d
    on_decode_error: stall
  ui_shop:
    postgres: {connection: reclock_demo_shop, publication: ui_shop_pub}
    tables: [public.ui_orders, public.ui_items]
    interval: 4000d
  ui_events:
    s3: {connection: reclock_s3, url: "s3://ui-landing/events/"}
    format: {type: json, schema: "id BIGINT"}
    interval: 4000d
sinks:
  it_out:
    from: it_orders
    kafka: {connection: reclock_kafka, topic: it_orders_out}
    format: debezium
  ops_out:
    from: ops_orders
    kafka: {connection: reclock_kafka, topic: ops_orders_out}
    format: debezium
  ui_out:
    from: ui_orders
    kafka: {connection: reclock_kafka, topic: ui_orders_out}
    format: debezium
"""


class SharedStack:
    """The stack the stack tests share, as its user starts it: ``reclock dev up`` (smoke checks included) on a
    state folder of its own with :data:`SHARED_CONFIG` (:meth:`start`; ``up`` is that command's result,
    ``first_up_s`` its seconds); :meth:`down` is ``reclock dev down``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.config = home / "reclock.yaml"
        self.config.write_text(SHARED_CONFIG)
        self.lineage = home / "lineage.jsonl"
        # the stack's processes inherit this environment: without the placeholder AWS keys tests/conftest.py sets
        # for Kinesis clients (the S3 source names its connection, which they never stand in for); OpenLineage
        # events go to a file (test_airflow_ops reads them)
        self.env = {**{k: v for k, v in os.environ.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")},
                    "RECLOCK_HOME": str(home / "stack"), "RECLOCK_CONFIG": str(self.config),
                    "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                        {"type": "file", "log_file_path": str(self.lineage), "append": True}),
                    "AIRFLOW__OPENLINEAGE__NAMESPACE": "reclock-tests",
                    # the deployments' 3 retries, 2 s apart instead of 10: a run the tests make fail on purpose
                    # (a refused conf, a stalled source) fails in its 4 tries without 30 s of waiting between them
                    "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2"}
        self.up: subprocess.CompletedProcess | None = None
        self.first_up_s = 0.0

    def start(self) -> None:
        t0 = time.monotonic()
        self.up = self.reclock("dev", "up", timeout=900)
        self.first_up_s = time.monotonic() - t0

    @functools.cached_property
    def stack(self):
        """The :class:`~reclock.dev.stack.Stack` on the state folder (read after ``up`` wrote it)."""
        from reclock.dev.stack import Stack
        from reclock.dev.state import StackState

        return Stack(StackState(self.home / "stack"))

    def require_up(self) -> None:
        """The test's first line: a failed ``reclock dev up`` fails it with the command's output."""
        assert self.up is not None and self.up.returncode == 0, \
            "reclock dev up failed:\n" + (self.up.stdout + self.up.stderr if self.up else "not run")

    def reclock(self, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([*RECLOCK, *args], env=env or self.env, capture_output=True, text=True,
                              timeout=timeout)

    def shell_env(self) -> dict[str, str]:
        """What `eval "$(reclock dev env)"` gives a shell."""
        out = self.reclock("dev", "env")
        assert out.returncode == 0, out.stderr
        return {**self.env, **dict(shlex.split(line)[1].split("=", 1) for line in out.stdout.splitlines())}

    def down(self) -> None:
        """``reclock dev down``: every service down, every port closed."""
        from reclock.dev.procs import port_open

        down = self.reclock("dev", "down")
        assert down.returncode == 0, down.stdout + down.stderr
        for name, state in self.stack.status().items():
            assert state == "down", (name, state)
        for port in (self.stack.postgres.port, self.stack.kafka.port, self.stack.spark.port, self.stack.airflow.port):
            assert not port_open(port)
