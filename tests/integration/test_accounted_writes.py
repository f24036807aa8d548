"""Accounted writes: a cycle appends only what it proved Spark wrote (DESIGN.md, "accounted writes").

The case that lost data silently before: a Spark Connect server that does not see the blob folder the
cycle sees (a server on another host without a shared store; here, a mount namespace of its own with a
tmpfs over the folder). Spark wrote, the cycle found nothing, and ``append`` advanced the shard over zero
parts. Now the step fails naming what is missing, nothing is appended and no offset is committed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ingest_support import check_invariants, make_ctx, produce, rec

from reclock import cycle
from reclock.batch import SliceWritten
from reclock.config import parse_source
from reclock.errors import UnaccountedWrite
from reclock.part_layout import DATA_OUTPUT, ERRORS_OUTPUT, REJECTED_COLUMN
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.shards import batches, shard_info
from reclock.persist.staged import COMMIT_MARKER, collect_parts, slice_folder, split_joint
from reclock.persist.status import latest_status
from reclock.sources.kafka.upstream import KafkaUpstream


def _nothing_landed(ctx) -> None:
    """No shard moved, no part is referenced, the consumer group has no committed offset."""
    with connect(ctx.dsn) as conn:
        for s in ctx.spec.shards:
            assert shard_info(conn, s).upper == 0 and batches(conn, s) == []
        status = latest_status(conn, ctx.spec.name)
    assert status.status == "stalled"
    committed = KafkaUpstream(ctx.spec.name, ctx.upstream, ctx.spec.upstream.topic).committed(ctx.spec.consumer_group)
    assert not committed or all(o == 0 for o in committed.as_dict().values())


@pytest.fixture
def blind_spark(tmp_path):
    """The URL of a Spark Connect server in a mount namespace of its own, where ``tmp_path/blobs`` is a
    tmpfs: it writes parts the test process never sees there."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("this test needs root and util-linux's unshare (a mount namespace for the Spark server)")
    from reclock.dev.spark import LocalSparkConnect
    from reclock.dev.state import StackState

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "true"], capture_output=True)
    assert probe.returncode == 0, f"unshare --mount refused: {probe.stderr.decode()}"
    mount = f'mount -t tmpfs reclock-blind {blobs} && exec "$@"'
    server = LocalSparkConnect(StackState(tmp_path / "blind-stack"), master="local[2]", driver_memory="1g",
                               launcher=("unshare", "--mount", "--propagation", "private", "--",
                                         "sh", "-c", mount, "sh"))
    server.start()
    try:
        yield server.url, blobs
    finally:
        server.stop()


# one cycle in a process of its own (a process cannot drive a Spark Connect session beside the suite's
# classic one): prints the error's type and message, or "ok"
_CYCLE = """
import json, sys
from pyspark.sql import SparkSession
from reclock import cycle
from reclock.config import parse_source
from reclock.persist.blob import LocalBlobStore
raw, dsn, bootstrap, blobs, url = json.loads(sys.argv[1])
spark = SparkSession.builder.remote(url).getOrCreate()
ctx = cycle.CycleContext(spec=parse_source("orders", raw), dsn=dsn, upstream=bootstrap,
                         blob=LocalBlobStore(blobs), spark_factory=lambda: spark)
try:
    cycle.run_cycle(ctx)
    print(json.dumps(["ok", ""]))
except Exception as e:
    import traceback
    traceback.print_exc()
    print(json.dumps([type(e).__name__, str(e)]))
"""


def test_a_spark_server_that_sees_another_blob_folder_fails_the_cycle_and_commits_nothing(
        db, kafka, topic, spark, tmp_path, blind_spark):
    url, blobs = blind_spark
    name = topic(partitions=2)
    produce(kafka, name, [rec(i, i % 2) for i in range(100)])
    ctx = make_ctx(db, kafka, spark, tmp_path, name)
    raw = {"kafka": {"topic": name, "bootstrap": kafka.bootstrap},
           "format": {"type": "json", "schema": "id BIGINT, name STRING"},
           "include": ["partition", "offset", "key"], "budget": {"max_records": 50}}
    assert parse_source("orders", raw) == ctx.spec
    run = subprocess.run([sys.executable, "-c", _CYCLE, json.dumps([raw, db, kafka.bootstrap, str(blobs), url])],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert run.returncode == 0, run.stderr[-3000:]
    kind, msg = json.loads(run.stdout.strip().splitlines()[-1])
    assert kind == "UnaccountedWrite", run.stderr[-3000:]
    assert f"source {ctx.spec.name}" in msg and "slice 0" in msg and COMMIT_MARKER in msg
    assert "50 rows" in msg and str(blobs) in msg  # what Spark reported writing (a 50-record slice), and where
    assert "nothing was appended and no offset committed" in msg
    _nothing_landed(ctx)
    assert not any(p.suffix == ".parquet" for p in blobs.rglob("*"))  # the test process sees no part at all

    # the same source through a Spark that sees the folder: every record exactly once
    cycle.run_cycle(ctx)
    check_invariants(ctx, set(range(100)))


def _tampering(monkeypatch, what):
    """Let each slice's real Spark job run, then do ``what(folder)`` to its output before it is collected."""
    from reclock.sources.kafka import spark_job

    real = spark_job.write_slice

    def write_slice(*args, **kwargs):
        out = real(*args, **kwargs)
        what(Path(out.url))
        return out
    monkeypatch.setattr(spark_job, "write_slice", write_slice)


def _first_part(folder: Path) -> Path:
    return sorted(p for p in folder.rglob("*.parquet"))[0]


@pytest.mark.parametrize("tamper, expect", [
    ("part", "the cycle found"),
    ("marker", "commit marker _SUCCESS is not there"),
    ("foreign", "not a file of this job"),
])
def test_a_write_that_does_not_add_up_fails_and_the_next_cycle_lands_everything_once(
        db, kafka, topic, spark, tmp_path, monkeypatch, tamper, expect):
    name = topic(partitions=2)
    produce(kafka, name, [rec(i, i % 2) for i in range(60)])
    ctx = make_ctx(db, kafka, spark, tmp_path, name)

    def what(folder: Path) -> None:
        if tamper == "part":
            _first_part(folder).unlink()
        elif tamper == "marker":
            (folder / COMMIT_MARKER).unlink()
        else:
            pq.write_table(pa.table({"id": [1]}), folder / "part-99999-stray.parquet")
    _tampering(monkeypatch, what)
    with pytest.raises(UnaccountedWrite, match=expect):
        cycle.run_cycle(ctx)
    _nothing_landed(ctx)
    monkeypatch.undo()
    cycle.run_cycle(ctx)
    check_invariants(ctx, set(range(60)))


def test_a_rebuild_whose_parts_do_not_add_up_swaps_nothing(db, kafka, topic, spark, tmp_path, monkeypatch):
    name = topic(partitions=2)
    produce(kafka, name, [rec(i, i % 2) for i in range(80)])
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name), retain_history_ms=10**12)
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        before = batches(conn, ctx.spec.data_shard)
    _tampering(monkeypatch, lambda folder: _first_part(folder).unlink())
    with pytest.raises(UnaccountedWrite, match="the cycle found"):
        cycle.rebuild(ctx)
    with connect(db) as conn:
        assert batches(conn, ctx.spec.data_shard) == before
    check_invariants(ctx, set(range(80)))


# -- the collector alone, over files written here ---------------------------------------------------

SHARDS = {DATA_OUTPUT: "s", ERRORS_OUTPUT: "s_errors"}


def _slice(store: LocalBlobStore, rows: int, rejected: int = 0, marker: bool = True) -> str:
    folder = slice_folder("s/0-10/abc", 0)
    n = rows + rejected
    if n:
        packed = [None] * rows + ['{"partition": 0, "offset": %d, "reason": "bad"}' % i for i in range(rejected)]
        table = pa.table({"id": list(range(n)), "ts": [5] * n, "diff": [1] * n,
                          REJECTED_COLUMN: pa.array(packed, pa.string())})
        Path(store.url(folder)).mkdir(parents=True)
        pq.write_table(table, store.url(f"{folder}/part-00000.parquet"))
    if marker:
        store.put_bytes(f"{folder}/{COMMIT_MARKER}", b"")
    return folder


def _report(store, records: int, rows: dict[int, int], offsets: int = 100) -> SliceWritten:
    return SliceWritten(0, store.url(slice_folder("s/0-10/abc", 0)), offsets, records, rows)


def test_the_collector_takes_what_adds_up(tmp_path):
    store = LocalBlobStore(tmp_path)
    _slice(store, 7, rejected=2)
    parts, state = collect_parts(store, "s", SHARDS, "s/0-10/abc",
                                 [_report(store, 9, {DATA_OUTPUT: 7, ERRORS_OUTPUT: 2})], upsert=False)
    assert [p.rows for p in parts["s"]] == [7] and [p.rows for p in parts["s_errors"]] == [2] and state == ()


def test_an_empty_slice_needs_its_marker_too(tmp_path):
    store = LocalBlobStore(tmp_path)
    _slice(store, 0, marker=True)
    parts, _ = collect_parts(store, "s", SHARDS, "s/0-10/abc", [_report(store, 0, {0: 0, 1: 0})], upsert=False)
    assert parts == {"s": (), "s_errors": ()}
    with pytest.raises(UnaccountedWrite, match="commit marker _SUCCESS is not there"):
        collect_parts(LocalBlobStore(tmp_path / "other"), "s", SHARDS, "s/0-10/abc",
                      [_report(store, 0, {0: 0, 1: 0})], upsert=False)


@pytest.mark.parametrize("records, rows, offsets, expect", [
    (10, {0: 10, 1: 0}, 100, "found 7 rows"),  # Spark says 10, the files hold 7
    (8, {0: 7, 1: 0}, 100, "read 8 records but wrote 7 rows"),
    (7, {0: 7, 1: 0}, 5, "spanning 5 offsets"),
    (7, {0: 6, 1: 1}, 100, r"found 7 rows \(data 7, rejected 0\)"),
])
def test_the_collector_refuses_what_does_not_add_up(tmp_path, records, rows, offsets, expect):
    store = LocalBlobStore(tmp_path)
    _slice(store, 7)
    with pytest.raises(UnaccountedWrite, match=expect) as e:
        collect_parts(store, "s", SHARDS, "s/0-10/abc", [_report(store, records, rows, offsets)], upsert=False)
    assert "source s: slice 0" in str(e.value)


def test_a_joint_jobs_files_are_handed_out_only_after_its_commit_marker_and_each_slice_is_proved(tmp_path):
    store = LocalBlobStore(tmp_path)
    base = "s/0-10/abc/slice-0000-joint-1"
    for i, rows in enumerate((3, 0, 5)):  # the job wrote no file for slice 1 (it had no rows)
        if rows:
            table = pa.table({"id": list(range(rows)), "ts": [5] * rows, "diff": [1] * rows,
                              REJECTED_COLUMN: pa.array([None] * rows, pa.string())})
            Path(store.url(f"{base}/_reclock_member={i}")).mkdir(parents=True)
            pq.write_table(table, store.url(f"{base}/_reclock_member={i}/part-00000.parquet"))
            store.put_bytes(f"{base}/_reclock_member={i}/.part-00000.parquet.crc", b"x")
    folders = [slice_folder(f"{name}/0-10/w", 0) for name in ("a", "b", "c")]
    with pytest.raises(UnaccountedWrite, match="joint job's commit marker _SUCCESS is not there"):
        split_joint(store, "a", base, "_reclock_member", folders)
    assert not any(store.exists(f) for f in folders)  # nothing moved
    store.put_bytes(f"{base}/{COMMIT_MARKER}", b"")
    split_joint(store, "a", base, "_reclock_member", folders)
    for name, folder, rows in zip("abc", folders, (3, 0, 5)):
        assert store.exists(f"{folder}/{COMMIT_MARKER}") and not store.exists(f"{folder}/.part-00000.parquet.crc")
        written = SliceWritten(0, store.url(folder), 100, rows, {DATA_OUTPUT: rows, ERRORS_OUTPUT: 0})
        parts, _ = collect_parts(store, name, {DATA_OUTPUT: name, ERRORS_OUTPUT: f"{name}_errors"},
                                 f"{name}/0-10/w", [written], upsert=False)
        assert [p.rows for p in parts[name]] == ([rows] if rows else [])
