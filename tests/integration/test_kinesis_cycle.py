"""A Kinesis source's cycles against the local Kinesis endpoint: exactly once against an oracle that reads
every shard itself, with producers writing throughout, a split and a merge mid-stream; AS OF at every
binding; the progress relation; budgets cutting a backlog into bindings; finished shards dropped."""

from __future__ import annotations

from dataclasses import replace

from reclock import cycle
from reclock.dev.kinesis import BackgroundProducer
from reclock.persist import connect
from reclock.persist.status import latest_statistics
from reclock.sources.kinesis.sequence import shard_id

from kinesis_support import check_as_of_every_binding, check_exactly_once, kinesis_ctx


def test_cycles_land_every_record_once_across_a_split_and_a_merge(db, kinesis, stream, spark, tmp_path):
    name = stream(2)
    c = kinesis.client()
    ctx = replace(kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name), retain_history_ms=10 ** 12)
    producer = BackgroundProducer(c, name, batch=5, pause=0.2, keys=30)
    producer.put(300)  # a backlog: the first mint cuts it into bindings of the budget
    first = cycle.run_cycle(ctx)
    assert first["descriptions"] >= 2
    producer.start()
    try:
        cycle.run_cycle(ctx)
        c.split_shard(StreamName=name, ShardToSplit=shard_id(0), NewStartingHashKey=str(2 ** 126))
        kinesis.wait_active(name)
        cycle.run_cycle(ctx)
        cycle.run_cycle(ctx)
        c.merge_shards(StreamName=name, ShardToMerge=shard_id(2), AdjacentShardToMerge=shard_id(3))
        kinesis.wait_active(name)
        for _ in range(3):
            cycle.run_cycle(ctx)
    finally:
        acked = producer.stop()
    assert not producer.errors
    for _ in range(3):  # drain: parents to their ends, children after them
        cycle.run_cycle(ctx)
    seen = check_exactly_once(ctx, c, name)
    assert seen["bound"] == len(acked) == len(set(acked))
    assert check_as_of_every_binding(ctx, c, name) >= 5
    with connect(db) as conn:
        progress = conn.execute('SELECT shard_id, sequence_number FROM reclock."clicks_progress" '
                                "WHERE ts = (SELECT max(ts) FROM reclock.\"clicks_progress\") ORDER BY 1").fetchall()
    # the newest binding: shard 0 (split), 2 and 3 (merged) read to their ends or dropped; 1 and 4 open
    done = {sid for sid, seq in progress if seq is None}
    assert {shard_id(1), shard_id(4)} <= {sid for sid, seq in progress if seq is not None}
    assert done <= {shard_id(0), shard_id(2), shard_id(3)}


def test_compaction_drops_finished_shards_and_keeps_state_bounded(db, kinesis, stream, spark, tmp_path):
    """Reshard after reshard with compaction on: finished shards leave the frontier once their children
    are in it, counts are compacted, and every record is still there exactly once."""
    name = stream(1)
    c = kinesis.client()
    ctx = kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name)
    producer = BackgroundProducer(c, name, keys=40)
    sizes = []
    for i in range(4):
        producer.put(40)
        opened = sorted(s["ShardId"] for s in c.list_shards(StreamName=name)["Shards"]
                        if "EndingSequenceNumber" not in s["SequenceNumberRange"])
        if i % 2 == 0:
            c.split_shard(StreamName=name, ShardToSplit=opened[0], NewStartingHashKey=str(
                (int(next(s for s in c.list_shards(StreamName=name)["Shards"] if s["ShardId"] == opened[0])
                     ["HashKeyRange"]["StartingHashKey"]) + 2 ** 126)))
        else:
            c.merge_shards(StreamName=name, ShardToMerge=opened[0], AdjacentShardToMerge=opened[1])
        kinesis.wait_active(name)
        producer.put(40)
        for _ in range(3):
            cycle.run_cycle(ctx)
        with connect(db) as conn:
            sizes.append(conn.execute("SELECT (SELECT count(*) FROM reclock.remap_offsets WHERE source = 'clicks'), "
                                      "(SELECT count(*) FROM reclock.kinesis_segments WHERE source = 'clicks'), "
                                      "(SELECT count(*) FROM reclock.kinesis_marks WHERE source = 'clicks')")
                         .fetchone())
    seen = check_exactly_once(ctx, c, name)
    assert seen["bound"] == 320
    shards = len(c.list_shards(StreamName=name)["Shards"])
    offsets, segments, marks = sizes[-1]
    assert offsets < shards, f"finished shards stay in the frontier: {sizes} with {shards} shards"
    assert segments <= 2 * shards, f"counts are not compacted: {sizes}"
    assert 0 < marks <= 2 * shards, f"marks are not compacted: {sizes}"
    with connect(db) as conn:
        (dropped,) = conn.execute("SELECT dropped_records FROM reclock.kinesis_streams WHERE source = 'clicks'"
                                  ).fetchone()
        checked = [m.get("marks_checked") for m in
                   (s.metrics for s in latest_statistics(conn, "clicks", "mint", limit=50))]
    assert dropped > 0
    # the mints checked the record at the positions they read on from, across the reshardings, and found the
    # records they had read (a mint at a child's start or a finished parent has none to check)
    assert sum(c or 0 for c in checked) >= 4, checked


def test_the_write_reads_the_records_the_scan_captured(db, kinesis, stream, spark, tmp_path):
    """The mint's scan captures each counted segment; the write reads those instead of the stream (each
    record read from the stream once), a capture that is missing or holds another count is read from the
    stream instead, every record lands once, and the resume step deletes the captures it no longer needs."""
    from datetime import datetime, timezone

    from reclock.persist.status import latest_statistics
    from reclock.sources.kinesis import capture

    name = stream(2)
    c = kinesis.client()
    ctx = kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name)
    BackgroundProducer(c, name, keys=30).put(120)
    minted = cycle.mint(ctx)
    files = sorted(b.path for b in ctx.blob.list(capture.folder("clicks")))
    assert files and sum(capture.rows_of(ctx.blob, f) for f in files) == 120
    # damage two captures: one gone, one with another count (the stream is read for both)
    damaged = capture.rows_of(ctx.blob, files[0]) + capture.rows_of(ctx.blob, files[1])
    ctx.blob.delete(files[0])
    shard, span = files[1].rsplit("/", 2)[-2:]
    start = int(span.split("-")[0])
    short = [{"SequenceNumber": "1", "PartitionKey": "k", "Data": b"{}",
              "ApproximateArrivalTimestamp": datetime.now(timezone.utc)}]
    ctx.blob.put_bytes(files[1], capture.encode(int(shard), start, short))
    for desc in minted.descriptions:
        cycle.append(ctx, cycle.write_batches(ctx, desc))
    with connect(db) as conn:
        writes = [s.metrics for s in latest_statistics(conn, "clicks", "write_batches", limit=50)]
    assert sum(m["records_read"] for m in writes) == 120
    # the two damaged units came from the stream, the rest from their captures
    assert sum(m["records_from_captures"] for m in writes) == 120 - damaged
    seen = check_exactly_once(ctx, c, name)
    assert seen["bound"] == 120
    cycle.resume(ctx)
    assert [b.path for b in ctx.blob.list(capture.folder("clicks"))] == []
