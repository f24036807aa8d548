"""Continuous mode (issue 19): ``run_cycles`` runs whole cycles back to back for a lease; a process killed
mid-lease (SIGKILL, anywhere in a cycle) and the next lease taking over leave every record exactly once at
its binding's timestamp, while producers write throughout. Resume runs at most every ``resume_s`` and when
the lease ends. A group (``run_group``) cycles several sources in one process, and one source that stalls
does not stop the others; its sources' one-slice writes share Spark jobs, and a joint job that fails sends
each to a job of its own."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Iterator

import pytest
import yaml
from ingest_support import check_invariants, make_ctx, produce, rec

from reclock import cycle, failpoints
from reclock.continuous import GroupFailed, JointWriter, Member, run_cycles, run_group
from reclock.dev.jars import spark_kafka_jars
from reclock.dev.state import REPO_ROOT
from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.persist.status import latest_status
from reclock.sources.kafka.upstream import KafkaUpstream

LEASE = """
import sys
from reclock.config import load_config
from reclock.continuous import run_cycles
from reclock.orchestration.contexts import cycle_context

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
    with _producing(kafka, name, batch=5, pause=0.25) as sent:
        first = _lease(env, 120)
        deadline = time.monotonic() + 240
        while True:  # some cycles in: then kill it, wherever it is
            if _count(db, "cont", "resume") >= 2:
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
    while cycle.run_cycle(ctx)["descriptions"]:  # the rest, in this process
        pass
    check_invariants(ctx, set(range(sent[0])))
    with connect(db) as conn:
        assert shard_info(conn, "cont").upper > 0


@contextlib.contextmanager
def _producing(kafka, topic: str, batch: int, pause: float, limit: int | None = None) -> Iterator[list[int]]:
    """A thread producing ``batch`` records (ids from 0, over two partitions) every ``pause`` seconds, up to
    ``limit`` records, while the block runs; yields ``[records sent so far]``."""
    stop, sent = threading.Event(), [0]

    def producer() -> None:
        while not stop.is_set() and (limit is None or sent[0] < limit):
            produce(kafka, topic, [rec(sent[0] + j, (sent[0] + j) % 2) for j in range(batch)])
            sent[0] += batch
            time.sleep(pause)

    t = threading.Thread(target=producer, daemon=True)
    t.start()
    try:
        yield sent
    finally:
        stop.set()
        t.join(30)


def _count(db: str, name: str, step: str) -> int:
    with connect(db) as conn:
        return conn.execute("SELECT count(*) FROM reclock.statistics WHERE name = %s AND step = %s",
                            (name, step)).fetchone()[0]


def test_resume_runs_at_most_every_resume_s_and_when_the_lease_ends(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="cont_rs", schedule="continuous")
    produce(kafka, name, [rec(i, i % 2) for i in range(120)])  # budget 50: several slices in the first cycle
    # a clock that moves one second each time the loop reads it (two to four reads a cycle): a 12 s lease
    # holds at least three cycles however slow they run (on the real clock, a cycle at load ~20 took the
    # whole 4 s lease: one cycle), and no resume falls due between the first and the last
    ticks = itertools.count()
    out = run_cycles(ctx, 12.0, idle_s=0.05, resume_s=3600, clock=lambda: float(next(ticks)))
    assert out["cycles"] >= 3 and out["resumes"] == 2, out  # the first cycle's, and the lease's end
    assert _count(db, "cont_rs", "mint") == out["cycles"] and _count(db, "cont_rs", "resume") == 2
    check_invariants(ctx, set(range(120)))  # includes: the consumer group's commit is the resumption frontier
    committed = KafkaUpstream("cont_rs", kafka.bootstrap, name).committed(ctx.spec.consumer_group)
    assert sum(committed.as_dict().values()) == 120, committed


def test_a_group_cycles_its_sources_in_one_process_and_a_stalled_one_does_not_stop_the_others(
        db, kafka, topic, spark, tmp_path):
    a, b = topic(partitions=2), topic(partitions=1)
    ctx_a = make_ctx(db, kafka, spark, tmp_path, a, name="grp_a", schedule="continuous", group="g1")
    ctx_b = make_ctx(db, kafka, spark, tmp_path, b, name="grp_b", schedule="continuous", group="g1",
                     on_decode_error="stall")
    produce(kafka, b, [rec(i, 0) for i in range(10)] + [(0, b"k", b"{not json")])
    with _producing(kafka, a, batch=20, pause=0.2, limit=400) as sent:  # a receives records while b is stalled
        with pytest.raises(GroupFailed) as failed:
            run_group("g1", [Member(ctx_a, idle_s=0.05, resume_s=0.5), Member(ctx_b, idle_s=0.05)], 8.0)
    assert set(failed.value.failed) == {"grp_b"} and "grp_b: DecodeError" in str(failed.value), failed.value
    assert "offset 10" in str(failed.value)  # the poison record, named
    assert _count(db, "grp_a", "append") >= 2 and _count(db, "grp_a", "resume") >= 2
    while cycle.run_cycle(ctx_a)["descriptions"]:  # what was produced after a's last cycle of the lease
        pass
    check_invariants(ctx_a, set(range(sent[0])))
    with connect(db) as conn:
        st = latest_status(conn, "grp_b")
        assert shard_info(conn, "grp_b").upper == 0  # nothing of b appended past (or with) its poison record
    assert st.status == "stalled" and "offset 10" in st.error, st


def _joint_sources(db: str, prefix: str) -> list[tuple[str, str | None]]:
    """The joint-job count of every write that wrote slices (an idle cycle's write, which only advances the
    upper, writes none)."""
    with connect(db) as conn:
        return conn.execute("SELECT name, metrics->>'joint_sources' FROM reclock.statistics WHERE step = "
                            "'write_batches' AND name LIKE %s AND (metrics->>'slices')::int > 0 ORDER BY id",
                            (prefix + "%",)).fetchall()


def test_a_groups_sources_share_one_spark_job_and_a_failed_joint_job_falls_back_to_one_job_each(
        db, kafka, topic, spark, tmp_path):
    topics = [topic(partitions=2) for _ in range(3)]
    ctxs = [make_ctx(db, kafka, spark, tmp_path, t, name=f"jnt_{i}", schedule="continuous", group="gj",
                     budget={"max_records": 10_000}) for i, t in enumerate(topics)]
    for t in topics:
        produce(kafka, t, [rec(i, i % 2) for i in range(30)])
    joint = JointWriter(gather_s=2.0)  # long enough for all three to hand in their slices
    run_group("gj", [Member(c, idle_s=0.05) for c in ctxs], 3.0, joint=joint)
    assert joint.jobs == 1
    assert sorted(_joint_sources(db, "jnt_")) == [(f"jnt_{i}", "3") for i in range(3)]
    for c in ctxs:
        check_invariants(c, set(range(30)))  # each source's own records, once, at its own bindings' ts

    for t in topics:
        produce(kafka, t, [rec(i, i % 2) for i in range(30, 60)])
    with failpoints.enabled("write_batches:joint_job"):
        run_group("gj", [Member(c, idle_s=0.05) for c in ctxs], 3.0, joint=JointWriter(gather_s=2.0))
    assert [n for _, n in _joint_sources(db, "jnt_")[3:]] == [None] * 3  # each wrote in a job of its own
    for c in ctxs:
        check_invariants(c, set(range(60)))
