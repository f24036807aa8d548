"""The Kinesis upstream client against a real Kinesis API endpoint (kinesalite on 127.0.0.1): lineage as
ListShards shows it after a split and a merge, scans that end at a closed shard's end, reads that survive
throttling (a real proxy enforcing AWS's 5 reads a second per shard) and expired iterators (the
endpoint's clock moved past an iterator's 5 minutes), and retention trimming records (its clock moved past
24 hours)."""

from __future__ import annotations

import pytest

from reclock.dev.kinesis_proxy import KinesisProxy
from reclock.errors import KinesisUnavailable
from reclock.sources.kinesis.client import KinesisUpstream, StreamAddress
from reclock.sources.kinesis.lineage import FINISHED, entry_position, readable
from reclock.sources.kinesis.sequence import shard_id


def put(client, stream: str, n: int, prefix: str = "r") -> list[str]:
    """Put ``n`` records (keys spread over the hash space); returns their data in put order."""
    data = [f"{prefix}{i}" for i in range(n)]
    for i in range(0, n, 500):
        resp = client.put_records(StreamName=stream, Records=[{"Data": d.encode(), "PartitionKey": d}
                                                              for d in data[i:i + 500]])
        assert resp["FailedRecordCount"] == 0
    return data


def oracle(client, stream: str) -> dict[int, list[tuple[int, bytes]]]:
    """Every shard read by itself from TRIM_HORIZON to its tip or end: shard -> [(seq, data)]."""
    out = {}
    for s in client.list_shards(StreamName=stream)["Shards"]:
        it = client.get_shard_iterator(StreamName=stream, ShardId=s["ShardId"],
                                       ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        got = []
        while it:
            r = client.get_records(ShardIterator=it)
            got += [(int(x["SequenceNumber"]), x["Data"]) for x in r["Records"]]
            it = r.get("NextShardIterator")
            if not r["Records"] and "EndingSequenceNumber" not in s["SequenceNumberRange"]:
                break
        out[int(s["ShardId"].split("-")[1])] = got
    return out


def read_all(up: KinesisUpstream) -> dict[int, list[tuple[int, bytes]]]:
    """What a source reads: readable shards to their tips or ends, then the children their ends made
    readable, until nothing is left (the test's writers are done)."""
    shards = up.shards()
    positions: dict[int, int] = {}
    out: dict[int, list] = {}
    while True:
        todo = [s for s in readable(shards, positions) if s.number not in out]
        if not todo:
            return out
        for s in todo:
            start = positions.get(s.number, 0) or entry_position(s, shards)
            out[s.number] = []
            for page in up.pages(s, start):
                out[s.number] += [(int(r["SequenceNumber"]), r["Data"]) for r in page.records]
                if page.ended:
                    positions[s.number] = FINISHED


def test_scans_and_reads_follow_splits_and_merges(kinesis, stream):
    name = stream(2)
    c = kinesis.client()
    up = KinesisUpstream("t", StreamAddress(name, kinesis.region, kinesis.endpoint_url))
    put(c, name, 300, "a")
    c.split_shard(StreamName=name, ShardToSplit=shard_id(0), NewStartingHashKey=str(2 ** 126))
    kinesis.wait_active(name)
    put(c, name, 300, "b")
    c.merge_shards(StreamName=name, ShardToMerge=shard_id(2), AdjacentShardToMerge=shard_id(3))
    kinesis.wait_active(name)
    put(c, name, 300, "c")

    shards = {s.number: s for s in up.shards()}
    assert shards[2].parents == (0,) and shards[3].parents == (0,) and shards[4].parents == (2, 3)
    assert shards[0].closed and shards[2].closed and shards[3].closed and not shards[4].closed
    assert all(len(str(s.start)) == 56 for s in shards.values())  # AWS's sequence numbers, beyond DECIMAL(38)

    # a closed shard's scan ends at FINISHED with every record counted; an open one at its tip
    truth = oracle(c, name)
    scan0 = up.scan(shards[0], 0, stride=50)
    assert scan0.ended and scan0.points[-1] == (FINISHED, len(truth[0]))
    assert [p for p, _ in scan0.points[:-1]] == [seq + 1 for i, (seq, _) in enumerate(truth[0])
                                                  if (i + 1) % 50 == 0 or i + 1 == len(truth[0])]
    scan4 = up.scan(shards[4], shards[4].start, stride=1000)
    assert not scan4.ended and scan4.points == ((truth[4][-1][0] + 1, len(truth[4])),)
    # a scan from a point in the middle (AFTER_SEQUENCE_NUMBER its last record) counts the rest
    mid = scan0.points[1][0]
    assert up.scan(shards[0], mid, stride=1000).points[-1] == (FINISHED, len(truth[0]) - 100)

    # reading parents before children yields exactly what the oracle holds, each record once
    got = read_all(up)
    assert {n: sorted(rs) for n, rs in got.items()} == {n: sorted(rs) for n, rs in truth.items() if rs}
    assert sum(len(rs) for rs in got.values()) == 900


def test_a_missing_stream_is_named(kinesis):
    up = KinesisUpstream("src", StreamAddress("no-such-stream", kinesis.region, kinesis.endpoint_url))
    with pytest.raises(KinesisUnavailable, match="source src: .*'no-such-stream'.*does not exist"):
        up.shards()


def test_reads_wait_out_throttling_and_lose_nothing(kinesis, stream, stack_state):
    name = stream(1)
    data = put(kinesis.client(), name, 1000)
    proxy = KinesisProxy(stack_state, kinesis.endpoint_url, reads_per_shard_s=4)
    proxy.start()
    try:
        up = KinesisUpstream("t", StreamAddress(name, kinesis.region, proxy.endpoint_url))
        (shard,) = up.shards()
        got = [r["Data"].decode() for page in up.pages(shard, 0, limit=100) for r in page.records]
        assert got == data
        assert up.throttled > 0 and proxy.stats()["throttled"] == up.throttled
    finally:
        proxy.stop()


def test_an_expired_iterator_is_renewed_after_the_last_record(kinesis_server):
    server = kinesis_server("kinesis-expiry")
    server.create_stream("x", 1)
    data = put(server.client(), "x", 500)
    up = KinesisUpstream("t", StreamAddress("x", server.region, server.endpoint_url))
    (shard,) = up.shards()
    got = []
    for page in up.pages(shard, 0, limit=100):
        got += [r["Data"].decode() for r in page.records]
        if len(got) == 200:
            server.advance_clock(301)  # past the iterator's 5 minutes
    assert got == data and up.expired == 1


def test_retention_trims_what_is_older_than_the_stream_keeps(kinesis_server):
    server = kinesis_server("kinesis-retention")
    server.create_stream("x", 1)
    put(server.client(), "x", 10, "old")
    up = KinesisUpstream("t", StreamAddress("x", server.region, server.endpoint_url))
    (shard,) = up.shards()
    first_old = up.first_retained(shard)
    server.advance_clock(25 * 3600)
    put(server.client(), "x", 10, "new")
    assert not up.still_holds(shard, first_old)
    first_new = up.first_retained(shard)
    assert first_new > first_old
    assert up.still_holds(shard, first_new)
    assert [r["Data"] for p in up.pages(shard, 0) for r in p.records] == [f"new{i}".encode() for i in range(10)]
