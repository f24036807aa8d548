"""A Kinesis source's config: its ``kinesis:`` section (:class:`reclock.sources.kinesis.config.KinesisSpec`, the
source's ``upstream``) and the keys beside it that a Kinesis source takes: ``format``, ``envelope``
(``upsert``: keyed by the partition key), ``include``, ``budget``, ``on_decode_error``, ``rebuild`` and the
schedule's (``interval``, ``upstream``, ``continuous``)."""

from __future__ import annotations

from pathlib import Path

from reclock.errors import ConfigError
from reclock.sources.kinesis.config import METADATA, parse_kinesis
from reclock.specs import (ENVELOPES, REBUILDS, SCHEDULE_KEYS, SourceSpec, parse_budget, parse_format,
                           parse_schedule, refuse_unknown, require)

SCHEDULES = ("interval", "upstream", "continuous")


def parse_kinesis_source(name: str, d: dict, base: Path | None) -> SourceSpec:
    """The source ``name``'s mapping ``d`` (it has a ``kinesis:`` section), validated."""
    what = f"source {name}"
    refuse_unknown(d, {"kinesis", "format", "envelope", "include", "budget", "on_decode_error", "rebuild",
                       *SCHEDULE_KEYS}, what)
    kinesis = parse_kinesis(d["kinesis"], f"{what}.kinesis")
    fmt = parse_format(d.get("format", {"type": "json"}), f"{what}.format", base)
    envelope = d.get("envelope", "none")
    if envelope not in ENVELOPES:
        raise ConfigError(f"{what}: envelope {envelope!r} is not one of {', '.join(ENVELOPES)}")
    include = tuple(d.get("include", ()) or ())
    bad = [c for c in include if c not in METADATA]
    if bad:
        raise ConfigError(f"{what}: include {bad} not among {', '.join(METADATA)}")
    b = require(d.get("budget", {}) or {}, f"{what}.budget")
    if "max_bytes" in b:
        raise ConfigError(f"{what}.budget: max_bytes is not supported for a Kinesis source (a scan counts records); "
                          "size a cycle's bindings and Spark jobs with max_records")
    budget = parse_budget(b, f"{what}.budget", 1_000_000)
    on_err = d.get("on_decode_error", "collect")
    if on_err not in ("collect", "stall"):
        raise ConfigError(f"{what}: on_decode_error {on_err!r} is not collect or stall")
    rebuild = d.get("rebuild", "task")
    if rebuild not in REBUILDS:
        raise ConfigError(f"{what}: rebuild {rebuild!r} is not one of {', '.join(REBUILDS)}")
    sched = parse_schedule(d, what, SCHEDULES)
    return SourceSpec(name=name, upstream=kinesis, format=fmt, envelope=envelope, include=include, budget=budget,
                      on_decode_error=on_err, rebuild=rebuild, **sched)
