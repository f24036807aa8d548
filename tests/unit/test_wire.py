"""The Confluent wire format (``reclock.wire``): the header's law, and what is not a record in it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.wire import HEADER, WireError, decode_header, encode, message_indexes_bytes

ids = st.integers(-(1 << 31), (1 << 31) - 1)


@given(ids, st.binary(max_size=64))
def test_avro_header_round_trip(schema_id: int, payload: bytes) -> None:
    value = encode(schema_id, payload)
    h = decode_header(value)
    assert (h.schema_id, h.message_indexes, h.payload_offset) == (schema_id, (), HEADER)
    assert value[h.payload_offset:] == payload


@given(ids, st.lists(st.integers(0, 1 << 40), min_size=1, max_size=8), st.binary(max_size=32))
def test_protobuf_header_round_trip(schema_id: int, indexes: list[int], payload: bytes) -> None:
    value = encode(schema_id, payload, indexes)
    h = decode_header(value, protobuf=True)
    assert h.schema_id == schema_id and h.message_indexes == tuple(indexes)
    assert value[h.payload_offset:] == payload


def test_first_message_is_one_zero_byte() -> None:
    """Confluent's serializers write the path [0] as the single byte 0, and [1] as count 1, index 1."""
    assert message_indexes_bytes([0]) == b"\x00"
    assert message_indexes_bytes([1]) == b"\x02\x02"
    assert encode(7, b"p", [0]) == b"\x00\x00\x00\x00\x07\x00p"


@pytest.mark.parametrize("value, words", [
    (b"", "too short"), (b"\x00\x00\x00", "too short"), (b"{\"a\": 1}", "magic byte"),
    (b"\x01\x00\x00\x00\x01xyz", "magic byte"),
])
def test_not_the_wire_format(value: bytes, words: str) -> None:
    with pytest.raises(WireError, match=words):
        decode_header(value)


def test_truncated_message_indexes() -> None:
    with pytest.raises(WireError, match="past the end"):
        decode_header(b"\x00\x00\x00\x00\x01\x04\x02", protobuf=True)  # count 2, one index
