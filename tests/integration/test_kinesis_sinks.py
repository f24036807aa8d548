"""A Kinesis source's collection through the exactly-once Kafka sink and the Iceberg export, as a Kafka
source's goes (issue 35: "sinks and the Iceberg export work as for Kafka sources"): an upsert source keyed by
the partition key, across a split, exported by both while cycles go on; each checked against the shard (the
checks of ``test_sink_kafka`` and ``test_sink_iceberg``) and against the producer's own record of what
Kinesis acknowledged (the latest value per key)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from types import SimpleNamespace

import yaml
from test_sink_iceberg import check_table, default_catalog
from test_sink_kafka import check_exactly_once, collection_after, topic_messages

from kinesis_support import kinesis_ctx, kinesis_raw
from reclock import cycle
from reclock.config import parse_config
from reclock.dev.kinesis import BackgroundProducer
from reclock.sinks import iceberg, kafka as kafka_sink
from reclock.sources.kinesis.sequence import shard_id

KEYS = 12


def test_a_kinesis_collection_goes_through_the_kafka_sink_and_the_iceberg_export_exactly(
        db, kafka, kinesis, stream, spark, tmp_path):
    name = stream(2)
    c = kinesis.client()
    ctx = replace(kinesis_ctx(db, kinesis.endpoint_url, spark, tmp_path, name, envelope="upsert"),
                  retain_history_ms=10 ** 12)
    producer = BackgroundProducer(c, name, keys=KEYS)
    topic = f"clicks_out_{os.getpid()}_{name}"
    raw = {"sources": {"clicks": kinesis_raw(name, kinesis.endpoint_url, envelope="upsert")},
           "sinks": {"out": {"from": "clicks", "format": "debezium", "key": ["_partition_key"],
                             "kafka": {"topic": topic, "bootstrap": kafka.bootstrap},
                             "progress_topic": f"_progress_{topic}", "budget": {"max_messages": 25},
                             "transaction_timeout": "20s"},
                     "lake": {"from": "clicks", "iceberg": {"table": f"lake.{name.replace('-', '_')}"},
                              "budget": {"max_rows": 30}}}}
    config = tmp_path / "sinks.yaml"
    config.write_text(yaml.safe_dump(raw))
    specs = parse_config(raw).sinks
    kctx = kafka_sink.SinkContext(spec=specs["out"], dsn=db, kafka=kafka.bootstrap, blob=ctx.blob)
    ictx = iceberg.IcebergSinkContext(spec=specs["lake"], dsn=db, blob=ctx.blob,
                                      catalog=default_catalog(db, ctx.blob))
    assert ictx.spec.layout == "changelog"

    producer.put(60)
    cycle.run_cycle(ctx)
    kafka_sink.run_once(kctx)
    iceberg.run_once(ictx)
    c.split_shard(StreamName=name, ShardToSplit=shard_id(0), NewStartingHashKey=str(2 ** 126))
    kinesis.wait_active(name)
    for _ in range(3):  # the same keys move to the children; their later values must win
        producer.put(40)
        cycle.run_cycle(ctx)
    assert kafka_sink.run_once(kctx).frontier > 0
    assert iceberg.run_once(ictx).commits >= 1

    latest = {}
    for i in sorted(producer.acked):
        latest[f"k{i % KEYS}"] = i
    assert len(producer.acked) == 180
    # the Kafka sink: every update of the shard exactly once in ts order, its progress at the shard's upper;
    # what its messages add up to is the latest value Kinesis acknowledged per partition key
    check_exactly_once(SimpleNamespace(ctx=ctx, kafka=kafka), config, "out")
    after = collection_after(topic_messages(kafka, topic))
    assert {json.loads(k)["_partition_key"] if k.startswith(b"{") else k.decode(): v["id"]
            for k, v in after.items()} == latest
    # the Iceberg table: the collection AS OF the sink's frontier (pyiceberg and Spark), no file added twice
    assert check_table(ictx, spark) > 0
    rows = iceberg.load_catalog(ictx.catalog, ictx.spec.catalog).load_table(ictx.spec.table).scan().to_arrow()
    state: dict = {}
    for r in sorted(rows.to_pylist(), key=lambda r: (r[iceberg.TS_COLUMN], r[iceberg.DIFF_COLUMN])):
        state[(r["_partition_key"], r["id"])] = state.get((r["_partition_key"], r["id"]), 0) + r[iceberg.DIFF_COLUMN]
    assert {k: i for (k, i), n in state.items() if n} == latest
