"""Laws of the marks a Kinesis source checks before it reads past a position (``reclock.sources.kinesis
.marks``): a shard that retention trimmed is never taken for a replaced stream, and a replaced stream that
holds a record the read after the position would skip is always ``replaced``, unless its record at the
position is the one read, byte for byte (the case no check can see)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.sources.kinesis.marks import Mark, digest, mark_of, verdict

keys = st.text(max_size=6)
datas = st.binary(max_size=6)
records = st.tuples(keys, datas, st.integers(0, 3))  # partition key, data, arrival (ms, few to collide)


@st.composite
def shards(draw, min_size: int = 0):
    """A shard: records at strictly increasing sequence numbers (sparse, as Kinesis's are)."""
    recs = draw(st.lists(records, min_size=min_size, max_size=8))
    gaps = draw(st.lists(st.integers(1, 3), min_size=len(recs), max_size=len(recs)))
    seq, out = 0, []
    for (key, data, arrival), gap in zip(recs, gaps):
        seq += gap
        out.append(Mark(seq, arrival, digest(key, data)))
    return out


def check(shard: list[Mark], expected: Mark) -> str:
    """What the kind does: the record at the expected sequence number, and the shard's first."""
    found = next((m for m in shard if m.sequence == expected.sequence), None)
    return verdict(expected, found, shard[0].sequence if shard and found is None else None)


@given(shards(min_size=1), st.data())
def test_retention_is_never_a_replaced_stream(shard, data):
    i = data.draw(st.integers(0, len(shard) - 1))  # the last record the source read
    trimmed = data.draw(st.integers(0, len(shard)))  # retention took the oldest `trimmed` records
    assert check(shard[trimmed:], shard[i]) == ("same" if trimmed <= i else "trimmed")


@given(shards(min_size=1), shards(), st.data())
def test_a_replaced_stream_is_seen_unless_the_record_is_the_same(old, new, data):
    expected = old[data.draw(st.integers(0, len(old) - 1))]
    got = check(new, expected)
    skipped = [m for m in new if m.sequence <= expected.sequence]  # what a read after the position skips
    if expected in new:
        assert got == "same"  # byte-identical at the position: undetectable (docs/kinesis.md)
    elif skipped:
        assert got == "replaced"
    else:
        assert got == "trimmed"  # nothing at or below it: the read after it skips nothing


@given(keys, datas, keys, datas)
def test_the_digest_tells_key_and_data_apart(k1, d1, k2, d2):
    assert (digest(k1, d1) == digest(k2, d2)) == ((k1, d1) == (k2, d2))


def test_a_record_split_otherwise_between_key_and_data_has_another_digest():
    assert digest("ab", b"c") != digest("a", b"bc")


def test_mark_of_a_boto3_record():
    arrival = datetime(2026, 11, 27, 1, 2, 3, 456000, tzinfo=timezone.utc)
    m = mark_of({"SequenceNumber": "49590338271490256608559692538361571095921575989136588898",
                 "ApproximateArrivalTimestamp": arrival, "PartitionKey": "k1", "Data": b"{}"})
    assert m == Mark(49590338271490256608559692538361571095921575989136588898, 1_795_741_323_456, digest("k1", b"{}"))
    assert "2026-11-27T01:02:03.456+00:00" in m.describe()


def test_a_found_record_must_be_at_the_expected_sequence_number():
    with pytest.raises(ValueError):
        verdict(Mark(5, 0, "a"), Mark(6, 0, "a"), None)
