"""Reading bound sequence ranges: which records a description covers, cut into Spark tasks, and the
reader a task runs.

A description's records are, per shard, the sequence numbers between two bindings' positions; each binding
range ``[a, b)`` at ``ts`` is cut at the points the scans counted (:class:`~reclock.sources.kinesis.lineage
.Segment`: "``n`` records have a sequence number in ``[s, t)``"), so that every :class:`Unit` is a range of
one shard with a known record count, all of it at one ``ts``. Reclocking is exact by construction: a
unit's records carry its ``ts`` (a constant column), no per-record lookup.

Units of one shard that follow each other are read by one task, one ``GetShardIterator`` and
``GetRecords`` pages on (:class:`ReadTask`, at most ``task_records`` records, so a long shard range is read
by several tasks at once). A task checks what it read against the counts: fewer records than a unit was
bound with (retention trimmed them, the stream was replaced) fails the task with :class:`RangeLost`, which
the driver turns into ``UpstreamDataLost`` naming the shard and range; never a silent skip.

The pure planning (:func:`units_for`, :func:`plan_tasks`, :func:`slices`) imports nothing but the lineage
rules and ``reclock.batch.pack``; :func:`read_task` runs in a Spark task (or anywhere) with boto3.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from reclock.batch import pack
from reclock.sources.kinesis.lineage import FINISHED, Segment, ShardInfo


@dataclass(frozen=True)
class Unit:
    """``records`` records of ``shard`` with a sequence number in ``[start, stop)``, all bound at ``ts``."""

    shard: int
    start: int
    stop: int
    records: int
    ts: int


@dataclass(frozen=True)
class ReadTask:
    """Consecutive units of one shard (each ``stop`` the next ``start``), read in one pass from
    ``units[0].start``. ``shard_start`` and ``closed`` are the shard's, for its iterator and its end."""

    shard: int
    shard_start: int
    closed: bool
    units: tuple[Unit, ...]

    @property
    def records(self) -> int:
        return sum(u.records for u in self.units)

    @property
    def start(self) -> int:
        return self.units[0].start

    @property
    def stop(self) -> int:
        return self.units[-1].stop


class CountsMissing(Exception):
    """No chain of counted segments joins two positions of a shard (a bug: scans write them before the
    bindings that use them, and compaction keeps those a read may need)."""


def segment_path(segments: Sequence[Segment], start: int, stop: int) -> list[Segment]:
    """A chain of ``segments`` (of one shard) from ``start`` to ``stop``: each segment's ``stop`` the next one's
    ``start``. Several scans may have counted overlapping stretches; any chain will do (they are all facts
    about the same records). ``CountsMissing`` if there is none; ``[]`` for ``start == stop``."""
    if start == stop:
        return []
    by_start: dict[int, list[Segment]] = {}
    for s in segments:
        if start <= s.start and s.stop <= stop:
            by_start.setdefault(s.start, []).append(s)
    # depth-first from start, longest steps first; remember dead ends
    dead: set[int] = set()
    path: list[Segment] = []
    stack = [iter(sorted(by_start.get(start, ()), key=lambda s: -s.stop))]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            if path:
                dead.add(path.pop().stop)
            continue
        if nxt.stop in dead:
            continue
        path.append(nxt)
        if nxt.stop == stop:
            return path
        stack.append(iter(sorted(by_start.get(nxt.stop, ()), key=lambda s: -s.stop)))
    raise CountsMissing(f"no counted records of shard between positions {start} and {stop}")


def units_for(ranges: Mapping[int, Sequence[tuple[int, int, int]]],
              segments: Mapping[int, Sequence[Segment]]) -> list[Unit]:
    """The units of ``ranges`` (shard -> its binding ranges ``(start, stop, ts)``, as
    ``reclock.remap.reclock_ranges`` gives them, limited to a description), cut at the counted points.

    Laws: per shard the units are contiguous and cover exactly the ranges; each lies within one range
    (its ``ts``); a unit's ``records`` is the count the segments give; units of no records are left out
    (nothing to read: the scans proved it)."""
    out: list[Unit] = []
    for shard in sorted(ranges):
        for start, stop, ts in ranges[shard]:
            for seg in segment_path(segments.get(shard, ()), start, stop):
                if seg.records:
                    out.append(Unit(shard, seg.start, seg.stop, seg.records, ts))
    return out


def plan_tasks(units: Sequence[Unit], shards: Mapping[int, ShardInfo], task_records: int) -> list[ReadTask]:
    """Group consecutive units of each shard into tasks of at most ``task_records`` records (a unit larger
    than that is a task alone: counts are known only at the scans' points).

    Laws: the tasks hold every unit once, in order; a task's units are of one shard and contiguous; each task
    holds at most ``task_records`` records unless it is one unit."""
    if task_records <= 0:
        raise ValueError(f"task_records must be positive, got {task_records}")
    tasks: list[ReadTask] = []
    current: list[Unit] = []

    def close() -> None:
        if current:
            info = shards[current[0].shard]
            tasks.append(ReadTask(info.number, info.start, info.closed, tuple(current)))
            current.clear()
    for u in sorted(units, key=lambda u: (u.shard, u.start)):
        if current and (u.shard != current[-1].shard or u.start != current[-1].stop
                        or sum(x.records for x in current) + u.records > task_records):
            close()
        current.append(u)
    close()
    return tasks


def slices(tasks: Sequence[ReadTask], max_records: int) -> list[list[ReadTask]]:
    """Group tasks into slices (one Spark job each) of at most ``max_records`` records (a task larger than
    that is a slice alone). Law: every task in exactly one slice, in order."""
    return pack(tasks, lambda t: t.records, max_records)


class RangeLost(Exception):
    """A task read fewer records of a unit than it was bound with. Its message is machine-readable after
    :data:`LOST_MARK` (the driver finds it in Spark's error and raises ``UpstreamDataLost``)."""

    def __init__(self, shard: int, start: int, stop: int, expected: int, found: int) -> None:
        self.shard, self.start, self.stop, self.expected, self.found = shard, start, stop, expected, found
        super().__init__(f"{LOST_MARK}{shard}:{start}:{stop}:{expected}:{found}{LOST_END}")


LOST_MARK = "RECLOCK_KINESIS_RANGE_LOST:"
LOST_END = ":END"


def parse_lost(message: str) -> RangeLost | None:
    """The :class:`RangeLost` a Spark error message carries, if any."""
    i = message.find(LOST_MARK)
    if i < 0:
        return None
    body = message[i + len(LOST_MARK):message.find(LOST_END, i)]
    shard, start, stop, expected, found = (int(x) for x in body.split(":"))
    return RangeLost(shard, start, stop, expected, found)


READ_SCHEMA = ("shard BIGINT, sequence_number STRING, partition_key STRING, data BINARY, "
               "arrival TIMESTAMP, ts BIGINT")
"""The columns a read task yields: the record's shard (its number), sequence number (the decimal), partition
key, data, ``ApproximateArrivalTimestamp``, and the ``ts`` of its binding."""


def _arrow_schema():
    import pyarrow as pa

    return pa.schema([("shard", pa.int64()), ("sequence_number", pa.string()), ("partition_key", pa.string()),
                      ("data", pa.binary()), ("arrival", pa.timestamp("us", tz="UTC")), ("ts", pa.int64())])


def read_task(upstream, task: ReadTask) -> Iterator:
    """Read ``task``'s units with ``upstream`` (a ``KinesisUpstream``) and yield Arrow record batches of
    :data:`READ_SCHEMA`, one per page. Stops at the task's last unit's end (the record just below its
    ``stop``, or a closed shard's end for :data:`FINISHED`). Raises :class:`RangeLost` for the first unit
    that yields fewer records than it was bound with."""
    import pyarrow as pa

    schema = _arrow_schema()
    shard = ShardInfo(task.shard, (), task.shard_start, task.shard_start if task.closed else None)
    stops = [u.stop for u in task.units]
    counts = [0] * len(task.units)
    last = task.stop - 1 if task.stop < FINISHED else None  # the last record's sequence number
    for page in upstream.pages(shard, task.start):
        seqs = [int(r["SequenceNumber"]) for r in page.records]
        cut = bisect.bisect_left(seqs, task.stop)  # records at or past the task's stop are not ours
        if cut:
            recs = page.records[:cut]
            # each record's unit: the first whose stop is beyond its sequence number (units are contiguous)
            idx = [bisect.bisect_right(stops, s) for s in seqs[:cut]]
            for i in idx:
                counts[i] += 1
            yield pa.record_batch([
                pa.array([task.shard] * cut, pa.int64()),
                pa.array([r["SequenceNumber"] for r in recs], pa.string()),
                pa.array([r["PartitionKey"] for r in recs], pa.string()),
                pa.array([r["Data"] for r in recs], pa.binary()),
                pa.array([r["ApproximateArrivalTimestamp"] for r in recs], pa.timestamp("us", tz="UTC")),
                pa.array([task.units[i].ts for i in idx], pa.int64()),
            ], schema=schema)
        if cut < len(seqs) or (last is not None and cut and seqs[cut - 1] == last):
            break
    # a read that came to the shard's tip (or end) before the task's last record has some unit short
    for u, n in zip(task.units, counts):
        if n != u.records:
            raise RangeLost(u.shard, u.start, u.stop, u.records, n)


def read_frame(spark, source: str, address, tasks: Sequence[ReadTask], read_metrics=None):
    """A DataFrame of :data:`READ_SCHEMA` holding exactly the records of ``tasks``, one Spark task per read
    task (``mapInArrow`` over ``range(len(tasks))``: each Spark task reads its units with its own boto3 client
    from ``address``, a ``StreamAddress``, and its environment's credentials). ``read_metrics`` (an
    ``Observation``) counts the records read, as ``records``. Works in a local session and over Spark
    Connect; the executors' Python needs ``reclock`` and boto3."""
    from pyspark.sql import functions as F

    payload = list(tasks)
    if not payload:
        raise ValueError("read_frame needs at least one task")

    def run(batches):
        from reclock.sources.kinesis.client import KinesisUpstream

        upstream = KinesisUpstream(source, address)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                yield from read_task(upstream, payload[i])

    df = spark.range(0, len(payload), 1, len(payload)).mapInArrow(run, READ_SCHEMA)
    if read_metrics is not None:
        df = df.observe(read_metrics, F.count(F.lit(1)).alias("records"))
    return df
