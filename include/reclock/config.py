"""Declarative source specs, validated (YAML in, frozen dataclasses out).

A config file holds ``sources:`` (and, later, ``sinks:``). Example::

    sources:
      orders:
        kafka:
          connection: reclock_kafka        # Airflow connection id (or `bootstrap: host:port`)
          topic: orders
        format:
          type: json                       # json | csv | text | bytes
          schema: "id BIGINT, customer STRING, amount DOUBLE"   # Spark DDL, for json and csv
        envelope: none                     # none | upsert (upsert keys on the Kafka key)
        include: [partition, offset, key, timestamp, headers]  # metadata columns (like INCLUDE)
        interval: 30s                      # the DAG's schedule
        budget: {max_records: 500000, max_bytes: 268435456}
        on_decode_error: collect           # collect (to <source>_errors) | stall

The file is ``$RECLOCK_CONFIG`` if set, else ``include/reclock.yaml`` in the repo.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reclock.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
FORMATS = ("json", "csv", "text", "bytes")
ENVELOPES = ("none", "upsert")
METADATA = ("partition", "offset", "key", "timestamp", "headers")
ERRORS_SUFFIX = "_errors"
"""A source's error collection is the shard ``<source>_errors``."""
_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")


def parse_duration(value: Any, what: str) -> float:
    """``30s`` / ``500ms`` / ``5m`` / ``1h`` / a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = _DURATION.match(str(value).strip())
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"{what}: {value!r} is not a duration like 500ms, 30s, 5m or 1h")
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


@dataclass(frozen=True)
class KafkaSpec:
    topic: str
    connection: str = "reclock_kafka"
    bootstrap: str | None = None  # overrides the connection (tests, scripts)
    options: tuple[tuple[str, str], ...] = ()  # extra librdkafka / Spark kafka.* options


@dataclass(frozen=True)
class FormatSpec:
    type: str = "json"
    schema: str | None = None  # Spark DDL
    csv_header: bool = False


@dataclass(frozen=True)
class BudgetSpec:
    max_records: int = 1_000_000
    max_bytes: int | None = None


@dataclass(frozen=True)
class SourceSpec:
    name: str
    kafka: KafkaSpec
    format: FormatSpec = field(default_factory=FormatSpec)
    envelope: str = "none"
    include: tuple[str, ...] = ()
    interval_s: float = 60.0
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    on_decode_error: str = "collect"

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
    def shards(self) -> tuple[str, ...]:
        return (self.data_shard, self.errors_shard)


def _require(mapping: Any, what: str) -> dict:
    if not isinstance(mapping, dict):
        raise ConfigError(f"{what}: expected a mapping, got {type(mapping).__name__}")
    return mapping


def _unknown(d: dict, allowed: set[str], what: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise ConfigError(f"{what}: unknown key(s) {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}")


def parse_source(name: str, raw: Any) -> SourceSpec:
    what = f"source {name}"
    if not NAME_RE.match(name):
        raise ConfigError(f"{what}: a source name must match {NAME_RE.pattern} (it becomes a SQL name)")
    d = _require(raw, what)
    _unknown(d, {"kafka", "format", "envelope", "include", "interval", "budget", "on_decode_error"}, what)
    if "kafka" not in d:
        raise ConfigError(f"{what}: needs a `kafka:` section with at least `topic:`")
    k = _require(d["kafka"], f"{what}.kafka")
    _unknown(k, {"topic", "connection", "bootstrap", "options"}, f"{what}.kafka")
    if not k.get("topic") or not isinstance(k["topic"], str):
        raise ConfigError(f"{what}.kafka: `topic` is required")
    opts = _require(k.get("options", {}) or {}, f"{what}.kafka.options")
    kafka = KafkaSpec(topic=k["topic"], connection=str(k.get("connection", "reclock_kafka")),
                      bootstrap=k.get("bootstrap"),
                      options=tuple(sorted((str(a), str(b)) for a, b in opts.items())))
    f = d.get("format", {"type": "json"})
    if isinstance(f, str):
        f = {"type": f}
    f = _require(f, f"{what}.format")
    _unknown(f, {"type", "schema", "header"}, f"{what}.format")
    ftype = f.get("type", "json")
    if ftype not in FORMATS:
        raise ConfigError(f"{what}.format: type {ftype!r} is not one of {', '.join(FORMATS)}")
    schema = f.get("schema")
    if ftype in ("json", "csv") and not schema:
        raise ConfigError(f"{what}.format: type {ftype} needs a `schema` (Spark DDL, e.g. \"id BIGINT, name STRING\")")
    fmt = FormatSpec(type=ftype, schema=schema, csv_header=bool(f.get("header", False)))
    envelope = d.get("envelope", "none")
    if envelope not in ENVELOPES:
        raise ConfigError(f"{what}: envelope {envelope!r} is not one of {', '.join(ENVELOPES)}")
    include = tuple(d.get("include", ()) or ())
    bad = [c for c in include if c not in METADATA]
    if bad:
        raise ConfigError(f"{what}: include {bad} not among {', '.join(METADATA)}")
    b = _require(d.get("budget", {}) or {}, f"{what}.budget")
    _unknown(b, {"max_records", "max_bytes"}, f"{what}.budget")
    budget = BudgetSpec(max_records=int(b.get("max_records", 1_000_000)),
                        max_bytes=int(b["max_bytes"]) if b.get("max_bytes") else None)
    if budget.max_records <= 0 or (budget.max_bytes is not None and budget.max_bytes <= 0):
        raise ConfigError(f"{what}.budget: max_records and max_bytes must be positive")
    on_err = d.get("on_decode_error", "collect")
    if on_err not in ("collect", "stall"):
        raise ConfigError(f"{what}: on_decode_error {on_err!r} is not collect or stall")
    return SourceSpec(name=name, kafka=kafka, format=fmt, envelope=envelope, include=include,
                      interval_s=parse_duration(d.get("interval", "60s"), f"{what}.interval"),
                      budget=budget, on_decode_error=on_err)


@dataclass(frozen=True)
class Config:
    sources: dict[str, SourceSpec]

    def source(self, name: str) -> SourceSpec:
        try:
            return self.sources[name]
        except KeyError:
            raise ConfigError(f"no source named {name!r}; configured: {', '.join(sorted(self.sources)) or '(none)'}")


def parse_config(raw: Any) -> Config:
    d = _require(raw or {}, "config")
    _unknown(d, {"sources", "sinks"}, "config")
    sources = _require(d.get("sources", {}) or {}, "sources")
    return Config(sources={name: parse_source(name, spec) for name, spec in sources.items()})


def default_config_path() -> Path:
    from reclock.dev.state import REPO_ROOT

    return Path(os.environ.get("RECLOCK_CONFIG", REPO_ROOT / "include" / "reclock.yaml"))


def load_config(path: Path | str | None = None) -> Config:
    p = Path(path) if path else default_config_path()
    if not p.exists():
        return Config(sources={})
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e
    try:
        return parse_config(raw)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from e
