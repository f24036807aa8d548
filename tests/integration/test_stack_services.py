"""The real services the tests and the stack rely on: a transactional Kafka broker and Spark's Kafka source."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer


def _read_all(bootstrap: str, topic: str, isolation: str, expect: int, timeout: float = 30) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}-{isolation}",
                         "isolation.level": isolation, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        # give stragglers (which must not exist) a moment
        extra = consumer.poll(1.0)
        if extra is not None and not extra.error():
            got.append(extra.value())
    finally:
        consumer.close()
    return got


def test_transactions_commit_and_abort_on_one_node(kafka, topic):
    name = topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"tx-{name}"})
    producer.init_transactions(30)
    for i, commit in enumerate([True, False, True]):
        producer.begin_transaction()
        for j in range(5):
            producer.produce(name, f"{i}-{j}".encode(), partition=j % 2)
        assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"  # the aborted records must reach the broker, not just be purged locally
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    committed = _read_all(kafka.bootstrap, name, "read_committed", expect=10)
    assert sorted(committed) == sorted(f"{i}-{j}".encode() for i in (0, 2) for j in range(5))
    # the aborted records and the three transaction markers still occupy offsets: 15 records and 3 markers per partition
    probe = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"probe-{name}"})
    from confluent_kafka import TopicPartition

    ends = [probe.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in (0, 1)]
    probe.close()
    assert sum(ends) == 15 + 2 * 3


def test_spark_reads_kafka_offset_ranges(kafka, topic, spark):
    """Spark's Kafka batch source (the jars Maven fetched) reads exact offset ranges, read_committed."""
    import json

    name = topic(partitions=3)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(90):
        producer.produce(name, str(i).encode(), partition=i % 3)
    assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
    df = (spark.read.format("kafka")
          .option("kafka.bootstrap.servers", kafka.bootstrap)
          .option("subscribe", name)
          .option("kafka.isolation.level", "read_committed")
          .option("kafka.fetch.max.wait.ms", "10")
          .option("startingOffsets", json.dumps({name: {"0": 5, "1": 0, "2": 29}}))
          .option("endingOffsets", json.dumps({name: {"0": 15, "1": 30, "2": 30}}))
          .load())
    rows = df.selectExpr("partition", "offset").collect()
    got = sorted((r["partition"], r["offset"]) for r in rows)
    want = sorted([(0, o) for o in range(5, 15)] + [(1, o) for o in range(30)] + [(2, 29)])
    assert got == want
