"""The workload every contender reads: JSON records of ~200 bytes over 8 partitions, and the sizes.

One topic per backlog size, produced once with a batching confluent-kafka producer before anything is
timed; every contender then reads the same topic from offset 0 up to the same end offsets.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

PARTITIONS = 8
SCHEMA = "id BIGINT, customer STRING, amount DOUBLE, created_ms BIGINT, country STRING, note STRING"
"""The Spark DDL every contender decodes the values with (``from_json``, PERMISSIVE)."""
FIELDS = tuple(column.split()[0] for column in SCHEMA.split(","))

_COUNTRIES = ("DE", "FR", "NL", "US", "JP", "BR", "IN", "ZA")
_NOTE = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore"
_TEMPLATE = ('{"id":%d,"customer":"customer-%05d","amount":%d.%02d,"created_ms":%d,"country":"%s",'
             '"note":"%s"}')


@dataclass(frozen=True)
class Size:
    """The backlogs of one ``--size``: ``base`` is the 1x backlog, ``small`` and ``large`` show how cost grows."""

    name: str
    small: int
    base: int
    large: int
    state_cycles: int  # cycles of the state-size run

    def backlogs(self) -> dict[str, int]:
        return {"small": self.small, "base": self.base, "large": self.large}


SIZES = {
    "tiny": Size("tiny", small=1_000, base=5_000, large=20_000, state_cycles=10),
    "quick": Size("quick", small=20_000, base=200_000, large=1_000_000, state_cycles=100),
    "standard": Size("standard", small=100_000, base=1_000_000, large=5_000_000, state_cycles=1000),
    "full": Size("full", small=500_000, base=5_000_000, large=50_000_000, state_cycles=1000),
}


@dataclass(frozen=True)
class Backlog:
    """A produced topic: ``records`` values totalling ``value_bytes``; partition -> end offset in ``ends``."""

    label: str
    topic: str
    records: int
    value_bytes: int
    ends: dict[int, int]

    @property
    def megabytes(self) -> float:
        return self.value_bytes / 1e6


def record(i: int, created_ms: int) -> bytes:
    """Record ``i`` as ~200 bytes of JSON."""
    return (_TEMPLATE % (i, i % 50_000, (i * 7919) % 100_000, i % 100, created_ms,
                         _COUNTRIES[i % len(_COUNTRIES)], _NOTE)).encode()


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


def fast_producer(bootstrap: str):
    """A producer tuned for bulk loading: large batches, long linger, a deep queue, leader acks."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                     "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 1_048_576,
                     "acks": "1", "enable.idempotence": False, "log_level": 2})


def produce_backlog(bootstrap: str, label: str, topic: str, records: int, keys: int | None = None,
                    start: int = 0) -> Backlog:
    """Create ``topic`` with :data:`PARTITIONS` partitions and fill it with ``records`` records, round robin;
    with ``keys``, record ``i`` has the key ``k<i % keys>`` (so an upsert source's later records of a key
    retract its earlier ones). With ``start``, the topic exists and holds records ``0 .. start - 1``: records
    ``start ..`` are added.

    Checks afterwards that the partitions' end offsets add up to ``start + records`` (nothing lost)."""
    if start == 0:
        create_topic(bootstrap, topic)
    producer = fast_producer(bootstrap)
    produce = producer.produce
    total = 0
    created = int(time.time() * 1000)
    for i in range(start, start + records):
        value = record(i, created)
        key = None if keys is None else b"k%d" % (i % keys)
        total += len(value)
        try:
            produce(topic, value, key, partition=i % PARTITIONS)
        except BufferError:
            producer.poll(0.1)
            produce(topic, value, key, partition=i % PARTITIONS)
        if i % 50_000 == 0:
            producer.poll(0)
    if producer.flush(600) != 0:
        raise RuntimeError(f"topic {topic}: messages still queued after 10 minutes of flushing")
    ends = end_offsets(bootstrap, topic)
    if sum(ends.values()) != start + records:
        raise RuntimeError(f"topic {topic}: produced {start + records} records but the end offsets add up to "
                           f"{sum(ends.values())}")
    return Backlog(label, topic, records, total, ends)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> end offset (what a ``read_committed`` reader can read up to)."""
    from reclock.sources.kafka.upstream import KafkaUpstream

    return KafkaUpstream("benchmark", bootstrap, topic).probe_upper().as_dict()
