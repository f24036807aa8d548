"""Laws of the Kinesis sequence-number representations: Python int, the padded sort key Spark compares,
and the decimal string Kinesis gives (Postgres ``numeric`` is checked in tests/integration/test_kinesis_store.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.sources.kinesis.sequence import (MAX_DIGITS, MAX_SEQUENCE, SORT_WIDTH, format_sequence,
                                              parse_sequence, shard_id, shard_number, sort_key)

# sequence numbers of every length up to the API's 129 digits, dense near the edges that matter: BIGINT's
# and DECIMAL(38)'s limits, 39 digits (the seed), 56 (what AWS issues) and the maximum
sequences = st.one_of(
    st.integers(min_value=0, max_value=MAX_SEQUENCE),
    st.integers(min_value=0, max_value=MAX_DIGITS - 1).map(lambda d: 10 ** d),
    st.integers(min_value=0, max_value=MAX_DIGITS).map(lambda d: 10 ** d - 1),
    st.sampled_from([2 ** 63 - 1, 2 ** 63, 10 ** 38 - 1, 10 ** 38, 10 ** 39 - 1, 49 * 10 ** 54, MAX_SEQUENCE]),
    st.integers(min_value=2 ** 63 - 5, max_value=2 ** 63 + 5),
)


@given(sequences)
def test_decimal_string_round_trip(n):
    assert parse_sequence(format_sequence(n)) == n


@given(sequences, sequences)
def test_sort_key_orders_as_the_numbers(a, b):
    assert (sort_key(a) < sort_key(b)) == (a < b)
    assert (sort_key(a) == sort_key(b)) == (a == b)
    assert len(sort_key(a)) == SORT_WIDTH


def test_a_position_one_past_the_largest_sequence_number_fits():
    assert sort_key(MAX_SEQUENCE + 1) > sort_key(MAX_SEQUENCE)


@pytest.mark.parametrize("text", ["", "-1", "+1", "01", "1.0", "1e5", " 1", "1" * (MAX_DIGITS + 1), "١٢"])
def test_not_sequence_numbers_are_refused(text):
    with pytest.raises(ValueError, match="not a Kinesis sequence number"):
        parse_sequence(text)


@pytest.mark.parametrize("n", [-1, MAX_SEQUENCE + 2])
def test_positions_out_of_range_are_refused(n):
    with pytest.raises(ValueError, match="position"):
        sort_key(n)


@given(st.integers(min_value=0, max_value=10 ** 12 - 1))
def test_shard_id_round_trip(n):
    assert shard_number(shard_id(n)) == n


@pytest.mark.parametrize("text", ["shardId-1", "shard-000000000001", "shardId-0000000000001", "shardId-00000000000a"])
def test_other_shard_ids_are_refused(text):
    with pytest.raises(ValueError, match="not a Kinesis shard id"):
        shard_number(text)
