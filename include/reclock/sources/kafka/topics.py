"""A Kafka source over several topics (``topics:``): one frontier over every topic's partitions.

The remap collection, its progress view and every frontier of a Kafka source map a *partition* to its next
offset (``reclock.time.PartitionedFrontier``). A source over several topics keeps that shape: topic ``i``
(its position in the config's ``topics:``) and its partition ``p`` are the frontier's partition
``i * PARTITION_SPAN + p``. Topic 0's partitions are their own numbers, so a source over one topic has the
frontier it always had. The topics' order is the source's: ``reclock.sources.kafka.kind`` records it at
registration and refuses a config that removes or reorders a topic (a topic may be added at the end).

Laws (tests/unit/test_kafka_topics_law.py): :func:`slot` and :func:`topic_partition` are inverse;
:func:`split` then :func:`join` is the identity; a frontier's per-topic parts are disjoint.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

from reclock.batch import OffsetRange
from reclock.spark.reclocking import BindingRange
from reclock.specs import SourceSpec
from reclock.time import PartitionedFrontier

PARTITION_SPAN = 100_000
"""Topic ``i``'s partition ``p`` is the frontier's partition ``i * PARTITION_SPAN + p`` (readable in the
progress view: topic 1's partition 3 is 100003). A topic of more partitions is refused."""


def slot(topic_index: int, partition: int) -> int:
    """The frontier's partition of ``partition`` of the source's topic ``topic_index``."""
    if not 0 <= partition < PARTITION_SPAN:
        raise ValueError(f"a topic of a source over several topics has at most {PARTITION_SPAN} partitions "
                         f"(partition {partition})")
    if topic_index < 0:
        raise ValueError(f"topic index must be >= 0, got {topic_index}")
    return topic_index * PARTITION_SPAN + partition


def topic_partition(frontier_partition: int) -> tuple[int, int]:
    """``(topic index, partition)`` of one of the frontier's partitions (:func:`slot`'s inverse)."""
    return divmod(frontier_partition, PARTITION_SPAN)


def split(frontier: PartitionedFrontier, topics: int) -> list[PartitionedFrontier]:
    """The frontier's part of each of ``topics`` topics, in the topic's own partitions. A partition of a
    topic index >= ``topics`` is a ``ValueError`` (a frontier of topics the config no longer names)."""
    parts: list[dict[int, int]] = [{} for _ in range(topics)]
    for p, o in frontier:
        i, q = topic_partition(p)
        if i >= topics:
            raise ValueError(f"frontier partition {p} is partition {q} of topic #{i}; the source has {topics} "
                             "topic(s)")
        parts[i][q] = o
    return [PartitionedFrontier.of(d) for d in parts]


def join(per_topic: Iterable[Mapping[int, int] | PartitionedFrontier]) -> PartitionedFrontier:
    """One frontier of the topics' own frontiers (topic ``i`` the ``i``-th)."""
    out: dict[int, int] = {}
    for i, f in enumerate(per_topic):
        for p, o in (f.items() if isinstance(f, Mapping) else f):
            out[slot(i, p)] = o
    return PartitionedFrontier.of(out)


def topic_specs(spec: SourceSpec) -> tuple[SourceSpec, ...]:
    """Each topic's own spec, in the source's topic order: a source over one topic is its own; a source over
    several has one per topic, named by the topic's collection (``<source>__<collection>``: its
    ``data_shard``, ``errors_shard`` and read group), reading that topic with that table's row schema."""
    kafka = spec.upstream
    if not kafka.tables:
        return (spec,)
    return tuple(dataclasses.replace(spec, name=t.shard(spec.name), upstream=dataclasses.replace(
        kafka, topic=t.topic, tables=()), format=dataclasses.replace(spec.format, schema=t.schema))
        for t in kafka.tables)


def by_topic(ranges: Sequence[OffsetRange], bindings: Sequence[BindingRange], topics: int
             ) -> list[tuple[list[OffsetRange], list[BindingRange]]]:
    """A description's ranges and bindings (over the frontier's partitions) per topic, in the topic's own
    partitions."""
    out: list[tuple[list[OffsetRange], list[BindingRange]]] = [([], []) for _ in range(topics)]
    for r in ranges:
        i, p = topic_partition(r.partition)
        out[i][0].append(OffsetRange(p, r.start, r.end))
    for b in bindings:
        i, p = topic_partition(b.partition)
        out[i][1].append(BindingRange(p, b.start, b.end, b.ts))
    return out


def state_key(namespace: bytes | None, key: bytes) -> bytes:
    """A key as the upsert state keeps it: a source over several topics keeps each topic's keys apart (two
    tables have keys of the same value) under its collection's name and a zero byte."""
    return key if namespace is None else namespace + b"\0" + key
