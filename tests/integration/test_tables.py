"""Collections as tables (issue 18): Spark and DuckDB read exactly the parts a shard lists AS OF a time, equal
to ``read_as_of`` at every binding (append-only, upsert with retractions, identical rows compaction
consolidated), while cycles, compaction and garbage collection run; the read hold is a lease that protects
the listed parts and lapses when its reader dies."""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import replace

import duckdb
import pytest
from ingest_support import make_ctx, produce, rec

from reclock import cycle
from reclock.errors import BeyondUpper, SinceViolation, UnknownReadHold, UnknownShard
from reclock.persist import connect
from reclock.persist.compact import compact_parts
from reclock.persist.gc import collect_garbage
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import (acquire_read_hold, advance_since, batches, drop_lapsed_holds, read_holds,
                                    renew_read_hold, shard_info)
from reclock.read import read_as_of, read_updates
from reclock.tables import ReadLost, duckdb_as_of, read_table, spark_as_of, spark_updates


def expected_bag(conn, blob, shard: str, t: int) -> collections.Counter:
    """``read_as_of``'s contents as a bag of rows (each row ``diff`` times)."""
    table = read_as_of(conn, blob, shard, t)
    cols = [c for c in table.column_names if c != "diff"]
    bag = collections.Counter()
    for r in table.to_pylist():
        bag[tuple(r[c] for c in cols)] += r["diff"]
    return bag, cols


def spark_bag(df, cols) -> collections.Counter:
    assert sorted(df.columns) == sorted(cols), (df.columns, cols)
    return collections.Counter(tuple(r[c] for c in cols) for r in df.collect())


def duck_bag(rel, cols) -> collections.Counter:
    assert sorted(rel.columns) == sorted(cols), (rel.columns, cols)
    return collections.Counter(tuple(r[c] for c in cols) for r in
                               (dict(zip(rel.columns, row)) for row in rel.fetchall()))


def keyed(key: str, value: dict | None, part: int = 0):
    return part, key.encode(), None if value is None else json.dumps(value).encode()


def check_every_binding(conn, ctx, spark, shard: str) -> int:
    rc = load_remap(conn, ctx.spec.name)
    info = shard_info(conn, shard)
    times = sorted({b.ts for b in rc.bindings if info.since <= b.ts < info.upper} | {info.upper - 1})
    con = duckdb.connect()
    for t in times:
        want, cols = expected_bag(conn, ctx.blob, shard, t)
        assert spark_bag(spark_as_of(spark, shard, t, dsn=ctx.dsn, blob=ctx.blob), cols) == want, f"Spark AS OF {t}"
        assert duck_bag(duckdb_as_of(con, shard, t, dsn=ctx.dsn, blob=ctx.blob), cols) == want, f"DuckDB AS OF {t}"
    # each call left a leased hold (they lapse in 10 minutes): let them lapse now, so since can move
    conn.execute("UPDATE reclock.read_holds SET expires_at = now() WHERE holder LIKE 'reader:%%'")
    return len(times)


def test_spark_and_duckdb_equal_read_as_of_at_every_binding_before_and_after_compaction(db, kafka, topic, spark,
                                                                                         tmp_path):
    # append-only, with identical records (no partition/offset columns): rows of multiplicity above 1
    name = topic(partitions=2)
    app = replace(make_ctx(db, kafka, spark, tmp_path, name, name="plain", include=[], budget={"max_records": 9}),
                  retain_history_ms=10**12)
    for wave in range(4):
        produce(kafka, name, [(i % 2, None, json.dumps({"id": i % 5, "name": "same"}).encode()) for i in range(12)])
        cycle.run_cycle(app)
    # upsert: updates and deletes (retractions)
    uname = topic(partitions=2)
    ups = replace(make_ctx(db, kafka, spark, tmp_path, uname, name="keyed", envelope="upsert", include=["key"],
                           budget={"max_records": 7}), retain_history_ms=10**12)
    produce(kafka, uname, [keyed(f"k{i % 6}", {"id": i, "name": f"v{i}"}, i % 2) for i in range(20)])
    cycle.run_cycle(ups)
    produce(kafka, uname, [keyed("k1", None, 1), keyed("k2", None, 0), keyed("k2", {"id": 99, "name": "back"}, 0)])
    for _ in range(4):
        cycle.run_cycle(ups)
    with connect(db) as conn:
        assert check_every_binding(conn, app, spark, "plain") >= 4
        assert check_every_binding(conn, ups, spark, "keyed") >= 2
        # compaction: since to the middle binding, the small parts below it merged (diffs summed)
        for ctx, shard in ((app, "plain"), (ups, "keyed")):
            rc = load_remap(conn, ctx.spec.name)
            middle = sorted(b.ts for b in rc.bindings)[len(rc.bindings) // 2]
            advance_since(conn, shard, middle)
            before = len(batches(conn, shard))
            assert compact_parts(conn, ctx.blob, shard, min_parts=2).parts_merged >= 2
            assert len(batches(conn, shard)) < before
        bag, _ = expected_bag(conn, app.blob, "plain", shard_info(conn, "plain").upper - 1)
        assert max(bag.values()) > 1, "the test needs identical rows (a multiplicity above 1)"
        assert check_every_binding(conn, app, spark, "plain") >= 2
        assert check_every_binding(conn, ups, spark, "keyed") >= 1
        # the raw updates of a range, as read_updates gives them
        info = shard_info(conn, "keyed")
        lo, hi = info.since, info.upper
        want = collections.Counter(tuple(sorted(r.items())) for r in read_updates(conn, ups.blob, "keyed", lo, hi).to_pylist())
        got = spark_updates(spark, "keyed", lo, hi, dsn=db, blob=ups.blob)
        assert collections.Counter(tuple(sorted(r.asDict().items())) for r in got.collect()) == want


def test_reads_are_right_while_cycles_compact_and_collect_garbage(db, kafka, topic, spark, tmp_path):
    """A reader lists parts, then a rebuild replaces them and a cycle's garbage collection (grace 0) runs before
    the reader scans: the hold keeps the listed parts, and the read equals read_as_of at its time."""
    name = topic(partitions=2)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, name="busy", budget={"max_records": 10}),
                  retain_history_ms=0, gc_grace_s=0.0, gc_interval_s=0.0)
    produce(kafka, name, [rec(i, i % 2) for i in range(20)])
    cycle.run_cycle(ctx)
    stop, errors, cycles = threading.Event(), [], [0]

    def cycles_loop() -> None:
        i = 20
        try:
            while not stop.is_set():
                produce(kafka, name, [rec(j, j % 2) for j in range(i, i + 6)])
                i += 6
                cycle.rebuild(ctx)  # every part retired
                cycle.run_cycle(ctx)  # its resume compacts, and collects what nothing holds
                cycles[0] += 1
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=cycles_loop, daemon=True)
    t.start()
    con = duckdb.connect()
    reads = 0
    try:
        deadline = time.monotonic() + 240
        while reads < 4 and time.monotonic() < deadline and not errors:
            with read_table("busy", dsn=db, blob=ctx.blob) as r:
                listed = set(r.parts.paths)
                seen = cycles[0]
                while cycles[0] < seen + 2 and not errors and time.monotonic() < deadline:
                    time.sleep(0.2)  # a whole rebuild and cycle after the listing
                with connect(db) as conn:
                    live = {b.path for b in batches(conn, "busy")}
                    want, cols = expected_bag(conn, ctx.blob, "busy", r.as_of)
                    assert min(h.ts for h in read_holds(conn, "busy")) <= r.as_of
                    assert shard_info(conn, "busy").since <= r.as_of, "since passed a held time"
                retired = listed - live
                assert spark_bag(r.spark(spark), cols) == want, f"Spark AS OF {r.as_of}"
                assert duck_bag(r.duckdb(con), cols) == want, f"DuckDB AS OF {r.as_of}"
                assert all(ctx.blob.exists(p) for p in listed), "a listed part was deleted under its reader"
                reads += 1 if retired else 0
    finally:
        stop.set()
        t.join(300)
    assert not errors, errors
    assert reads >= 1, "no read had its parts retired under it: the test did not test the hold"
    with connect(db) as conn:
        assert not [h for h in read_holds(conn, "busy") if h.holder.startswith("reader:")], "holds left behind"
        gone = collect_garbage(conn, ctx.blob, "busy", 0.0)  # released: the retired parts go now
    assert gone.kept_read == 0


def test_a_reader_hold_is_a_lease(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=1)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, name="leased"), retain_history_ms=10**12)
    for w in range(3):
        produce(kafka, name, [rec(i, 0) for i in range(w * 5, w * 5 + 5)])
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        info = shard_info(conn, "leased")
        first = min(b.ts for b in load_remap(conn, "leased").bindings)
        # a lapsed lease pins nothing and cannot be renewed
        acquire_read_hold(conn, "leased", "reader:dead", first, lease_s=0.5)
        assert [h.holder for h in read_holds(conn, "leased")] == ["reader:dead"]
        time.sleep(1.0)
        assert read_holds(conn, "leased") == []
        with pytest.raises(UnknownReadHold):
            renew_read_hold(conn, "leased", "reader:dead", 60)
        assert advance_since(conn, "leased", info.upper - 1) == info.upper - 1
        assert drop_lapsed_holds(conn) == 1
        # errors a reader can act on
        with pytest.raises(SinceViolation):
            spark_as_of(spark, "leased", first, dsn=db, blob=ctx.blob)
        with pytest.raises(BeyondUpper):
            duckdb_as_of(duckdb.connect(), "leased", info.upper, dsn=db, blob=ctx.blob)
        with pytest.raises(UnknownShard):
            spark_as_of(spark, "nosuch", dsn=db, blob=ctx.blob)
    # a hold released by someone else while the block reads: the read fails loudly at the end
    with pytest.raises(ReadLost):
        with read_table("leased", dsn=db, blob=ctx.blob, lease_s=0.6) as r:
            with connect(db) as conn:
                conn.execute("DELETE FROM reclock.read_holds WHERE holder = %s", (r.holder,))
            time.sleep(0.6)
    with read_table("leased", dsn=db, blob=ctx.blob, lease_s=0.6) as r:
        time.sleep(1.5)  # renewed every 0.2 s: still in effect
        with connect(db) as conn:
            assert [h.holder for h in read_holds(conn, "leased")] == [r.holder]
            want, cols = expected_bag(conn, ctx.blob, "leased", r.as_of)
        assert spark_bag(r.spark(spark), cols) == want


def test_a_missing_part_fails_the_read_even_when_spark_ignores_missing_files(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=2)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, name="holed"), retain_history_ms=10**12)
    produce(kafka, name, [rec(i, i % 2) for i in range(20)])
    cycle.run_cycle(ctx)
    with pytest.raises(FileNotFoundError):  # gone before the listing: its footer cannot be read
        with connect(db) as conn:
            first = batches(conn, "holed")[0].path
        ctx.blob.put_bytes("keep.parquet", ctx.blob.get_bytes(first))
        ctx.blob.delete(first)
        spark_as_of(spark, "holed", dsn=db, blob=ctx.blob)
    ctx.blob.put_bytes(first, ctx.blob.get_bytes("keep.parquet"))
    spark.conf.set("spark.sql.files.ignoreMissingFiles", "true")
    try:
        with read_table("holed", dsn=db, blob=ctx.blob) as r:  # gone after the plan: the scan fails
            df = r.spark(spark)
            ctx.blob.delete(first)
            with pytest.raises(Exception, match="(?i)not exist|not found|no such file"):
                df.collect()
            with pytest.raises(Exception, match="(?i)no such file|no files found|does not exist"):
                r.duckdb(duckdb.connect()).fetchall()
    finally:
        spark.conf.set("spark.sql.files.ignoreMissingFiles", "false")
