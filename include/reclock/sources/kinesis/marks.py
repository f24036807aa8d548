"""Marks: what a Kinesis source remembers of the record just below each position it binds, so that the next
cycle can check that the stream still holds that record before it reads past it.

A position ``p`` (``reclock.sources.kinesis.lineage``) other than 0, a child's start and ``FINISHED`` is
``last + 1`` for the last record read; the next scan reads the shard ``AFTER_SEQUENCE_NUMBER p - 1``. If the
stream was deleted and created again under the same name, its shards and sequence numbers start over, and a
read after ``p - 1`` skips the new stream's records at or below it: silent loss. The creation time and the
shards' first sequence numbers tell a new stream apart only when it was created in another second than the
old one (some endpoints give both in whole seconds, and kinesalite creates and deletes in milliseconds).
A :class:`Mark` is the record at ``p - 1`` as the source read it: its sequence number, its
``ApproximateArrivalTimestamp`` and a digest of its partition key and data. Before a scan reads past ``p``,
the record ``AT_SEQUENCE_NUMBER p - 1`` is read again and :func:`verdict` compares.

A record that is gone is not always a replaced stream: retention trims a shard's oldest records first, so
the last record read may have been trimmed while nothing after it was (a quiet stream). Retention never
keeps an older record while it trims a newer one, so a gone record with a record at or below its sequence
number still in the shard is not retention's work: the stream was replaced. A gone record with nothing at or
below it left is left to the retention check (``reclock.sources.kinesis.kind``); a read after ``p - 1``
skips nothing there.

What no check here can see: a new stream whose record at ``p - 1`` has the same sequence number, the same
arrival time (in the endpoint's resolution), the same partition key and the same data.

Pure: nothing here does I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Mapping

Verdict = Literal["same", "trimmed", "replaced"]


@dataclass(frozen=True)
class Mark:
    """The record at ``sequence`` as a read returned it: its ``ApproximateArrivalTimestamp`` in ms and
    :func:`digest` of its partition key and data."""

    sequence: int
    arrival_ms: int
    digest: str

    def describe(self) -> str:
        return f"sequence number {self.sequence}, arrived {_when(self.arrival_ms)}, digest {self.digest[:12]}"


def digest(partition_key: str, data: bytes) -> str:
    """A digest of a record's partition key and data (the key's length first, so that no split of the same
    bytes between key and data gives the same digest)."""
    key = partition_key.encode("utf-8")
    h = hashlib.sha256()
    h.update(len(key).to_bytes(8, "big"))
    h.update(key)
    h.update(data)
    return h.hexdigest()


def arrival_ms(arrival: datetime) -> int:
    return int(round(arrival.timestamp() * 1000))


def mark_of(record: Mapping[str, Any]) -> Mark:
    """The mark of a record as boto3's ``GetRecords`` returns it."""
    return Mark(int(record["SequenceNumber"]), arrival_ms(record["ApproximateArrivalTimestamp"]),
                digest(record["PartitionKey"], bytes(record["Data"])))


def verdict(expected: Mark, found: Mark | None, first_retained: int | None) -> Verdict:
    """Whether the stream still holds the record the source read at ``expected.sequence``.

    ``found``: the record the stream now holds at that sequence number (None: none there); ``first_retained``:
    the sequence number of the shard's oldest record (None: the shard holds none; needed only when ``found``
    is None).

    * ``same``: the record is there, unchanged;
    * ``replaced``: another record is there, or none is while an older record is (retention trims the oldest
      first): the stream is not the one the source read;
    * ``trimmed``: gone, and nothing at or below it is left: retention's work, or a new stream holding
      nothing the read after it would skip.
    """
    if found is not None:
        if found.sequence != expected.sequence:
            raise ValueError(f"found record {found.sequence} is not at the expected {expected.sequence}")
        return "same" if found == expected else "replaced"
    if first_retained is not None and first_retained <= expected.sequence:
        return "replaced"
    return "trimmed"


def _when(ms: int) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(timespec="milliseconds")
