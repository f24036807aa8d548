"""An Iceberg sink's config (``sinks: {name: {from, iceberg: {...}}}``), its catalog settings, and the layout
``shape`` gives a collection's consolidated updates; the Kafka sink's config is unchanged."""

from __future__ import annotations

import pyarrow as pa
import pytest

from reclock.config import IcebergSinkSpec, SinkSpec, parse_config
from reclock.errors import ConfigError
from reclock.orchestration.contexts import find_catalog_settings
from reclock.persist.objectstore import S3Settings, pyiceberg_options
from reclock.errors import SinkRefused
from reclock.sinks.iceberg import RetractionInAppendTable, catalog_uri, shape, table_schema

SOURCES = {"orders": {"kafka": {"topic": "orders", "bootstrap": "127.0.0.1:9"}, "format": {"type": "bytes"}},
           "users": {"kafka": {"topic": "users", "bootstrap": "127.0.0.1:9"}, "format": {"type": "bytes"},
                     "envelope": "upsert"}}


def sink(**raw):
    return parse_config({"sources": SOURCES, "sinks": {"lake": raw}}).sinks["lake"]


def test_an_iceberg_sink_and_its_layout_defaults():
    s = sink(**{"from": "orders", "iceberg": {"table": "lake.orders"}})
    assert isinstance(s, IcebergSinkSpec)
    assert (s.table, s.catalog, s.layout, s.namespace, s.holder) == ("lake.orders", "reclock", "append", "lake",
                                                                     "sink:lake")
    assert sink(**{"from": "users", "iceberg": {"table": "lake.users"}}).layout == "changelog"
    assert sink(**{"from": "users_errors", "iceberg": {"table": "lake.e"}}).layout == "append"
    assert sink(**{"from": "orders", "iceberg": {"table": "a.b.c", "catalog": "lakehouse"}, "layout": "changelog",
                   "budget": {"max_rows": 5}, "start": 7}).budget.max_rows == 5
    assert s.copy_min_bytes == 8 << 20
    assert sink(**{"from": "orders", "iceberg": {"table": "l.o"}, "copy_min_bytes": 0}).copy_min_bytes == 0
    assert sink(**{"from": "orders", "iceberg": {"table": "l.o"}, "copy_min_bytes": None}).copy_min_bytes is None
    kafka = sink(**{"from": "orders", "kafka": {"topic": "out", "bootstrap": "x:1"}})
    assert isinstance(kafka, SinkSpec) and kafka.kafka.topic == "out"


@pytest.mark.parametrize("raw, message", [
    ({"from": "orders", "iceberg": {"table": "orders"}}, r"`table` must be namespace\.table"),
    ({"from": "orders", "iceberg": {"table": "lake.o-x"}}, r"`table` must be namespace\.table"),
    ({"from": "orders", "iceberg": {"table": "lake.o", "warehouse": "/x"}}, r"unknown key\(s\) warehouse"),
    ({"from": "orders", "iceberg": {"table": "lake.o", "catalog": "Bad Name"}}, r"`catalog` must match"),
    ({"from": "orders", "iceberg": {"table": "lake.o"}, "layout": "merge"}, r"layout 'merge' is not one of"),
    ({"from": "users", "iceberg": {"table": "lake.u"}, "layout": "append"}, r"upsert collection .* changelog"),
    ({"from": "orders", "iceberg": {"table": "lake.o"}, "format": "debezium"}, r"unknown key\(s\) format"),
    ({"from": "orders", "iceberg": {"table": "lake.o"}, "budget": {"max_rows": 0}}, r"must be positive"),
    ({"from": "orders", "iceberg": {"table": "lake.o"}, "kafka": {"topic": "t"}}, r"either `kafka:`.*or `iceberg:`"),
    ({"from": "nope", "iceberg": {"table": "lake.o"}}, r"`from` must name a collection"),
    ({"from": "orders", "iceberg": "lake.o"}, r"sink lake\.iceberg: expected a mapping"),
    ({"from": "orders", "iceberg": {"table": "lake.o"}, "copy_min_bytes": -1}, r"`copy_min_bytes` is a size"),
    ({"from": "orders", "iceberg": {"table": "lake.o"}, "copy_min_bytes": "8MB"}, r"`copy_min_bytes` is a size"),
])
def test_config_errors_say_what_to_fix(raw, message):
    with pytest.raises(ConfigError, match=message):
        sink(**raw)


def test_catalog_settings_default_to_the_consensus_database_and_the_blob_store(monkeypatch):
    monkeypatch.delenv("RECLOCK_ICEBERG_CATALOG_URI", raising=False)
    monkeypatch.delenv("RECLOCK_ICEBERG_WAREHOUSE", raising=False)
    c = find_catalog_settings("postgresql://u:p%40ss@127.0.0.1:5433/reclock", "/data/blobs/")
    assert c.uri == "postgresql+psycopg://u:p%40ss@127.0.0.1:5433/reclock"
    assert (c.warehouse, c.s3) == ("/data/blobs/_iceberg", None)
    assert catalog_uri("host=h port=5 dbname=d user=u") == "postgresql+psycopg://u@h:5/d"
    monkeypatch.setenv("RECLOCK_ICEBERG_CATALOG_URI", "sqlite:////tmp/c.db")
    monkeypatch.setenv("RECLOCK_ICEBERG_WAREHOUSE", "s3://bucket/wh")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    c = find_catalog_settings("postgresql://x/y", "/b")
    assert (c.uri, c.warehouse) == ("sqlite:////tmp/c.db", "s3://bucket/wh")
    assert c.properties()["s3.endpoint"] == "http://127.0.0.1:9000"
    assert c.properties()["s3.force-virtual-addressing"] == "false"


def test_pyiceberg_options_on_aws():
    props = pyiceberg_options(S3Settings(None, "eu-west-1", "AKIAEXAMPLE", "secret"))
    assert "s3.endpoint" not in props and props["s3.region"] == "eu-west-1"
    assert props["s3.force-virtual-addressing"] == "true"


def _updates(ids, diffs, ts=5) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids]),
                     "ts": pa.array([ts] * len(ids), pa.int64()), "diff": pa.array(diffs, pa.int64())})


def test_shape_append_repeats_rows_by_multiplicity_and_refuses_retractions():
    spec = IcebergSinkSpec(name="s", collection="c", table="a.b")
    schema = table_schema(_updates([1], [1]).schema, "append")
    assert schema.names == ["id", "name", "_reclock_ts"]
    out = shape(_updates([1, 2], [2, 1]), schema, spec)
    assert out.to_pylist() == [{"id": 1, "name": "n1", "_reclock_ts": 5}] * 2 + [{"id": 2, "name": "n2",
                                                                                   "_reclock_ts": 5}]
    with pytest.raises(RetractionInAppendTable, match="at ts 5"):
        shape(_updates([1, 2], [1, -1]), schema, spec)
    with pytest.raises(SinkRefused, match="no column"):
        shape(_updates([1], [1]).append_column("extra", pa.array([1])), schema, spec)


def test_shape_changelog_keeps_diff_and_fills_a_missing_column_with_nulls():
    spec = IcebergSinkSpec(name="s", collection="c", table="a.b", layout="changelog")
    schema = table_schema(_updates([1], [1]).schema, "changelog")
    out = shape(_updates([1, 2], [1, -1]).drop_columns(["name"]), schema, spec)
    assert out.to_pylist() == [{"id": 1, "name": None, "_reclock_ts": 5, "_reclock_diff": 1},
                               {"id": 2, "name": None, "_reclock_ts": 5, "_reclock_diff": -1}]
