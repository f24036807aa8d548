"""A Kinesis source's own Postgres state: sequence numbers as numeric order exactly (a hypothesis law over
Python int, Postgres numeric and the padded strings Spark compares), the stream's identity, and segments
compacted to one per shard below the frontier."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reclock.errors import StreamReplaced
from reclock.persist.remap_store import register_source
from reclock.sources.kinesis.lineage import FINISHED, Segment
from reclock.sources.kinesis.reader import segment_path
from reclock.sources.kinesis.sequence import MAX_SEQUENCE, sort_key
from reclock.sources.kinesis.store import (add_segments, bind_stream, compact_segments, load_segments, record_scan,
                                           stream_record)

positions = st.one_of(st.integers(0, FINISHED), st.integers(10 ** 55, 10 ** 56), st.sampled_from(
    [0, 2 ** 63 - 1, 2 ** 63, 10 ** 38, 10 ** 39, MAX_SEQUENCE, FINISHED]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(positions, min_size=1, max_size=30, unique=True))
def test_postgres_numeric_orders_sequence_numbers_as_python_and_spark_do(conn, values):
    got = [int(v) for (v,) in conn.execute(
        "SELECT v FROM unnest(%s::numeric[]) AS t(v) ORDER BY v", ([str(v) for v in values],)).fetchall()]
    assert got == sorted(values)  # exact: no digit lost at any length
    assert sorted(values, key=sort_key) == sorted(values)


def test_a_stream_created_again_is_refused(conn):
    register_source(conn, "k", kind="kafka")
    rec = bind_stream(conn, "k", "orders", "arn:aws:kinesis:us-east-1:1:stream/orders", 1000)
    assert (rec.created_ms, rec.scanned_ms) == (1000, None)
    record_scan(conn, "k", 5000)
    record_scan(conn, "k", 4000)  # never back
    assert stream_record(conn, "k").scanned_ms == 5000
    assert bind_stream(conn, "k", "orders", "arn:aws:kinesis:us-east-1:1:stream/orders", 1000).created_ms == 1000
    with pytest.raises(StreamReplaced, match="source k: stream 'orders' was created at .* deleted and created again"):
        bind_stream(conn, "k", "orders", "arn:aws:kinesis:us-east-1:1:stream/orders", 9000)


def test_segments_compact_to_one_per_shard_below_the_frontier(conn):
    register_source(conn, "k", kind="kafka")
    bind_stream(conn, "k", "orders", "arn:x", 1000)
    big = 10 ** 55
    winning = [Segment(1, 0, big + 10, 3), Segment(1, big + 10, big + 20, 3), Segment(1, big + 20, big + 30, 2)]
    losing = [Segment(1, big + 10, big + 25, 4)]  # a racing scan with another tip
    later = [Segment(1, big + 30, big + 40, 5)]
    add_segments(conn, "k", winning + losing + later + [Segment(2, 0, FINISHED, 7)])
    add_segments(conn, "k", winning)  # a replay adds nothing
    segs = load_segments(conn, "k", [1])[1]
    assert sum(s.records for s in segment_path(segs, 0, big + 40)) == 13
    with conn.transaction():
        compact_segments(conn, "k", {1: big + 30}, dropped=[2])
    assert load_segments(conn, "k", [1, 2]) == {1: [Segment(1, 0, big + 30, 8), Segment(1, big + 30, big + 40, 5)]}
    assert stream_record(conn, "k").dropped_records == 7  # the dropped shard's records, for a rebuild
