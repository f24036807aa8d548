"""The ingestion cycle against real Kafka, Postgres and Spark (no Airflow: the steps are plain functions).

The checks are the DESIGN invariants: every committed record lands exactly once, aborted ones never, each
at the timestamp of the binding that covers its offset; the consumer group's committed offsets equal the
offset resumption frontier; a replayed or crashed cycle changes nothing.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from ingest_support import check_invariants, make_ctx, produce, rec

from reclock import cycle, remap
from reclock.batch import BatchDescription
from reclock.config import parse_source
from reclock.errors import UpperMismatch
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import batches, shard_info
from reclock.persist.status import latest_status
from reclock.read import read_as_of, read_updates
from reclock.sources.kafka.upstream import UpstreamUnavailable


def test_waves_aborts_new_partition_bad_records(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=4)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name), retain_history_ms=10**12)  # keep history
    expected: set[int] = set()

    # wave 1: plain records with keys over 4 partitions, before the source exists: the first binding
    # covers all of it (the snapshot lands at one timestamp)
    produce(kafka, name, [rec(i, i % 4) for i in range(120)])
    expected |= set(range(120))
    out = cycle.run_cycle(ctx)
    assert out["descriptions"] == 1
    state = check_invariants(ctx, expected)
    assert len({r["ts"] for r in state["rows"]}) == 1

    # wave 2: a committed and an aborted transaction, a null value and a record that does not decode
    produce(kafka, name, [rec(i, i % 4) for i in range(200, 230)], transactional=f"tx-{name}")
    produce(kafka, name, [rec(i, i % 4) for i in range(300, 330)], transactional=f"tx-{name}", abort=True)
    produce(kafka, name, [(1, b"gone", None), (2, b"bad", b"{not json")])
    expected |= set(range(200, 230))
    cycle.run_cycle(ctx)
    state = check_invariants(ctx, expected)
    nulls = [r for r in state["rows"] if r["id"] is None]
    assert [(r["_partition"], r["_key"]) for r in nulls] == [(1, b"gone")]  # a null value is a row of nulls
    with connect(db) as conn:
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
    assert [(e["partition"], e["key"], e["raw"]) for e in errors] == [(2, b"bad", b"{not json")]
    assert "JSON" in errors[0]["reason"]

    # wave 3: a partition appears while the source runs
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    admin.create_partitions([NewPartitions(name, 5)])[name].result(30)
    produce(kafka, name, [rec(i, i % 5) for i in range(400, 480)])
    expected |= set(range(400, 480))
    cycle.run_cycle(ctx)
    state = check_invariants(ctx, expected)
    assert any(r["_partition"] == 4 for r in state["rows"])

    # an idle cycle mints nothing and writes nothing
    out = cycle.run_cycle(ctx)
    assert out["minted"] is None and out["descriptions"] == 0
    check_invariants(ctx, expected)

    # history is kept: AS OF the first binding is exactly wave 1, and every binding is still there
    rc = state["rc"]
    assert rc.since < rc.bindings[0].ts and len(rc.bindings) == 3
    with connect(db) as conn:
        snap = read_as_of(conn, ctx.blob, ctx.spec.name, rc.bindings[0].ts)
        assert sorted(snap.column("id").to_pylist()) == list(range(120))
        progress = conn.execute('SELECT ts, partition, "offset" FROM reclock.orders_progress').fetchall()
        assert sorted(progress) == sorted(remap.progress_rows(rc))


def test_replay_and_crash_between_steps(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=3)
    ctx = make_ctx(db, kafka, spark, tmp_path, name)
    produce(kafka, name, [rec(i, i % 3) for i in range(90)])

    # crash after mint (binding durable, nothing written), then after write (parts orphaned, not appended)
    minted = cycle.mint(ctx)
    produce(kafka, name, [rec(i, i % 3) for i in range(100, 160)])
    minted2 = cycle.mint(ctx)
    assert minted2.descriptions[0].lower == 0  # re-minted from the shard's upper, covering both bindings
    orphan = cycle.write_batches(ctx, minted2.descriptions[0])
    # the cycle that "restarts" finishes the job
    cycle.run_cycle(ctx)
    check_invariants(ctx, set(range(90)) | set(range(100, 160)))

    # replaying the orphaned write's append: its range is already in the shards -> a no-op
    before = read_updates(connect(db), ctx.blob, ctx.spec.name).num_rows
    cycle.append(ctx, orphan)
    with connect(db) as conn:
        assert read_updates(conn, ctx.blob, ctx.spec.name).num_rows == before

    # an append that only partly overlaps the shard is refused and changes nothing
    with connect(db) as conn:
        upper = shard_info(conn, ctx.spec.name).upper
    with pytest.raises(UpperMismatch):
        cycle.append(ctx, cycle.WrittenBatch(BatchDescription(upper - 1, upper + 5), {}))
    with connect(db) as conn:
        assert shard_info(conn, ctx.spec.name).upper == upper
    assert minted.binding is not None


def test_a_run_after_failed_tries_writes_what_its_time_allows_and_the_next_runs_the_rest(
        db, kafka, topic, spark, tmp_path):
    """``mint_and_write`` (the write task of a two-task run) starts no further description once ``run_s``
    has passed. Three tries that failed after their mint leave three bindings, each over the budget (three
    descriptions); a run with ``run_s=0`` writes the oldest only, its append makes exactly that visible, and
    the next runs bring the rest: every record once, at its binding's timestamp. Without ``run_s`` a run
    writes them all (issue 37: the retried run's work grew with every failed try)."""
    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="tries")
    expected: set[int] = set()
    for w in range(3):  # three tries, each killed after its mint
        produce(kafka, name, [rec(i, i % 2) for i in range(100 * w, 100 * w + 60)])
        expected |= set(range(100 * w, 100 * w + 60))
        assert cycle.mint(ctx).binding is not None
    with connect(db) as conn:
        bindings = load_remap(conn, "tries").bindings
    assert len(cycle.mint(ctx).descriptions) == 3

    for run in range(3):
        written = cycle.mint_and_write(ctx, run_s=0)
        (w,) = written  # the oldest pending one, alone; the newest reaches the remap upper (idle: the clock)
        assert w.desc.upper == bindings[run].ts + 1 if run < 2 else w.desc.upper >= bindings[run].ts + 1
        cycle.append(ctx, w)
        with connect(db) as conn:
            assert shard_info(conn, "tries").upper == w.desc.upper
    for w in cycle.mint_and_write(ctx, run_s=0):  # at most an idle description: it moves the upper, writes none
        assert not any(p.rows for ps in w.parts.values() for p in ps)
        cycle.append(ctx, w)
    cycle.resume(ctx)
    check_invariants(ctx, expected)

    produce(kafka, name, [rec(i, i % 2) for i in range(500, 560)])
    cycle.mint(ctx)
    produce(kafka, name, [rec(i, i % 2) for i in range(600, 660)])
    written = cycle.mint_and_write(ctx)  # no bound: both descriptions in one run
    assert len(written) == 2
    for w in written:
        cycle.append(ctx, w)
    cycle.resume(ctx)
    check_invariants(ctx, expected | set(range(500, 560)) | set(range(600, 660)))


def test_missing_topic_fails_with_source_and_cause_and_stalls(db, kafka, spark, tmp_path):
    ctx = make_ctx(db, kafka, spark, tmp_path, "no_such_topic", name="ghost")
    with pytest.raises(UpstreamUnavailable, match=r"source ghost: topic 'no_such_topic' does not exist"):
        cycle.mint(ctx)
    with connect(db) as conn:
        status, error = conn.execute(
            "SELECT status, error FROM reclock.status_history WHERE name = 'ghost' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        assert status == "stalled" and "no_such_topic" in error
        assert load_remap(conn, "ghost").bindings == ()  # nothing written


@pytest.mark.parametrize("fmt,good,bad,want", [
    ({"type": "csv", "schema": "id BIGINT, name STRING"}, [b"1,a", b"2,b"], b"x,y,z,w", [(1, "a"), (2, "b")]),
    ({"type": "text"}, [b"hello", b"world"], b"\xff\xfe", [("hello",), ("world",)]),
    # the raw bytes of a bad JSON value come from the parser's corrupt-record column: byte for byte the value
    ({"type": "json", "schema": "id BIGINT, name STRING"}, [b'{"id":1,"name":"a"}', b'{"id":2,"name":"b"}'],
     b'\xff\xfe{"id":\x00\xc3', [(1, "a"), (2, "b")]),
])
def test_other_formats_decode_and_route_errors(db, kafka, topic, spark, tmp_path, fmt, good, bad, want):
    name = topic(partitions=1)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name=f"f_{fmt['type']}")
    ctx = replace(ctx, spec=replace(ctx.spec, format=parse_source("x", {"kafka": {"topic": name},
                                                                          "format": fmt}).format))
    produce(kafka, name, [(0, None, v) for v in [*good, bad]])
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        rows = read_updates(conn, ctx.blob, ctx.spec.data_shard).to_pylist()
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
    cols = ["id", "name"] if fmt["type"] in ("csv", "json") else ["text"]
    assert sorted(tuple(r[c] for c in cols) for r in rows) == want
    assert [(e["offset"], e["raw"]) for e in errors] == [(len(good), bad)]


def test_the_read_goes_through_sparks_v2_kafka_reader(db, kafka, topic, spark, tmp_path):
    """``SESSION_CONF`` holds in the sessions Reclock makes: the batch read of Kafka is a V2 scan, not the
    V1 relation that converts every record to an external Row and back."""
    from reclock.batch import OffsetRange
    from reclock.sources.kafka.spark_job import reclock_and_decode
    from reclock.spark.reclocking import BindingRange

    name = topic(partitions=1)
    produce(kafka, name, [rec(0, 0)])
    ctx = make_ctx(db, kafka, spark, tmp_path, name)
    df = reclock_and_decode(spark, ctx.spec, kafka.bootstrap, [OffsetRange(0, 0, 1)], [BindingRange(0, 0, 1, 5)])
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan" in plan and "KafkaRelation" not in plan, plan
    assert [(r["id"], r["ts"]) for r in df.collect()] == [(0, 5)]


def test_stall_on_first_decode_error_appends_nothing(db, kafka, topic, spark, tmp_path):
    from reclock.errors import DecodeError

    name = topic(partitions=1)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="stally", on_decode_error="stall")
    produce(kafka, name, [rec(1, 0), (0, None, b"{broken"), rec(2, 0)])
    with pytest.raises(DecodeError, match=r"source stally: record at partition 0 offset 1: .*JSON"):
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        assert shard_info(conn, "stally").upper == 0  # nothing appended
        assert latest_status(conn, "stally").status == "stalled"


def test_upstream_data_lost_is_never_skipped(db, kafka, topic, spark, tmp_path):
    from confluent_kafka import TopicPartition

    from reclock.errors import UpstreamDataLost

    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="lossy")
    produce(kafka, name, [rec(i, i % 2) for i in range(40)])
    minted = cycle.mint(ctx)  # bound, not yet written: then retention deletes records the shard needs
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for fut in admin.delete_records([TopicPartition(name, 1, 5)]).values():
        fut.result(30)
    with pytest.raises(UpstreamDataLost, match=r"source lossy: partition 1 offsets \[0, 20\)") as e:
        cycle.write_batches(ctx, minted.descriptions[0])
    assert (e.value.partition, e.value.earliest) == (1, 5)


def test_two_cycles_at_once_never_duplicate(db, kafka, topic, spark, tmp_path):
    import threading

    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="racy")
    produce(kafka, name, [rec(i, i % 2) for i in range(100)])
    errors: list[Exception] = []

    def one() -> None:  # both threads share the context, as two tasks in one worker might
        try:
            cycle.run_cycle(ctx)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    # the loser of the append race may get UpperMismatch (the next cycle re-mints); nothing else
    assert all(isinstance(e, UpperMismatch) for e in errors), errors
    cycle.run_cycle(ctx)  # whatever the race left, one more cycle settles it
    check_invariants(ctx, set(range(100)))


@pytest.mark.parametrize("reclock_by", ["case", "join"])
def test_rebuild_gives_identical_updates_and_timestamps(db, kafka, topic, spark, tmp_path, monkeypatch, reclock_by):
    """The cycles reclock with a ``CASE`` expression over the bindings; the rebuild with the same, or with the
    broadcast range join (what a slice spanning more bindings than ``CASE_LIMIT`` uses): the same updates."""
    from reclock.spark import reclocking

    name = topic(partitions=3)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, name="rebuilt"), retain_history_ms=10**12)
    produce(kafka, name, [rec(i, i % 3) for i in range(60)] + [(0, None, b"nope")])
    cycle.run_cycle(ctx)
    produce(kafka, name, [rec(i, i % 3) for i in range(100, 190)])
    cycle.run_cycle(ctx)

    def updates(shard: str) -> list:
        with connect(db) as conn:
            return sorted(tuple(sorted(r.items())) for r in read_updates(conn, ctx.blob, shard).to_pylist())

    before = {s: updates(s) for s in ctx.spec.shards}
    with connect(db) as conn:
        old_paths = {b.path for s in ctx.spec.shards for b in batches(conn, s)}
    progress: list[tuple[int, int]] = []
    if reclock_by == "join":
        monkeypatch.setattr(reclocking, "CASE_LIMIT", 0)
    out = cycle.rebuild(ctx, on_slice=lambda done, total: progress.append((done, total)))
    assert out["upper"] > 0 and progress[-1][0] == progress[-1][1] >= 4  # 151 offsets, 50 per slice
    after = {s: updates(s) for s in ctx.spec.shards}
    assert after == before and len(after[ctx.spec.data_shard]) == 150
    with connect(db) as conn:
        new_paths = {b.path for s in ctx.spec.shards for b in batches(conn, s)}
    assert new_paths and not (new_paths & old_paths)  # new parts swapped in; the old ones are garbage


def test_compaction_keeps_batch_rows_bounded(db, kafka, topic, spark, tmp_path):
    """20 small cycles appending a part per partition each: resume's compaction keeps the shard's batch rows
    below ``min_parts`` plus the parts above since (40 without it), every record still there exactly once."""
    from reclock.persist.compact import DEFAULT_MIN_PARTS
    from reclock.persist.status import latest_statistics

    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="bounded",
                   include=["partition", "offset", "key", "timestamp"])  # a Spark timestamp column, merged too
    expected: set[int] = set()
    counts = []
    for i in range(20):
        produce(kafka, name, [rec(2 * i + p, p) for p in range(2)])
        expected |= {2 * i, 2 * i + 1}
        cycle.run_cycle(ctx)
        with connect(db) as conn:
            since = shard_info(conn, ctx.spec.name).since
            rows = batches(conn, ctx.spec.name)
        assert len(rows) < DEFAULT_MIN_PARTS + sum(1 for b in rows if b.upper > since + 1)
        counts.append(len(rows))
    state = check_invariants(ctx, expected)
    assert max(counts) < DEFAULT_MIN_PARTS
    assert len({r["ts"] for r in state["rows"]}) < 20  # merged parts' times were advanced, as far as since
    with connect(db) as conn:
        merged = [s.metrics["compacted"][ctx.spec.name] for s in latest_statistics(conn, "bounded", "resume", 20)]
        assert read_as_of(conn, ctx.blob, ctx.spec.name).num_rows == 40
    assert sum(merged) >= 2 * DEFAULT_MIN_PARTS  # 20 to 40 parts were appended; few are left


def test_a_source_named_like_an_error_collection_keeps_its_data_columns(db, kafka, topic, spark, tmp_path):
    """A shard's kind is what was registered for it, not its name: ``login_errors``'s data shard keeps
    its data columns in every reader, and its own error collection is ``login_errors_errors``."""
    from reclock.read import UpdateReader, updates_parts

    name = topic(partitions=2)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, name="login_errors", budget={"max_records": 5}),
                  retain_history_ms=0)
    produce(kafka, name, [rec(i, i % 2) for i in range(40)] + [(0, b"bad", b"{not json")])
    for _ in range(2):
        cycle.run_cycle(ctx)
    check_invariants(ctx, set(range(40)))
    with connect(db) as conn:
        assert (shard_info(conn, "login_errors").kind, shard_info(conn, "login_errors_errors").kind) == ("data", "errors")
        contents = read_as_of(conn, ctx.blob, "login_errors")
        assert {"id", "name", "_partition", "_offset", "_key", "diff"} <= set(contents.column_names)
        assert sorted(contents["id"].to_pylist()) == list(range(40))
        errors = read_as_of(conn, ctx.blob, "login_errors_errors")
        assert errors["raw"].to_pylist() == [b"{not json"] and "id" not in errors.column_names
        assert len(batches(conn, "login_errors")) == 1  # resume merged the small parts, by the shard's kind
        rows, upper = updates_parts(conn, "login_errors")
        reader = UpdateReader(ctx.blob, "login_errors", rows, 0, upper, shard_info(conn, "login_errors").kind)
        assert "id" in reader.schema.names and sorted(read_as_of(conn, ctx.blob, "login_errors")["id"].to_pylist()) \
            == list(range(40))


def _write_stats(db: str, name: str) -> dict:
    with connect(db) as conn:
        return conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'write_batches' "
                            "ORDER BY id DESC LIMIT 1", (name,)).fetchone()[0]


def test_a_retried_write_takes_the_slices_an_earlier_write_proved_and_writes_the_rest(db, kafka, topic, spark,
                                                                                      tmp_path, caplog):
    """A write that a fault ended after its first slice leaves that slice's parts and record; the next
    cycle's write of the same description takes them (proved again) instead of running the job again, writes
    the other slices, and the collection is exact: each record once, at its binding's timestamp. The slice
    taken is leased until the append, so garbage collection in between keeps it."""
    from reclock.failpoints import enabled
    from benchmarks.chaos import REUSE_LINE
    from reclock.persist.gc import collect_garbage, lease_key
    from reclock.persist.staged import RECORDS_FOLDER

    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, budget={"max_records": 10})
    produce(kafka, name, [rec(i, i % 2) for i in range(30)])
    with pytest.raises(Exception, match="fail point"):
        with enabled("write_batches:after_slice"):
            cycle.run_cycle(ctx)
    records = [b.path for b in ctx.blob.list(f"{ctx.spec.name}/{RECORDS_FOLDER}")]
    assert len(records) == 1, records
    first_write = json.loads(ctx.blob.get_bytes(records[0]))["folder"]
    taken = first_write + "/slice-0000"
    # the retry's write, then (before its append: in Airflow another task, maybe much later) garbage
    # collection with no grace at all: the slice it took is leased as its own folder is, and stays
    with caplog.at_level(logging.WARNING, logger="reclock"):
        (written,) = cycle.mint_and_write(ctx)
    # the campaign's report counts the slices retries took from this warning (benchmarks.chaos.slices_reused)
    reuse = [m.groups() for r in caplog.records if (m := REUSE_LINE.search(r.getMessage()))]
    assert reuse == [(ctx.spec.name, "1", "3")], caplog.text
    held = lease_key(taken, written.prefix)  # this write's own lease on the folder it took from
    assert written.taken == (taken,) and written.leased == (written.prefix, held)
    with connect(db) as conn:
        leased = {p for (p,) in conn.execute("SELECT prefix FROM reclock.write_leases")}
        assert {written.prefix, held} <= leased, leased
        report = collect_garbage(conn, ctx.blob, ctx.spec.name, 0.0)
    assert report.kept_leased and ctx.blob.list(taken), report
    cycle.append(ctx, written)
    with connect(db) as conn:
        leased = {p for (p,) in conn.execute("SELECT prefix FROM reclock.write_leases")}
    assert not {written.prefix, held} & leased, leased  # released with the append
    cycle.resume(ctx)
    stats = _write_stats(db, ctx.spec.name)
    assert (stats["slices"], stats["slices_reused"]) == (3, 1), stats
    check_invariants(ctx, set(range(30)))
    with connect(db) as conn:
        paths = [b.path for b in batches(conn, ctx.spec.name)]
    assert any(p.startswith(taken + "/") for p in paths), "the earlier slice's parts are not in"


def test_an_earlier_slice_is_written_again_when_its_parts_do_not_prove_or_its_source_changed(db, kafka, topic,
                                                                                             spark, tmp_path):
    """What an earlier write left is taken only when it proves whole and was written for the same rows: a
    part deleted from its folder, or a source whose configuration changed since (any field: the fingerprint
    does not guess which ones a decode reads), and the slice's job runs again; the collection is exact."""
    from reclock.failpoints import enabled
    from reclock.persist.staged import RECORDS_FOLDER

    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, budget={"max_records": 10})
    produce(kafka, name, [rec(i, i % 2) for i in range(20)])
    for _ in range(2):  # each write ends after its first slice (the second takes the first's, then ends too)
        with pytest.raises(Exception, match="fail point"):
            with enabled("write_batches:after_slice"):
                cycle.run_cycle(ctx)
    records = [b.path for b in ctx.blob.list(f"{ctx.spec.name}/{RECORDS_FOLDER}")]
    assert len(records) == 1, records  # the second write took slice 0 and recorded nothing new
    folder = json.loads(ctx.blob.get_bytes(records[0]))["folder"] + "/slice-0000"
    parquet = [b.path for b in ctx.blob.list(folder) if b.path.endswith(".parquet")]
    ctx.blob.delete(parquet[0])  # the earlier slice is no longer whole
    cycle.run_cycle(ctx)
    stats = _write_stats(db, ctx.spec.name)
    assert stats["slices"] == 2 and "slices_reused" not in stats, stats
    check_invariants(ctx, set(range(20)))

    produce(kafka, name, [rec(i, i % 2) for i in range(20, 40)])
    with pytest.raises(Exception, match="fail point"):
        with enabled("write_batches:after_slice"):
            cycle.run_cycle(ctx)
    changed = replace(ctx, spec=make_ctx(db, kafka, spark, tmp_path, name, budget={"max_records": 10},
                                         interval="5s").spec)
    assert changed.spec != ctx.spec
    cycle.run_cycle(changed)
    stats = _write_stats(db, ctx.spec.name)
    assert stats["slices"] == 2 and "slices_reused" not in stats, stats
    check_invariants(ctx, set(range(40)))


def test_resume_collects_garbage_and_keeps_what_a_running_write_leased(db, kafka, topic, spark, tmp_path):
    """GC runs in operations: resume deletes the parts nothing references once the grace period passed
    (a failed write's, those compaction replaced), never a live part nor one under a leased folder."""
    from reclock.failpoints import enabled
    from reclock.persist.gc import lease_write

    name = topic(partitions=2)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, budget={"max_records": 10}), retain_history_ms=0,
                  gc_grace_s=0.0, gc_interval_s=0.0, stats_keep_s=3600.0)
    produce(kafka, name, [rec(i, i % 2) for i in range(30)])
    with pytest.raises(Exception):  # a write that dies after its first slice leaves parts behind
        with enabled("write_batches:after_slice"):
            cycle.run_cycle(ctx)
    ctx.blob.put_bytes(f"{ctx.spec.name}/1-2/running/slice-0000/part-0.parquet", b"x")  # a write under way
    with connect(db) as conn:
        lease_write(conn, ctx.spec.name, f"{ctx.spec.name}/1-2/running")
        # two days of history before this cycle: the same pass prunes it, but not the newest of each kind
        conn.execute("INSERT INTO reclock.statistics (name, step, metrics, at) SELECT %s, 'mint', '{\"old\": 1}', "
                     "now() - interval '2 days' FROM generate_series(1, 50)", (ctx.spec.name,))
        conn.execute("INSERT INTO reclock.status_history (name, status, error, at) SELECT %s, 'stalled', 'old', "
                     "now() - interval '2 days' FROM generate_series(1, 50)", (ctx.spec.name,))
        conn.execute("INSERT INTO reclock.statistics (name, step, metrics, at) VALUES "
                     "('idle_sink', 'write', '{\"frontier\": 7}', now() - interval '2 days')")
    cycle.run_cycle(ctx)
    check_invariants(ctx, set(range(30)))
    with connect(db) as conn:
        old = conn.execute("SELECT count(*) FROM reclock.statistics WHERE metrics ? 'old'").fetchone()[0]
        old_status = conn.execute("SELECT count(*) FROM reclock.status_history WHERE name = %s AND at < now() "
                                  "- interval '1 day'", (ctx.spec.name,)).fetchone()[0]
        idle = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = 'idle_sink'").fetchall()
    assert (old, old_status) == (0, 0), "statistics or status rows past RECLOCK_STATS_RETAIN_S were kept"
    assert idle == [({"frontier": 7},)], "the newest row of a name and step goes only when a newer one exists"
    with connect(db) as conn:
        live = {b.path for s in ctx.spec.shards for b in batches(conn, s)}
        stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'resume' "
                             "ORDER BY id DESC LIMIT 1", (ctx.spec.name,)).fetchone()[0]
    files = {b.path for b in ctx.blob.list("") if b.path.endswith(".parquet")}
    assert files == live | {f"{ctx.spec.name}/1-2/running/slice-0000/part-0.parquet"}, "garbage left or live part gone"
    assert stats["gc_deleted"] > 0 and stats["history_pruned"] >= 100
