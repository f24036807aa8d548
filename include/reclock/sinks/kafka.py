"""The exactly-once Kafka sink: a collection's updates, in timestamp order, through Kafka transactions that
also record the sink's frontier in a progress topic (DESIGN.md, "Exactly-once Kafka sink").

::

    shard (complete times < upper)                          Kafka
    ------------------------------                          -----
    read [F, U) -> consolidate -> per ts:           BEGIN
                                                      messages of ts F .. T-1   -> target topic
                                                      {"frontier": [T], "version": v}  -> progress topic
                                                    COMMIT          (both or neither: exactly once)
    downgrade the read hold to T - 1                F := T

On start, ``init_transactions`` with the sink's stable ``transactional.id`` fences any older instance and
aborts its open transaction; then the latest progress record (read ``read_committed``) says where the
sink is: everything below its frontier is in the topic, so the sink resumes strictly after it. A new sink
(no progress record) starts with a snapshot of the collection AS OF its since (or ``start:``), and refuses
to write into a topic that already holds data unless asked to start fresh; so does a sink whose frontier
the shard can no longer serve (it was compacted past it).

The sink holds a read hold on the shard at ``frontier - 1``: compaction of the shard's since, and of its
source's remap collection, never passes what the sink still has to write. ``drop`` releases it.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pyarrow as pa

from reclock import compaction
from reclock.config import SinkSpec
from reclock.errors import AcknowledgedStateLost, MigrationError, ReclockError, SinceViolation, SinkRefused
from reclock.ahead import read_ahead as _ahead
from reclock.failpoints import failpoint
from reclock import kafka_client
from reclock.kafka_client import KafkaClientConfig
from reclock.persist import blob as blobs
from reclock.persist import connect
from reclock.persist.migrate import check_schema
from reclock.persist.shards import acquire_read_hold, downgrade_read_hold, release_read_hold, shard_info
from reclock.persist.status import record_statistics, record_status
from reclock.persist.schemas import load_history
from reclock.read import UpdateReader, read_as_of, updates_parts
from reclock.sinks.encode import TsRun, dumps, encode_runs

PROGRESS_VERSION_KEY = "version"
TS_HEADER = "reclock.ts"


class SinkFenced(ReclockError):
    """Another instance of the sink took over (its ``init_transactions`` bumped the producer epoch)."""

    def __init__(self, sink: str) -> None:
        super().__init__(f"sink {sink}: fenced by a newer instance with the same transactional.id; this one "
                         "stopped without writing (the other carries on from the progress topic)")
        self.sink = sink


@dataclass(frozen=True)
class Progress:
    """The latest progress record of a sink: every update at ``ts < frontier`` is in the target topic."""

    frontier: int
    version: int


@dataclass
class SinkContext:
    """A sink's spec and where its consensus, its blobs and its Kafka cluster (``kafka``: its connection's
    settings, or the address of an unsecured cluster) are."""

    spec: SinkSpec
    dsn: str
    kafka: KafkaClientConfig | str
    blob: blobs.BlobStore

    def __post_init__(self) -> None:
        self.kafka = kafka_client.client_config(self.kafka)

    @contextlib.contextmanager
    def connect(self) -> Iterator:
        with connect(self.dsn) as conn:
            yield conn


@dataclass(frozen=True)
class SinkResult:
    frontier: int
    version: int
    transactions: int
    messages: int
    bytes: int


# -- progress topic ------------------------------------------------------------------------------------------


def ensure_topics(ctx: SinkContext) -> None:
    """Create the progress topic (compacted, one partition) and the target topic if they are missing (this
    needs ``CREATE`` on them; topics created beforehand need none)."""
    from confluent_kafka.admin import NewTopic

    what = f"sink {ctx.spec.name}"
    admin = kafka_client.admin(ctx.kafka, what)
    existing = set(admin.metadata().topics)  # the topics the principal may describe
    wanted = []
    if ctx.spec.progress_topic not in existing:
        wanted.append(NewTopic(ctx.spec.progress_topic, 1, -1, config={"cleanup.policy": "compact"}))
    if ctx.spec.kafka.topic not in existing:
        wanted.append(NewTopic(ctx.spec.kafka.topic, ctx.spec.partitions, -1))
    for topic, fut in admin.handle.create_topics(wanted).items() if wanted else ():
        try:
            fut.result(30)
        except Exception as e:  # noqa: BLE001 - a concurrent creator is fine
            if "TOPIC_ALREADY_EXISTS" in str(e):
                continue
            refused = admin.refused(e, f"creating topic {topic} (it is missing, or not visible: DESCRIBE)",
                                    {"topic": ("CREATE", topic), "cluster": ("CREATE", "kafka-cluster")})
            raise refused or ReclockError(f"{what}: cannot create topic {topic}: {e}") from e


def read_all(kafka: KafkaClientConfig | str, topic: str, group: str, stop: Callable[[Any], bool] | None = None,
             what: str = "reading") -> Iterator:
    """Every committed record of ``topic`` (read_committed, from the start to the end), oldest first per
    partition; stops early when ``stop(message)`` is true. A topic that does not exist yields nothing; one
    the principal may not read raises :class:`~reclock.errors.KafkaAccessDenied`."""
    from confluent_kafka import KafkaError, TopicPartition

    # fetch.wait.max.ms: the broker answers a fetch at the end of a partition at once instead of holding it
    # 500 ms for data that will not come (a sink's start reads two topics to their ends)
    client = kafka_client.consumer(kafka_client.client_config(kafka), what, {
        "group.id": group, "isolation.level": "read_committed", "enable.auto.commit": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10})
    c = client.handle
    needs = {"topic": ("READ", topic), "group": ("DESCRIBE", group)}  # a consumer of a group: its coordinator
    try:
        meta = client.metadata(topic).topics.get(topic)
        if meta is not None and meta.error is not None and meta.error.code() not in (
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            raise client.refused(meta.error, f"reading {topic}", {"topic": ("DESCRIBE", topic)}) or ReclockError(
                f"{what}: topic {topic}: {meta.error}")
        if meta is None or meta.error is not None:
            return
        c.assign([TopicPartition(topic, p, -2) for p in meta.partitions])  # -2: OFFSET_BEGINNING
        eof: set[int] = set()
        deadline = time.monotonic() + 120
        while len(eof) < len(meta.partitions):
            if time.monotonic() > deadline:
                raise ReclockError(f"{what}: reading {topic}: no end of partition after 120 s")
            m = c.poll(0.1)
            if m is None:
                continue
            if m.error():
                if m.error().code() == -191:  # _PARTITION_EOF: at the last stable offset
                    eof.add(m.partition())
                    continue
                raise client.refused(m.error(), f"reading {topic}", needs) or ReclockError(
                    f"{what}: reading {topic}: {m.error()}")
            yield m
            if stop is not None and stop(m):
                return
    finally:
        c.close()


def progress_group(sink: str) -> str:
    """The group of the consumer that reads ``sink``'s progress at start (assigned, it commits nothing; the
    broker still checks DESCRIBE on it)."""
    return f"reclock-sink-{sink}-progress"


def check_group(sink: str) -> str:
    """The group of the consumer that looks whether ``sink``'s topic already holds data."""
    return f"reclock-sink-{sink}-check"


def read_progress(kafka: KafkaClientConfig | str, progress_topic: str, sink: str) -> Progress | None:
    """The latest committed progress record of ``sink`` (None if it never committed one)."""
    latest = None
    for m in read_all(kafka, progress_topic, progress_group(sink), what=f"sink {sink}"):
        if m.key() == sink.encode():
            latest = None if m.value() is None else json.loads(m.value())
    if latest is None:
        return None
    return Progress(frontier=int(latest["frontier"][0]), version=int(latest.get(PROGRESS_VERSION_KEY, 0)))


def topic_holds_data(kafka: KafkaClientConfig | str, topic: str, group: str, what: str = "reading") -> bool:
    """Whether ``topic`` holds any committed record (aborted transactions do not count), read by a consumer
    of ``group`` (it commits nothing there)."""
    return any(True for _ in read_all(kafka, topic, group, stop=lambda m: True, what=what))


# -- encoding -------------------------------------------------------------------------------------------------


def consolidate(table: pa.Table) -> pa.Table:
    """Sum ``diff`` per ``(ts, row)``, drop zeros (:func:`reclock.compaction.consolidate`), sort by ts (the
    order the sink writes in). Without retractions nothing can cancel, so the (costly) grouping is skipped:
    only the sort remains."""
    if table.num_rows == 0:
        return table
    if compaction.has_retractions(table):
        table = compaction.consolidate(table)
    return compaction.sorted_by_ts(table)


# -- the sink ------------------------------------------------------------------------------------------------


def _producer(ctx: SinkContext) -> kafka_client.Client:
    conf = {"transactional.id": ctx.spec.transactional_id,
            "enable.idempotence": True, "acks": "all",
            "transaction.timeout.ms": int(ctx.spec.transaction_timeout_s * 1000),
            "linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
            "compression.type": "lz4"}
    conf.update(dict(ctx.spec.kafka.options))
    return kafka_client.producer(ctx.kafka, f"sink {ctx.spec.name}", conf)


def _fenced(e: Exception) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(e, KafkaException):
        return False
    err = e.args[0] if e.args else None
    return isinstance(err, KafkaError) and (
        err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
        or "fenced" in str(err).lower())


def _fatal_cause(producer, e: Exception) -> Exception:
    """What made ``producer`` fail for good, when ``e`` says only that it has (``produce`` on a producer hit by
    a fatal error raises ``_FATAL``, "Local: Fatal error"): confluent-kafka raises the cause (the producer was
    fenced, say) from the next ``poll``. ``e`` itself when it is not that or no cause comes."""
    from confluent_kafka import KafkaError, KafkaException

    err = e.args[0] if isinstance(e, KafkaException) and e.args else None
    if producer is None or not isinstance(err, KafkaError) or err.code() != KafkaError._FATAL:
        return e
    try:
        producer.poll(0.1)
    except KafkaException as cause:
        return cause
    return e


@dataclass(frozen=True)
class _Begin:
    """Where a run begins: the frontier and version to carry on with, and the snapshot to write first."""

    frontier: int
    version: int
    snapshot_at: int | None = None  # a new sink: write the collection AS OF here, at this ts, first


def _start(ctx: SinkContext, fresh: bool) -> _Begin:
    """Resume after the progress record, or start anew (checked for safety); take the read hold."""
    spec = ctx.spec
    progress = read_progress(ctx.kafka, spec.progress_topic, spec.name)
    if progress is not None and not fresh:
        lost = SinkRefused(spec.name, f"its progress record says frontier {progress.frontier}, but "
                           f"{spec.collection} was compacted past it (its read hold was released); it can only "
                           "start fresh (`--fresh`), writing a new snapshot")
        with ctx.connect() as conn:
            try:  # refused below since: frontier <= since means the shard was compacted past the frontier
                acquire_read_hold(conn, spec.collection, spec.holder, progress.frontier - 1)
            except SinceViolation:
                raise lost from None
        return _Begin(progress.frontier, progress.version)
    if progress is None and not fresh and topic_holds_data(ctx.kafka, spec.kafka.topic, check_group(spec.name),
                                                         f"sink {spec.name}"):
        raise SinkRefused(spec.name, f"topic {spec.kafka.topic} already holds data but the progress topic "
                          f"{spec.progress_topic} has no record for this sink: writing would duplicate; "
                          "start fresh (`--fresh`) to write a new snapshot anyway")
    version = (progress.version + 1) if progress is not None else 1
    for _ in range(10):
        with ctx.connect() as conn:
            info = shard_info(conn, spec.collection)
            start = info.since if spec.start is None else spec.start
            try:
                acquire_read_hold(conn, spec.collection, spec.holder, start)
            except SinceViolation:
                if spec.start is not None:
                    raise SinkRefused(spec.name, f"start {spec.start} is below {spec.collection}'s since "
                                      f"{info.since}") from None
                continue  # since moved between the two statements: take the new one
        return _Begin(start, version, snapshot_at=start)
    raise SinkRefused(spec.name, f"{spec.collection}'s since kept moving; try again")


class KafkaSink:
    """A running instance of a sink: ``start`` once (fence older instances, find where to resume), then
    ``step`` as often as wanted (each writes what became complete since the last)."""

    def __init__(self, ctx: SinkContext) -> None:
        self.ctx = ctx
        self.client: kafka_client.Client | None = None
        self.producer = None
        self.begin: _Begin | None = None
        self.reported = False  # a `running` status row was written since start

    def _guard(self, fn, *args):
        """Run ``fn``; on failure record ``stalled`` with the cause (``SinkFenced`` when fenced; an ACL the
        principal lacks, named) and raise."""
        try:
            return fn(*args)
        except Exception as caught:
            e = _fatal_cause(self.producer, caught)
            err = SinkFenced(self.ctx.spec.name) if _fenced(e) else self._refused(e) or e
            if not isinstance(e, MigrationError):  # a schema not this release's takes no status row
                with self.ctx.connect() as conn:
                    record_status(conn, self.ctx.spec.name, "stalled", error=str(err))
            if err is not caught:
                raise err from None
            raise

    def _refused(self, e: Exception) -> ReclockError | None:
        """The ACL a producer error says the principal lacks: the transactional id's, or writing a topic."""
        if self.client is None:
            return None
        spec = self.ctx.spec
        return self.client.refused(e, "writing in a transaction", {
            "transactional id": ("WRITE", spec.transactional_id),
            "topic": ("WRITE", f"{spec.kafka.topic} (or {spec.progress_topic})"),
            "cluster": ("IDEMPOTENT_WRITE", "kafka-cluster")})

    def start(self, fresh: bool = False) -> None:
        def go() -> None:
            with self.ctx.connect() as conn:
                check_schema(conn, self.ctx.dsn)
            ensure_topics(self.ctx)
            self.client = _producer(self.ctx)
            self.producer = self.client.handle
            self.producer.init_transactions(60)  # fences older instances; their open transaction is aborted
            self.begin = _start(self.ctx, fresh)

        self._guard(go)

    def step(self) -> SinkResult:
        if self.begin is None:
            raise RuntimeError("start() the sink first")
        result = self._guard(_write, self.ctx, self.producer, self.begin)
        self.begin = _Begin(result.frontier, result.version)  # the snapshot, if any, is written
        if result.transactions or not self.reported:  # an idle step (--follow) adds no status rows
            with self.ctx.connect() as conn:
                record_status(conn, self.ctx.spec.name, "running")
            self.reported = True
        return result


def run_once(ctx: SinkContext, fresh: bool = False) -> SinkResult:
    """Start the sink and write every complete update of the collection not yet in the topic.

    Raises ``SinkRefused`` when starting could duplicate or skip data, ``SinkFenced`` when a newer
    instance took over. Records statistics (messages, bytes, frontier, lag behind the shard's upper) and
    a status row.
    """
    sink = KafkaSink(ctx)
    sink.start(fresh)
    return sink.step()


def updates(ctx: SinkContext, begin: _Begin, upper: int) -> Iterator[pa.Table]:
    """The consolidated updates to write, in ts order, as tables each sorted by ts: the snapshot first (a
    new sink: the collection AS OF ``snapshot_at``, at that ts), then the updates at
    ``frontier <= ts < upper``, a cluster of row groups at a time (:class:`reclock.read.UpdateReader`), so
    the first messages go out while later parts are still unread. A ts spans two tables only when the
    sink's format is unkeyed and nothing retracts: then no message depends on another. A collection whose
    schema evolved gives each update the schema in force at its ts (a table is cut where it changes:
    :meth:`reclock.read.UpdateReader.by_version`), so a message carries the columns of its time: a column
    dropped in the range up to the drop, and a column added again under a dropped one's name (another column)
    in a reader of its own from the re-add on."""
    spec = ctx.spec
    lower = begin.frontier
    snapshot = None
    with ctx.connect() as conn:
        if begin.snapshot_at is not None and begin.snapshot_at < upper:
            snap = read_as_of(conn, ctx.blob, spec.collection, begin.snapshot_at)
            if snap.num_rows and len(snap.column_names) > 1:
                snapshot = snap.append_column("ts", pa.array([begin.snapshot_at] * snap.num_rows, pa.int64()))
            lower = begin.snapshot_at + 1
        rows, upper = updates_parts(conn, spec.collection, lower, upper) if lower < upper else ([], upper)
        kind = shard_info(conn, spec.collection).kind
        history = load_history(conn, spec.collection)
        # a column added again under a dropped one's name is another column: one reader holds only one of them
        cuts = [v.since_ts for v in history.versions if lower < v.since_ts < upper
                and any(c.from_ts == v.since_ts for c in history.read_as(v.since_ts).columns)]
        bounds = [lower, *cuts, upper]
        ranges = [(lo, hi, updates_parts(conn, spec.collection, lo, hi)[0] if len(bounds) > 2 else rows)
                  for lo, hi in zip(bounds, bounds[1:])]
    readers = [UpdateReader(ctx.blob, spec.collection, r, lo, hi, kind, history=history, across=True)
               for lo, hi, r in ranges]
    if snapshot is not None:
        yield readers[0].conform(snapshot) if rows and readers[0].target is None else snapshot
    for reader in readers:
        for _, table in reader.by_version(reader.tables(split_ts=not spec.key)):
            yield consolidate(table)


ENCODE_CHUNK = 50_000
"""Rows per encoding chunk: the updates are read and encoded a chunk at a time on a helper thread (Arrow's
readers and kernels release the GIL) while the main thread produces the previous ones."""

ENCODE_AHEAD = 2
"""Encoded chunks the helper thread may hold ready before the producer takes them (bounds the memory)."""


def ts_chunks(table: pa.Table, rows: int = ENCODE_CHUNK) -> list[pa.Table]:
    """``table`` (sorted by ts) cut into slices of about ``rows`` rows, only where the ts changes, so no
    timestamp (and no key's updates at one timestamp) spans two slices."""
    import numpy as np

    ts = table["ts"].to_numpy()
    out, start = [], 0
    while start < len(ts):
        end = min(start + rows, len(ts))
        if end < len(ts):
            end = int(np.searchsorted(ts, ts[end - 1], side="right"))
        out.append(table.slice(start, end - start))
        start = end
    return out


def _encoded(ctx: SinkContext, begin: _Begin, upper: int) -> Iterator[list[TsRun]]:
    """The messages to write, in ts order, as the runs of one encoding chunk at a time."""
    for table in updates(ctx, begin, upper):
        for chunk in ts_chunks(table):
            yield encode_runs(ctx.spec, chunk)


def _write(ctx: SinkContext, producer, begin: _Begin) -> SinkResult:
    """Write the complete updates ``[frontier, upper)`` in transactions, streaming: the updates are read and
    encoded a chunk at a time on a helper thread while the main one produces; each message goes into a
    transaction begun at its first message; a transaction is cut at the first ts boundary after the budget
    is reached (a ts never spans two) and committed with the progress record of that ts. One Postgres
    connection serves the step's read-hold moves (a connection each would stall every commit ~15 ms)."""
    with ctx.connect() as conn:
        return _write_on(ctx, producer, begin, conn)


def _write_on(ctx: SinkContext, producer, begin: _Begin, conn) -> SinkResult:
    from itertools import repeat

    spec = ctx.spec
    frontier, version = begin.frontier, begin.version
    txns = messages = nbytes = 0
    upper = shard_info(conn, spec.collection).upper
    if upper < frontier:
        raise AcknowledgedStateLost(f"sink {spec.name}", f"its progress record says frontier {frontier}",
                                    f"{spec.collection} up to {upper}")
    t0 = time.monotonic()
    topic, produce = spec.kafka.topic, producer.produce
    max_messages, max_bytes = spec.budget.max_messages, spec.budget.max_bytes
    count = size = 0  # of the open transaction
    open_txn = False
    last_ts = None
    chunks = _ahead(_encoded(ctx, begin, upper), ENCODE_AHEAD, "sink-encode")
    try:
        for runs in chunks:
            for run in runs:  # one ts: a transaction is cut only between two timestamps
                if count and (count >= max_messages or size >= max_bytes) and run.ts != last_ts:
                    frontier = _commit(ctx, producer, conn, run.ts, version)
                    txns, messages, nbytes = txns + 1, messages + count, nbytes + size
                    count = size = 0
                    open_txn = False
                if not open_txn:
                    producer.begin_transaction()
                    open_txn = True
                headers = [(TS_HEADER, str(run.ts).encode())]
                keys = repeat(None) if run.keys is None else iter(run.keys)
                for values in run.value_lists():
                    for v, k in zip(values, keys):  # values first: zip stops there, taking no key
                        try:  # the hot loop: as bare as a plain producer's
                            produce(topic, v, k, headers=headers)
                        except BufferError:  # the local queue is full: let it drain
                            _produce_when_room(producer, topic, v, k, headers)
                count += len(run.values)
                size += run.nbytes
                last_ts = run.ts
                producer.poll(0)
    finally:
        chunks.close()
    # the last transaction carries the frontier up to the shard's upper (times without updates included)
    if upper > frontier:
        if not open_txn:
            producer.begin_transaction()
        frontier = _commit(ctx, producer, conn, upper, version)
        txns, messages, nbytes = txns + 1, messages + count, nbytes + size
    if txns:  # an idle step records nothing: a following sink steps many times a second
        upper_now = shard_info(conn, spec.collection).upper
        record_statistics(conn, spec.name, "sink", {
            "transactions": txns, "messages": messages, "bytes": nbytes, "frontier": frontier,
            "lag_ms": max(0, upper_now - frontier), "seconds": round(time.monotonic() - t0, 3)})
    return SinkResult(frontier, version, txns, messages, nbytes)


def _produce_when_room(producer, topic: str, value, key, headers) -> None:
    while True:
        producer.poll(0.05)
        try:
            producer.produce(topic, value, key, headers=headers)
            return
        except BufferError:
            continue


def _commit(ctx: SinkContext, producer, conn, new_frontier: int, version: int) -> int:
    """Close the open transaction: add the progress record ``new_frontier`` and commit (the messages and
    the record become visible together, or neither), then move the read hold to ``new_frontier - 1``."""
    spec = ctx.spec
    failpoint("sink:in_transaction")
    producer.produce(spec.progress_topic, key=spec.name.encode(),
                     value=dumps({"frontier": [new_frontier], PROGRESS_VERSION_KEY: version}))
    producer.commit_transaction(max(30.0, spec.transaction_timeout_s))
    downgrade_read_hold(conn, spec.collection, spec.holder, new_frontier - 1)
    return new_frontier


def drop(ctx: SinkContext) -> bool:
    """Drop the sink: release its read hold (compaction may pass its frontier from now on). The topics
    keep their data; recreating the sink then needs ``--fresh``."""
    with ctx.connect() as conn:
        released = release_read_hold(conn, ctx.spec.collection, ctx.spec.holder)
        record_status(conn, ctx.spec.name, "paused", error="dropped: read hold released")
    return released
