"""Continuous mode (issue 19): ``run_cycles`` runs whole cycles back to back for a lease; a process killed
mid-lease (SIGKILL, anywhere in a cycle) and the next lease taking over leave every record exactly once at
its binding's timestamp, while producers write throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import yaml
from ingest_support import check_invariants, make_ctx, produce, rec

from reclock import cycle
from reclock.dev.jars import spark_kafka_jars
from reclock.dev.state import REPO_ROOT
from reclock.persist import connect
from reclock.persist.shards import shard_info

LEASE = """
import sys
from reclock.config import load_config
from reclock.cycle import run_cycles
from reclock.orchestration.settings import cycle_context

print("ready", flush=True)
print(run_cycles(cycle_context(load_config(None).source("cont")), float(sys.argv[1]), idle_s=0.1), flush=True)
"""


def _lease(env: dict, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LEASE, str(seconds)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_a_lease_killed_midway_and_the_next_taking_over_land_everything_once(db, kafka, topic, spark, tmp_path,
                                                                             stack_state):
    name = topic(partitions=2)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, name="cont", budget={"max_records": 10_000}),
                  retain_history_ms=10**12)
    config = tmp_path / "reclock.yaml"
    config.write_text(yaml.safe_dump({"sources": {"cont": {
        "kafka": {"topic": name, "bootstrap": kafka.bootstrap}, "format": {"type": "json", "schema": "id BIGINT, name STRING"},
        "include": ["partition", "offset", "key"], "budget": {"max_records": 10_000}, "schedule": "continuous",
        "lease": "1m"}}}))
    env = {**os.environ, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": db, "RECLOCK_BLOB_URL": str(tmp_path / "blobs"),
           "RECLOCK_SPARK_MASTER": "local[1]", "RECLOCK_SPARK_JARS": ",".join(spark_kafka_jars(stack_state)),
           "RECLOCK_RETAIN_HISTORY_S": "1000000000", "PYTHONPATH": os.pathsep.join(
               [str(REPO_ROOT / "include"), os.environ.get("PYTHONPATH", "")])}
    stop, sent = threading.Event(), [0]

    def producer() -> None:
        while not stop.is_set():
            produce(kafka, name, [rec(sent[0] + j, (sent[0] + j) % 2) for j in range(5)])
            sent[0] += 5
            time.sleep(0.25)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    try:
        first = _lease(env, 120)
        deadline = time.monotonic() + 240
        while True:  # some cycles in: then kill it, wherever it is
            with connect(db) as conn:
                n = conn.execute("SELECT count(*) FROM reclock.statistics WHERE name = 'cont' AND step = 'resume'"
                                 ).fetchone()[0]
            if n >= 2:
                break
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0][-3000:]
            time.sleep(0.3)
        time.sleep(0.7)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        second = _lease(env, 6)  # the next lease takes over while the producers go on
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 0, out[-3000:]
        assert "'cycles': " in out and "'with_data': 0" not in out, out[-2000:]
    finally:
        stop.set()
        t.join(30)
    while cycle.run_cycle(ctx)["descriptions"]:  # the rest, in this process
        pass
    check_invariants(ctx, set(range(sent[0])))
    with connect(db) as conn:
        assert shard_info(conn, "cont").upper > 0
