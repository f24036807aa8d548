"""The dev Kafka cluster's arithmetic: which ``__transaction_state`` partition (so which node) coordinates a
``transactional.id``, as Kafka computes it (``Utils.abs(id.hashCode()) % partitions``, Java's string hash)."""

from __future__ import annotations

import pytest

from reclock.dev.kafka import _read_uvarint, _uvarint, java_string_hash_partition


@pytest.mark.parametrize("key,of50,of4", [
    # computed by Java 17 (``Math.abs(s.hashCode()) % n``) on this machine
    ("reclock-sink-out", 34, 2),
    ("chaos-txn", 21, 1),
    ("héllo-ü", 13, 1),
])
def test_the_coordinator_partition_is_javas(key, of50, of4):
    assert (java_string_hash_partition(key, 50), java_string_hash_partition(key, 4)) == (of50, of4)


def test_integer_min_value_hashes_to_partition_zero():
    """Kafka's ``Utils.abs`` maps Integer.MIN_VALUE to 0 (``Math.abs`` would leave it negative): the string
    "polygenelubricants" hashes to exactly -2^31 in Java."""
    assert java_string_hash_partition("polygenelubricants", 50) == 0


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, 2**31])
def test_unsigned_varints_round_trip(n):
    encoded = _uvarint(n)
    assert _read_uvarint(encoded + b"\xff", 0) == (n, len(encoded))
