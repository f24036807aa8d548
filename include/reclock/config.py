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

A Postgres source's tables become the collections ``<source>__<table>`` (``shop__orders``; a table outside
the ``public`` schema: ``<source>__<schema>__<table>``), beside its error collection ``<source>_errors``
(:func:`pg_table_shard`). Without ``tables:``, the first cycle takes the publication's tables then and
keeps them (``reclock.sources.postgres.upstream``).

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

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
NAME_RE_SHARD = re.compile(r"^[a-z][a-z0-9_]{0,60}$")  # reclock.persist.names.SHARD_RE
FORMATS = ("json", "avro", "csv", "text", "bytes", "json_schema", "protobuf")
SCHEMA_MODES = ("fixed", "evolve")
WIRES = ("plain", "confluent")
ENVELOPES = ("none", "upsert")
METADATA = ("partition", "offset", "key", "timestamp", "headers")
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


@dataclass(frozen=True)
class KafkaSpec:
    topic: str
    connection: str = "reclock_kafka"
    bootstrap: str | None = None  # overrides the connection (tests, scripts)
    options: tuple[tuple[str, str], ...] = ()  # extra librdkafka / Spark kafka.* options


SPARK_SNAPSHOT_MIN_BYTES = 1 << 30
"""A table at least this large (``pg_table_size``) has its initial snapshot read by Spark
(``reclock.sources.postgres.spark_snapshot``); a smaller one is read in the task
(``reclock.sources.postgres.cdc.read_snapshot``), which on one host is the faster of the two (``benchmarks/pg_cdc.py``):
Spark pays off with executors on several hosts."""


@dataclass(frozen=True)
class PostgresSpec:
    """A Postgres source's upstream: a publication in the database an Airflow connection (or the DSN in an
    environment variable) reaches; ``tables`` (``schema.table``) are its outputs, in order (empty: every
    table of the publication, fixed at the first cycle)."""

    publication: str
    connection: str | None = None  # an Airflow connection id
    dsn_env: str | None = None  # or the name of an environment variable holding the DSN
    tables: tuple[str, ...] = ()
    spark_snapshot_min_bytes: int | None = SPARK_SNAPSHOT_MIN_BYTES  # None: every snapshot in the task


PG_IDENT_RE = re.compile(r"^[a-z_][a-z0-9_$]{0,62}$")
"""A Postgres identifier Reclock accepts in config: lower case, unquoted (what ``CREATE TABLE t`` makes)."""


def pg_table_shard(source: str, table: str) -> str:
    """The collection (shard id) of table ``schema.table`` of a Postgres source: ``<source>__<table>`` for the
    ``public`` schema, ``<source>__<schema>__<table>`` otherwise."""
    schema, _, name = table.partition(".")
    return f"{source}__{name}" if schema == "public" else f"{source}__{schema}__{name}"


def parse_pg_table(source: str, raw: Any) -> str:
    """``schema.table`` (a bare ``table`` is in ``public``), validated so its collection name is valid."""
    what = f"source {source}.tables"
    if not isinstance(raw, str) or not raw:
        raise ConfigError(f"{what}: {raw!r} is not a table name (schema.table)")
    schema, dot, name = raw.partition(".")
    if not dot:
        schema, name = "public", raw
    for part in (schema, name):
        if not PG_IDENT_RE.match(part):
            raise ConfigError(f"{what}: {raw!r}: {part!r} is not a lower-case unquoted identifier")
    table = f"{schema}.{name}"
    shard = pg_table_shard(source, table)
    if not NAME_RE_SHARD.match(shard):
        raise ConfigError(f"{what}: {raw!r} gives the collection name {shard!r}, which is not valid (at most 61 "
                          "characters of a-z, 0-9, _); rename the source or the table")
    return table



def _parse_postgres(source: str, raw: Any, tables_raw: Any) -> PostgresSpec:
    what = f"source {source}.postgres"
    p = _require(raw, what)
    _unknown(p, {"connection", "dsn_env", "dsn", "publication", "spark_snapshot_min_bytes"}, what)
    if "dsn" in p:
        raise ConfigError(f"{what}: `dsn:` would put credentials in the config; give `dsn_env:` (the name of an "
                          "environment variable holding the DSN) or `connection:` (an Airflow connection id)")
    if ("connection" in p) == ("dsn_env" in p):
        raise ConfigError(f"{what}: give exactly one of `connection:` (an Airflow connection id) or `dsn_env:` "
                          "(an environment variable holding the DSN)")
    for key in ("connection", "dsn_env"):
        if key in p and (not isinstance(p[key], str) or not p[key]):
            raise ConfigError(f"{what}: `{key}` must be a non-empty string")
    pub = p.get("publication")
    if not isinstance(pub, str) or not PG_IDENT_RE.match(pub):
        raise ConfigError(f"{what}: `publication` is required, a lower-case unquoted identifier (got {pub!r})")
    if tables_raw is None:
        tables: tuple[str, ...] = ()
    elif isinstance(tables_raw, list) and tables_raw:
        tables = tuple(parse_pg_table(source, t) for t in tables_raw)
    else:
        raise ConfigError(f"source {source}.tables: a non-empty list of schema.table (or leave it out: every "
                          "table of the publication)")
    shards = [pg_table_shard(source, t) for t in tables]
    dup = sorted({s for s in shards if shards.count(s) > 1})
    if dup:
        raise ConfigError(f"source {source}.tables: listed twice: {', '.join(dup)}")
    spark_min = p.get("spark_snapshot_min_bytes", SPARK_SNAPSHOT_MIN_BYTES)
    if spark_min is not None and (isinstance(spark_min, bool) or not isinstance(spark_min, int) or spark_min < 0):
        raise ConfigError(f"{what}.spark_snapshot_min_bytes: a size in bytes >= 0 (tables at least this large are "
                          f"snapshotted on Spark), or null to read every snapshot in the task (got {spark_min!r})")
    return PostgresSpec(publication=pub, connection=p.get("connection"), dsn_env=p.get("dsn_env"), tables=tables,
                        spark_snapshot_min_bytes=spark_min)


S3_FORMATS = ("json", "csv", "text", "parquet", "avro")
"""An S3 source's formats: lines (JSON lines, CSV, text; also gzip'd) or whole objects (Parquet, Avro files)."""
S3_METADATA = ("key", "offset", "last_modified")
"""An S3 source's metadata columns (``include:``): ``_key``, ``_offset``, ``_last_modified``."""
DISCOVERIES = ("listing", "notifications")
KEY_ORDERS = ("any", "increasing")
OVERWRITES = ("stall", "collect", "reingest")
COMPRESSIONS = ("auto", "gzip", "none")


@dataclass(frozen=True)
class S3Spec:
    """An S3 source's upstream: the objects under ``url`` (``s3://bucket/prefix/`` on the S3 API its
    ``connection`` reaches, or a local folder), how they are discovered, and what overwrites do
    (``reclock.sources.s3``; docs/s3.md)."""

    url: str
    connection: str | None = "reclock_s3"  # an Airflow connection of type aws (None: a local folder)
    discovery: str = "listing"  # listing | notifications (S3 event notifications through SQS `queue`)
    keys: str = "any"  # listing: any (every cycle lists everything) | increasing (after a key frontier)
    lookback_s: float = 3600.0  # keys increasing: how late a key may arrive after greater ones
    queue: str | None = None  # notifications: the SQS queue URL the bucket's events go to
    dedupe_s: float | None = None  # notifications: how long an object is remembered (None: queue retention)
    backfill: bool = True  # notifications: the first cycle also lists what is there already
    settle_s: float = 30.0  # a local file unchanged this long is complete (S3 objects: on sight)
    on_overwrite: str = "stall"  # stall | collect | reingest
    compression: str = "auto"  # auto (.gz keys are gzip) | gzip | none
    max_objects_per_cycle: int = 100_000  # new objects one binding takes (the rest: the next cycles)
    max_bytes: int = 1 << 30  # bytes one Spark job reads
    max_objects: int = 100_000  # objects one Spark job reads

    @property
    def is_folder(self) -> bool:
        return not self.url.startswith(("s3://", "s3a://"))


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
    registry: RegistrySpec | None = None  # avro, json_schema: writer schemas by id from a Schema Registry

    @property
    def avro_fields(self) -> list[str]:
        """The top-level field names of an Avro record schema."""
        import json

        return [f["name"] for f in json.loads(self.schema)["fields"]]


@dataclass(frozen=True)
class BudgetSpec:
    """How much one Spark job (a slice of a cycle) may read: ``max_records`` upstream records."""

    max_records: int = 1_000_000


@dataclass(frozen=True)
class SourceSpec:
    """One source: a Kafka topic (``kafka``) or a Postgres publication (``postgres``), exactly one of them."""

    name: str
    kafka: KafkaSpec | None = None
    format: FormatSpec = field(default_factory=FormatSpec)
    envelope: str = "none"
    include: tuple[str, ...] = ()
    interval_s: float = 60.0
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    on_decode_error: str = "collect"
    rebuild: str = "task"  # how rebuild__<source> runs: in its Airflow task, or as a spark-submit job
    schedule: str = "interval"  # ingest__<source> runs every interval_s, when upstream moves ("upstream"), or
    #                             runs cycles back to back for lease_s a run ("continuous")
    poll_s: float = 1.0  # upstream: how often the cluster's offsets are probed; continuous: the idle pause
    lease_s: float = 600.0  # continuous: how long one run keeps cycling before the next run takes over
    resume_s: float = 1.0  # continuous: resume at most this often (and when the lease ends)
    group: str | None = None  # continuous: the group whose one task runs this source's cycles
    postgres: PostgresSpec | None = None
    schema_mode: str = "fixed"  # registry formats: fixed | evolve (``schema:`` in the config)
    kinesis: Any = None  # reclock.sources.kinesis.config.KinesisSpec: a Kinesis stream
    s3: S3Spec | None = None

    @property
    def ingest_dag(self) -> str:
        """The DAG that runs this source's cycles: ``ingest__<source>``, or ``ingest_group__<group>``."""
        return f"ingest_group__{self.group}" if self.group else f"ingest__{self.name}"

    @property
    def kind(self) -> str:
        """``kafka``, ``postgres``, ``s3`` or ``kinesis``: the kind the source is registered as."""
        if self.s3 is not None:
            return "s3"
        return "postgres" if self.postgres is not None else "kinesis" if self.kinesis is not None else "kafka"

    @property
    def consumer_group(self) -> str:
        """The Kafka consumer group whose committed offsets show this source's progress (lag tools)."""
        return f"reclock-{self.name}"

    @property
    def data_shard(self) -> str:
        """Output 0: the source's collection."""
        return self.name

    @property
    def errors_shard(self) -> str:
        """The source's error collection: undecodable records with partition, offset, raw bytes, reason."""
        return f"{self.name}{ERRORS_SUFFIX}"

    @property
    def table_shards(self) -> tuple[str, ...]:
        """A Postgres source's collections, one per table listed in the config, in order."""
        return tuple(pg_table_shard(self.name, t) for t in self.postgres.tables) if self.postgres else ()

    @property
    def shards(self) -> tuple[str, ...]:
        """Every collection of the source known from its config (a Postgres source without ``tables:``
        learns its tables' collections at its first cycle)."""
        if self.postgres is not None:
            return (*self.table_shards, self.errors_shard)
        return (self.data_shard, self.errors_shard)


def _require(mapping: Any, what: str) -> dict:
    if not isinstance(mapping, dict):
        raise ConfigError(f"{what}: expected a mapping, got {type(mapping).__name__}")
    return mapping


def _unknown(d: dict, allowed: set[str], what: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise ConfigError(f"{what}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def _parse_kafka(raw: Any, what: str) -> KafkaSpec:
    """A ``kafka:`` section (a source's or a sink's): topic, connection or bootstrap, extra options."""
    k = _require(raw, what)
    _unknown(k, {"topic", "connection", "bootstrap", "options"}, what)
    if not k.get("topic") or not isinstance(k["topic"], str):
        raise ConfigError(f"{what}: `topic` is required")
    opts = _require(k.get("options", {}) or {}, f"{what}.options")
    return KafkaSpec(topic=k["topic"], connection=str(k.get("connection", "reclock_kafka")),
                     bootstrap=k.get("bootstrap"), options=tuple(sorted((str(a), str(b)) for a, b in opts.items())))


def _avro_schema(f: dict, what: str, base: Path | None) -> str:
    """Load and check the Avro schema of ``format: avro`` (a record with fields), as JSON text."""
    import json

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


def parse_source(name: str, raw: Any, base: Path | None = None) -> SourceSpec:
    """Validate one source's config; ``base`` is the folder relative schema files are found in."""
    what = f"source {name}"
    if not NAME_RE.match(name):
        raise ConfigError(f"{what}: a source name must match {NAME_RE.pattern} (it becomes a SQL name)")
    d = _require(raw, what)
    if "postgres" in d:
        return _parse_postgres_source(name, d)
    if "s3" in d:
        return _parse_s3_source(name, d, base)
    if "tables" in d:
        raise ConfigError(f"{what}: `tables` belongs to a Postgres source (a `postgres:` section)")
    _unknown(d, {"kafka", "kinesis", "format", "envelope", "include", "interval", "budget", "on_decode_error",
                 "rebuild", "schedule", "poll", "lease", "resume", "group", "schema"}, what)
    if "kafka" in d and "kinesis" in d:
        raise ConfigError(f"{what}: has both a `kafka:` and a `kinesis:` section; a source reads one upstream")
    if "kafka" not in d and "kinesis" not in d:
        raise ConfigError(f"{what}: needs a `kafka:` section with at least `topic:` (or `kinesis:` with `stream:`, "
                          "or `postgres:`)")
    kafka = _parse_kafka(d["kafka"], f"{what}.kafka") if "kafka" in d else None
    kinesis = None
    if "kinesis" in d:
        from reclock.sources.kinesis.config import parse_kinesis

        kinesis = parse_kinesis(d["kinesis"], f"{what}.kinesis")
    f = d.get("format", {"type": "json"})
    if isinstance(f, str):
        f = {"type": f}
    f = _require(f, f"{what}.format")
    _unknown(f, {"type", "schema", "header", "schema_file", "wire", "registry"}, f"{what}.format")
    ftype = f.get("type", "json")
    if ftype not in FORMATS:
        raise ConfigError(f"{what}.format: type {ftype!r} is not one of {', '.join(FORMATS)}")
    if "registry" in f and kafka is None:
        raise ConfigError(f"{what}.format: `registry:` is read by Kafka sources only (not yet by a Kinesis source)")
    registry = _parse_registry(f, f"{what}.format", ftype, kafka.topic if kafka is not None else "")
    schema = f.get("schema")
    if ftype in ("json", "csv") and not schema:
        raise ConfigError(f"{what}.format: type {ftype} needs a `schema` (Spark DDL, e.g. \"id BIGINT, name STRING\")")
    if ftype == "avro" and (registry is None or "schema_file" in f):
        schema = _avro_schema(f, f"{what}.format", base)
    wire = f.get("wire", "confluent" if registry is not None else "plain")
    if wire not in WIRES:
        raise ConfigError(f"{what}.format: wire {wire!r} is not one of {', '.join(WIRES)}")
    if registry is not None and wire != "confluent":
        raise ConfigError(f"{what}.format: records read through a registry are in the Confluent wire format "
                          "(leave out `wire:`, or give `wire: confluent`)")
    fmt = FormatSpec(type=ftype, schema=schema, csv_header=bool(f.get("header", False)), wire=wire,
                     registry=registry)
    schema_mode = d.get("schema", "fixed")
    if schema_mode not in SCHEMA_MODES:
        raise ConfigError(f"{what}: schema {schema_mode!r} is not one of {', '.join(SCHEMA_MODES)}")
    if schema_mode == "evolve" and registry is None:
        raise ConfigError(f"{what}: `schema: evolve` needs writer schemas from a registry (`format.registry:`)")
    envelope = d.get("envelope", "none")
    if envelope not in ENVELOPES:
        raise ConfigError(f"{what}: envelope {envelope!r} is not one of {', '.join(ENVELOPES)}")
    include = tuple(d.get("include", ()) or ())
    if kinesis is not None:
        from reclock.sources.kinesis.config import METADATA as allowed
    else:
        allowed = METADATA
    bad = [c for c in include if c not in allowed]
    if bad:
        raise ConfigError(f"{what}: include {bad} not among {', '.join(allowed)}")
    if envelope == "upsert" and "headers" in include:
        raise ConfigError(f"{what}: envelope upsert cannot include headers (the upsert state keeps key, value, "
                          "partition, offset and timestamp of each key's current record)")
    b = _require(d.get("budget", {}) or {}, f"{what}.budget")
    if "max_bytes" in b:
        raise ConfigError(f"{what}.budget: max_bytes is not supported for a source (Kafka does not tell a range's "
                          "size before it is read); size a cycle's Spark jobs with max_records")
    _unknown(b, {"max_records"}, f"{what}.budget")
    budget = BudgetSpec(max_records=int(b.get("max_records", 1_000_000)))
    if budget.max_records <= 0:
        raise ConfigError(f"{what}.budget: max_records must be positive, got {budget.max_records}")
    on_err = d.get("on_decode_error", "collect")
    if on_err not in ("collect", "stall"):
        raise ConfigError(f"{what}: on_decode_error {on_err!r} is not collect or stall")
    rebuild = d.get("rebuild", "task")
    if rebuild not in REBUILDS:
        raise ConfigError(f"{what}: rebuild {rebuild!r} is not one of {', '.join(REBUILDS)}")
    sched = _parse_schedule(d, what, SCHEDULES)
    return SourceSpec(name=name, kafka=kafka, kinesis=kinesis, format=fmt, envelope=envelope, include=include,
                      budget=budget, on_decode_error=on_err, rebuild=rebuild, schema_mode=schema_mode, **sched)


def _parse_registry(f: dict, what: str, ftype: str, topic: str) -> RegistrySpec | None:
    """``format.registry`` (required for json_schema, optional for avro, refused for the others)."""
    if "registry" not in f:
        if ftype in ("json_schema", "protobuf"):
            raise ConfigError(f"{what}: type {ftype} needs `registry:` (where the writer schemas are, e.g. "
                              "{connection: reclock_registry})")
        return None
    if ftype not in ("avro", "json_schema", "protobuf"):
        raise ConfigError(f"{what}: `registry:` is for avro, json_schema and protobuf, not {ftype}")
    r = _require(f["registry"] or {}, f"{what}.registry")
    _unknown(r, {"connection", "url", "subject"}, f"{what}.registry")
    subject = r.get("subject") or f"{topic}-value"
    if not isinstance(subject, str):
        raise ConfigError(f"{what}.registry: subject must be a string, got {subject!r}")
    url = r.get("url")
    if url is not None and not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ConfigError(f"{what}.registry: url {url!r} is not an http(s):// URL")
    return RegistrySpec(connection=str(r.get("connection", "reclock_registry")), url=url, subject=subject)


SCHEDULES = ("interval", "upstream", "continuous")

PG_SCHEDULES = ("interval", "upstream")
"""A Postgres source's schedules: not ``continuous``, since its upper (the flush LSN) moves with any WAL the
server writes, so cycles back to back would mint a binding every ``poll``."""


def _parse_schedule(d: dict, what: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    """A source's ``schedule:`` and the keys that go with it (``interval``; ``poll``; ``lease``, ``resume``,
    ``group``), as :class:`SourceSpec` fields; a key that does not belong to the schedule is an error."""
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
            "resume_s": parse_duration(d.get("resume", "1s"), f"{what}.resume")}
"""When ``ingest__<source>`` runs: every ``interval``; when the topic holds records beyond the newest
binding (``reclock.orchestration.triggers``); or continuously, one run cycling back to back for ``lease``
and the next run taking over (``reclock.continuous``; with ``group:``, one run of ``ingest_group__<group>``
cycles every source of the group, each in its own thread)."""


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


def _parse_postgres_source(name: str, d: dict) -> SourceSpec:
    """A source with a ``postgres:`` section: ``tables``, ``budget`` and the schedule's keys besides it."""
    what = f"source {name}"
    if "kafka" in d:
        raise ConfigError(f"{what}: a source is either `kafka:` or `postgres:`, not both")
    _unknown(d, {"postgres", "tables", "budget", "schedule", "interval", "poll"}, what)
    if d.get("schedule") == "continuous":
        raise ConfigError(f"{what}: a Postgres source cannot be `schedule: continuous` (its upper, the flush LSN, "
                          "moves with any WAL the server writes, so cycles back to back would mint a binding every "
                          "`poll`); use `schedule: upstream`, which runs a cycle when the publication has changes")
    sched = _parse_schedule(d, what, PG_SCHEDULES)
    pg = _parse_postgres(name, d["postgres"], d.get("tables"))
    b = _require(d.get("budget", {}) or {}, f"{what}.budget")
    _unknown(b, {"max_records"}, f"{what}.budget")
    budget = BudgetSpec(max_records=int(b.get("max_records", 100_000)))
    if budget.max_records <= 0:
        raise ConfigError(f"{what}.budget: max_records must be positive, got {budget.max_records}")
    return SourceSpec(name=name, postgres=pg, budget=budget, **sched)


def _choice(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ConfigError(f"{what}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _size(value: Any, what: str) -> int:
    """A byte count: an int, or text like 512MB / 1GiB / 64k."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.match(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", str(value).lower())
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"{what}: {value!r} is not a size like 134217728, 128MB or 1GiB")
    return int(m.group(1)) * 1024 ** "_kmgt".index(m.group(2) or "_")


def _parse_s3_source(name: str, d: dict, base: Path | None) -> SourceSpec:
    """A source with an ``s3:`` section: the objects under an ``s3://`` prefix or in a local folder
    (``reclock.sources.s3``)."""
    what = f"source {name}"
    for other in ("kafka", "postgres"):
        if other in d:
            raise ConfigError(f"{what}: a source has one upstream section; `s3:` and `{other}:` are both given")
    _unknown(d, {"s3", "format", "include", "budget", "on_decode_error", "schedule", "interval", "poll"}, what)
    s = _require(d["s3"], f"{what}.s3")
    _unknown(s, {"connection", "url", "discovery", "keys", "lookback", "queue", "dedupe", "backfill", "settle",
                 "on_overwrite", "compression", "max_objects_per_cycle"}, f"{what}.s3")
    url = s.get("url")
    if not isinstance(url, str) or not url:
        raise ConfigError(f"{what}.s3: `url` is required: s3://bucket/prefix/ or a local folder (/path, file:///path)")
    is_s3 = url.startswith(("s3://", "s3a://"))
    if is_s3:
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        if not bucket:
            raise ConfigError(f"{what}.s3: url {url!r} names no bucket (s3://bucket/prefix/)")
    elif not (url.startswith("file://") or url.startswith("/")):
        raise ConfigError(f"{what}.s3: url {url!r} is neither s3://bucket/prefix/ nor an absolute folder path")
    if not is_s3 and "connection" in s:
        raise ConfigError(f"{what}.s3: `connection:` is for an s3:// url; {url} is a local folder")
    connection = str(s.get("connection", "reclock_s3")) if is_s3 else None
    discovery = _choice(s.get("discovery", "listing"), DISCOVERIES, f"{what}.s3.discovery")
    keys = _choice(s.get("keys", "any"), KEY_ORDERS, f"{what}.s3.keys")
    if discovery == "notifications":
        if not is_s3:
            raise ConfigError(f"{what}.s3: `discovery: notifications` needs an s3:// url (a folder is listed)")
        if not isinstance(s.get("queue"), str) or not s["queue"]:
            raise ConfigError(f"{what}.s3: `discovery: notifications` needs `queue:`, the SQS queue the bucket's event "
                              "notifications go to: its URL (https://sqs.<region>.amazonaws.com/<account>/<name>) or "
                              "its name (in the connection's region)")
        for key in ("keys", "lookback"):
            if key in s:
                raise ConfigError(f"{what}.s3: `{key}:` is for `discovery: listing`")
    else:
        for key in ("queue", "dedupe", "backfill"):
            if key in s:
                raise ConfigError(f"{what}.s3: `{key}:` is for `discovery: notifications`")
        if "lookback" in s and keys != "increasing":
            raise ConfigError(f"{what}.s3: `lookback:` is for `keys: increasing` (a listing that starts after a key "
                              "frontier)")
    if "settle" in s and is_s3:
        raise ConfigError(f"{what}.s3: `settle:` is for a local folder (S3 objects are complete when they appear)")
    backfill = s.get("backfill", True)
    if not isinstance(backfill, bool):
        raise ConfigError(f"{what}.s3.backfill: true or false")
    max_new = s.get("max_objects_per_cycle", 100_000)
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new <= 0:
        raise ConfigError(f"{what}.s3.max_objects_per_cycle: a positive number of objects, got {max_new!r}")
    f = d.get("format", {"type": "json"})
    f = _require({"type": f} if isinstance(f, str) else f, f"{what}.format")
    _unknown(f, {"type", "schema", "header", "schema_file"}, f"{what}.format")
    ftype = _choice(f.get("type", "json"), S3_FORMATS, f"{what}.format.type")
    schema = f.get("schema")
    if ftype in ("json", "csv", "parquet") and not schema:
        raise ConfigError(f"{what}.format: type {ftype} needs a `schema` (Spark DDL, e.g. \"id BIGINT, name STRING\")")
    if ftype == "avro":
        schema = _avro_schema(f, f"{what}.format", base)
    if "header" in f and ftype != "csv":
        raise ConfigError(f"{what}.format: `header:` is for csv")
    compression = _choice(s.get("compression", "auto"), COMPRESSIONS, f"{what}.s3.compression")
    if ftype in ("parquet", "avro") and compression == "gzip":
        raise ConfigError(f"{what}.s3: {ftype} files compress inside; `compression: gzip` is for line formats")
    include = tuple(d.get("include", ()) or ())
    bad = [c for c in include if c not in S3_METADATA]
    if bad:
        raise ConfigError(f"{what}: include {bad} not among {', '.join(S3_METADATA)} (an S3 source's metadata)")
    b = _require(d.get("budget", {}) or {}, f"{what}.budget")
    _unknown(b, {"max_bytes", "max_objects"}, f"{what}.budget")
    max_bytes = _size(b.get("max_bytes", S3Spec.max_bytes), f"{what}.budget.max_bytes")
    max_objects = b.get("max_objects", S3Spec.max_objects)
    if isinstance(max_objects, bool) or not isinstance(max_objects, int) or max_objects <= 0:
        raise ConfigError(f"{what}.budget.max_objects: a positive number of objects, got {max_objects!r}")
    on_err = _choice(d.get("on_decode_error", "collect"), ("collect", "stall"), f"{what}.on_decode_error")
    dedupe = s.get("dedupe")
    spec = S3Spec(url=url, connection=connection, discovery=discovery, keys=keys,
                  lookback_s=parse_duration(s.get("lookback", "1h"), f"{what}.s3.lookback"),
                  queue=s.get("queue"), dedupe_s=None if dedupe is None else parse_duration(dedupe, f"{what}.s3.dedupe"),
                  backfill=backfill, settle_s=parse_duration(s.get("settle", "30s"), f"{what}.s3.settle"),
                  on_overwrite=_choice(s.get("on_overwrite", "stall"), OVERWRITES, f"{what}.s3.on_overwrite"),
                  compression=compression, max_objects_per_cycle=max_new, max_bytes=max_bytes, max_objects=max_objects)
    sched = _parse_schedule(d, what, PG_SCHEDULES)
    fmt = FormatSpec(type=ftype, schema=schema, csv_header=bool(f.get("header", False)))
    return SourceSpec(name=name, s3=spec, format=fmt, include=include, on_decode_error=on_err, **sched)


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
    _unknown(d, {"from", "iceberg", "layout", "start", "budget", "copy_min_bytes"}, what)
    ice = _require(d["iceberg"], f"{what}.iceberg")
    _unknown(ice, {"table", "catalog"}, f"{what}.iceberg")
    table = ice.get("table")
    if not isinstance(table, str) or not ICEBERG_TABLE_RE.match(table):
        raise ConfigError(f"{what}.iceberg: `table` must be namespace.table (letters, digits, _), got {table!r}")
    catalog = ice.get("catalog", "reclock")
    if not isinstance(catalog, str) or not NAME_RE.match(catalog):
        raise ConfigError(f"{what}.iceberg: `catalog` must match {NAME_RE.pattern}, got {catalog!r}")
    retracts = coll == source.data_shard and source.envelope == "upsert"
    layout = d.get("layout", "changelog" if retracts else "append")
    if layout not in ICEBERG_LAYOUTS:
        raise ConfigError(f"{what}: layout {layout!r} is not one of {', '.join(ICEBERG_LAYOUTS)}")
    if layout == "append" and retracts:
        raise ConfigError(f"{what}: {coll} is an upsert collection (its updates retract rows), which an append "
                          "layout cannot hold; use `layout: changelog`")
    b = _require(d.get("budget", {}) or {}, f"{what}.budget")
    _unknown(b, {"max_rows", "max_bytes"}, f"{what}.budget")
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
    d = _require(raw, what)
    collections = {c: s for s in sources.values() for c in s.shards}
    coll = d.get("from")
    if coll not in collections:
        raise ConfigError(f"{what}: `from` must name a collection; {coll!r} is none of "
                          f"{', '.join(sorted(collections)) or '(no sources configured)'}")
    if "iceberg" in d and "kafka" in d:
        raise ConfigError(f"{what}: give either `kafka:` (a Kafka sink) or `iceberg:` (an Iceberg export), not both")
    if "iceberg" in d:
        return _parse_iceberg_sink(name, d, coll, collections[coll], what)
    _unknown(d, {"from", "kafka", "format", "key", "progress_topic", "start", "partitions", "budget",
                 "transaction_timeout"}, what)
    kafka = _parse_kafka(d.get("kafka"), f"{what}.kafka")
    source_kafka = collections[coll].kafka
    if source_kafka is not None and kafka.topic == source_kafka.topic:
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
    b = _require(d.get("budget", {}) or {}, f"{what}.budget")
    _unknown(b, {"max_messages", "max_bytes"}, f"{what}.budget")
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

    def source(self, name: str) -> SourceSpec:
        try:
            return self.sources[name]
        except KeyError:
            raise ConfigError(f"no source named {name!r}; configured: {', '.join(sorted(self.sources)) or '(none)'}")


def parse_config(raw: Any, base: Path | None = None) -> Config:
    d = _require(raw or {}, "config")
    _unknown(d, {"sources", "sinks"}, "config")
    raw_sources = _require(d.get("sources", {}) or {}, "sources")
    sources = {name: parse_source(name, spec, base) for name, spec in raw_sources.items()}
    _check_groups(sources)
    raw_sinks = _require(d.get("sinks", {}) or {}, "sinks")
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
