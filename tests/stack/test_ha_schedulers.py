"""Highly available schedulers: two Airflow schedulers on one metadata database
(``LocalAirflow(schedulers=2)``, with Reclock's ``HA_SETTINGS``) drive ``ingest__ha`` (a Postgres source, every
2 s) while one of them, in turn, is SIGKILLed mid-run with its executor's task processes (a crash of its
host) and started again a few seconds later, as a service manager would. Runs keep completing: after each
kill another run succeeds, and at the end the collection equals the table (nothing lost or doubled).
It runs with ``make test-deployment`` (three kills, each scheduler in turn); ``make test`` has the scheduler
kill in its short fault campaign instead (tests/chaos/test_chaos_short.py: one of two schedulers killed
mid-run, runs of ``ingest__afl`` succeeding after it, the data checked by the campaign's oracle)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from reclock.dev.airflow import LocalAirflow
from reclock.dev.state import StackState

pytestmark = pytest.mark.stack

REPO = Path(__file__).resolve().parents[2]
RECOVERY_BOUND_S = 300.0
"""Airflow's own recovery time with its defaults (a dead task's heartbeat timeout, the orphan check): after
a kill, a run must succeed within it."""


def contents_equal_table(dsn: str, up_dsn: str, blobs: Path, source: str, table: str) -> None:
    """One more cycle here (binding everything the writer committed), then the collection AS OF its last
    binding is the table: every row once, none missing."""
    from reclock import cycle
    from reclock.config import parse_source
    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.remap_store import load_remap
    from reclock.read import read_as_of

    spec = parse_source(source, {"postgres": {"dsn_env": "UNUSED", "publication": "ha_pub"}})
    ctx = cycle.CycleContext(spec=spec, dsn=dsn, blob=LocalBlobStore(blobs), upstream=up_dsn)
    cycle.run_cycle(ctx)
    with connect(dsn) as conn:
        last = load_remap(conn, source).bindings[-1].ts
        rows = read_as_of(conn, ctx.blob, f"{source}__{table}", last).to_pylist()
    with psycopg.connect(up_dsn) as conn:
        want = sorted(conn.execute(f"SELECT id, v FROM {table}").fetchall())
    assert all(r["diff"] == 1 for r in rows)
    assert sorted((r["id"], r["v"]) for r in rows) == want


def _successes(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM dag_run WHERE dag_id = 'ingest__ha' AND state = 'success'"
                            ).fetchone()[0]


def _running_task(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM task_instance WHERE dag_id = 'ingest__ha' AND state = 'running'"
                            ).fetchone()[0] > 0


@pytest.mark.deployment
@pytest.mark.parametrize("kills", [3])
def test_runs_keep_completing_while_one_of_two_schedulers_is_killed_mid_run(postgres, db, stack_state, tmp_path,
                                                                           kills):
    up_db = f"ha_up_{os.getpid()}_{kills}"
    af_db = f"ha_airflow_{os.getpid()}_{kills}"
    for name in (up_db, af_db):
        postgres.create_database(name)
    up_dsn = postgres.dsn(up_db)
    with psycopg.connect(up_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int8 PRIMARY KEY, v text)")
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION ha_pub FOR TABLE t")
    config = tmp_path / "reclock.yaml"
    config.write_text(yaml.safe_dump({"sources": {"ha": {"postgres": {"dsn_env": "HA_UP_DSN", "publication": "ha_pub"},
                                                           "interval": "2s"}}}))
    env = {"RECLOCK_CONFIG": str(config), "RECLOCK_DSN": db, "RECLOCK_BLOB_URL": str(tmp_path / "blobs"),
           "HA_UP_DSN": up_dsn, "PYTHONPATH": str(REPO / "include"),
           "AIRFLOW__CORE__DEFAULT_TASK_RETRIES": "10", "AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": "2"}
    af = LocalAirflow(StackState(Path(stack_state.root) / f"ha-airflow-{kills}"), postgres.dsn(af_db), env, schedulers=2)
    stop = threading.Event()

    def write() -> None:  # a transaction every 100 ms until the end
        i = 0
        with psycopg.connect(up_dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
            while not stop.is_set():
                conn.execute("INSERT INTO t VALUES (%s, 'v')", (i,))
                if i % 5 == 4:
                    conn.execute("UPDATE t SET v = 'u' WHERE id = %s", (i - 3,))
                i += 1
                time.sleep(0.1)

    writer = threading.Thread(target=write, daemon=True)
    try:
        af.start(timeout=600)
        assert af.components.count("scheduler-2") == 1
        af.wait_for_dag("ingest__ha", timeout=300)
        writer.start()
        af.unpause("ingest__ha")
        meta = postgres.dsn(af_db)
        deadline = time.monotonic() + RECOVERY_BOUND_S
        while _successes(meta) < 1:
            assert time.monotonic() < deadline, "no run succeeded before the kills"
            time.sleep(1)
        gaps = []
        for k in range(kills):
            victim = ("scheduler", "scheduler-2")[k % 2]
            deadline = time.monotonic() + 120
            while not _running_task(meta):  # mid-run: a task of ingest__ha is running
                assert time.monotonic() < deadline, "no task ran"
                time.sleep(0.2)
            before, killed_at = _successes(meta), time.monotonic()
            assert af.kill(victim), f"{victim} was not running"
            time.sleep(3)
            af.start_component(victim)  # the service manager's restart
            while _successes(meta) < before + 2:  # a run begun after the kill, completed
                assert time.monotonic() - killed_at < RECOVERY_BOUND_S, \
                    f"kill {k + 1} ({victim}): no run completed within {RECOVERY_BOUND_S} s"
                time.sleep(1)
            gaps.append(round(time.monotonic() - killed_at))
        print(f"runs completed again {gaps} s after each kill")
    finally:
        stop.set()
        try:
            af.api("PATCH", "dags/ingest__ha", {"is_paused": True})
        except Exception:  # noqa: BLE001 - stop it anyway
            pass
        af.stop()
    contents_equal_table(db, up_dsn, tmp_path / "blobs", "ha", "t")
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s", (up_db,)):
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        for name in (up_db, af_db):
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
