"""What a Kinesis source keeps in Postgres beside its remap collection (schema ``reclock``):

* ``kinesis_streams(source, stream_arn, created_ms, scanned_ms, dropped_records)``: which stream the source
  reads (its ARN and creation time when the source first bound it: a stream deleted and created again has a
  new one, :class:`~reclock.errors.StreamReplaced`), when the last mint began a scan of every readable shard
  to its tip (the retention check of ``reclock.sources.kinesis.kind`` needs it), and how many records were
  bound from shards that compaction dropped from the frontier (a rebuild must find them all again);
* ``kinesis_segments(source, shard, start, stop, records)``: facts the scans establish, "``records``
  records of the shard have a sequence number in ``[start, stop)``", written before the bindings that use
  them; every read of a bound range is checked against them (``reclock.sources.kinesis.reader``).
  :func:`compact_segments` keeps them bounded: per shard, what lies below the compacted frontier becomes
  one segment;
* ``kinesis_marks(source, shard, position, arrival_ms, digest)``: for each position a mint binds, the record
  just below it as the scan read it (:class:`~reclock.sources.kinesis.marks.Mark`), written with the
  segments; the next mint checks the stream still holds it before reading past the position.
  :func:`compact_marks` keeps those at or above the compacted frontier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from reclock.errors import StreamReplaced
from reclock.sources.kinesis.lineage import Segment
from reclock.sources.kinesis.marks import Mark
from reclock.sources.kinesis.reader import CountsMissing, segment_path


@dataclass(frozen=True)
class StreamRecord:
    stream_arn: str
    created_ms: int
    scanned_ms: int | None
    dropped_records: int


def stream_record(conn, source: str) -> StreamRecord | None:
    row = conn.execute("SELECT stream_arn, created_ms, scanned_ms, dropped_records FROM reclock.kinesis_streams "
                       "WHERE source = %s", (source,)).fetchone()
    return StreamRecord(*row) if row else None


def bind_stream(conn, source: str, stream: str, arn: str, created_ms: int) -> StreamRecord:
    """Record the stream the source reads (its first time), or check it is still that stream: a stream of
    another creation time is :class:`StreamReplaced`."""
    conn.execute("INSERT INTO reclock.kinesis_streams (source, stream_arn, created_ms) VALUES (%s, %s, %s) "
                 "ON CONFLICT (source) DO NOTHING", (source, arn, created_ms))
    rec = stream_record(conn, source)
    if rec.created_ms != created_ms or rec.stream_arn != arn:
        raise StreamReplaced(source, stream, rec.created_ms, created_ms)
    return rec


def record_scan(conn, source: str, scanned_ms: int) -> None:
    """A scan that began at ``scanned_ms`` read every readable shard to its tip (never moves back)."""
    conn.execute("UPDATE reclock.kinesis_streams SET scanned_ms = greatest(coalesce(scanned_ms, 0), %s) "
                 "WHERE source = %s", (scanned_ms, source))


def add_segments(conn, source: str, segments: Iterable[Segment]) -> int:
    rows = [(source, s.shard, s.start, s.stop, s.records) for s in segments]
    if rows:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reclock.kinesis_segments (source, shard, start, stop, records) "
                            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", rows)
    return len(rows)


def load_segments(conn, source: str, shards: Sequence[int]) -> dict[int, list[Segment]]:
    """The segments of ``shards`` (shard -> segments by start)."""
    out: dict[int, list[Segment]] = {}
    for shard, start, stop, records in conn.execute(
            "SELECT shard, start, stop, records FROM reclock.kinesis_segments WHERE source = %s "
            "AND shard = ANY(%s) ORDER BY shard, start, stop", (source, list(shards))):
        out.setdefault(shard, []).append(Segment(shard, int(start), int(stop), records))
    return out


def compact_segments(conn, source: str, since_positions: Mapping[int, int], dropped: Iterable[int] = ()) -> int:
    """Per shard, replace the segments below its position in the compacted frontier (the binding at since)
    by one segment from the shard's first counted position; the segments of ``dropped`` shards (read to
    their ends, dropped from the frontier) go, their records added to ``dropped_records``. In the caller's
    transaction. Returns how many segment rows were deleted."""
    deleted = 0
    dropped = list(dropped)
    if dropped:
        total = sum(_chain_total(conn, source, shard) for shard in dropped)
        conn.execute("UPDATE reclock.kinesis_streams SET dropped_records = dropped_records + %s WHERE source = %s",
                     (total, source))
        deleted += conn.execute("DELETE FROM reclock.kinesis_segments WHERE source = %s AND shard = ANY(%s)",
                                (source, dropped)).rowcount
    for shard, pos in since_positions.items():
        segs = load_segments(conn, source, [shard]).get(shard, [])
        below = [s for s in segs if s.start < pos]
        if len(below) <= 1:
            continue
        first = min(s.start for s in below)
        try:
            path = segment_path(below, first, pos)
        except CountsMissing:
            continue  # nothing joins them yet (a racing mint's segments): leave them
        deleted += conn.execute("DELETE FROM reclock.kinesis_segments WHERE source = %s AND shard = %s AND start < %s",
                                (source, shard, pos)).rowcount
        add_segments(conn, source, [Segment(shard, first, pos, sum(s.records for s in path))])
    return deleted


def _chain_total(conn, source: str, shard: int) -> int:
    """The records of a shard's longest counted chain from its first position (a shard read to its end)."""
    segs = load_segments(conn, source, [shard]).get(shard, [])
    if not segs:
        return 0
    first, last = min(s.start for s in segs), max(s.stop for s in segs)
    try:
        return sum(s.records for s in segment_path(segs, first, last))
    except CountsMissing:
        return 0


def add_marks(conn, source: str, marks: Iterable[tuple[int, int, Mark]]) -> int:
    """Record ``(shard, position, mark)``: the record just below ``position`` as a scan read it. A later scan's
    mark at the same position replaces an earlier one (a mint that bound nothing leaves marks no binding
    uses; the newest scan is what the bindings about to be appended rest on)."""
    rows = [(source, shard, pos, m.arrival_ms, m.digest) for shard, pos, m in marks]
    if rows:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reclock.kinesis_marks (source, shard, position, arrival_ms, digest) "
                            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (source, shard, position) DO UPDATE SET "
                            "arrival_ms = EXCLUDED.arrival_ms, digest = EXCLUDED.digest", rows)
    return len(rows)


def load_marks(conn, source: str, positions: Mapping[int, int]) -> dict[int, Mark]:
    """The marks at ``positions`` (shard -> position): shard -> the mark of the record at ``position - 1``;
    a shard without one is left out (a position no record of this source's scans made: 0, a child's start,
    ``FINISHED``; or one bound before marks were kept). One query (compaction keeps the table to the
    positions at or above the frontier)."""
    out: dict[int, Mark] = {}
    for shard, pos, arrival, dig in conn.execute(
            "SELECT shard, position, arrival_ms, digest FROM reclock.kinesis_marks WHERE source = %s", (source,)):
        if positions.get(shard) == int(pos):
            out[shard] = Mark(int(pos) - 1, arrival, dig)
    return out


def compact_marks(conn, source: str, since_positions: Mapping[int, int], dropped: Iterable[int] = ()) -> int:
    """Delete the marks below each shard's position in the compacted frontier, and those of ``dropped``
    shards. In the caller's transaction. Returns how many rows were deleted."""
    deleted = 0
    dropped = list(dropped)
    if dropped:
        deleted += conn.execute("DELETE FROM reclock.kinesis_marks WHERE source = %s AND shard = ANY(%s)",
                                (source, dropped)).rowcount
    for shard, pos in since_positions.items():
        deleted += conn.execute("DELETE FROM reclock.kinesis_marks WHERE source = %s AND shard = %s "
                                "AND position < %s", (source, shard, pos)).rowcount
    return deleted
