"""`reclock dev up` on a state folder of its own (the stack the stack tests share, tests/stack/conftest.py):
every service healthy on loopback, the smoke checks pass, the health DAG succeeds under the real scheduler, a
second `up` is a no-op, `reclock dev env` gives the other commands the stack's settings, and `down` stops it
all (the shared stack's teardown, after the last test on it: every service down, every port closed)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from reclock.dev.procs import read_pid
from stack_support import wait_sink_caught_up

pytestmark = pytest.mark.stack


def _listening_pids_not_on_loopback(pids: set[int]) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    bad = []
    for line in out.splitlines():
        local = line.split()[3]
        if any(f"pid={p}," in line for p in pids) and not (local.startswith("127.0.0.1:")
                                                           or local.startswith("[::ffff:127.0.0.1]:")):
            bad.append(line)
    return bad


def _descendants(pids: set[int]) -> set[int]:
    found = set(pids)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    rest = f.read().split(") ", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(rest[2]) in pids:  # process group id
                found.add(int(entry))
    return found


def _ingest_under_scheduler(stack) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from reclock import remap
    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.remap_store import load_remap
    from reclock.read import read_updates
    from reclock.sources.kafka.upstream import KafkaUpstream

    admin = AdminClient({"bootstrap.servers": stack.kafka.bootstrap})
    admin.create_topics([NewTopic("it_orders", 3, 1)])["it_orders"].result(30)
    producer = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    stack.airflow.wait_for_dag("ingest__it_orders")
    stack.airflow.wait_for_dag("sink__it_out")
    stack.airflow.unpause("sink__it_out")  # scheduled on the it_orders Asset: runs when appends land
    for wave in range(2):
        for i in range(wave * 500, wave * 500 + 500):
            producer.produce("it_orders", value=b'{"id": %d}' % i, partition=i % 3)
        assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
        run_id = stack.airflow.trigger("ingest__it_orders", conf={"max_records": 200})
        assert stack.airflow.wait_run("ingest__it_orders", run_id, timeout=300)["state"] == "success"
    with connect(stack.postgres.dsn()) as conn:
        rows = read_updates(conn, LocalBlobStore(stack.state.root / "blobs"), "it_orders").to_pylist()
        rc = load_remap(conn, "it_orders")
    assert sorted(r["id"] for r in rows) == list(range(1000))
    assert all(max(r["ts"], rc.since) == remap.reclock(rc, r["_partition"], r["_offset"]) for r in rows)
    committed = KafkaUpstream("it_orders", stack.kafka.bootstrap, "it_orders").committed("reclock-it_orders")
    assert committed.as_dict() == {0: 334, 1: 333, 2: 333}  # lag 0

    # `airflow backfill create` over three past hours, up to 10 runs at once: ONE run (ReclockTimetable), one
    # catch-up cycle minted at the wall clock (never a binding in the past), so the backlog lands once
    for i in range(1000, 1300):
        producer.produce("it_orders", value=b'{"id": %d}' % i, partition=i % 3)
    assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
    started_ms = int(time.time() * 1000)
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    stack.airflow.airflow("backfill", "create", "--dag-id", "ingest__it_orders", "--max-active-runs", "10",
                          "--from-date", (now - timedelta(hours=4)).isoformat(),
                          "--to-date", (now - timedelta(hours=1)).isoformat())
    deadline = time.monotonic() + 300
    while True:
        runs = stack.airflow.api("GET", "dags/ingest__it_orders/dagRuns?run_type=backfill")["dag_runs"]
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            break
        assert time.monotonic() < deadline, runs
        time.sleep(2)
    assert [r["state"] for r in runs] == ["success"], runs  # one run, whatever the range and max_active_runs
    assert (runs[0]["data_interval_start"][:13], runs[0]["data_interval_end"][:13]) == (
        (now - timedelta(hours=4)).isoformat()[:13], (now - timedelta(hours=1)).isoformat()[:13])
    with connect(stack.postgres.dsn()) as conn:
        rows = read_updates(conn, LocalBlobStore(stack.state.root / "blobs"), "it_orders").to_pylist()
        after = load_remap(conn, "it_orders")
    assert sorted(r["id"] for r in rows) == list(range(1300))
    new = [b for b in after.bindings if b.ts > rc.upper - 1]
    assert new and all(b.ts >= started_ms for b in new), "a backfill never mints a binding in the past"

    # the sink DAG ran on the appends' asset events and caught up: every record once in the target topic
    from reclock.sinks.kafka import read_all

    wait_sink_caught_up(stack, "it_out", "it_orders")
    runs = stack.airflow.api("GET", "dags/sink__it_out/dagRuns")["dag_runs"]
    assert runs and {r["run_type"] for r in runs} == {"asset_triggered"}
    ids = sorted(json.loads(m.value())["after"]["id"] for m in read_all(stack.kafka.bootstrap, "it_orders_out", "t"))
    assert ids == list(range(1300))


def _event_driven(stack) -> None:
    """``schedule: upstream``: ingest__it_events runs (asset-triggered, through the triggerer's watcher) when
    the topic moves, and not while it stands still."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore
    from reclock.read import read_updates

    admin = AdminClient({"bootstrap.servers": stack.kafka.bootstrap})
    admin.create_topics([NewTopic("it_events", 2, 1)])["it_events"].result(30)
    stack.airflow.wait_for_dag("ingest__it_events")
    stack.airflow.unpause("ingest__it_events")

    def runs() -> list[dict]:
        return stack.airflow.api("GET", "dags/ingest__it_events/dagRuns?limit=100")["dag_runs"]

    def landed() -> int:
        with connect(stack.postgres.dsn()) as conn:
            ups = read_updates(conn, LocalBlobStore(stack.state.root / "blobs"), "it_events") \
                if conn.execute("SELECT 1 FROM reclock.shards WHERE id = 'it_events'").fetchone() else None
        return 0 if ups is None else ups.num_rows

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 240
        while landed() < n or any(r["state"] in ("queued", "running") for r in runs()):
            assert time.monotonic() < deadline, (landed(), runs())
            time.sleep(1)

    time.sleep(10)
    assert runs() == [], "an empty topic: no run"
    producer = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    for wave, (lo, hi) in enumerate(((0, 40), (40, 60))):
        for i in range(lo, hi):
            producer.produce("it_events", value=b'{"id": %d}' % i, partition=i % 2)
        assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
        wait_for(hi)
        assert landed() == hi
        before = runs()
        assert before and {r["run_type"] for r in before} == {"asset_triggered"}, before
        assert all(r["state"] == "success" for r in before), before
        tis = stack.airflow.api("GET", "dags/ingest__it_events/dagRuns/~/taskInstances?limit=100")["task_instances"]
        assert {t["task_id"] for t in tis} == {"cycle"} and len(tis) == len(before), tis  # a run: one task
        if hi == 60:
            time.sleep(15)  # upstream stands still: no run
            assert len(runs()) == len(before), runs()


def _event_driven_postgres(stack) -> None:
    """``schedule: upstream`` for a Postgres source: ingest__it_shop runs (through the triggerer's
    PublicationChanged watcher) for its first cycle and when a published table changes, and not for a change
    to a table outside the publication."""
    import psycopg

    from reclock.dev.demo import shop_upstream
    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore
    from reclock.read import read_as_of

    dsn = shop_upstream(stack, "it_shop_pub", ["it_orders"], prefix="it_")  # it_orders, it_items; it_orders published
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        conn.execute("INSERT INTO it_orders SELECT g, 'c', 'open', 1, now() FROM generate_series(1, 30) g")
    stack.airflow.wait_for_dag("ingest__it_shop")
    stack.airflow.unpause("ingest__it_shop")

    def runs() -> list[dict]:
        return stack.airflow.api("GET", "dags/ingest__it_shop/dagRuns?limit=100")["dag_runs"]

    def orders() -> set[int]:
        with connect(stack.postgres.dsn()) as conn:
            info = conn.execute("SELECT upper FROM reclock.shards WHERE id = 'it_shop__it_orders'").fetchone()
            if info is None or info[0] == 0:
                return set()
            return {r["order_id"] for r in read_as_of(conn, LocalBlobStore(stack.state.root / "blobs"),
                                                        "it_shop__it_orders", info[0] - 1).to_pylist()}

    def wait_for(ids: set[int]) -> None:
        deadline = time.monotonic() + 240
        while orders() != ids or any(r["state"] in ("queued", "running") for r in runs()):
            assert time.monotonic() < deadline, (sorted(orders()), runs())
            time.sleep(1)

    wait_for(set(range(1, 31)))  # the first cycle: the snapshot
    before = runs()
    assert before and {r["run_type"] for r in before} == {"asset_triggered"}, before
    assert all(r["state"] == "success" for r in before), before
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        conn.execute("INSERT INTO it_items SELECT g, 1, 'sku', 1 FROM generate_series(1, 500) g")
    time.sleep(10)  # only an unpublished table changed (and Airflow writes WAL beside it): no run
    assert len(runs()) == len(before), runs()
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        conn.execute("INSERT INTO it_orders SELECT g, 'c', 'open', 1, now() FROM generate_series(31, 40) g")
    wait_for(set(range(1, 41)))
    after = runs()
    assert len(after) > len(before) and all(r["state"] == "success" for r in after), after
    tis = stack.airflow.api("GET", "dags/ingest__it_shop/dagRuns/~/taskInstances?limit=100")["task_instances"]
    assert {t["task_id"] for t in tis} == {"cycle"}, tis


def _health_dag(stack) -> None:
    """The health DAG runs under the real scheduler, through the Airflow connections."""
    deadline = time.monotonic() + 90
    while "reclock__health" not in {d["dag_id"] for d in stack.airflow.api("GET", "dags").get("dags", [])}:
        assert time.monotonic() < deadline, "the dag-processor never parsed dags/"
        time.sleep(1)
    run_id = stack.airflow.trigger("reclock__health")
    assert stack.airflow.wait_run("reclock__health", run_id, timeout=240)["state"] == "success"


SESSION_SCRIPT = """
import sys
from reclock.spark.connect import shared_session

spark = shared_session(sys.argv[1], sys.argv[3])
if sys.argv[2] == "make":
    spark.sql("CREATE OR REPLACE TEMP VIEW shared_probe AS SELECT 7 AS x")
print("SEES", spark.catalog.tableExists("shared_probe"), spark.range(5).count(), flush=True)
print("V1", spark.conf.get("spark.sql.sources.useV1SourceList"), flush=True)
if sys.argv[2] == "stop":
    spark.stop()  # the server closes the session and refuses its id from now on
"""


def _shared_spark_sessions(stack) -> None:
    """A source's processes attach to one server-side Spark Connect session (a temp view one makes,
    another sees); once that session is closed, the next process goes on in a new one of its own."""
    from reclock.spark.connect import shared_session_id
    from reclock.spark.session import SESSION_CONF

    v1_sources: list[str] = []

    def run(action: str, scope: str) -> str:
        out = subprocess.run([sys.executable, "-c", SESSION_SCRIPT, stack.spark.url, action, scope],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr[-3000:]
        v1_sources.append(next(line for line in out.stdout.splitlines() if line.startswith("V1 ")))
        return next(line for line in out.stdout.splitlines() if line.startswith("SEES"))

    for _ in range(2):  # the shared id changes every WINDOW_S (on the half hour): a pair that straddles it, again
        scope = f"probe-{time.time_ns()}"
        window = shared_session_id(scope)
        made, stopped = run("make", scope), run("stop", scope)
        if shared_session_id(scope) == window:
            break
    assert (made, stopped) == ("SEES True 5", "SEES True 5")
    assert run("look", scope) == "SEES False 5"  # and every session gets SESSION_CONF: Kafka is read by V2
    assert set(v1_sources) == {f"V1 {SESSION_CONF['spark.sql.sources.useV1SourceList']}"}


def test_up_smoke_health_dag_down(shared_stack):
    shared_stack.require_up()
    up, env = shared_stack.up, shared_stack.env
    reclock = [sys.executable, "-m", "reclock.cli"]
    for name in ("postgres", "kafka", "spark", "airflow"):
        assert f"check {name}" in up.stdout and "ok:" in up.stdout, up.stdout
    assert "login: admin / " in up.stdout  # the admin login, printed once

    stack = shared_stack.stack
    pidfiles = [stack.kafka.pidfile, stack.spark.pidfile,
                *(stack.airflow.pidfile(c) for c in ("api-server", "scheduler", "dag-processor", "triggerer"))]
    pids = {read_pid(p) for p in pidfiles}
    assert None not in pids
    assert not _listening_pids_not_on_loopback(_descendants(pids))

    # the second up finds everything running and does not print the password again
    again = subprocess.run([*reclock, "dev", "up", "--no-smoke"], env=env, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "login: admin / " not in again.stdout
    assert {read_pid(p) for p in pidfiles} == pids  # nothing restarted

    # side by side, each on DAGs and sources of its own (most of their time is waiting: on a run, or through
    # a window in which no run may come): the health DAG; an ingest DAG under the real scheduler (two waves,
    # two triggered runs, everything lands once); the two event-driven sources; the shared Spark sessions
    with ThreadPoolExecutor(5) as pool:
        for done in [pool.submit(check, stack) for check in (_health_dag, _ingest_under_scheduler, _event_driven,
                                                             _event_driven_postgres, _shared_spark_sessions)]:
            done.result()
    for dag_id in ("ingest__it_events", "ingest__it_shop"):  # their watchers: not while later tests run
        stack.airflow.api("PATCH", f"dags/{dag_id}", {"is_paused": True})

    # `reclock dev env` hands the stack's settings to the other commands (what the demo tells a user)
    exports = subprocess.run([*reclock, "dev", "env"], env=env, capture_output=True, text=True, timeout=120)
    assert exports.returncode == 0, exports.stderr
    settings = dict(shlex.split(line)[1].split("=", 1) for line in exports.stdout.splitlines())
    assert {"RECLOCK_CONFIG", "RECLOCK_DSN", "RECLOCK_BLOB_URL", "RECLOCK_BOOTSTRAP"} <= set(settings)
    read = subprocess.run([*reclock, "read", "it_orders", "--limit", "0"], env={**env, **settings},
                          capture_output=True, text=True, timeout=120)
    assert read.returncode == 0 and "1300 in all" in read.stdout, read.stdout[-500:] + read.stderr[-2000:]
    print(f"first up {shared_stack.first_up_s:.1f}s")
