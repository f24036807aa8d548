"""The Kafka upstream: probe the upper, check retention, commit the offset resumption frontier.

All reads of progress use ``read_committed`` semantics: the upper of a partition is its *last stable
offset*, so an open or aborted transaction never lets a binding pass data that is not yet readable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from reclock import kafka_client
from reclock.errors import ReclockError, UpstreamDataLost
from reclock.kafka_client import KafkaClientConfig
from reclock.sources.kafka.topics import slot, topic_partition
from reclock.time import PartitionedFrontier


_COORDINATOR_SETTLING = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                   KafkaError.COORDINATOR_NOT_AVAILABLE})


class UpstreamUnavailable(ReclockError):
    """The broker cannot be reached or the topic does not exist."""


def listed_offsets(source: str, topics: tuple[str, ...], listed: dict[tuple[str, int], int]) -> dict[int, int]:
    """The offsets a ``list_offsets`` call gave per ``(topic, partition)``, as the source's frontier partitions
    (``reclock.sources.kafka.topics.slot``). An offset below 0 is no position (the broker answered without
    one, as during a leader election): ``UpstreamUnavailable`` naming the partition, never a frontier or a
    retention check made of it."""
    out: dict[int, int] = {}
    for (topic, partition), offset in listed.items():
        if offset < 0:
            raise UpstreamUnavailable(f"source {source}: listing offsets gave {offset} for {topic} partition "
                                      f"{partition} (no position: its leader may be moving); try again")
        out[slot(topics.index(topic), partition)] = offset
    return out


@dataclass
class KafkaUpstream:
    """A Kafka source's topic on its cluster (``kafka``: its connection's settings, or the address of an
    unsecured cluster). A call the principal has no ACL for raises
    :class:`~reclock.errors.KafkaAccessDenied` naming the operation and the resource; a refused login
    :class:`~reclock.errors.KafkaAuthenticationFailed`."""

    source: str
    kafka: KafkaClientConfig | str
    topic: str
    timeout: float = 15.0
    topics: tuple[str, ...] = ()  # a source over several topics (``topic`` unused): frontiers over all of
    #                               them, topic i's partition p as ``reclock.sources.kafka.topics.slot(i, p)``
    transaction_topic: str | None = None  # Debezium's transaction topic (the last of ``topics``), if read
    _client: kafka_client.Client | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.kafka = kafka_client.client_config(self.kafka)
        if not self.topics:
            self.topics = (self.topic,)

    def _tp(self, frontier_partition: int, offset: int | None = None) -> TopicPartition:
        i, p = topic_partition(frontier_partition)
        return TopicPartition(self.topics[i], p) if offset is None else TopicPartition(self.topics[i], p, offset)

    def _all_partitions(self) -> list[int]:
        """Every topic's partitions, as the frontier's partitions."""
        if len(self.topics) == 1:
            return self.partitions()
        return [slot(i, p) for i, t in enumerate(self.topics) for p in self.partitions(t)]

    @property
    def config(self) -> KafkaClientConfig:
        return kafka_client.client_config(self.kafka)

    def _admin(self) -> kafka_client.Client:
        """One admin client for this upstream's calls: each new one connects and fetches metadata anew."""
        if self._client is None:
            self._client = kafka_client.admin(self.config, f"source {self.source}",
                                              {"socket.connection.setup.timeout.ms": 5000})
        return self._client

    def _denied(self, e, doing: str, needs) -> ReclockError | None:
        return self._admin().refused(e, doing, needs)

    def partitions(self, topic: str | None = None) -> list[int]:
        """The partitions of ``topic`` (default: the source's topic); raises ``UpstreamUnavailable`` naming the
        source, the topic and the cause."""
        topic = self.topics[0] if topic is None else topic
        try:
            md = self._admin().metadata(topic, self.timeout)  # synchronous
        except KafkaException as e:
            raise UpstreamUnavailable(f"source {self.source}: Kafka at {self.config.describe()} is unreachable: "
                                      f"{e}") from e
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            if t is not None and t.error.code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                          KafkaError._UNKNOWN_TOPIC):
                raise self._denied(t.error, "reading the topic's metadata", {"topic": ("DESCRIBE", topic)}) \
                    or UpstreamUnavailable(f"source {self.source}: topic {topic!r}: {t.error}")
            where = ("`transaction_topic` (Debezium writes it with provide.transaction.metadata=true, as "
                     "<topic.prefix>.transaction)" if topic == self.transaction_topic
                     else "`kafka.topic`" if len(self.topics) == 1 else "the source's `topics:`")
            raise UpstreamUnavailable(
                f"source {self.source}: topic {topic!r} does not exist on {self.config.bootstrap} "
                f"(create it, or fix {where} in the source config)")
        return sorted(t.partitions)

    def _list_offsets(self, spec_factory) -> dict[int, int]:
        from confluent_kafka import IsolationLevel

        parts = self._all_partitions()
        req = {self._tp(p): spec_factory() for p in parts}
        try:
            futs = self._admin().handle.list_offsets(req, isolation_level=IsolationLevel.READ_COMMITTED,
                                                     request_timeout=self.timeout)
            return listed_offsets(self.source, self.topics,
                                  {(tp.topic, tp.partition): fut.result(timeout=self.timeout + 5).offset
                                   for tp, fut in futs.items()})
        except KafkaException as e:
            names = ", ".join(self.topics)
            raise self._denied(e, "listing offsets", {"topic": ("DESCRIBE", names)}) or UpstreamUnavailable(
                f"source {self.source}: listing offsets of {names!r} failed: {e}") from e

    def probe_upper(self) -> PartitionedFrontier:
        """Per-partition last stable offsets (what a ``read_committed`` consumer can read up to)."""
        return PartitionedFrontier.of(self._list_offsets(OffsetSpec.latest))

    def earliest(self) -> dict[int, int]:
        """Per-partition earliest offsets still held upstream (retention may have moved them)."""
        return self._list_offsets(OffsetSpec.earliest)

    def check_retained(self, needed_from: PartitionedFrontier, needed_until: PartitionedFrontier) -> None:
        """Raise ``UpstreamDataLost`` if any needed offset range starts before what upstream still holds."""
        earliest = self.earliest()
        for p, until in needed_until:
            start = needed_from.get(p)
            if until > start and earliest.get(p, 0) > start:
                raise UpstreamDataLost(self.source, p, start, until, earliest[p])

    def commit(self, group: str, frontier: PartitionedFrontier) -> None:
        """Commit ``frontier`` (next offsets) to ``group`` so every standard lag tool sees our progress."""
        if frontier.is_minimum():
            return
        client = kafka_client.consumer(self.config, f"source {self.source}",
                                       {"group.id": group, "enable.auto.commit": False})
        try:
            client.handle.commit(offsets=[self._tp(p, o) for p, o in frontier], asynchronous=False)
        except KafkaException as e:
            needs = {"group": ("READ", group), "topic": ("READ", ", ".join(self.topics))}
            raise client.refused(e, f"committing offsets to group {group}", needs) or UpstreamUnavailable(
                f"source {self.source}: committing offsets to group {group} failed: {e}") from e
        finally:
            client.handle.close()

    def acknowledged(self, group: str) -> PartitionedFrontier:
        """What resume has acknowledged upstream: ``group``'s committed offsets."""
        return self.committed(group)

    def committed(self, group: str) -> PartitionedFrontier:
        """The offsets ``group`` has committed (absent partitions at 0).

        A group's coordinator moves (a new group, a broker restarting, a leader election): the broker answers
        ``NOT_COORDINATOR`` or ``COORDINATOR_LOAD_IN_PROGRESS`` until it settles, so those are retried until
        ``timeout``; then ``UpstreamUnavailable`` names the group and the last error."""
        parts = [self._tp(p) for p in self._all_partitions()]
        deadline = time.monotonic() + self.timeout
        client = kafka_client.consumer(self.config, f"source {self.source}",
                                       {"group.id": group, "enable.auto.commit": False})
        try:
            while True:
                try:
                    tps = client.handle.committed(parts, timeout=max(1.0, deadline - time.monotonic()))
                    break
                except KafkaException as e:
                    err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                    if err is None or err.code() not in _COORDINATOR_SETTLING or time.monotonic() >= deadline:
                        refused = client.refused(e, f"reading group {group}'s offsets", {"group": ("DESCRIBE", group)})
                        if refused is not None:
                            raise refused from e
                        raise UpstreamUnavailable(f"source {self.source}: reading the offsets group {group} "
                                                  f"committed failed: {e}") from e
                    time.sleep(0.5)
        finally:
            client.handle.close()
        return PartitionedFrontier.of((slot(self.topics.index(tp.topic), tp.partition), tp.offset)
                                      for tp in tps if tp.offset >= 0)
