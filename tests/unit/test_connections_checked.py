"""The config's Airflow connections are resolved when the DAG file loads, and a connection the config names is
never passed over silently when RECLOCK_BOOTSTRAP gives the brokers (``reclock.settings``)."""

from __future__ import annotations

import json

import pytest

from reclock.config import parse_config
from reclock.errors import ConfigError, SettingError
from reclock.settings import check_connections, find_kafka

CFG = {"sources": {
    "a": {"kafka": {"topic": "a", "connection": "kafka_a"}, "format": "bytes"},
    "b": {"kafka": {"topic": "b"}, "format": "bytes"},  # the default connection, reclock_kafka
    "c": {"kafka": {"topic": "c", "bootstrap": "h:1"}, "format": "bytes"},  # no connection at all
    "d": {"postgres": {"connection": "shop_db", "publication": "p"}}}}


def _conn(monkeypatch, conn_id: str) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "generic", "host": "x", "port": 9}))


def test_every_connection_the_config_reaches_through_must_be_defined(monkeypatch):
    cfg = parse_config(CFG)
    monkeypatch.delenv("RECLOCK_BOOTSTRAP", raising=False)
    with pytest.raises(ConfigError) as e:
        check_connections(cfg)
    for part in ("source a: its `kafka.connection: kafka_a`", "source b: its `kafka.connection: reclock_kafka`",
                 "source d: its `postgres.connection: shop_db`"):
        assert part in str(e.value)
    assert "source c" not in str(e.value)
    for c in ("kafka_a", "reclock_kafka", "shop_db"):
        _conn(monkeypatch, c)
    check_connections(cfg)


def test_the_environment_s_brokers_serve_the_default_but_never_hide_a_named_connection(monkeypatch):
    cfg = parse_config(CFG)
    monkeypatch.setenv("RECLOCK_BOOTSTRAP", "env:1")
    assert find_kafka(cfg.sources["b"].kafka, "source b").bootstrap == "env:1"  # the default: no connection needed
    with pytest.raises(SettingError, match="kafka_a.*not defined.*RECLOCK_BOOTSTRAP gives the brokers"):
        find_kafka(cfg.sources["a"].kafka, "source a")
    _conn(monkeypatch, "kafka_a")
    assert find_kafka(cfg.sources["a"].kafka, "source a").bootstrap == "env:1"
    assert find_kafka(cfg.sources["a"].kafka, "source a", given="opt:2").bootstrap == "opt:2"


def test_connection_and_bootstrap_are_one_or_the_other():
    with pytest.raises(ConfigError, match="either `connection:`"):
        parse_config({"sources": {"a": {"kafka": {"topic": "a", "connection": "x", "bootstrap": "h:1"},
                                        "format": "bytes"}}})
