"""A Kafka source's config: its ``kafka:`` section (``reclock.specs.KafkaSpec``, shared with Kafka sinks) and the
keys beside it that a Kafka source takes: ``format`` (with ``registry:``), ``schema``, ``envelope``, ``include``, ``budget``,
``on_decode_error``, ``rebuild`` and the schedule's (``interval``, ``upstream``, ``continuous``)."""

from __future__ import annotations

from pathlib import Path

from reclock.errors import ConfigError
from reclock.specs import (ENVELOPES, FORMATS, REBUILDS, SourceSpec, parse_budget, parse_format, parse_include,
                           parse_kafka, parse_on_decode_error, parse_schedule, parse_schema_mode, refuse_unknown,
                           require)

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
    refuse_unknown(d, {"kafka", "format", "envelope", "include", "interval", "budget", "on_decode_error", "rebuild",
                       "schedule", "poll", "lease", "resume", "group", "schema"}, what)
    kafka = parse_kafka(d["kafka"], f"{what}.kafka")
    fmt = parse_format(d.get("format", {"type": "json"}), f"{what}.format", base, KAFKA_FORMATS,
                       subject=f"{kafka.topic}-value")
    schema_mode = parse_schema_mode(d, fmt, what)
    envelope = d.get("envelope", "none")
    if envelope not in KAFKA_ENVELOPES:
        raise ConfigError(f"{what}: envelope {envelope!r} is not one of {', '.join(KAFKA_ENVELOPES)}")
    include = parse_include(d, METADATA, what)
    if envelope == "debezium":
        if fmt.type != "json" or fmt.registry is not None:
            raise ConfigError(f"{what}: envelope debezium reads Debezium's JSON change events (with or without "
                              "Connect's schemas): give `format: {type: json, schema: <the table's columns>}`")
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
