"""Declarative source specs, validated (YAML in, frozen dataclasses out).

A config file holds ``sources:`` and ``sinks:``. Example::

    sources:
      orders:
        kafka:
          connection: reclock_kafka        # Airflow connection id (or `bootstrap: host:port`)
          topic: orders
        format:
          type: json                       # json | avro | csv | text | bytes
          schema: "id BIGINT, customer STRING, amount DOUBLE"   # Spark DDL, for json and csv
          # avro: `schema_file: orders.avsc` (relative to this file) and `wire: plain | confluent`
          # (confluent: a 5-byte schema-registry header precedes each value)
          # avro | json_schema | protobuf through a Schema Registry (writer schema per record, by its id):
          #   registry: {connection: reclock_registry, subject: orders-value}   # subject: default <topic>-value
          #   (avro: `schema_file:` optional, the reader schema; default the subject's latest version)
        schema: fixed                      # registry formats: fixed (the reader never changes) | evolve (a
                                           # compatible new writer adds columns / widens types from the first
                                           # record carrying it; an incompatible one stalls the source)
        envelope: none                     # none | upsert (upsert keys on the Kafka key; a null value deletes)
        include: [partition, offset, key, timestamp, headers]  # metadata columns (like INCLUDE)
        schedule: interval                 # interval: every `interval:` | upstream: when the topic holds
        interval: 30s                      # records beyond the newest binding (probed every `poll: 1s`) |
                                           # continuous: cycles back to back, a run per `lease: 10m`
                                           # (`resume: 1s`: how often it commits offsets and compacts;
                                           # `group: g`: the group's sources cycle in one task, ingest_group__g)
        budget: {max_records: 500000}
        on_decode_error: collect           # collect (to <source>_errors) | stall
        rebuild: task                      # how rebuild__<source> runs: task (in the Airflow task) |
                                           # spark_submit (spark_jobs/rebuild.py on connection reclock_spark_submit)

      shop:                                # a Postgres source: one output collection per table
        postgres:
          connection: shop_db              # an Airflow connection id (or `dsn_env: SHOP_DSN`, an environment
          publication: shop_pub            # variable holding the DSN); credentials never sit in this file
        tables: [public.orders, public.items]   # optional: default every table of the publication
        schedule: upstream                 # interval (`interval: 60s`) | upstream: when a published table
                                           # changes or idle WAL is to release (`poll: 1s`)
        budget: {max_records: 100000}      # changes per Parquet part (memory of write_batches)

    sinks:
      orders_out:
        from: orders                       # a collection (a source's, or its `<source>_errors`)
        kafka: {connection: reclock_kafka, topic: orders_out}
        format: debezium                   # debezium ({"before", "after"}) | upsert (key + value/tombstone)
        key: [id]                          # required for upsert; pairs before/after for debezium
        progress_topic: _reclock_progress  # compacted, one per Kafka cluster, keyed by sink
        start: 1700000000000               # optional: a new sink starts here instead of at since
        budget: {max_messages: 1000000, max_bytes: 268435456}   # per Kafka transaction
        transaction_timeout: 60s           # below the broker's transaction.max.timeout.ms
      orders_lake:
        from: orders
        iceberg: {table: lake.orders, catalog: reclock}   # a SQL catalog (settings: RECLOCK_ICEBERG_*)
        layout: changelog                  # append | changelog (default: changelog for an upsert source)
        budget: {max_rows: 1000000, max_bytes: 268435456}  # per Iceberg commit

A source's kind is the one whose section it has (``kafka:``, ``postgres:``; ``reclock.sources.registry``); the
kind parses the source (``reclock.sources.<kind>.spec``) into a ``reclock.specs.SourceSpec``. A Postgres
source's tables become the collections ``<source>__<table>`` (``shop__orders``; a table outside the
``public`` schema: ``<source>__<schema>__<table>``), beside its error collection ``<source>_errors``
(``reclock.sources.postgres.spec``).

The file is the path a caller gives, else ``$RECLOCK_CONFIG``, else the caller's default (the DAG file
passes ``include/reclock.yaml`` beside the DAGs folder); none of them is a ``SettingError``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reclock.errors import ConfigError, SettingError
from reclock.sources.registry import KINDS
from reclock.specs import NAME_RE, KafkaSpec, SourceSpec, parse_duration, parse_kafka, refuse_unknown, require
from reclock.specs import RegistrySpec  # noqa: F401 - reclock.config.RegistrySpec, as before the move

def parse_source(name: str, raw: Any, base: Path | None = None) -> SourceSpec:
    """Validate one source's config: its kind is the one whose section it has (``kafka:``, ``postgres:``, ...;
    ``reclock.sources.registry``), which parses the rest (``SourceKind.parse``); ``base`` is the folder
    relative files (schemas) are found in."""
    what = f"source {name}"
    if not NAME_RE.match(name):
        raise ConfigError(f"{what}: a source name must match {NAME_RE.pattern} (it becomes a SQL name)")
    d = require(raw, what)
    sections = [k for k in KINDS if k in d]
    if not sections:
        others = [k for k in d if isinstance(d[k], dict) and k not in ("format", "budget")]
        raise ConfigError(f"{what}: no source kind: give one of " + ", ".join(f"`{k}:`" for k in KINDS)
                          + " (the kinds this Reclock knows; e.g. `kafka: {topic: orders}`)"
                          + (f"; {', '.join(f'`{k}:`' for k in others)} is none of them" if others else ""))
    if len(sections) > 1:
        raise ConfigError(f"{what}: a source is of one kind; it has " + " and ".join(f"`{k}:`" for k in sections)
                          + " (give one, not both)")
    return KINDS[sections[0]].parse(name, d, base)


def groups(sources: dict[str, SourceSpec]) -> dict[str, list[SourceSpec]]:
    """The continuous groups: group name -> its sources, in config order."""
    out: dict[str, list[SourceSpec]] = {}
    for spec in sources.values():
        if spec.group:
            out.setdefault(spec.group, []).append(spec)
    return out


def _check_groups(sources: dict[str, SourceSpec]) -> None:
    """A group's sources share its runs, so they share one lease; a group is not named like a source."""
    for g, members in groups(sources).items():
        leases = {m.lease_s for m in members}
        if len(leases) > 1:
            raise ConfigError(f"group {g}: its sources run in one task and need one `lease:`; got "
                              + ", ".join(f"{m.name}: {m.lease_s:g}s" for m in members))


SINK_FORMATS = ("debezium", "upsert")
DEFAULT_PROGRESS_TOPIC = "_reclock_progress"


@dataclass(frozen=True)
class SinkBudget:
    """How much one Kafka transaction may carry (a timestamp is never split across transactions)."""

    max_messages: int = 1_000_000
    max_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class SinkSpec:
    """An exactly-once Kafka sink of one collection (see ``reclock.sinks.kafka``)."""

    name: str
    collection: str
    kafka: KafkaSpec
    format: str = "debezium"
    key: tuple[str, ...] = ()
    progress_topic: str = DEFAULT_PROGRESS_TOPIC
    start: int | None = None  # a new sink starts at the collection's since, or here
    partitions: int = 1  # when the sink creates its topic
    budget: SinkBudget = field(default_factory=SinkBudget)
    transaction_timeout_s: float = 60.0

    @property
    def transactional_id(self) -> str:
        """Stable per sink: a second instance fences the first."""
        return f"reclock-sink-{self.name}"

    @property
    def holder(self) -> str:
        """The name of the sink's read hold on its collection's shard."""
        return f"sink:{self.name}"


ICEBERG_LAYOUTS = ("append", "changelog")
ICEBERG_TABLE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


@dataclass(frozen=True)
class IcebergBudget:
    """How much one Iceberg commit may carry (a timestamp is never split across commits)."""

    max_rows: int = 1_000_000
    max_bytes: int = 256 * 1024 * 1024


COPY_MIN_BYTES = 8 << 20
"""An Iceberg export's default ``copy_min_bytes``: a part at least this large whose rows are exactly what the
table gets is copied into it (its pages as they are, a new footer after them) instead of read and written
again; smaller ones are written anew together, so the table does not get small files one for one
(Reclock's compaction merges parts below the same size)."""


@dataclass(frozen=True)
class IcebergSinkSpec:
    """An exactly-once export of one collection into an Iceberg table (see ``reclock.sinks.iceberg``).

    ``layout`` ``append``: the table holds the collection's rows (user columns and ``_reclock_ts``), one row
    per unit of multiplicity; ``changelog``: every consolidated update (user columns, ``_reclock_ts``,
    ``_reclock_diff``); the collection AS OF t is the sum of ``_reclock_diff`` by row over ``_reclock_ts <= t``.
    """

    name: str
    collection: str
    table: str  # namespace.table
    catalog: str = "reclock"  # the SQL catalog's name (its rows in the catalog database carry it)
    layout: str = "append"
    start: int | None = None
    budget: IcebergBudget = field(default_factory=IcebergBudget)
    copy_min_bytes: int | None = COPY_MIN_BYTES  # parts this large are copied into the table (None: never)

    @property
    def holder(self) -> str:
        """The name of the sink's read hold on its collection's shard."""
        return f"sink:{self.name}"

    @property
    def namespace(self) -> str:
        return self.table.rsplit(".", 1)[0]


def _parse_start(d: dict, what: str) -> int | None:
    start = d.get("start")
    if start is not None and (not isinstance(start, int) or isinstance(start, bool) or start < 0):
        raise ConfigError(f"{what}: `start` is a timestamp in ms (a non-negative integer)")
    return start


def _parse_iceberg_sink(name: str, d: dict, coll: str, source: SourceSpec, what: str) -> IcebergSinkSpec:
    refuse_unknown(d, {"from", "iceberg", "layout", "start", "budget", "copy_min_bytes"}, what)
    ice = require(d["iceberg"], f"{what}.iceberg")
    refuse_unknown(ice, {"table", "catalog"}, f"{what}.iceberg")
    table = ice.get("table")
    if not isinstance(table, str) or not ICEBERG_TABLE_RE.match(table):
        raise ConfigError(f"{what}.iceberg: `table` must be namespace.table (letters, digits, _), got {table!r}")
    catalog = ice.get("catalog", "reclock")
    if not isinstance(catalog, str) or not NAME_RE.match(catalog):
        raise ConfigError(f"{what}.iceberg: `catalog` must match {NAME_RE.pattern}, got {catalog!r}")
    data = (source.data_shard, *(t.shard(source.name) for t in getattr(source.upstream, "tables", ())))
    retracts = coll in data and source.keyed
    layout = d.get("layout", "changelog" if retracts else "append")
    if layout not in ICEBERG_LAYOUTS:
        raise ConfigError(f"{what}: layout {layout!r} is not one of {', '.join(ICEBERG_LAYOUTS)}")
    if layout == "append" and retracts:
        raise ConfigError(f"{what}: {coll} is an upsert collection (its updates retract rows), which an append "
                          "layout cannot hold; use `layout: changelog`")
    b = require(d.get("budget", {}) or {}, f"{what}.budget")
    refuse_unknown(b, {"max_rows", "max_bytes"}, f"{what}.budget")
    budget = IcebergBudget(int(b.get("max_rows", IcebergBudget.max_rows)),
                           int(b.get("max_bytes", IcebergBudget.max_bytes)))
    if budget.max_rows <= 0 or budget.max_bytes <= 0:
        raise ConfigError(f"{what}.budget: max_rows and max_bytes must be positive")
    copy_min = d.get("copy_min_bytes", COPY_MIN_BYTES)
    if copy_min is not None and (isinstance(copy_min, bool) or not isinstance(copy_min, int) or copy_min < 0):
        raise ConfigError(f"{what}: `copy_min_bytes` is a size in bytes >= 0 (parts this large are copied into the "
                          f"table instead of rewritten), or null to rewrite every part (got {copy_min!r})")
    return IcebergSinkSpec(name=name, collection=coll, table=table, catalog=catalog, layout=layout,
                           start=_parse_start(d, what), budget=budget, copy_min_bytes=copy_min)


def parse_sink(name: str, raw: Any, sources: dict[str, SourceSpec]) -> SinkSpec | IcebergSinkSpec:
    """Validate one sink's config: a Kafka sink (``kafka:``) or an Iceberg export (``iceberg:``)."""
    what = f"sink {name}"
    if not NAME_RE.match(name):
        raise ConfigError(f"{what}: a sink name must match {NAME_RE.pattern}")
    d = require(raw, what)
    collections = {c: s for s in sources.values() for c in s.shards}
    coll = d.get("from")
    if coll not in collections:
        raise ConfigError(f"{what}: `from` must name a collection; {coll!r} is none of "
                          f"{', '.join(sorted(collections)) or '(no sources configured)'}")
    if "iceberg" in d and "kafka" in d:
        raise ConfigError(f"{what}: give either `kafka:` (a Kafka sink) or `iceberg:` (an Iceberg export), not both")
    if "iceberg" in d:
        return _parse_iceberg_sink(name, d, coll, collections[coll], what)
    refuse_unknown(d, {"from", "kafka", "format", "key", "progress_topic", "start", "partitions", "budget",
                 "transaction_timeout"}, what)
    kafka = parse_kafka(d.get("kafka"), f"{what}.kafka")
    source_kafka = collections[coll].upstream
    if isinstance(source_kafka, KafkaSpec) and kafka.topic in source_kafka.topics:
        raise ConfigError(f"{what}.kafka: topic {kafka.topic!r} is the source topic of {coll}")
    fmt = d.get("format", "debezium")
    if fmt not in SINK_FORMATS:
        raise ConfigError(f"{what}: format {fmt!r} is not one of {', '.join(SINK_FORMATS)}")
    key = d.get("key", []) or []
    if isinstance(key, str):
        key = [key]
    if not isinstance(key, list) or not all(isinstance(c, str) and c for c in key):
        raise ConfigError(f"{what}: `key` is a list of column names")
    if fmt == "upsert" and not key:
        raise ConfigError(f"{what}: format upsert needs `key:` (the columns that identify a row)")
    start = _parse_start(d, what)
    b = require(d.get("budget", {}) or {}, f"{what}.budget")
    refuse_unknown(b, {"max_messages", "max_bytes"}, f"{what}.budget")
    budget = SinkBudget(int(b.get("max_messages", SinkBudget.max_messages)),
                        int(b.get("max_bytes", SinkBudget.max_bytes)))
    if budget.max_messages <= 0 or budget.max_bytes <= 0:
        raise ConfigError(f"{what}.budget: max_messages and max_bytes must be positive")
    timeout = parse_duration(d.get("transaction_timeout", "60s"), f"{what}.transaction_timeout")
    if timeout > 900:
        raise ConfigError(f"{what}: transaction_timeout {timeout:.0f}s exceeds the broker's default maximum "
                          "(transaction.max.timeout.ms, 15 minutes)")
    partitions = int(d.get("partitions", 1))
    if partitions <= 0:
        raise ConfigError(f"{what}: partitions must be positive")
    return SinkSpec(name=name, collection=coll, kafka=kafka, format=fmt, key=tuple(key),
                    progress_topic=str(d.get("progress_topic", DEFAULT_PROGRESS_TOPIC)), start=start,
                    partitions=partitions, budget=budget, transaction_timeout_s=timeout)


@dataclass(frozen=True)
class Config:
    sources: dict[str, SourceSpec]
    sinks: dict[str, SinkSpec | IcebergSinkSpec] = field(default_factory=dict)

    def sink(self, name: str) -> SinkSpec | IcebergSinkSpec:
        try:
            return self.sinks[name]
        except KeyError:
            raise ConfigError(f"no sink named {name!r}; configured: {', '.join(sorted(self.sinks)) or '(none)'}")

    def connections(self) -> set[str]:
        """The Airflow connections the config's sources and sinks reach their upstreams and targets through
        (a Kafka section's ``connection:``, ``reclock_kafka`` unless it gives ``bootstrap:``; a Postgres
        source's ``connection:`` unless it gives ``dsn_env:``)."""
        from reclock.sources.postgres.spec import PostgresSpec

        ups = [s.upstream for s in self.sources.values()]
        kafkas = [u for u in ups if isinstance(u, KafkaSpec)]
        kafkas += [k.kafka for k in self.sinks.values() if isinstance(k, SinkSpec)]
        out = {k.connection for k in kafkas if k.bootstrap is None}
        return out | {u.connection for u in ups if isinstance(u, PostgresSpec) and u.connection}

    def source(self, name: str) -> SourceSpec:
        try:
            return self.sources[name]
        except KeyError:
            raise ConfigError(f"no source named {name!r}; configured: {', '.join(sorted(self.sources)) or '(none)'}")


def parse_config(raw: Any, base: Path | None = None) -> Config:
    d = require(raw or {}, "config")
    refuse_unknown(d, {"sources", "sinks"}, "config")
    raw_sources = require(d.get("sources", {}) or {}, "sources")
    sources = {name: parse_source(name, spec, base) for name, spec in raw_sources.items()}
    _check_groups(sources)
    raw_sinks = require(d.get("sinks", {}) or {}, "sinks")
    sinks = {name: parse_sink(name, spec, sources) for name, spec in raw_sinks.items()}
    clash = sorted(set(sinks) & set(sources))
    if clash:
        raise ConfigError(f"sinks and sources share the name(s) {', '.join(clash)} (their status rows would mix)")
    return Config(sources=sources, sinks=sinks)


NO_CONFIG = "no Reclock config file: set RECLOCK_CONFIG to its path (reclock commands: --config PATH)"


def config_path(path: Path | str | None = None, default: Path | str | None = None) -> Path:
    """The config file: ``path``, else ``$RECLOCK_CONFIG``, else ``default``; it must exist."""
    chosen = path or os.environ.get("RECLOCK_CONFIG") or default
    if not chosen:
        raise SettingError(NO_CONFIG)
    p = Path(chosen)
    if not p.is_file():
        raise SettingError(f"config file {p} does not exist (set RECLOCK_CONFIG, or --config, to a Reclock "
                           "config file)")
    return p


def load_config(path: Path | str | None = None, default: Path | str | None = None) -> Config:
    """The validated config in the file :func:`config_path` finds."""
    p = config_path(path, default)
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    try:
        return parse_config(raw, p.parent)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from e
