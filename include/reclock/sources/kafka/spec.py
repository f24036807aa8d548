"""A Kafka source's config: its ``kafka:`` section (``reclock.specs.KafkaSpec``, shared with Kafka sinks) and the
keys beside it that a Kafka source takes: ``format`` (with ``registry:``), ``schema``, ``envelope``, ``include``, ``budget``,
``on_decode_error``, ``rebuild`` and the schedule's (``interval``, ``upstream``, ``continuous``); a source over
several topics: ``topics`` and ``transaction_topic``."""

from __future__ import annotations

from pathlib import Path

import dataclasses
import re

from reclock.ddl import check_schema
from reclock.errors import ConfigError
from reclock.persist.names import SHARD_RE
from reclock.specs import (ENVELOPES, ERRORS_SUFFIX, FORMATS, REBUILDS, SCHEDULE_KEYS, SourceSpec, TopicTable,
                           parse_budget, parse_format, parse_include, parse_kafka, parse_on_decode_error,
                           parse_schedule, parse_schema_mode, refuse_unknown, require)

METADATA = ("partition", "offset", "key", "timestamp", "headers")
"""The metadata columns a Kafka source may include (like Materialize's ``INCLUDE``)."""
KAFKA_ENVELOPES = (*ENVELOPES, "debezium")
"""A Kafka source's envelopes: none, upsert (by the Kafka key) and debezium (``reclock.debezium``)."""
SCHEDULES = ("interval", "upstream", "continuous")
KAFKA_FORMATS = (*FORMATS, "json_schema", "protobuf")
"""A Kafka source's formats: the decoded ones, json_schema and protobuf (writer schemas from a Schema Registry)."""


def parse_kafka_source(name: str, d: dict, base: Path | None) -> SourceSpec:
    """The source ``name``'s mapping ``d`` (it has a ``kafka:`` section), validated."""
    what = f"source {name}"
    if "tables" in d:
        raise ConfigError(f"{what}: `tables` belongs to a Postgres source (a `postgres:` section)")
    refuse_unknown(d, {"kafka", "format", "envelope", "include", "budget", "on_decode_error", "rebuild", "schema",
                       "topics", "transaction_topic", *SCHEDULE_KEYS}, what)
    kafka = parse_kafka(d["kafka"], f"{what}.kafka", topic="topics" not in d)
    if "topics" in d:
        return _several_topics(name, d, kafka, base)
    if "transaction_topic" in d:
        raise ConfigError(f"{what}: `transaction_topic` is Debezium's transaction topic of a source over several "
                          "topics: give the connector's table topics in `topics:` (with `envelope: debezium`)")
    fmt = parse_format(d.get("format", {"type": "json"}), f"{what}.format", base, KAFKA_FORMATS,
                       subject=f"{kafka.topic}-value")
    schema_mode = parse_schema_mode(d, fmt, what)
    envelope = d.get("envelope", "none")
    if envelope not in KAFKA_ENVELOPES:
        raise ConfigError(f"{what}: envelope {envelope!r} is not one of {', '.join(KAFKA_ENVELOPES)}")
    include = parse_include(d, METADATA, what)
    if envelope == "debezium":
        avro = fmt.type == "avro" and fmt.registry is not None
        if not avro and (fmt.type != "json" or fmt.registry is not None):
            raise ConfigError(f"{what}: envelope debezium reads Debezium's JSON change events (with or without "
                              "Connect's schemas): give `format: {type: json, schema: <the table's columns>}`, or "
                              "its Avro ones through a registry: `format: {type: avro, registry: {...}, schema: "
                              "<the table's columns>}`")
        if avro:
            if not isinstance(fmt.schema, str) or not fmt.schema.strip() or "schema_file" in (d.get("format") or {}):
                raise ConfigError(f"{what}.format: envelope debezium with Avro needs `schema:` (the table's row, "
                                  "`after`, as Spark DDL, e.g. \"id INT, name STRING\"), not `schema_file:` (the "
                                  "writer schemas are the registry's, by each record's id)")
            check_schema(fmt.schema, f"{what}.format.schema")
        if include:
            raise ConfigError(f"{what}: envelope debezium cannot include Kafka metadata ({', '.join(include)}): a "
                              "row's retraction must carry what its insertion carried, and the upsert state keeps "
                              "the row only")
    if envelope == "upsert" and "headers" in include:
        raise ConfigError(f"{what}: envelope upsert cannot include headers (the upsert state keeps key, value, "
                          "partition, offset and timestamp of each key's current record)")
    b = require(d.get("budget", {}) or {}, f"{what}.budget")
    if "max_bytes" in b:
        raise ConfigError(f"{what}.budget: max_bytes is not supported for a source (Kafka does not tell a range's "
                          "size before it is read); size a cycle's Spark jobs with max_records")
    budget = parse_budget(b, f"{what}.budget", 1_000_000)
    on_err = parse_on_decode_error(d, what)
    rebuild = d.get("rebuild", "task")
    if rebuild not in REBUILDS:
        raise ConfigError(f"{what}: rebuild {rebuild!r} is not one of {', '.join(REBUILDS)}")
    sched = parse_schedule(d, what, SCHEDULES)
    return SourceSpec(name=name, upstream=kafka, format=fmt, envelope=envelope, include=include, budget=budget,
                      on_decode_error=on_err, rebuild=rebuild, schema_mode=schema_mode, **sched)


TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
"""A Kafka topic name (Kafka's own rule)."""


def _several_topics(name: str, d: dict, kafka, base: Path | None) -> SourceSpec:
    """A source over several topics of one Debezium connector (``topics:``, a list of ``{topic, collection,
    schema}``): each topic's change events go to the collection ``<source>__<collection>`` (and its errors to
    ``<source>__<collection>_errors``); all topics bind together, one remap collection, one append. With
    ``transaction_topic`` (Debezium's ``provide.transaction.metadata``), a binding covers whole upstream
    transactions in that topic's order (``reclock.sources.kafka.transactions``)."""
    what = f"source {name}"
    if d.get("envelope") != "debezium":
        raise ConfigError(f"{what}: `topics:` names the topics of one Debezium connector (one per table); it needs "
                          "`envelope: debezium` (a source of other records reads one `kafka.topic`)")
    raw = d["topics"]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{what}.topics: a non-empty list of {{topic, collection, schema}}, one per table")
    fmt = d.get("format", {"type": "json"})
    fmt = {"type": fmt} if isinstance(fmt, str) else require(fmt, f"{what}.format")
    avro = fmt.get("type") == "avro" and "registry" in fmt and not set(fmt) - {"type", "registry"}
    if not avro and (fmt.get("type", "json") != "json" or set(fmt) - {"type"}):
        raise ConfigError(f"{what}.format: a source over several topics reads Debezium's JSON change events: give "
                          "`format: json` (or leave it out), or its Avro ones through a registry: `format: {type: "
                          "avro, registry: {...}}`; each topic's row schema in its `topics:` entry")
    tables: list[TopicTable] = []
    for i, t in enumerate(raw):
        w = f"{what}.topics[{i}]"
        t = require(t, w)
        refuse_unknown(t, {"topic", "collection", "schema"}, w)
        topic = t.get("topic")
        if not isinstance(topic, str) or not TOPIC_RE.match(topic):
            raise ConfigError(f"{w}: `topic` must be a Kafka topic name (letters, digits, . _ -), got {topic!r}")
        coll = t.get("collection", topic.rsplit(".", 1)[-1].lower())
        shard = f"{name}__{coll}{ERRORS_SUFFIX}"
        if not isinstance(coll, str) or not SHARD_RE.match(shard) or not re.match(r"^[a-z][a-z0-9_]*$", coll):
            raise ConfigError(f"{w}: collection {coll!r} must be lower case letters, digits and _ (starting with a "
                              f"letter), short enough that {shard!r} is at most 61 characters")
        schema = t.get("schema")
        if not isinstance(schema, str) or not schema.strip():
            raise ConfigError(f"{w}: `schema` is required: the table's row (`after`) as Spark DDL, e.g. "
                              "\"id INT, name STRING\"")
        check_schema(schema, f"{w}.schema")
        for other in tables:
            if other.topic == topic:
                raise ConfigError(f"{w}: topic {topic!r} is named twice")
            if other.collection == coll:
                raise ConfigError(f"{w}: topics {other.topic!r} and {topic!r} both go to collection {coll!r} "
                                  "(one collection per table: give each a `collection:`)")
        tables.append(TopicTable(topic, coll, schema))
    tx = d.get("transaction_topic")
    if tx is not None:
        if not isinstance(tx, str) or not TOPIC_RE.match(tx):
            raise ConfigError(f"{what}.transaction_topic: a Kafka topic name (letters, digits, . _ -), Debezium's "
                              f"`<topic.prefix>.transaction`, got {tx!r}")
        if tx in {t.topic for t in tables}:
            raise ConfigError(f"{what}.transaction_topic: {tx!r} is also one of `topics:` (a table's topic); the "
                              "transaction topic holds BEGIN and END records, no rows")
    first = tables[0]
    one = {k: v for k, v in d.items() if k not in ("topics", "transaction_topic")}
    one["kafka"] = {**d["kafka"], "topic": first.topic}
    one["format"] = {**fmt, "schema": first.schema} if avro else {"type": "json", "schema": first.schema}
    spec = parse_kafka_source(name, one, base)  # every other key validated as for one topic
    return dataclasses.replace(spec, upstream=dataclasses.replace(kafka, tables=tuple(tables), transaction_topic=tx))
