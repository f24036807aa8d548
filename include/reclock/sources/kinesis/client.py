"""The Kinesis upstream through boto3: the stream's identity and shards, scans, and reads of ranges.

Every read goes through :meth:`KinesisUpstream.pages`, which follows a shard from a position with
``GetShardIterator`` / ``GetRecords`` and keeps going through what Kinesis throws at a reader:

* ``ProvisionedThroughputExceededException`` (a shard serves 5 reads a second): botocore's standard retry
  mode retries it a few times with jittered backoff; if it still fails, the read waits (doubling, up to
  :attr:`KinesisUpstream.max_backoff_s`) and asks again with the same iterator, for up to
  :attr:`KinesisUpstream.throttle_patience_s` before it fails with ``UpstreamThrottled``. Nothing is skipped:
  the iterator does not move until records are returned.
* ``ExpiredIteratorException`` (an iterator lives 5 minutes): a new iterator is asked for right after the
  last record returned (or at the original start), and the read goes on.
* the end of a closed shard: ``NextShardIterator`` is absent; the page says ``ended``.

The client reaches AWS, or any endpoint given (``endpoint_url``; boto3 also honours
``AWS_ENDPOINT_URL_KINESIS``), with the standard credential chain (environment, profile, instance role):
no key is in the config or in any Spark setting. Spark tasks build their own client from the same
:class:`StreamAddress` (region and endpoint only) and the credentials of their own environment.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping

from reclock.errors import KinesisUnavailable, UpstreamThrottled
from reclock.sources.kinesis.lineage import FINISHED, ShardInfo, ShardScan, iterator_for
from reclock.sources.kinesis.marks import Mark, mark_of
from reclock.sources.kinesis.sequence import shard_id, shard_number

PAGE_LIMIT = 10_000
"""Records a ``GetRecords`` call asks for (Kinesis's maximum)."""


@dataclass(frozen=True)
class StreamAddress:
    """Where a stream lives: its name, region and (for a non-AWS endpoint such as the dev stack's) the
    endpoint URL. No credentials: every process takes them from its own environment."""

    stream: str
    region: str
    endpoint_url: str | None = None

    def client(self, max_attempts: int = 3):
        import boto3
        from botocore.config import Config

        cfg = Config(retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=5,
                     read_timeout=30, max_pool_connections=16)
        return boto3.client("kinesis", region_name=self.region, endpoint_url=self.endpoint_url, config=cfg)


@dataclass(frozen=True)
class StreamIdentity:
    """Which stream this is: a stream deleted and created again under the same name has the same name and
    ARN but a new creation time (and new shards and sequence numbers)."""

    arn: str
    created_ms: int
    retention_hours: int


@dataclass(frozen=True)
class Page:
    """One ``GetRecords`` answer: its records (boto3's dicts), how far behind the tip it left the reader,
    and whether it reached the end of a closed shard."""

    records: list[dict[str, Any]]
    millis_behind: int
    ended: bool


def _code(e: Exception) -> str:
    return _code_of(getattr(e, "response", {}))


def _code_of(parsed: Mapping | None) -> str:
    """The error code of a parsed botocore response (empty for a success)."""
    return (parsed or {}).get("Error", {}).get("Code", "")


@dataclass
class KinesisUpstream:
    """One source's stream. ``throttled`` and ``expired`` count what the reads met (statistics)."""

    source: str
    address: StreamAddress
    throttle_patience_s: float = 600.0
    max_backoff_s: float = 5.0
    throttled: int = 0
    expired: int = 0
    _client: Any = field(default=None, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @property
    def client(self):
        if self._client is None:
            self._client = self.address.client()
            # every throttled answer counts, the ones botocore's own retry absorbed included: a retry that then
            # meets another error (an expired iterator) carries no trace of the throttle in what it raises
            self._client.meta.events.register("needs-retry.kinesis.GetRecords", self._count_throttle)
        return self._client

    def _count_throttle(self, response=None, **_kwargs) -> None:
        """A ``needs-retry`` hook, called once per attempt; it only counts (returning None leaves botocore's
        retry decision alone)."""
        if response is not None and _code_of(response[1]) == "ProvisionedThroughputExceededException":
            with self._lock:  # a mint's scan reads shards from several threads through one client
                self.throttled += 1

    def _where(self) -> str:
        return f"stream {self.address.stream!r} ({self.address.endpoint_url or 'AWS ' + self.address.region})"

    def _call(self, what: str, fn, **kwargs):
        """``fn(**kwargs)``, turning a missing stream or an unreachable endpoint into ``KinesisUnavailable``."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(**kwargs)
        except ClientError as e:
            if _code(e) == "ResourceNotFoundException":
                raise KinesisUnavailable(f"source {self.source}: {what}: {self._where()} does not exist "
                                         f"({e}); create it, or fix `kinesis.stream` in the source config") from e
            raise
        except BotoCoreError as e:
            raise KinesisUnavailable(f"source {self.source}: {what}: {self._where()} is unreachable: {e}") from e

    def identity(self) -> StreamIdentity:
        """The stream's ARN, creation time and retention (``DescribeStreamSummary``)."""
        d = self._call("describing the stream", self.client.describe_stream_summary,
                       StreamName=self.address.stream)["StreamDescriptionSummary"]
        created: datetime = d["StreamCreationTimestamp"]
        return StreamIdentity(d["StreamARN"], int(round(created.timestamp() * 1000)), int(d["RetentionPeriodHours"]))

    def shards(self) -> list[ShardInfo]:
        """Every shard ``ListShards`` shows (open, and closed ones not yet expired), in shard order."""
        out, token = [], None
        while True:
            kw = {"NextToken": token} if token else {"StreamName": self.address.stream}
            resp = self._call("listing shards", self.client.list_shards, **kw)
            for s in resp["Shards"]:
                rng = s["SequenceNumberRange"]
                parents = tuple(shard_number(s[k]) for k in ("ParentShardId", "AdjacentParentShardId") if s.get(k))
                end = rng.get("EndingSequenceNumber")
                out.append(ShardInfo(shard_number(s["ShardId"]), parents, int(rng["StartingSequenceNumber"]),
                                     int(end) if end is not None else None))
            token = resp.get("NextToken")
            if not token:
                return sorted(out, key=lambda s: s.number)

    def _iterator(self, shard: ShardInfo, kind: str, seq: int | None) -> str:
        kw: dict[str, Any] = {"StreamName": self.address.stream, "ShardId": shard_id(shard.number),
                              "ShardIteratorType": kind}
        if seq is not None:
            kw["StartingSequenceNumber"] = str(seq)
        return self._call(f"shard {shard_id(shard.number)}: GetShardIterator", self.client.get_shard_iterator,
                          **kw)["ShardIterator"]

    def _get_records(self, shard: ShardInfo, iterator: str, limit: int) -> dict:
        from botocore.exceptions import ClientError

        delay, waited = 0.05, 0.0
        while True:
            try:
                return self._call(f"shard {shard_id(shard.number)}: GetRecords", self.client.get_records,
                                  ShardIterator=iterator, Limit=limit)
            except ClientError as e:
                if _code(e) != "ProvisionedThroughputExceededException":
                    raise
                if waited >= self.throttle_patience_s:
                    raise UpstreamThrottled(
                        f"source {self.source}: shard {shard_id(shard.number)} of {self._where()} refused reads "
                        f"(ProvisionedThroughputExceededException) for {waited:.0f} s; nothing was skipped. "
                        "Other consumers of the stream share each shard's 5 reads a second and 2 MB/s: give "
                        "the stream more shards, or read it with fewer consumers") from e
                pause = delay * (0.5 + random.random())
                time.sleep(pause)
                waited += pause
                delay = min(delay * 2, self.max_backoff_s)

    def pages(self, shard: ShardInfo, position: int, limit: int = PAGE_LIMIT) -> Iterator[Page]:
        """The shard's records from ``position`` on, page by page, until the reader is at the tip of an open
        shard (a page short of ``limit`` that says ``millis_behind == 0``) or at the end of a closed shard
        (``ended``: no ``NextShardIterator``). Throttling waits, an
        expired iterator is renewed after the last record returned."""
        from botocore.exceptions import ClientError

        kind, seq = iterator_for(shard, position)
        it = self._iterator(shard, kind, seq)
        last: int | None = None
        while True:
            try:
                resp = self._get_records(shard, it, limit)
            except ClientError as e:
                if _code(e) != "ExpiredIteratorException":
                    raise
                self.expired += 1
                it = (self._iterator(shard, kind, seq) if last is None
                      else self._iterator(shard, "AFTER_SEQUENCE_NUMBER", last))
                continue
            records = resp.get("Records", [])
            if records:
                last = int(records[-1]["SequenceNumber"])
            nxt = resp.get("NextShardIterator")
            behind = int(resp.get("MillisBehindLatest", 0))
            yield Page(records, behind, nxt is None)
            if nxt is None:
                return
            # at the tip of an open shard: nothing more now. A closed shard goes on to its end, where Kinesis
            # leaves NextShardIterator out (an empty page may come first)
            if not shard.closed and behind == 0 and (not records or len(records) < limit):
                return
            it = nxt

    def scan(self, shard: ShardInfo, start: int, stride: int, cap: int | None = None,
             on_segment: Callable[[int, int, int, list[dict]], None] | None = None) -> ShardScan:
        """Read ``shard`` from ``start`` to its tip (or its end, or about ``cap`` records: whole pages),
        keeping a point every ``stride`` records and at the tip (``reclock.sources.kinesis.lineage``).
        ``on_segment(shard, start, stop, records)`` is handed the records of each segment the points make
        (``lineage.scan_segments``: ``[start, stop)``, in order) as soon as its point is kept (the mint's
        captures: ``reclock.sources.kinesis.capture``); memory holds at most ``stride`` records then."""
        points: list[tuple[int, int]] = []
        marks: list[tuple[int, Mark]] = []
        n, last, ended, first = 0, None, False, None
        held: list[dict] = []
        record: dict | None = None

        def point(pos: int) -> None:
            if on_segment is not None:
                on_segment(shard.number, points[-1][0] if points else start, pos, held[:])
            held.clear()
            points.append((pos, n))
            marks.append((pos, mark_of(record)))

        for page in self.pages(shard, start):
            if first is None and page.records:
                first = int(page.records[0]["ApproximateArrivalTimestamp"].timestamp() * 1000)
            for r in page.records:
                last = int(r["SequenceNumber"])
                record = r
                n += 1
                if on_segment is not None:
                    held.append(r)
                if n % stride == 0:
                    point(last + 1)
            ended = page.ended
            if cap is not None and n >= cap and not ended:
                break
        if last is not None and (not points or points[-1][0] != last + 1):
            point(last + 1)
        if ended:
            points.append((FINISHED, n))
        return ShardScan(shard.number, start, tuple(points), ended, first, tuple(marks))

    def first_retained(self, shard: ShardInfo) -> int | None:
        """The sequence number of the oldest record the shard still holds (None: it holds none). Whole pages:
        an endpoint may answer a page of one record empty where it skips trimmed records (kinesalite does)."""
        for page in self.pages(shard, 0):
            if page.records:
                return int(page.records[0]["SequenceNumber"])
        return None

    def record_at(self, shard: ShardInfo, seq: int) -> Mark | None:
        """The mark of the record ``seq`` of ``shard`` if the shard holds it (one ``GetShardIterator``
        ``AT_SEQUENCE_NUMBER`` and one ``GetRecords`` of one record; more only for empty pages before the tip,
        a throttled read or an expired iterator). None if the record is not there: the read starts at a later
        record or at the tip, or the endpoint refuses the sequence number as not of this shard
        (``InvalidArgumentException``, as Kinesis does for a sequence number of a deleted stream)."""
        from botocore.exceptions import ClientError

        try:
            it = self._iterator(shard, "AT_SEQUENCE_NUMBER", seq)
        except ClientError as e:
            if _code(e) == "InvalidArgumentException":
                return None
            raise
        while True:
            try:
                resp = self._get_records(shard, it, 1)
            except ClientError as e:
                if _code(e) != "ExpiredIteratorException":
                    raise
                self.expired += 1
                it = self._iterator(shard, "AT_SEQUENCE_NUMBER", seq)
                continue
            records = resp.get("Records", [])
            if records:
                return mark_of(records[0]) if int(records[0]["SequenceNumber"]) == seq else None
            nxt = resp.get("NextShardIterator")
            if nxt is None or int(resp.get("MillisBehindLatest", 0)) == 0:
                return None
            it = nxt

    def still_holds(self, shard: ShardInfo, seq: int) -> bool:
        """Whether the record ``seq`` of ``shard`` is still retained (reading ``AT_SEQUENCE_NUMBER`` it)."""
        it = self._iterator(shard, "AT_SEQUENCE_NUMBER", seq)
        resp = self._get_records(shard, it, 1)
        records = resp.get("Records", [])
        return bool(records) and int(records[0]["SequenceNumber"]) == seq

    def moved(self, shard: ShardInfo, position: int) -> tuple[bool, int]:
        """Whether ``shard`` holds a record at or after ``position`` (or is closed and not yet read to its end),
        and how far behind the tip ``position`` is: one small ``GetRecords``, or a few when Kinesis answers
        empty pages before the tip."""
        if position >= FINISHED:
            return False, 0
        for page in self.pages(shard, position, limit=100):
            if page.records or page.ended:
                return bool(page.records) or page.ended, page.millis_behind
        return False, 0
