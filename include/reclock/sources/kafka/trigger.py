"""A Kafka source's ``schedule: upstream`` trigger: :class:`UpstreamMoved` fires when the topic's last stable
offsets (what a ``read_committed`` reader can read) moved past what the source has bound (the offsets of
its newest binding, in Postgres). A source over several topics (``topics:``) is watched on all of them, in the
frontier's partitions (``reclock.sources.kafka.topics.join``): any topic ahead of the binding fires. Mint binds those offsets, so the trigger stays quiet until upstream moves
again: no data, no runs.

One probe per Kafka cluster serves every source on it: the triggers of one cluster share one poll loop in the
triggerer (``shared_stream_key``), which lists every topic's offsets with one ``list_offsets`` call a ``poll``
and fans the snapshot out; each trigger then compares its own topic with its own source's bound frontier
(one small query, only when its topic's offsets changed). The probe is an admin client: it never joins,
consumes or commits under any consumer group. The trigger's arguments hold no secret (the brokers and the
consensus DSN are found in the triggerer, as every task finds them).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Hashable, Mapping, Sequence

from airflow.triggers.base import TriggerEvent

from reclock.sources.kafka.topics import join
from reclock.sources.trigger import REFIRE_S, SharedProbeTrigger, bound_frontier

log = logging.getLogger(__name__)

CLASSPATH = "reclock.sources.kafka.trigger.UpstreamMoved"


def admin_client(kafka, what: str = "trigger"):
    """An admin client for the cluster ``kafka`` (a ``KafkaClientConfig``, or an unsecured cluster's
    address)."""
    from reclock import kafka_client

    return kafka_client.admin(kafka_client.client_config(kafka), what).handle


def cluster_offsets(admin, timeout: float = 10.0) -> dict[str, dict[int, int]]:
    """Topic -> partition -> last stable offset, for every topic of ``admin``'s cluster (internal ones aside),
    from one metadata request and one ``list_offsets`` call; a partition the answer gives no position for
    (offset -1) is left out."""
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
        offset = fut.result(timeout=timeout + 5).offset
        if offset >= 0:  # -1: no position in this answer (a leader election); the next probe has it
            out[tp.topic][tp.partition] = offset
    return out


class UpstreamMoved(SharedProbeTrigger):
    """Fires when ``topic`` (or any of ``topics``) on ``bootstrap`` holds records beyond ``source``'s newest
    binding.

    If upstream is ahead of the newest binding and stays so (a run failed for good, and upstream is quiet
    now), it fires again every :data:`REFIRE_S`, so data never waits for upstream to move again.

    :param source: the Reclock source.
    :param topic: its Kafka topic; or
    :param topics: the topics of a source over several topics, in the source's order (its frontier's).
    :param connection: its Kafka Airflow connection, and ``bootstrap`` its brokers if the config gives them:
        found in the triggerer as a task finds them (``RECLOCK_BOOTSTRAP``, ``bootstrap``, the connection);
        the triggers of one cluster share a probe.
    :param poll: seconds between probes.
    """

    def __init__(self, *, source: str, topic: str | None = None, topics: Sequence[str] = (),
                 connection: str = "reclock_kafka", bootstrap: str | None = None, poll: float = 1.0) -> None:
        super().__init__()
        if (topic is None) == (not topics):
            raise ValueError(f"the upstream trigger of source {source} watches one `topic` or several `topics`")
        self.source, self.topic, self.topics = source, topic, tuple(topics)
        self.connection, self.bootstrap = connection, bootstrap
        self.poll = float(poll)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"source": self.source, "topic": self.topic, "topics": list(self.topics),
                           "connection": self.connection, "bootstrap": self.bootstrap, "poll": self.poll}

    def upper(self, snapshot: Mapping[str, dict[int, int]]) -> tuple[dict[int, int] | None, list[str]]:
        """The source's upstream frontier in ``snapshot`` (a probe's topic -> partition -> offset) and the
        topics it lacks: a source over several topics in its frontier's partitions (topic ``i``'s partition
        ``p`` is ``i * PARTITION_SPAN + p``). ``None`` while a topic is missing: a frontier without it would
        read as "nothing there" for its partitions."""
        if not self.topics:
            found = snapshot.get(self.topic)
            return found, [] if found is not None else [self.topic]
        missing = [t for t in self.topics if t not in snapshot]
        if missing:
            return None, missing
        return dict(join(snapshot[t] for t in self.topics)), []

    def shared_stream_key(self) -> Hashable | None:
        return ("reclock-kafka-offsets", self.bootstrap or f"connection:{self.connection}", self.poll)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One probe loop per cluster: every topic's last stable offsets, every ``poll`` seconds. A probe that
        fails (the broker away) is logged and retried; the loop never ends by itself."""
        from reclock.settings import find_kafka
        from reclock.specs import KafkaSpec

        spec = KafkaSpec(topic=kwargs.get("topic") or kwargs["topics"][0], connection=kwargs["connection"],
                         bootstrap=kwargs["bootstrap"])
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
        """This source's events: its topics' offsets changed since the last look and some partition is beyond
        the source's newest binding."""
        from reclock.settings import find_dsn

        dsn = await asyncio.to_thread(find_dsn, None)
        seen: dict[int, int] | None = None
        fired = 0.0
        missing_logged = False
        loop = asyncio.get_running_loop()
        async for snapshot in shared_stream:
            upper, missing = self.upper(snapshot)
            if upper is None:
                if not missing_logged:
                    self.log.warning("reclock: topic %s of source %s is not on %s, or its principal may not "
                                     "DESCRIBE it (an ACL is missing)", ", ".join(missing), self.source,
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
