"""The group Spark's Kafka consumers read a source with carries a digest of their settings: Spark pools its
executors' consumers by group and partition and refuses one made with other settings, so a changed setting
(a new release's option, an edited source, rotated credentials) must get a group of its own."""

from reclock.config import parse_source
from reclock.kafka_client import KafkaClientConfig
from reclock.sources.kafka.spark_job import kafka_read_options, read_group
from reclock.batch import OffsetRange


def _spec(**options):
    raw = {"kafka": {"topic": "t", **({"options": options} if options else {})}, "format": {"type": "text"}}
    return parse_source("orders", raw)


def test_the_group_is_stable_for_equal_settings_and_named_in_the_read_options():
    spec = _spec()
    group = read_group(spec, "127.0.0.1:9092")
    assert group == read_group(_spec(), "127.0.0.1:9092")
    assert group.startswith(f"{spec.consumer_group}-read-")
    opts = kafka_read_options(spec, "127.0.0.1:9092", [OffsetRange(0, 0, 5)])
    assert opts["kafka.group.id"] == group


def test_changed_consumer_settings_get_another_group():
    base = read_group(_spec(), "127.0.0.1:9092")
    assert read_group(_spec(**{"fetch.min.bytes": "10"}), "127.0.0.1:9092") != base  # a librdkafka-style option
    assert read_group(_spec(**{"kafka.max.poll.records": "10"}), "127.0.0.1:9092") != base
    assert read_group(_spec(), "127.0.0.2:9092") != base  # another cluster
    assert read_group(_spec(), KafkaClientConfig.plaintext("127.0.0.1:9092")) == base


def test_spark_source_options_do_not_change_the_group():
    assert read_group(_spec(minPartitions="4"), "127.0.0.1:9092") == read_group(_spec(), "127.0.0.1:9092")
    opts = kafka_read_options(_spec(minPartitions="4"), "127.0.0.1:9092", [OffsetRange(0, 0, 5)])
    assert opts["minPartitions"] == "4" and "kafka.minPartitions" not in opts
