"""Kinesis sequence numbers and shard ids: the exact representations of a Kinesis source's FromTime.

A sequence number is a decimal string: by the API's pattern ``0|([1-9]\\d{0,128})``, up to 129 digits (AWS
issues 56-digit ones today; the reclocking seed speaks of 39). That is beyond BIGINT (19 digits) and beyond
any ``DECIMAL(38)``, Spark's widest decimal. Sequence numbers increase within a shard and are far apart
(the next record's number is not this one's plus one). Reclock holds one exactly in each place it goes:

=====================  ==========================================  ==========================================
where                  representation                              why it orders exactly
=====================  ==========================================  ==========================================
Python (the pure core)  ``int`` (:func:`parse_sequence`)           unbounded integers
Postgres (remap store,  ``numeric`` (no precision: up to 131,072    exact decimal arithmetic and comparison
progress relation)      digits before the point)
Spark (reclocking in    ``STRING`` of :data:`SORT_WIDTH` digits,    equal-length digit strings compare byte
write_batches)          zero-padded (:func:`sort_key`)              by byte as the numbers they spell
Parquet / a collection  ``STRING``, the decimal as Kinesis gives it what users and the KCL compare against
=====================  ==========================================  ==========================================

A *position* in a shard (the value a frontier keeps for it) is an upper, as a Kafka offset is: every record
whose sequence number is below it is before the frontier. ``0`` is the start of a shard (read from
``TRIM_HORIZON``), ``last + 1`` the position after a record read, and a closed shard read to its end is at
its ``EndingSequenceNumber + 1`` (``reclock.sources.kinesis.lineage``).

A shard id is ``shardId-`` and 12 digits (what Kinesis issues); the remap store keeps the number (the
seed's ``shard: i64``), :func:`shard_id` gives the id back.

Pure: nothing here does I/O.
"""

from __future__ import annotations

import re

MAX_DIGITS = 129
"""The most digits a sequence number has, by the API's pattern ``0|([1-9]\\d{0,128})``."""
MAX_SEQUENCE = 10 ** MAX_DIGITS - 1
SORT_WIDTH = MAX_DIGITS + 1
"""Digits of :func:`sort_key`: one more than a sequence number has, so a position (up to
``MAX_SEQUENCE + 1``) fits too."""

_SEQUENCE = re.compile(r"0|[1-9][0-9]{0,128}")
_SHARD = re.compile(r"shardId-([0-9]{12})")


def parse_sequence(text: str) -> int:
    """The sequence number ``text`` (a decimal string as Kinesis gives it) as an int; ``ValueError``
    naming it if it is not one (a sign, leading zeros, a fraction, more than 129 digits)."""
    if not isinstance(text, str) or not _SEQUENCE.fullmatch(text):
        raise ValueError(f"not a Kinesis sequence number: {text!r} (a decimal string of at most "
                         f"{MAX_DIGITS} digits without leading zeros)")
    return int(text)


def format_sequence(n: int) -> str:
    """The decimal string Kinesis would give for ``n``. Law: ``parse_sequence(format_sequence(n)) == n``."""
    check_position(n)
    return str(n)


def check_position(n: int) -> int:
    """Return ``n`` if it is a valid position (``0 <= n <= MAX_SEQUENCE + 1``), else raise naming it."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"a Kinesis position must be an int, got {type(n).__name__}: {n!r}")
    if not 0 <= n <= MAX_SEQUENCE + 1:
        raise ValueError(f"a Kinesis position must be in [0, 10**{MAX_DIGITS}], got {n}")
    return n


def sort_key(n: int) -> str:
    """``n`` as :data:`SORT_WIDTH` digits, zero-padded: the form Spark compares positions in.

    Law: for positions ``a`` and ``b``, ``sort_key(a) < sort_key(b)`` iff ``a < b`` (and equal iff equal).
    """
    return str(check_position(n)).zfill(SORT_WIDTH)


def sort_key_sql(column: str) -> str:
    """The Spark SQL expression turning a column of decimal sequence-number strings into :func:`sort_key`
    form (``lpad``: the strings are digits only, at most :data:`MAX_DIGITS` long, so nothing is cut)."""
    return f"lpad({column}, {SORT_WIDTH}, '0')"


def shard_number(shard_id: str) -> int:
    """The number of a shard id ``shardId-NNNNNNNNNNNN``; ``ValueError`` naming any other id."""
    m = _SHARD.fullmatch(shard_id) if isinstance(shard_id, str) else None
    if m is None:
        raise ValueError(f"not a Kinesis shard id: {shard_id!r} (expected shardId- and 12 digits)")
    return int(m.group(1))


def shard_id(number: int) -> str:
    """The shard id of ``number``. Law: ``shard_number(shard_id(n)) == n`` for ``0 <= n < 10**12``."""
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < 10 ** 12:
        raise ValueError(f"a Kinesis shard number must be an int in [0, 10**12), got {number!r}")
    return f"shardId-{number:012d}"
