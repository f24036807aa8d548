"""Source specs: the frozen values every source kind shares, and the helpers each kind's config section parser
uses (``reclock.sources.base.SourceKind.parse``); ``reclock.config`` reads the file and finds each source's
kind.

A :class:`SourceSpec` holds what every source has (its name, schedule, budget; how its records decode, when
its kind decodes records) and, as ``upstream``, its kind's own spec (an :class:`UpstreamSpec`: Kafka's
:class:`KafkaSpec`, ``reclock.sources.postgres.spec.PostgresSpec``, ...), whose ``kind`` names the kind in
``reclock.sources.registry``. The YAML is one mapping per source with the kind's section (``kafka:``,
``postgres:``) beside the shared keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from reclock.ddl import check_schema
from reclock.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
NAME_RE_SHARD = re.compile(r"^[a-z][a-z0-9_]{0,60}$")  # reclock.persist.names.SHARD_RE
FORMATS = ("json", "avro", "csv", "text", "bytes")
REGISTRY_FORMATS = ("avro", "json_schema", "protobuf")
"""Formats whose writer schemas a Schema Registry may hold (``format.registry``; json_schema and protobuf need
one)."""
SCHEMA_MODES = ("fixed", "evolve")
WIRES = ("plain", "confluent")
ENVELOPES = ("none", "upsert")
KEYED_ENVELOPES = ("upsert", "debezium")
"""Envelopes whose updates retract what a key held before (an upsert state keeps each key's current value)."""
REBUILDS = ("task", "spark_submit")
ERRORS_SUFFIX = "_errors"
"""A source's error collection is the shard ``<source>_errors``."""
_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")


def parse_duration(value: Any, what: str) -> float:
    """``30s`` / ``500ms`` / ``5m`` / ``1h`` / ``4d`` / a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = _DURATION.match(str(value).strip())
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"{what}: {value!r} is not a duration like 500ms, 30s, 5m, 1h or 4d")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def require(mapping: Any, what: str) -> dict:
    """``mapping`` if it is a mapping, else a ``ConfigError`` naming ``what``."""
    if not isinstance(mapping, dict):
        raise ConfigError(f"{what}: expected a mapping, got {type(mapping).__name__}")
    return mapping


def choice(value: Any, allowed: tuple[str, ...], what: str) -> str:
    """``value`` if it is one of ``allowed``, else a ``ConfigError`` naming ``what`` and the choices."""
    if value not in allowed:
        raise ConfigError(f"{what}: {value!r} is not one of {', '.join(allowed)}")
    return value


def refuse_unknown(d: dict, allowed: set[str], what: str) -> None:
    """A ``ConfigError`` naming the keys of ``d`` outside ``allowed`` (and the allowed ones)."""
    extra = sorted(set(d) - allowed)
    if extra:
        raise ConfigError(f"{what}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


class UpstreamSpec(Protocol):
    """A kind's own part of a source's spec (its config section, validated): ``SourceSpec.upstream``."""

    kind: ClassVar[str]
    """The kind's name in ``reclock.sources.registry`` (its section's key)."""

    def shards(self, source: SourceSpec) -> tuple[str, ...]:
        """The collections of ``source`` its config alone tells (sinks name them in ``from:``)."""


@dataclass(frozen=True)
class TopicTable:
    """One topic of a Kafka source over several topics (``topics:``, envelope debezium: one topic per upstream
    table of one connector) and the collection its change events go to, with the table's row schema."""

    topic: str
    collection: str  # the collection's name within the source: its shard is ``<source>__<collection>``
    schema: str  # Spark DDL of the table's row (``after``)

    def shard(self, source: str) -> str:
        """The topic's collection (shard id): ``<source>__<collection>``."""
        return f"{source}__{self.collection}"

    def errors_shard(self, source: str) -> str:
        """The topic's error collection: ``<source>__<collection>_errors``."""
        return f"{self.shard(source)}{ERRORS_SUFFIX}"


@dataclass(frozen=True)
class KafkaSpec:
    """A Kafka topic and how to reach its brokers: a Kafka source's ``upstream``, and a Kafka sink's target.
    A source over several topics (``tables``, each a topic and its collection) has no ``topic``."""

    kind: ClassVar[str] = "kafka"
    topic: str
    connection: str = "reclock_kafka"
    bootstrap: str | None = None  # instead of a connection (tests, scripts)
    options: tuple[tuple[str, str], ...] = ()  # extra librdkafka / Spark kafka.* options
    connection_named: bool = False  # the config names `connection:` (else it is the default, reclock_kafka)
    tables: tuple[TopicTable, ...] = ()  # a source over several topics: its topics, in config order
    transaction_topic: str | None = None  # Debezium's transaction topic (a source over several topics)

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic the source reads, in config order (its position is the topic's index in the source's
        frontier: ``reclock.sources.kafka.topics``); Debezium's transaction topic, if named, last."""
        if not self.tables:
            return (self.topic,)
        return (*(t.topic for t in self.tables), *((self.transaction_topic,) if self.transaction_topic else ()))

    def shards(self, source: SourceSpec) -> tuple[str, ...]:
        """The source's collection (output 0) and its error collection; a source over several topics: each
        topic's collection and error collection."""
        if self.tables:
            return tuple(s for t in self.tables for s in (t.shard(source.name), t.errors_shard(source.name)))
        return (source.data_shard, source.errors_shard)


def parse_kafka(raw: Any, what: str, topic: bool = True) -> KafkaSpec:
    """A ``kafka:`` section (a source's or a sink's): topic, connection or bootstrap, extra options.
    ``topic=False``: the section must not name a topic (a source over several topics names them in
    ``topics:``)."""
    k = require(raw, what)
    refuse_unknown(k, {"topic", "connection", "bootstrap", "options"}, what)
    if not topic:
        if "topic" in k:
            raise ConfigError(f"{what}: give the topics in `topics:` beside `kafka:`, or one `topic` here, not both")
        k = {**k, "topic": ""}
    elif not k.get("topic") or not isinstance(k["topic"], str):
        raise ConfigError(f"{what}: `topic` is required")
    if "connection" in k and "bootstrap" in k:
        raise ConfigError(f"{what}: give either `connection:` (an Airflow connection) or `bootstrap:` (host:port), "
                          "not both")
    for key in ("connection", "bootstrap"):
        if key in k and (not isinstance(k[key], str) or not k[key]):
            raise ConfigError(f"{what}: `{key}` must be a non-empty string")
    opts = require(k.get("options", {}) or {}, f"{what}.options")
    return KafkaSpec(topic=k["topic"], connection=str(k.get("connection", "reclock_kafka")),
                     bootstrap=k.get("bootstrap"), options=tuple(sorted((str(a), str(b)) for a, b in opts.items())),
                     connection_named="connection" in k)


@dataclass(frozen=True)
class RegistrySpec:
    """Where a source's writer schemas are (``format.registry``): a Confluent-compatible Schema Registry reached
    through an Airflow connection (credentials and TLS there, never in this file), or a bare ``url`` (no
    credentials: scripts, tests); ``subject``: the subject whose versions the records' writers are (default
    ``<topic>-value``)."""

    connection: str = "reclock_registry"
    url: str | None = None
    subject: str | None = None


@dataclass(frozen=True)
class FormatSpec:
    type: str = "json"
    schema: str | None = None  # Spark DDL (json, csv) or the Avro schema's JSON text (avro)
    csv_header: bool = False
    wire: str = "plain"  # avro: plain binary, or confluent (magic byte + 4-byte schema id first)
    registry: RegistrySpec | None = None  # avro, json_schema, protobuf: writer schemas by id from a Schema Registry

    @property
    def avro_fields(self) -> list[str]:
        """The top-level field names of an Avro record schema."""
        return [f["name"] for f in json.loads(self.schema)["fields"]]


def avro_schema(f: dict, what: str, base: Path | None) -> str:
    """Load and check the Avro schema of ``format: avro`` (a record with fields), as JSON text."""
    if "schema_file" not in f:
        raise ConfigError(f"{what}: type avro needs `schema_file:` (an .avsc file, relative to the config file)")
    path = Path(str(f["schema_file"]))
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    try:
        schema = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{what}: cannot read the Avro schema file {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what}: the Avro schema file {path} is not valid JSON: {e}") from e
    if not isinstance(schema, dict) or schema.get("type") != "record" or not isinstance(schema.get("fields"), list) \
            or not all(isinstance(x, dict) and x.get("name") for x in schema["fields"]):
        raise ConfigError(f"{what}: the Avro schema in {path} must be a record with named fields")
    return json.dumps(schema)


SCHEMA_FORMATS = ("json", "csv", "parquet")
"""Formats whose columns the config declares as Spark DDL (``schema:``); avro's come from ``schema_file:``."""


def parse_format(raw: Any, what: str, base: Path | None, formats: tuple[str, ...] = FORMATS,
                 wires: tuple[str, ...] = WIRES, subject: str | None = None) -> FormatSpec:
    """A source's ``format:`` (a type name, or a mapping with ``type``, ``schema``, ``header`` (csv),
    ``schema_file`` (avro), ``wire`` (when the kind has ``wires``), ``registry`` (when the kind reads writer
    schemas from a registry: it gives the default ``subject``)), a type among the kind's ``formats``;
    ``base`` is the folder a relative ``schema_file`` is found in."""
    f = {"type": raw} if isinstance(raw, str) else raw
    f = require(f, what)
    refuse_unknown(f, {"type", "schema", "header", "schema_file", "registry", *(("wire",) if wires else ())}, what)
    ftype = f.get("type", "json")
    if ftype not in formats:
        raise ConfigError(f"{what}: type {ftype!r} is not one of {', '.join(formats)}")
    if "registry" in f and subject is None:
        raise ConfigError(f"{what}: `registry:` is read by Kafka sources only (not by this kind of source yet)")
    registry = parse_registry(f, what, ftype, subject or "")
    schema = f.get("schema")
    if ftype in SCHEMA_FORMATS and not schema:
        raise ConfigError(f"{what}: type {ftype} needs a `schema` (Spark DDL, e.g. \"id BIGINT, name STRING\")")
    if ftype in SCHEMA_FORMATS:
        check_schema(schema, f"{what}.schema")  # parsed now, not when the first record arrives
    if ftype == "avro" and (registry is None or "schema_file" in f):
        schema = avro_schema(f, what, base)
    if "header" in f and ftype != "csv":
        raise ConfigError(f"{what}: `header:` is for csv")
    wire = f.get("wire", "confluent" if registry is not None else "plain")
    if wires and wire not in wires:
        raise ConfigError(f"{what}: wire {wire!r} is not one of {', '.join(wires)}")
    if registry is not None and wire != "confluent":
        raise ConfigError(f"{what}: records read through a registry are in the Confluent wire format "
                          "(leave out `wire:`, or give `wire: confluent`)")
    return FormatSpec(type=ftype, schema=schema, csv_header=bool(f.get("header", False)), wire=wire,
                      registry=registry)


def parse_registry(f: dict, what: str, ftype: str, subject: str) -> RegistrySpec | None:
    """``format.registry`` of the format mapping ``f`` (required for json_schema and protobuf, optional for avro,
    refused for the others); ``subject``: the default subject (a Kafka topic's ``<topic>-value``)."""
    if "registry" not in f:
        if ftype in ("json_schema", "protobuf"):
            raise ConfigError(f"{what}: type {ftype} needs `registry:` (where the writer schemas are, e.g. "
                              "{connection: reclock_registry})")
        return None
    if ftype not in REGISTRY_FORMATS:
        raise ConfigError(f"{what}: `registry:` is for {', '.join(REGISTRY_FORMATS)}, not {ftype}")
    r = require(f["registry"] or {}, f"{what}.registry")
    refuse_unknown(r, {"connection", "url", "subject"}, f"{what}.registry")
    subject = r.get("subject") or subject
    if not isinstance(subject, str):
        raise ConfigError(f"{what}.registry: subject must be a string, got {subject!r}")
    url = r.get("url")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ConfigError(f"{what}.registry: url {url!r} is not an http(s):// URL")
    return RegistrySpec(connection=str(r.get("connection", "reclock_registry")), url=url, subject=subject)


def parse_schema_mode(d: dict, fmt: FormatSpec, what: str) -> str:
    """A source's ``schema:`` (fixed | evolve; evolve needs writer schemas from a registry)."""
    mode = d.get("schema", "fixed")
    if mode not in SCHEMA_MODES:
        raise ConfigError(f"{what}: schema {mode!r} is not one of {', '.join(SCHEMA_MODES)}")
    if mode == "evolve" and fmt.registry is None:
        raise ConfigError(f"{what}: `schema: evolve` needs writer schemas from a registry (`format.registry:`)")
    return mode


def parse_include(d: dict, metadata: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A source's ``include:``: metadata columns among the kind's ``metadata``."""
    include = tuple(d.get("include", ()) or ())
    bad = [c for c in include if c not in metadata]
    if bad:
        raise ConfigError(f"{what}: include {bad} not among {', '.join(metadata)}")
    return include


ON_DECODE_ERRORS = ("collect", "stall")


def parse_on_decode_error(d: dict, what: str) -> str:
    """A source's ``on_decode_error:``: collect (to ``<source>_errors``) or stall."""
    return choice(d.get("on_decode_error", "collect"), ON_DECODE_ERRORS, f"{what}.on_decode_error")


@dataclass(frozen=True)
class BudgetSpec:
    """How much one write (a slice of a cycle) may read: ``max_records`` upstream records."""

    max_records: int = 1_000_000


def parse_budget(raw: Any, what: str, default: int) -> BudgetSpec:
    """A source's ``budget:`` (``max_records``, ``default`` when absent)."""
    b = require(raw or {}, what)
    refuse_unknown(b, {"max_records"}, what)
    budget = BudgetSpec(max_records=int(b.get("max_records", default)))
    if budget.max_records <= 0:
        raise ConfigError(f"{what}: max_records must be positive, got {budget.max_records}")
    return budget


STEP_TIMEOUT_S = 1800.0
"""How long one ``write_batches`` step's Spark work may run by default (``step_timeout:``, 30m)."""


SCHEDULE_KEYS = frozenset({"schedule", "interval", "poll", "lease", "resume", "group", "step_timeout"})
"""A source's keys that :func:`parse_schedule` reads, whatever its kind: each kind's ``refuse_unknown`` list
takes them all, so a key of a schedule the kind lacks gets :func:`parse_schedule`'s message, not "unknown"."""


def parse_schedule(d: dict, what: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """A source's ``schedule:`` and the keys that go with it (``interval``; ``poll``; ``lease``, ``resume``,
    ``group``), and ``step_timeout`` (every schedule), as :class:`SourceSpec` fields; a key that does not
    belong to the schedule is an error.

    When ``ingest__<source>`` runs: every ``interval``; when the source's kind's trigger finds something
    (``schedule: upstream``); or continuously, one run cycling back to back for ``lease`` and the next run
    taking over (``reclock.continuous``; with ``group:``, one run of ``ingest_group__<group>`` cycles every
    source of the group, each in its own thread). ``allowed``: the kind's schedules."""
    schedule = d.get("schedule", "interval")
    if schedule not in allowed:
        raise ConfigError(f"{what}: schedule {schedule!r} is not one of {', '.join(allowed)}")
    if "interval" in d and schedule != "interval":
        raise ConfigError(f"{what}: `interval:` is for `schedule: interval`; with `schedule: {schedule}` the "
                          "source runs when upstream moves (`poll:` sets how often it is probed)")
    if "poll" in d and schedule == "interval":
        raise ConfigError(f"{what}: `poll:` is for `schedule: upstream` or `continuous`")
    for key in ("lease", "resume", "group"):
        if key in d and schedule != "continuous":
            raise ConfigError(f"{what}: `{key}:` is for `schedule: continuous`")
    group = d.get("group")
    if group is not None and (not isinstance(group, str) or not NAME_RE.match(group)):
        raise ConfigError(f"{what}: `group` must match {NAME_RE.pattern} (it names the DAG ingest_group__<group>), "
                          f"got {group!r}")
    return {"schedule": schedule, "group": group,
            "interval_s": parse_duration(d.get("interval", "60s"), f"{what}.interval"),
            "poll_s": parse_duration(d.get("poll", "1s" if schedule == "upstream" else "200ms"), f"{what}.poll"),
            "lease_s": parse_duration(d.get("lease", "10m"), f"{what}.lease"),
            "resume_s": parse_duration(d.get("resume", "1s"), f"{what}.resume"),
            "step_timeout_s": parse_duration(d.get("step_timeout", STEP_TIMEOUT_S), f"{what}.step_timeout")}


@dataclass(frozen=True)
class SourceSpec:
    """One source: its kind's spec (``upstream``: which kind it is, where its upstream is) and what every
    source has."""

    name: str
    upstream: UpstreamSpec
    format: FormatSpec = field(default_factory=FormatSpec)
    envelope: str = "none"
    include: tuple[str, ...] = ()
    interval_s: float = 60.0
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    on_decode_error: str = "collect"
    rebuild: str = "task"  # how rebuild__<source> runs: in its Airflow task, or as a spark-submit job
    schedule: str = "interval"  # ingest__<source> runs every interval_s, when upstream moves ("upstream"), or
    #                             runs cycles back to back for lease_s a run ("continuous")
    poll_s: float = 1.0  # upstream: how often upstream is probed; continuous: the idle pause
    lease_s: float = 600.0  # continuous: how long one run keeps cycling before the next run takes over
    resume_s: float = 1.0  # continuous: resume at most this often (and when the lease ends)
    group: str | None = None  # continuous: the group whose one task runs this source's cycles
    step_timeout_s: float = STEP_TIMEOUT_S  # a write_batches step's Spark work is interrupted past this (a failed try)
    schema_mode: str = "fixed"  # registry formats: fixed | evolve (``schema:`` in the config)

    @property
    def kind(self) -> str:
        """The source's kind (``kafka``, ``postgres``, ...): the kind it is registered as, its key in
        ``reclock.sources.registry``."""
        return self.upstream.kind

    @property
    def keyed(self) -> bool:
        """Its envelope keeps each key's current value in the upsert state and retracts it (``upsert``,
        ``debezium``): a description's retractions read the state its predecessor's append produced."""
        return self.envelope in KEYED_ENVELOPES

    @property
    def ingest_dag(self) -> str:
        """The DAG that runs this source's cycles: ``ingest__<source>``, or ``ingest_group__<group>``."""
        return f"ingest_group__{self.group}" if self.group else f"ingest__{self.name}"

    @property
    def consumer_group(self) -> str:
        """The consumer group (Kafka's) whose committed offsets show this source's progress (lag tools)."""
        return f"reclock-{self.name}"

    @property
    def data_shard(self) -> str:
        """Output 0: the source's collection."""
        return self.name

    @property
    def errors_shard(self) -> str:
        """The source's error collection: records that did not decode, with where they were and why."""
        return f"{self.name}{ERRORS_SUFFIX}"

    @property
    def shards(self) -> tuple[str, ...]:
        """Every collection of the source known from its config (a kind may learn more at its first cycle:
        a Postgres source without ``tables:``)."""
        return self.upstream.shards(self)
