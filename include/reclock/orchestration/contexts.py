"""A cycle's, a sink's or an export's context from the settings (``reclock.settings``: arguments first, then
the environment, then Airflow connections): what DAG tasks, ``spark_jobs/`` and ``reclock`` commands build
before they call a plain library function."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from reclock.config import IcebergSinkSpec, SinkSpec
from reclock.cycle import CycleContext
from reclock.errors import ConfigError, SettingError
from reclock.persist import objectstore
from reclock.settings import (SparkTarget, find_blob_store, find_blob_url, find_dsn, find_kafka, find_s3_settings,
                              find_spark, retain_history_ms, seconds_setting)
from reclock.sinks.iceberg import CatalogSettings, IcebergSinkContext, catalog_uri
from reclock.sinks.kafka import SinkContext
from reclock.sources.registry import kind_of
from reclock.specs import BudgetSpec, SourceSpec


def with_run_conf(spec: SourceSpec, conf: dict[str, Any] | None) -> SourceSpec:
    """``spec`` with the budget a run's conf overrides (``max_records``); any other key is refused."""
    conf = conf or {}
    unknown = sorted(set(conf) - {"max_records"})
    if unknown:
        raise ConfigError(f"source {spec.name}: run conf keys {', '.join(unknown)} are not known (a run's conf "
                          'may set only max_records, e.g. {"max_records": 1000})')
    if "max_records" not in conf:
        return spec
    mr = int(conf["max_records"])
    if mr <= 0:
        raise ConfigError(f"source {spec.name}: run conf max_records must be positive, got {mr}")
    return replace(spec, budget=BudgetSpec(max_records=mr))


def cycle_context(spec: SourceSpec, conf: dict[str, Any] | None = None, *, dsn: str | None = None,
                  blob_url: str | None = None, upstream: str | None = None,
                  spark: SparkTarget | None = None) -> CycleContext:
    """A cycle's context for ``spec`` from the settings (arguments first; ``upstream``: where the upstream is,
    as a command's option gives it, e.g. Kafka's ``--bootstrap``). Spark is found when a step first needs it,
    unless ``spark`` is given. Run conf may override the budget: ``{"max_records": 1000}``."""
    spec = with_run_conf(spec, conf)
    dsn = find_dsn(dsn)
    return CycleContext(
        spec=spec,
        dsn=dsn,
        upstream=kind_of(spec).find_upstream(spec, upstream),
        blob=find_blob_store(blob_url),
        spark_factory=lambda: (spark or find_spark()).session(spec.name),
        retain_history_ms=retain_history_ms(),
        gc_grace_s=seconds_setting("RECLOCK_GC_GRACE_S", 3600.0),
        gc_interval_s=seconds_setting("RECLOCK_GC_INTERVAL_S", 300.0),
        stats_keep_s=seconds_setting("RECLOCK_STATS_RETAIN_S", 7 * 86400.0),
    )


def sink_context(spec: SinkSpec, *, dsn: str | None = None, blob_url: str | None = None,
                 bootstrap: str | None = None) -> SinkContext:
    """A sink's context for ``spec`` from the settings (arguments first)."""
    return SinkContext(spec=spec, dsn=find_dsn(dsn), blob=find_blob_store(blob_url),
                       kafka=find_kafka(spec.kafka, f"sink {spec.name}", bootstrap))


def find_catalog_settings(dsn: str, blob_url: str) -> CatalogSettings:
    """The Iceberg SQL catalog: ``RECLOCK_ICEBERG_CATALOG_URI`` (a SQLAlchemy URL), else the consensus
    Postgres ``dsn``; the warehouse ``RECLOCK_ICEBERG_WAREHOUSE``, else ``<blob_url>/_iceberg`` (no source
    or shard is named ``_iceberg``, so garbage collection never looks there); an ``s3://`` warehouse on
    :func:`find_s3_settings`."""
    uri = os.environ.get("RECLOCK_ICEBERG_CATALOG_URI") or catalog_uri(dsn)
    warehouse = os.environ.get("RECLOCK_ICEBERG_WAREHOUSE") or blob_url.rstrip("/") + "/_iceberg"
    if warehouse.startswith("s3a://"):
        raise SettingError(f"Iceberg warehouse {warehouse!r}: write s3://bucket/prefix (s3a:// is Spark's name)")
    return CatalogSettings(uri=uri, warehouse=warehouse,
                           s3=find_s3_settings() if objectstore.is_s3(warehouse) else None)


def iceberg_sink_context(spec: IcebergSinkSpec, *, dsn: str | None = None,
                         blob_url: str | None = None) -> IcebergSinkContext:
    """An Iceberg sink's context for ``spec`` from the settings (arguments first)."""
    dsn, url = find_dsn(dsn), find_blob_url(blob_url)
    return IcebergSinkContext(spec=spec, dsn=dsn, blob=find_blob_store(url), catalog=find_catalog_settings(dsn, url))


def any_sink_context(spec: SinkSpec | IcebergSinkSpec, *, dsn: str | None = None, blob_url: str | None = None,
                     bootstrap: str | None = None) -> SinkContext | IcebergSinkContext:
    """The context of a Kafka sink or an Iceberg export, by its spec."""
    if isinstance(spec, IcebergSinkSpec):
        return iceberg_sink_context(spec, dsn=dsn, blob_url=blob_url)
    return sink_context(spec, dsn=dsn, blob_url=blob_url, bootstrap=bootstrap)
