"""Event-driven cycles: ``ingest__<source>`` runs when its upstream moves, not on a clock.

A source with ``schedule: upstream`` is scheduled on an Asset (``reclock-upstream://<source>``) with a
watcher whose trigger fires when the source has something to do:

- **Kafka** (:class:`UpstreamMoved`): the topic's last stable offsets (what a ``read_committed`` reader can
  read) moved past what the source has bound (the offsets of its newest binding, in Postgres). Mint binds
  those offsets, so the trigger stays quiet until upstream moves again: no data, no runs.
- **Postgres** (:class:`PublicationChanged`): a transaction that changed a published table committed at or
  after the slot's position (one transaction peeked from a temporary copy of the slot, so the probe never
  waits for, blocks or moves the slot a cycle uses); or the source is idle but the WAL behind its slot
  passed :data:`IDLE_WAL_BYTES` or its newest binding is :data:`IDLE_S` old while the flush LSN moved, so
  the cycle's resume releases that WAL (an idle source never pins WAL); or it has no binding yet (the first
  cycle takes the snapshot).

One probe per Kafka cluster serves every source on it: the triggers of one cluster share one poll loop in the
triggerer (``shared_stream_key``), which lists every topic's offsets with one ``list_offsets`` call a ``poll``
and fans the snapshot out; each trigger then compares its own topic with its own source's bound frontier
(one small query, only when its topic's offsets changed). Likewise one probe per upstream Postgres reads its
flush LSN a ``poll``, and a source looks at its slot only when the flush LSN moved (nothing was written, so
nothing can be pending). The Kafka probe is an admin client: it never joins, consumes or commits under any
consumer group. The triggers' arguments hold no secret (the DSNs are found in the triggerer, as every task
finds them). A source that stays behind (a run failed for good, or an error a run reports: a lost slot, a
missing publication) is fired for again every :data:`REFIRE_S`, so data never waits for upstream to move.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Hashable

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

log = logging.getLogger(__name__)

CLASSPATH = "reclock.orchestration.triggers.UpstreamMoved"
PG_CLASSPATH = "reclock.orchestration.triggers.PublicationChanged"
KINESIS_CLASSPATH = "reclock.orchestration.triggers.KinesisMoved"
REFIRE_S = 60.0
"""A source still behind its upstream this long after the trigger fired is fired for again."""
IDLE_S = 60.0
"""A Postgres source without changes runs a cycle once its newest binding is this old and WAL was written
since, so its slot follows the flush LSN and WAL is released."""
IDLE_WAL_BYTES = 16 << 20
"""... or as soon as this much WAL lies behind its slot."""


def upstream_asset_uri(source: str) -> str:
    return f"reclock-upstream://{source}"


def admin_client(kafka, what: str = "trigger"):
    """An admin client for the cluster ``kafka`` (a ``KafkaClientConfig``, or an unsecured cluster's
    address)."""
    from reclock import kafka_client

    return kafka_client.admin(kafka_client.client_config(kafka), what).handle


def cluster_offsets(admin, timeout: float = 10.0) -> dict[str, dict[int, int]]:
    """Topic -> partition -> last stable offset, for every topic of ``admin``'s cluster (internal ones aside),
    from one metadata request and one ``list_offsets`` call."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    md = admin.list_topics(timeout=timeout)
    parts = [TopicPartition(t, p) for t, tm in md.topics.items() if not t.startswith("__") and tm.error is None
             for p in tm.partitions]
    out: dict[str, dict[int, int]] = {t: {} for t in {tp.topic for tp in parts}}
    if not parts:
        return out
    futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in parts},
                                 isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
    for tp, fut in futures.items():
        out[tp.topic][tp.partition] = fut.result(timeout=timeout + 5).offset
    return out


def newest_binding(dsn: str, source: str) -> tuple[int, dict[int, int]] | None:
    """The timestamp and offsets of ``source``'s newest binding (None before its first)."""
    from reclock.persist import connect

    with connect(dsn) as conn:
        row = conn.execute("SELECT max(ts) FROM reclock.remap_bindings WHERE source = %s", (source,)).fetchone()
        if row is None or row[0] is None:
            return None
        rows = conn.execute('SELECT partition, "offset" FROM reclock.remap_offsets WHERE source = %s AND ts = %s',
                            (source, row[0])).fetchall()
        return row[0], {p: int(o) for p, o in rows}  # offsets are numeric: exact ints


def bound_frontier(dsn: str, source: str) -> dict[int, int]:
    """The offsets of ``source``'s newest binding (empty before its first)."""
    newest = newest_binding(dsn, source)
    return {} if newest is None else newest[1]


class _SharedProbe(BaseEventTrigger):
    """A trigger fed by a probe that the triggers of one upstream share (``shared_stream_key``,
    ``open_shared_stream``); ``filter_shared_stream`` picks its own source's events."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The same events, with a probe of its own (when the triggerer does not share streams)."""
        async for event in self.filter_shared_stream(type(self).open_shared_stream(self.serialize()[1])):
            yield event


class UpstreamMoved(_SharedProbe):
    """Fires when ``topic`` on ``bootstrap`` holds records beyond ``source``'s newest binding.

    If upstream is ahead of the newest binding and stays so (a run failed for good, and upstream is quiet
    now), it fires again every :data:`REFIRE_S`, so data never waits for upstream to move again.

    :param source: the Reclock source.
    :param topic: its Kafka topic.
    :param connection: its Kafka Airflow connection, and ``bootstrap`` its brokers if the config gives them:
        found in the triggerer as a task finds them (``RECLOCK_BOOTSTRAP``, ``bootstrap``, the connection);
        the triggers of one cluster share a probe.
    :param poll: seconds between probes.
    """

    def __init__(self, *, source: str, topic: str, connection: str = "reclock_kafka", bootstrap: str | None = None,
                 poll: float = 1.0) -> None:
        super().__init__()
        self.source, self.topic, self.connection, self.bootstrap = source, topic, connection, bootstrap
        self.poll = float(poll)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"source": self.source, "topic": self.topic, "connection": self.connection,
                           "bootstrap": self.bootstrap, "poll": self.poll}

    def shared_stream_key(self) -> Hashable | None:
        return ("reclock-kafka-offsets", self.bootstrap or f"connection:{self.connection}", self.poll)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One probe loop per cluster: every topic's last stable offsets, every ``poll`` seconds. A probe that
        fails (the broker away) is logged and retried; the loop never ends by itself."""
        from reclock.config import KafkaSpec
        from reclock.settings import find_kafka

        spec = KafkaSpec(topic=kwargs["topic"], connection=kwargs["connection"], bootstrap=kwargs["bootstrap"])
        kafka = await asyncio.to_thread(find_kafka, spec, f"source {kwargs['source']}")
        poll = float(kwargs["poll"])
        admin = admin_client(kafka, f"the upstream trigger of {kafka.describe()}")  # reconnects by itself
        while True:
            try:
                yield await asyncio.to_thread(cluster_offsets, admin)
            except Exception as e:  # noqa: BLE001 - a broker restart must not end the watch
                log.warning("reclock: probing %s failed: %s; retrying in %ss", kafka.describe(), e, poll)
            await asyncio.sleep(poll)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This source's events: its topic's offsets changed since the last look and some partition is beyond
        the source's newest binding."""
        from reclock.settings import find_dsn

        dsn = await asyncio.to_thread(find_dsn, None)
        seen: dict[int, int] | None = None
        fired = 0.0
        missing_logged = False
        loop = asyncio.get_running_loop()
        async for snapshot in shared_stream:
            upper = snapshot.get(self.topic)
            if upper is None:
                if not missing_logged:
                    self.log.warning("reclock: topic %s of source %s is not on %s, or its principal may not "
                                     "DESCRIBE it (an ACL is missing)", self.topic, self.source,
                                     self.bootstrap or f"connection {self.connection}")
                    missing_logged = True
                continue
            missing_logged = False
            if upper == seen and (not fired or loop.time() - fired < REFIRE_S):
                continue
            try:
                bound = await asyncio.to_thread(bound_frontier, dsn, self.source)
            except Exception as e:  # noqa: BLE001 - Postgres away for a moment: look again at the next probe
                self.log.warning("reclock: reading %s's bindings failed: %s", self.source, e)
                continue
            seen = upper
            fired = 0.0
            ahead = {p: o for p, o in upper.items() if o > bound.get(p, 0)}
            if ahead:
                fired = loop.time()
                yield TriggerEvent({"source": self.source, "upper": {str(p): o for p, o in upper.items()},
                                    "bound": {str(p): o for p, o in bound.items()}})


@dataclass(frozen=True)
class RunReason:
    """Why a Postgres source should run a cycle now: ``reason`` in words, its slot's confirmed position
    ``slot`` (None before the first binding), and whether it is ``news`` (fired for at once when the slot
    moved since the last event) or a standing condition fired for only every :data:`REFIRE_S`."""

    reason: str
    slot: int | None
    news: bool = True


def why_run(upstream, consensus_dsn: str, now_ms: int, idle_s: float = IDLE_S) -> RunReason | None:
    """Why Postgres source ``upstream.source`` should run a cycle now (None: nothing to do). Errors a run
    would report (``SlotLost``, ``PublicationMissing``) are raised. Without a free replication slot for the
    probe's copy, the source runs every :data:`REFIRE_S` (its cycles need no extra slot)."""
    from psycopg.errors import ConfigurationLimitExceeded

    newest = newest_binding(consensus_dsn, upstream.source)
    if newest is None:
        return RunReason("no binding yet: the first cycle takes the snapshot", None)
    ts, offsets = newest
    with upstream.connect() as conn:
        state = upstream.healthy_slot(conn)
        slot = state.confirmed_flush
        if slot < offsets.get(0, 0):
            return RunReason("the slot is behind the newest binding (a cycle is under way, or failed)", slot, False)
        try:
            pending = upstream.pending_changes(conn)
        except ConfigurationLimitExceeded:  # max_replication_slots: no room for the copy; run now and then
            return RunReason("no replication slot free for the probe's copy of the slot", slot, False)
        if pending:
            return RunReason("the publication has changes", slot)
        behind = upstream.flush_lsn(conn) - slot
    if behind >= IDLE_WAL_BYTES or (behind > 0 and now_ms - ts >= idle_s * 1000):
        return RunReason(f"idle: {behind} bytes of WAL behind the slot to release", slot)
    return None


class PublicationChanged(_SharedProbe):
    """Fires when Postgres source ``source`` has a cycle to run (:func:`why_run`): changes to its publication
    committed at or after its slot's position, WAL to release while idle, or no binding yet.

    A reason found again at the slot position last fired at (the run it fired is still under way), or a
    standing one (the slot behind the newest binding, an error a run reports), is fired for again only every
    :data:`REFIRE_S`.

    :param source: the Reclock source.
    :param publication: its publication.
    :param connection: its upstream's Airflow connection, or ``dsn_env`` the environment variable holding
        the DSN (found in the triggerer as a task finds them); the triggers of one upstream share a probe.
    :param poll: seconds between probes of the flush LSN.
    :param idle: seconds after which an idle source's newest binding is renewed, to release WAL.
    """

    def __init__(self, *, source: str, publication: str, connection: str | None = None,
                 dsn_env: str | None = None, poll: float = 1.0, idle: float = IDLE_S) -> None:
        super().__init__()
        self.source, self.publication, self.connection, self.dsn_env = source, publication, connection, dsn_env
        self.poll, self.idle = float(poll), float(idle)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return PG_CLASSPATH, {"source": self.source, "publication": self.publication,
                              "connection": self.connection, "dsn_env": self.dsn_env, "poll": self.poll,
                              "idle": self.idle}

    def shared_stream_key(self) -> Hashable | None:
        return ("reclock-pg-flush", self.connection, self.dsn_env, self.poll)

    @staticmethod
    def _upstream_dsn(kwargs: dict[str, Any]) -> str:
        from reclock.config import PostgresSpec
        from reclock.settings import find_upstream_dsn

        spec = PostgresSpec(publication=kwargs["publication"], connection=kwargs["connection"],
                            dsn_env=kwargs["dsn_env"])
        return find_upstream_dsn(spec, f"source {kwargs['source']}")

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One probe loop per upstream: its flush LSN, every ``poll`` seconds. A probe that fails (the server
        away) is logged and retried; the loop never ends by itself."""
        from reclock.sources.postgres.upstream import PostgresUpstream

        dsn = await asyncio.to_thread(cls._upstream_dsn, kwargs)
        probe = PostgresUpstream(kwargs["source"], dsn, kwargs["publication"])
        poll = float(kwargs["poll"])
        conn = None
        while True:
            try:
                if conn is None or conn.closed:
                    conn = await asyncio.to_thread(probe.connect)
                yield await asyncio.to_thread(probe.flush_lsn, conn)
            except Exception as e:  # noqa: BLE001 - a server restart must not end the watch
                log.warning("reclock: probing the upstream of %s failed: %s; retrying in %ss", kwargs["source"], e,
                            poll)
                if conn is not None:
                    conn.close()
                conn = None
            await asyncio.sleep(poll)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This source's events: the flush LSN moved since the last look (or a refire is due) and
        :func:`why_run` gives a reason that was not fired for at this slot position already. While a fired
        reason stands at the same slot position (its run is under way), the slot is looked at every probe,
        so changes committed during the run fire as soon as its resume moves the slot."""
        import time

        from reclock.errors import ReclockError
        from reclock.settings import find_dsn
        from reclock.sources.postgres.upstream import PostgresUpstream, UpstreamUnavailable

        kwargs = self.serialize()[1]
        dsn = await asyncio.to_thread(find_dsn, None)
        upstream = PostgresUpstream(self.source, await asyncio.to_thread(self._upstream_dsn, kwargs),
                                    self.publication)
        loop = asyncio.get_running_loop()
        seen: int | None = None
        fired_at: float | None = None
        fired_slot: int | None = None
        async for flush in shared_stream:
            due = fired_at is None or loop.time() - fired_at >= REFIRE_S
            if flush == seen and not due:
                continue
            try:
                why = await asyncio.to_thread(why_run, upstream, dsn, int(time.time() * 1000), self.idle)
            except UpstreamUnavailable as e:
                self.log.warning("reclock: %s", e)
                continue
            except ReclockError as e:  # a run reports it (its status: stalled)
                why = RunReason(f"error: {e}", fired_slot, news=False)
            except Exception as e:  # noqa: BLE001 - Postgres away for a moment: look again at the next probe
                self.log.warning("reclock: looking at %s's slot failed: %s", self.source, e)
                continue
            if why is not None and not (due or (why.news and why.slot != fired_slot)):
                continue  # already fired for: look again at the next probe (the run under way moves the slot)
            seen = flush  # nothing to do, or fired for: nothing new until the flush LSN moves
            if why is None:
                continue
            fired_at, fired_slot = loop.time(), why.slot
            yield TriggerEvent({"source": self.source, "reason": why.reason, "flush_lsn": flush, "slot": why.slot})


class KinesisMoved(_SharedProbe):
    """Fires when Kinesis source ``source``'s stream holds something its next mint would bind: a record at or
    after the newest binding's position in a readable shard, or a closed shard's end still to be read
    (``reclock.sources.kinesis.probe.moved``: one small ``GetRecords`` per readable shard, every ``poll``;
    Kinesis tells no tip without a read). Fired for again every :data:`REFIRE_S` while it stays so.

    :param source: the Reclock source.
    :param stream: its stream, in ``region``, at ``endpoint_url`` (None: AWS's), found in the triggerer as a
        task finds them (``RECLOCK_KINESIS_ENDPOINT`` ...); credentials from the triggerer's AWS chain.
    :param poll: seconds between probes.
    """

    def __init__(self, *, source: str, stream: str, region: str | None = None, endpoint_url: str | None = None,
                 poll: float = 1.0) -> None:
        super().__init__()
        self.source, self.stream, self.region, self.endpoint_url = source, stream, region, endpoint_url
        self.poll = float(poll)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return KINESIS_CLASSPATH, {"source": self.source, "stream": self.stream, "region": self.region,
                                   "endpoint_url": self.endpoint_url, "poll": self.poll}

    def shared_stream_key(self) -> Hashable | None:
        return None  # each source probes its stream from its own frontier

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One probe of the stream from the source's newest binding every ``poll``: ``(moved, why)``. A probe
        that fails (the endpoint away, Postgres away) is logged and retried."""
        from reclock.settings import find_dsn
        from reclock.sources.kinesis.client import KinesisUpstream
        from reclock.sources.kinesis.config import KinesisSpec, find_stream
        from reclock.sources.kinesis.probe import moved

        spec = KinesisSpec(stream=kwargs["stream"], region=kwargs["region"], endpoint_url=kwargs["endpoint_url"])
        address = await asyncio.to_thread(find_stream, spec, f"source {kwargs['source']}")
        dsn = await asyncio.to_thread(find_dsn, None)
        upstream = KinesisUpstream(kwargs["source"], address, throttle_patience_s=5.0)
        poll = float(kwargs["poll"])
        while True:
            try:
                bound = await asyncio.to_thread(bound_frontier, dsn, kwargs["source"])
                yield await asyncio.to_thread(moved, upstream, bound)
            except Exception as e:  # noqa: BLE001 - the endpoint or Postgres away for a moment
                log.warning("reclock: probing Kinesis stream %s failed: %s; retrying in %ss", kwargs["stream"], e,
                            poll)
            await asyncio.sleep(poll)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        loop = asyncio.get_running_loop()
        fired = 0.0
        async for ahead, why in shared_stream:
            if not ahead:
                fired = 0.0
                continue
            if fired and loop.time() - fired < REFIRE_S:
                continue
            fired = loop.time()
            yield TriggerEvent({"source": self.source, "reason": why})


def upstream_asset(spec, trigger: BaseEventTrigger) -> Any:
    """The Asset ``ingest__<source>`` is scheduled on when the source's schedule is ``upstream``, watched by
    ``trigger`` (its kind's: ``SourceKind.upstream_trigger``)."""
    from airflow.sdk import Asset, AssetWatcher

    return Asset(name=f"upstream__{spec.name}", uri=upstream_asset_uri(spec.name),
                 watchers=[AssetWatcher(name=f"upstream__{spec.name}", trigger=trigger)])
