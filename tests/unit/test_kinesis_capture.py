"""Captures of a mint's scan (reclock.sources.kinesis.capture): the scan hands each counted segment's records
to its hook, exactly the records the segment counts; a capture holds them as GetRecords returned them; a
unit whose capture is missing or holds another count is not taken from it; the resume step deletes the
captures below the frontier and nothing else."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.persist.blob import LocalBlobStore
from reclock.sources.kinesis import capture
from reclock.sources.kinesis.client import KinesisUpstream, Page, StreamAddress
from reclock.sources.kinesis.lineage import FINISHED, ShardInfo, scan_segments
from reclock.sources.kinesis.reader import Unit

AT = datetime(2026, 11, 26, 8, 0, 0, 123456, tzinfo=timezone.utc)


def rec(seq: int, data: bytes = b"x") -> dict:
    return {"SequenceNumber": str(seq), "PartitionKey": f"k{seq % 3}", "Data": data, "ApproximateArrivalTimestamp": AT}


class PagedUpstream(KinesisUpstream):
    """``pages`` from a list (no endpoint): what the scan's counting and hook see."""

    def __init__(self, pages: list[list[dict]], ended: bool) -> None:
        super().__init__("src", StreamAddress("s", "us-east-1", "http://127.0.0.1:1"))
        self._pages, self._ended = pages, ended

    def pages(self, shard, position, limit=10_000):
        for i, p in enumerate(self._pages):
            yield Page(p, 0, self._ended and i == len(self._pages) - 1)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 7), min_size=1, max_size=6), stride=st.integers(1, 5), ended=st.booleans())
def test_the_scan_hands_each_segment_exactly_its_records(sizes, stride, ended):
    seqs = iter(range(100, 10_000, 7))
    pages = [[rec(next(seqs)) for _ in range(n)] for n in sizes]
    got: list[tuple[int, int, int, list[dict]]] = []
    scan = PagedUpstream(pages, ended).scan(ShardInfo(3, (), 1, 99_999 if ended else None), 100, stride,
                                            on_segment=lambda *a: got.append(a))
    flat = [r for p in pages for r in p]
    segments = [s for s in scan_segments(scan) if s.records]
    assert [(g[0], g[1], g[2], len(g[3])) for g in got] == [(3, s.start, s.stop, s.records) for s in segments]
    assert [r for g in got for r in g[3]] == flat  # every record once, in order, in its segment
    for shard, start, stop, records in got:
        assert all(start <= int(r["SequenceNumber"]) < stop for r in records)
    assert bool(scan.points and scan.points[-1][0] == FINISHED) == ended


def test_a_capture_holds_the_records_bit_for_bit_and_only_a_full_one_is_taken(tmp_path):
    blob = LocalBlobStore(tmp_path)
    records = [rec(10, b"\x00\xff-0.0"), rec(12, b""), rec(15, b"{\"v\": NaN}")]
    writer = capture.CaptureWriter(blob, "src")
    writer(4, 10, 16, records)
    writer(4, 16, 20, [])  # a segment of no records: nothing to capture
    assert (writer.files, writer.records) == (1, 3)
    path = capture.Capture(4, 10, 16).path("src")
    table = pq.read_table(blob.url(path)).to_pylist()
    assert [(r["shard"], r["segment"], r["sequence_number"], r["partition_key"], r["data"], r["arrival"])
            for r in table] == [(4, "10", r["SequenceNumber"], r["PartitionKey"], r["Data"], AT) for r in records]
    units = [Unit(4, 10, 16, 3, 1000), Unit(4, 16, 30, 2, 1000), Unit(5, 1, 9, 1, 1001)]
    assert capture.captured(blob, "src", units) == {(4, 10, 16)}
    assert capture.captured(blob, "src", [Unit(4, 10, 16, 4, 1000)]) == set()  # another count: the stream
    blob.put_bytes(capture.Capture(5, 1, 9).path("src"), b"not parquet")
    assert capture.rows_of(blob, capture.Capture(5, 1, 9).path("src")) is None


def test_resume_deletes_the_captures_below_the_frontier_and_of_dropped_shards(tmp_path):
    blob = LocalBlobStore(tmp_path)
    w = capture.CaptureWriter(blob, "src")
    for shard, start, stop in [(0, 1, 10), (0, 10, 20), (1, 5, 8), (2, 3, 4)]:
        w(shard, start, stop, [rec(start)])
    blob.put_bytes(f"{capture.folder('src')}/0/.tmp-abc", b"")  # a write in progress: not a capture
    assert capture.drop_read(blob, "src", {0: 10, 1: 7}, dropped=[2]) == 2
    left = sorted(b.path.removeprefix(capture.folder("src") + "/") for b in blob.list(capture.folder("src")))
    assert left == ["0/.tmp-abc", "0/10-20.parquet", "1/5-8.parquet"]
    assert capture.drop_read(blob, "src", {0: FINISHED, 1: FINISHED}) == 2
