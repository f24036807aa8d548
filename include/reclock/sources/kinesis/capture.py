"""Captures: the records a mint's scan read, kept so that the write reads them once more from the blob
store instead of from the stream.

Kinesis tells no shard's tip, so a mint reads every record beyond the newest binding to find the tips and
count the segments its bindings rest on (``reclock.sources.kinesis.kind``). Without captures the write
then reads the same records from the stream a second time (its Spark tasks' ``GetRecords``): half of what
the endpoint serves went to finding the bound. With them, the scan writes each counted segment's records
(``[start, stop)`` of one shard, exactly the records it counted there) as one Parquet file, and the write
reads a unit from its capture when the capture is there and holds the unit's count of records:

==========================  ====================================================================================
a unit's capture            the write
==========================  ====================================================================================
there, ``records`` rows     Spark reads the file (its rows carry the shard and the segment's start, joined
                            to the unit's ``ts``); the slice's job counts what it read and the write fails
                            unless that is the bound count (``KinesisDataLost``)
missing, or another count   Spark tasks read the unit from the stream, checked against the count as always
                            (``reclock.sources.kinesis.reader``): a capture is a cache, never the proof
==========================  ====================================================================================

A capture holds the bytes ``GetRecords`` returned (data, partition key, sequence number, arrival), so
either way the write sees the same records: replay and rebuild give the same updates.

Where: ``<source>/_kinesis/<shard>/<start>-<stop>.parquet`` in the source's blob store (one name per
segment: two scans that counted the same segment captured the same records). Blob bytes stay bounded: the
resume step deletes the captures below the offset resumption frontier (:func:`drop_read`), each mint leases
the folder (``reclock.persist.gc.lease_write``), and once no mint has renewed the lease for its length the
source's garbage collection takes what is left; a write that then finds no capture reads the stream.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

FOLDER = "_kinesis"
"""The captures' folder under the source's folder."""

COLUMNS = ("shard", "segment", "sequence_number", "partition_key", "data", "arrival")
"""A capture's columns: the shard (its number), the segment's start (a decimal string: the join key to the
unit's ``ts``), then the record as the reader yields it (``reclock.sources.kinesis.reader.READ_SCHEMA``)."""


@dataclass(frozen=True)
class Capture:
    """Where the records of ``[start, stop)`` of ``shard`` are captured (a path in the blob store)."""

    shard: int
    start: int
    stop: int

    def path(self, source: str) -> str:
        return f"{folder(source)}/{self.shard}/{self.start}-{self.stop}.parquet"


def folder(source: str) -> str:
    return f"{source}/{FOLDER}"


def _schema():
    import pyarrow as pa

    return pa.schema([("shard", pa.int64()), ("segment", pa.string()), ("sequence_number", pa.string()),
                      ("partition_key", pa.string()), ("data", pa.binary()),
                      ("arrival", pa.timestamp("us", tz="UTC"))])


def encode(shard: int, start: int, records: Sequence[Mapping[str, Any]]) -> bytes:
    """``records`` (boto3's ``GetRecords`` dicts, in order) of the segment of ``shard`` that begins at
    ``start``, as a Parquet file's bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(records)
    table = pa.table([
        pa.array([shard] * n, pa.int64()),
        pa.array([str(start)] * n, pa.string()),
        pa.array([r["SequenceNumber"] for r in records], pa.string()),
        pa.array([r["PartitionKey"] for r in records], pa.string()),
        pa.array([r["Data"] for r in records], pa.binary()),
        pa.array([r["ApproximateArrivalTimestamp"] for r in records], pa.timestamp("us", tz="UTC")),
    ], schema=_schema())
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return buf.getvalue()


class CaptureWriter:
    """The scan's hook (``KinesisUpstream.scan(on_segment=...)``): writes each counted segment's records."""

    def __init__(self, blob, source: str) -> None:
        self.blob, self.source = blob, source
        self.files = 0
        self.records = 0

    def __call__(self, shard: int, start: int, stop: int, records: Sequence[Mapping[str, Any]]) -> None:
        if not records:
            return
        self.blob.put_bytes(Capture(shard, start, stop).path(self.source), encode(shard, start, records))
        self.files += 1
        self.records += len(records)


def rows_of(blob, path: str) -> int | None:
    """The rows the capture at ``path`` holds (its Parquet footer), None if it is missing or unreadable."""
    import pyarrow.parquet as pq

    try:
        if not blob.exists(path):
            return None
        with blob.open(path) as f:
            return pq.ParquetFile(f).metadata.num_rows
    except Exception:  # noqa: BLE001 - a capture that cannot be opened is as good as missing: read the stream
        return None


def captured(blob, source: str, units: Sequence[Any]) -> set[tuple[int, int, int]]:
    """The ``(shard, start, stop)`` of the ``units`` (``reader.Unit``) whose capture is there and holds
    exactly the unit's records."""
    out = set()
    for u in units:
        key = (u.shard, u.start, u.stop)
        if key not in out and rows_of(blob, Capture(*key).path(source)) == u.records:
            out.add(key)
    return out


def frame(spark, blob, source: str, units: Sequence[Any]):
    """A DataFrame of ``reader.READ_SCHEMA`` (``shard, sequence_number, partition_key, data, arrival, ts``)
    holding the captured records of ``units``, each with its unit's ``ts``."""
    from pyspark.sql import functions as F

    paths = [blob.url(Capture(u.shard, u.start, u.stop).path(source)) for u in units]
    stamps = spark.createDataFrame([(u.shard, str(u.start), u.ts) for u in units],
                                   "shard BIGINT, segment STRING, ts BIGINT")
    df = spark.read.parquet(*paths)
    return (df.join(F.broadcast(stamps), ["shard", "segment"])
            .select("shard", "sequence_number", "partition_key", "data", "arrival", "ts"))


def drop_read(blob, source: str, positions: Mapping[int, int], dropped: Sequence[int] = ()) -> int:
    """Delete the captures every output has (``stop`` at or below the shard's position in ``positions``, the
    offset resumption frontier), and all of the ``dropped`` shards'. Returns how many were deleted."""
    gone = 0
    for b in blob.list(folder(source)):
        parts = b.path.rsplit("/", 2)
        try:
            shard = int(parts[-2])
            start, stop = (int(x) for x in parts[-1].removesuffix(".parquet").split("-"))
        except ValueError:
            continue  # not a capture (a temporary file of a write in progress)
        if shard in dropped or positions.get(shard, 0) >= stop:
            blob.delete(b.path)
            gone += 1
    return gone
