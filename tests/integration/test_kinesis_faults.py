"""A Kinesis source under the faults Kinesis throws, against the local endpoint: reads throttled
(ProvisionedThroughputExceededException from a real proxy enforcing AWS's 5 reads a second per shard) and
iterators expiring (injected by the proxy) while cycles run across a split: nothing lost or read twice.
Records past retention (the endpoint's clock moved past 24 hours) are KinesisDataLost naming the shard and
range; a stream deleted, or created again under the same name, stops the source with a clear error."""

from __future__ import annotations

import time

import pytest

from reclock import cycle
from reclock.dev.kinesis import BackgroundProducer
from reclock.dev.kinesis_proxy import KinesisProxy
from reclock.errors import KinesisDataLost, KinesisUnavailable, StreamReplaced
from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.read import read_as_of
from reclock.sources.kinesis.sequence import shard_id

from kinesis_support import check_exactly_once, kinesis_ctx


def test_throttled_reads_and_expired_iterators_lose_nothing(db, kinesis, stream, spark, tmp_path, stack_state):
    name = stream(2)
    c = kinesis.client()
    # 1 read a second per shard (AWS allows 5), and every 5th read throttled whatever the rate: a loaded machine
    # may read too slowly to pass the rate
    proxy = KinesisProxy(stack_state, kinesis.endpoint_url, reads_per_shard_s=1, expire_every=7, throttle_every=5)
    proxy.start()
    try:
        ctx = kinesis_ctx(db, proxy.endpoint_url, spark, tmp_path, name)
        producer = BackgroundProducer(c, name, batch=5, pause=0.2, keys=20)
        producer.put(200)
        producer.start()
        try:
            cycle.run_cycle(ctx)
            c.split_shard(StreamName=name, ShardToSplit=shard_id(1), NewStartingHashKey=str(3 * 2 ** 126))
            kinesis.wait_active(name)
            for _ in range(3):
                cycle.run_cycle(ctx)
        finally:
            acked = producer.stop()
        for _ in range(2):
            cycle.run_cycle(ctx)
        stats = proxy.stats()
        assert check_exactly_once(ctx, c, name)["bound"] == len(acked)
    finally:
        proxy.stop()
    assert stats["throttled"] > 0 and stats["expired"] > 0, stats
    with connect(db) as conn:
        steps = conn.execute("SELECT step, metrics FROM reclock.statistics WHERE name = 'clicks' "
                             "AND step IN ('mint', 'write_batches')").fetchall()
    mints = [m for step, m in steps if step == "mint"]
    writes = [m for step, m in steps if step == "write_batches" and "records_read" in m]
    # every read of the stream is the mints' (the writes read their captures): they met the faults
    assert sum(m["records_from_captures"] for m in writes) == sum(m["records_read"] for m in writes) > 0, writes
    # the mints' statistics count every throttled answer and renewed iterator the proxy gave (the counts run
    # on for the source's life in one process), the throttles botocore's own retry absorbed included
    assert max(m.get("iterators_renewed") or 0 for m in mints) == stats["expired"], (stats, mints)
    assert max(m.get("throttled") or 0 for m in mints) == stats["throttled"], (stats, mints)


def test_a_bound_range_past_retention_is_lost_not_skipped(db, kinesis_server, spark, tmp_path):
    server = kinesis_server("kinesis-retention-bound")
    server.create_stream("r", 1)
    ctx = kinesis_ctx(db, server.endpoint_url, spark, tmp_path, "r")
    BackgroundProducer(server.client(), "r").put(30)
    minted = cycle.mint(ctx)  # bound, not yet written: then the stream's retention passes
    server.advance_clock(25 * 3600)
    # the mint's captures would still give the write every bound record (reclock.sources.kinesis.capture); gone
    # (a source idle past their lease), the write must read the stream, which no longer holds them
    from reclock.sources.kinesis import capture

    held = ctx.blob.list(capture.folder("clicks"))
    assert sum(capture.rows_of(ctx.blob, b.path) for b in held) == 30
    for b in held:
        ctx.blob.delete(b.path)
    with pytest.raises(KinesisDataLost, match=r"source clicks: shard shardId-000000000000, sequence numbers "
                                              r"\[0, \d+\): 20 records were bound there but the stream now "
                                              r"returns 0") as e:
        cycle.write_batches(ctx, minted.descriptions[0])
    assert e.value.shard == shard_id(0)
    with connect(db) as conn:
        (status, error) = conn.execute("SELECT status, error FROM reclock.status_history WHERE name = 'clicks' "
                                       "ORDER BY id DESC LIMIT 1").fetchone()
    assert status == "stalled" and "KinesisDataLost" not in error and "20 records were bound" in error


def test_records_retention_trimmed_before_a_scan_saw_them_are_lost(db, kinesis_server, spark, tmp_path):
    server = kinesis_server("kinesis-retention-scan")
    server.create_stream("r", 1)
    ctx = kinesis_ctx(db, server.endpoint_url, spark, tmp_path, "r")
    producer = BackgroundProducer(server.client(), "r")
    producer.put(10)
    cycle.run_cycle(ctx)
    producer.put(10)  # never scanned: the source stops for longer than the stream keeps records
    server.advance_clock(25 * 3600)
    ctx.clock.t += 25 * 3600 * 1000
    producer.put(5)
    with pytest.raises(KinesisDataLost, match=r"shard shardId-000000000000, sequence numbers \[\d+, \d+\): the "
                                              r"source last scanned the stream at \d+ and the stream keeps "
                                              r"records 24 hours"):
        cycle.run_cycle(ctx)


def test_a_quiet_stream_longer_than_retention_loses_nothing(db, kinesis_server, spark, tmp_path):
    """The last record read is gone, but the source scanned within the retention period: nothing after it
    can have been trimmed unread, so no alarm."""
    server = kinesis_server("kinesis-quiet")
    server.create_stream("q", 1)
    ctx = kinesis_ctx(db, server.endpoint_url, spark, tmp_path, "q")
    producer = BackgroundProducer(server.client(), "q")
    producer.put(10)
    cycle.run_cycle(ctx)
    for _ in range(5):  # a day passes with a cycle every ~5 hours, nothing written
        server.advance_clock(5 * 3600)
        ctx.clock.t += 5 * 3600 * 1000
        cycle.run_cycle(ctx)
    producer.put(7)
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        got = read_as_of(conn, ctx.blob, "clicks").column("id").to_pylist()
    assert sorted(got) == list(range(17))  # the first 10 read a day ago (trimmed upstream since), the 7 new


def test_a_stream_deleted_or_created_again_is_never_read_from_zero(db, kinesis_server, spark, tmp_path):
    """Deleted: KinesisUnavailable. Created again within the second of its first creation (kinesalite
    creates and deletes in ~50 ms and gives creation times and sequence numbers in whole seconds: the new
    stream has the old one's creation time and first sequence numbers; here its clock is moved back so that
    this always happens): the record at the source's position is not the one it read, StreamReplaced, and
    nothing is appended. Created again an hour later: StreamReplaced by its creation time."""
    server = kinesis_server("kinesis-recreated")
    c = server.client()
    server.create_stream("gone", 1)
    created_ms = _created_ms(c, "gone")
    ctx = kinesis_ctx(db, server.endpoint_url, spark, tmp_path, "gone")
    BackgroundProducer(c, "gone").put(10)
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        upper = shard_info(conn, "clicks").upper
    c.delete_stream(StreamName="gone")
    server.wait_deleted("gone")
    with pytest.raises(KinesisUnavailable, match=r"source clicks: .*'gone'.*does not exist"):
        cycle.run_cycle(ctx)
    # kinesalite stamps a stream created at now - 2 s, in whole seconds: now 2.2 s after the first creation's
    # second began is within it
    server.advance_clock((created_ms + 2200) / 1000 - time.time())
    server.create_stream("gone", 1)
    assert _created_ms(c, "gone") == created_ms  # the case no creation time or first sequence number tells
    # other records with the same partition keys, in the same second as the first stream's
    BackgroundProducer(c, "gone", start=1000).put(10)
    with pytest.raises(StreamReplaced, match=r"source clicks: stream 'gone' was created at .*another stream of that "
                                             r"name, created within the same second.* deleted and created again "
                                             r"\(at position \d+ of shardId-000000000000, the last record the "
                                             r"source read there was sequence number \d+.*; the stream now holds"):
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        assert shard_info(conn, "clicks").upper == upper  # nothing appended
        assert sorted(read_as_of(conn, ctx.blob, "clicks").column("id").to_pylist()) == list(range(10))
    c.delete_stream(StreamName="gone")
    server.wait_deleted("gone")
    server.advance_clock(3600)
    server.create_stream("gone", 1)
    BackgroundProducer(c, "gone").put(10)
    with pytest.raises(StreamReplaced, match="source clicks: stream 'gone' was created at .* deleted and created "
                                             "again"):
        cycle.run_cycle(ctx)


def _created_ms(client, stream: str) -> int:
    summary = client.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    return int(round(summary["StreamCreationTimestamp"].timestamp() * 1000))
