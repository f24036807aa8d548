"""Reading bound Kinesis ranges in Spark tasks (several per shard) against the local endpoint: exactly the
records the counts promise, each at its unit's ts, and a range retention trimmed fails naming it."""

from __future__ import annotations

import pytest

from reclock.sources.kinesis.client import KinesisUpstream, StreamAddress
from reclock.sources.kinesis.lineage import FINISHED, scan_segments
from reclock.sources.kinesis.reader import RangeLost, parse_lost, plan_tasks, read_frame, read_task, units_for
from reclock.sources.kinesis.sequence import shard_id
from test_kinesis_upstream import oracle, put


def test_spark_reads_bound_ranges_in_several_tasks_per_shard(kinesis, stream, spark):
    name = stream(2)
    c = kinesis.client()
    put(c, name, 400, "a")
    c.split_shard(StreamName=name, ShardToSplit=shard_id(1), NewStartingHashKey=str(3 * 2 ** 126))
    kinesis.wait_active(name)
    put(c, name, 200, "b")
    up = KinesisUpstream("t", StreamAddress(name, kinesis.region, kinesis.endpoint_url))
    shards = {s.number: s for s in up.shards()}
    truth = oracle(c, name)
    # scans count every 25 records; two "bindings" per shard: up to the 3rd point at ts 7, the rest at ts 8
    segments, ranges = {}, {}
    for n, s in shards.items():
        start = s.start if s.parents else 0
        scan = up.scan(s, start, stride=25)
        segments[n] = scan_segments(scan)
        cut = scan.points[2][0] if len(scan.points) > 3 else scan.tip
        ranges[n] = [(start, cut, 7)] + ([(cut, scan.tip, 8)] if scan.tip > cut else [])
    units = units_for(ranges, segments)
    tasks = plan_tasks(units, shards, task_records=60)
    assert len([t for t in tasks if t.shard == 0]) >= 3  # one shard, several tasks
    rows = read_frame(spark, "t", up.address, tasks).collect()
    got = sorted((r.shard, int(r.sequence_number), bytes(r.data), r.ts) for r in rows)
    want = []
    for n, recs in truth.items():
        for seq, data in recs:
            ts = next(t for a, b, t in ranges[n] if a <= seq < b)
            want.append((n, seq, data, ts))
    assert got == sorted(want)
    assert len(got) == 600


def test_a_trimmed_range_is_lost_not_skipped(kinesis_server):
    server = kinesis_server("kinesis-trim")
    server.create_stream("x", 1)
    put(server.client(), "x", 50, "old")
    up = KinesisUpstream("t", StreamAddress("x", server.region, server.endpoint_url))
    (shard,) = up.shards()
    scan = up.scan(shard, 0, stride=10)
    tasks = plan_tasks(units_for({0: [(0, scan.tip, 5)]}, {0: scan_segments(scan)}), {0: shard}, 1000)
    assert sum(b.num_rows for b in read_task(up, tasks[0])) == 50
    server.advance_clock(25 * 3600)  # past the stream's 24 hours
    put(server.client(), "x", 5, "new")
    with pytest.raises(RangeLost) as e:
        list(read_task(up, tasks[0]))
    assert (e.value.shard, e.value.start, e.value.expected, e.value.found) == (0, 0, 10, 0)
    assert parse_lost(str(e.value)).stop == e.value.stop
