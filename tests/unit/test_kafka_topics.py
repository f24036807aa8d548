"""A Kafka source over several topics (``topics:``, envelope debezium): its config and every mistake in it
named; the frontier over all its topics (``reclock.sources.kafka.topics``) as laws."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.batch import OffsetRange
from reclock.config import parse_source
from reclock.errors import ConfigError
from reclock.sources.kafka.topics import (PARTITION_SPAN, by_topic, join, slot, split, state_key, topic_partition,
                                          topic_specs)
from reclock.spark.reclocking import BindingRange
from reclock.specs import TopicTable
from reclock.time import PartitionedFrontier

ITEMS = {"topic": "dbz.public.items", "schema": "id INT, v STRING"}
ORDERS = {"topic": "dbz.public.orders", "collection": "orders", "schema": "id INT, item INT"}


def source(topics, **extra):
    d = {"kafka": {"bootstrap": "b:1"}, "envelope": "debezium", "topics": topics, **extra}
    return parse_source("shop", d)


def test_topics_and_their_collections():
    s = source([ITEMS, ORDERS])
    assert s.upstream.tables == (TopicTable("dbz.public.items", "items", "id INT, v STRING"),
                                 TopicTable("dbz.public.orders", "orders", "id INT, item INT"))
    assert s.upstream.topics == ("dbz.public.items", "dbz.public.orders")
    assert s.shards == ("shop__items", "shop__items_errors", "shop__orders", "shop__orders_errors")
    subs = topic_specs(s)
    assert [(t.name, t.data_shard, t.errors_shard, t.upstream.topic, t.format.schema) for t in subs] == [
        ("shop__items", "shop__items", "shop__items_errors", "dbz.public.items", "id INT, v STRING"),
        ("shop__orders", "shop__orders", "shop__orders_errors", "dbz.public.orders", "id INT, item INT")]
    assert all(t.envelope == "debezium" and not t.upstream.tables for t in subs)
    one = parse_source("items", {"kafka": {"topic": "t", "bootstrap": "b:1"}, "envelope": "debezium",
                                 "format": {"type": "json", "schema": "id INT"}})
    assert topic_specs(one) == (one,) and one.upstream.topics == ("t",)


@pytest.mark.parametrize("topics, extra, words", [
    ([ITEMS], {"envelope": "upsert"}, "`topics:` names the topics of one Debezium connector"),
    ([], {}, "topics: a non-empty list"),
    ({"a": ITEMS}, {}, "topics: a non-empty list"),
    ([ITEMS, {**ITEMS, "collection": "other"}], {}, "topics[1]: topic 'dbz.public.items' is named twice"),
    ([ITEMS, {**ORDERS, "collection": "items"}], {}, "topics 'dbz.public.items' and 'dbz.public.orders' both go "
                                                     "to collection 'items'"),
    ([{"schema": "id INT"}], {}, "topics[0]: `topic` must be a Kafka topic name"),
    ([{"topic": "a b", "schema": "id INT"}], {}, "topics[0]: `topic` must be a Kafka topic name"),
    ([{"topic": "t"}], {}, "topics[0]: `schema` is required"),
    ([{"topic": "t", "schema": "id WHAT"}], {}, "topics[0].schema:"),
    ([{"topic": "t", "schema": "id INT", "collection": "Bad-Name"}], {}, "collection 'Bad-Name' must be lower"),
    ([{"topic": "t", "schema": "id INT", "collection": "x" * 60}], {}, "at most 61 characters"),
    ([{"topic": "t", "schema": "id INT", "table": "x"}], {}, "topics[0]: unknown key(s) table"),
    ([ITEMS], {"format": {"type": "json", "schema": "id INT"}}, "format: a source over several topics reads"),
    ([ITEMS], {"format": "avro"}, "format: a source over several topics reads"),
    ([ITEMS], {"include": ["partition"]}, "envelope debezium cannot include Kafka metadata"),
])
def test_mistakes_are_named(topics, extra, words):
    with pytest.raises(ConfigError) as e:
        source(topics, **extra)
    assert "source shop" in str(e.value) and words in str(e.value), str(e.value)


def test_topic_in_kafka_and_topics():
    with pytest.raises(ConfigError, match="give the topics in `topics:` beside `kafka:`, or one `topic` here"):
        parse_source("shop", {"kafka": {"bootstrap": "b:1", "topic": "x"}, "envelope": "debezium", "topics": [ITEMS]})


partitions = st.integers(0, PARTITION_SPAN - 1)
topic_frontiers = st.lists(st.dictionaries(partitions, st.integers(1, 10**12), max_size=4), min_size=1, max_size=4)


@given(st.integers(0, 50), partitions)
def test_slot_and_topic_partition_are_inverse(i, p):
    assert topic_partition(slot(i, p)) == (i, p)
    assert slot(0, p) == p  # a source over one topic keeps the frontier it always had


@given(topic_frontiers)
def test_split_join(per_topic):
    joined = join(per_topic)
    assert [f.as_dict() for f in split(joined, len(per_topic))] == per_topic
    assert len(joined) == sum(len(d) for d in per_topic)  # no two topics share a partition of the frontier
    assert join(split(joined, len(per_topic))) == joined


@given(topic_frontiers, st.data())
def test_by_topic_keeps_every_range_and_binding(per_topic, data):
    topics = len(per_topic)
    ranges = [OffsetRange(slot(i, p), 0, o) for i, d in enumerate(per_topic) for p, o in d.items()]
    bindings = [BindingRange(r.partition, 0, r.end, data.draw(st.integers(0, 9))) for r in ranges]
    out = by_topic(ranges, bindings, topics)
    assert len(out) == topics
    for i, (rs, bs) in enumerate(out):
        assert {(r.partition, r.end) for r in rs} == set(per_topic[i].items())
        assert {(b.partition, b.end) for b in bs} == set(per_topic[i].items())
    assert sum(len(rs) for rs, _ in out) == len(ranges)


def test_split_refuses_an_unknown_topic_and_slot_a_large_partition():
    with pytest.raises(ValueError, match="the source has 1 topic"):
        split(PartitionedFrontier.of({slot(1, 0): 5}), 1)
    with pytest.raises(ValueError, match="at most"):
        slot(0, PARTITION_SPAN)


@given(st.binary(max_size=8), st.binary(max_size=8), st.binary(max_size=8))
def test_state_keys_of_two_topics_never_meet(k1, k2, key):
    ns1, ns2 = b"shop__items", b"shop__orders"
    assert state_key(ns1, key) != state_key(ns2, key)
    assert state_key(None, key) == key
    assert (state_key(ns1, k1) == state_key(ns1, k2)) == (k1 == k2)


def test_upstream_trigger_watches_every_topic():
    """``schedule: upstream`` over several topics: the trigger watches them all, in the frontier's partitions;
    a topic missing from the probe leaves no frontier (its partitions would read as empty), named."""
    from reclock.sources.kafka.trigger import UpstreamMoved
    from reclock.sources.registry import kind_of

    orders = {"topic": "dbz.public.orders", "collection": "orders", "schema": "id INT"}
    spec = source([ITEMS, orders], schedule="upstream")
    trigger = kind_of(spec).upstream_trigger(spec)
    assert trigger.topics == ("dbz.public.items", "dbz.public.orders") and trigger.topic is None
    assert UpstreamMoved(**trigger.serialize()[1]).serialize() == trigger.serialize()
    snapshot = {"dbz.public.items": {0: 5}, "dbz.public.orders": {0: 2, 1: 7}, "other": {0: 9}}
    assert trigger.upper(snapshot) == ({0: 5, 100_000: 2, 100_001: 7}, [])
    assert trigger.upper({"dbz.public.items": {0: 5}, "dbz.public.orders": {0: 0}}) == ({0: 5}, [])
    assert trigger.upper({"dbz.public.items": {0: 5}}) == (None, ["dbz.public.orders"])
    one = UpstreamMoved(source="s", topic="other")
    assert one.upper(snapshot) == ({0: 9}, []) and one.upper({}) == (None, ["other"])
    with pytest.raises(ValueError, match="one `topic` or several `topics`"):
        UpstreamMoved(source="s")


def test_listed_offsets_below_zero_are_no_position():
    """A ``list_offsets`` answer of -1 (no position, as during a leader election) is ``UpstreamUnavailable``
    naming the partition, never a frontier (it raised a bare ValueError there) or a retention check that
    would pass on it (an earliest offset of -1 is below every start)."""
    from reclock.sources.kafka.upstream import UpstreamUnavailable, listed_offsets

    assert listed_offsets("s", ("a", "b"), {("a", 0): 5, ("b", 1): 0}) == {0: 5, 100_001: 0}
    with pytest.raises(UpstreamUnavailable, match="gave -1 for b partition 1"):
        listed_offsets("s", ("a", "b"), {("a", 0): 5, ("b", 1): -1})
