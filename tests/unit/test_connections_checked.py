"""The config's Airflow connections are resolved where a task or a command runs, never while the DAG file parses
(a lookup there goes through the dag-processor's supervisor, under its import timeout), and a connection the
config names is never passed over silently when RECLOCK_BOOTSTRAP gives the brokers (``reclock.settings``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from reclock import connections
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
    # what a task checks: its own source's connections only
    with pytest.raises(ConfigError) as e:
        check_connections(sources=[cfg.sources["d"]])
    assert "shop_db" in str(e.value) and "kafka" not in str(e.value)
    check_connections(sources=[cfg.sources["c"]])
    for c in ("kafka_a", "reclock_kafka", "shop_db"):
        _conn(monkeypatch, c)
    check_connections(cfg)


def test_the_environment_s_brokers_serve_the_default_but_never_hide_a_named_connection(monkeypatch):
    cfg = parse_config(CFG)
    monkeypatch.setenv("RECLOCK_BOOTSTRAP", "env:1")
    assert find_kafka(cfg.sources["b"].upstream, "source b").bootstrap == "env:1"  # the default: no connection needed
    with pytest.raises(SettingError, match="kafka_a.*not defined.*RECLOCK_BOOTSTRAP gives the brokers"):
        find_kafka(cfg.sources["a"].upstream, "source a")
    with pytest.raises(ConfigError, match="source a: its `kafka.connection: kafka_a`"):
        check_connections(cfg)
    _conn(monkeypatch, "kafka_a")
    assert find_kafka(cfg.sources["a"].upstream, "source a").bootstrap == "env:1"
    assert find_kafka(cfg.sources["a"].upstream, "source a", given="opt:2").bootstrap == "opt:2"


def test_connection_and_bootstrap_are_one_or_the_other():
    with pytest.raises(ConfigError, match="either `connection:`"):
        parse_config({"sources": {"a": {"kafka": {"topic": "a", "connection": "x", "bootstrap": "h:1"},
                                        "format": "bytes"}}})


def test_the_dag_file_looks_up_no_connection_and_reclock_check_names_the_missing_ones(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowNotFoundException

    from reclock.cli import main
    from reclock.orchestration.dags import build_all

    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "reclock.yaml").write_text(yaml.safe_dump(CFG))
    monkeypatch.delenv("RECLOCK_CONFIG", raising=False)
    monkeypatch.delenv("RECLOCK_BOOTSTRAP", raising=False)
    looked_up: list[str] = []

    def lookup(conn_id=None, *args, **kwargs):
        looked_up.append(conn_id)
        raise AirflowNotFoundException(conn_id)

    for name in ("kafka_client_config", "postgres_dsn", "registry_settings", "s3_settings"):
        monkeypatch.setattr(connections, name, lookup)
    dags = build_all(project=tmp_path)
    assert {"ingest__a", "ingest__b", "ingest__c", "ingest__d", "rebuild__a"} <= set(dags)
    assert looked_up == []  # none of the missing connections is an import error, nor a lookup
    monkeypatch.undo()
    out = CliRunner().invoke(main, ["check", "--config", str(tmp_path / "include" / "reclock.yaml")])
    assert isinstance(out.exception, ConfigError)  # `reclock` prints it as one line (cli.run)
    for part in ("kafka.connection: kafka_a", "kafka.connection: reclock_kafka", "postgres.connection: shop_db"):
        assert part in str(out.exception)
    for c in ("kafka_a", "reclock_kafka", "shop_db"):
        _conn(monkeypatch, c)
    out = CliRunner().invoke(main, ["check", "--config", str(tmp_path / "include" / "reclock.yaml")])
    assert out.exit_code == 0 and "4 sources, 0 sinks" in out.output, out.output


S3_CFG = {"sources": {
    "e": {"s3": {"url": "s3://landing/e/", "connection": "s3_other"}, "format": "text"},  # names its connection
    "f": {"s3": {"url": "s3://landing/f/"}, "format": "text"}}}  # the default, reclock_s3
ENV_KEYS = {"AWS_ACCESS_KEY_ID": "AKIAENVIRONMENT", "AWS_SECRET_ACCESS_KEY": "env-secret",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9100", "AWS_REGION": "us-east-1"}


def _s3_conn() -> str:
    return json.dumps({"conn_type": "aws", "login": "AKIACONNECTION", "password": "conn-secret",
                       "extra": {"endpoint_url": "http://127.0.0.1:9200", "region_name": "eu-west-1"}})


def test_an_s3_source_s_named_connection_is_never_passed_over_for_the_environment_s_keys(monkeypatch):
    from reclock.sources.registry import kind_of
    from reclock.sources.s3.trigger import upstream_trigger

    cfg = parse_config(S3_CFG)
    e, f = cfg.sources["e"], cfg.sources["f"]
    assert e.upstream.connection_named and not f.upstream.connection_named
    for var in ("AIRFLOW_CONN_S3_OTHER", "AIRFLOW_CONN_RECLOCK_S3", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in ENV_KEYS.items():
        monkeypatch.setenv(var, value)
    kind = kind_of(f)
    assert kind.find_upstream(f).access_key == "AKIAENVIRONMENT"  # the default: the environment's keys serve
    # the named connection is not defined: an error naming it, never the environment's keys in its place
    with pytest.raises(SettingError, match="source e: its `s3.connection: s3_other` names an Airflow connection "
                                           "that is not defined.*AWS keys of the environment are not used"):
        kind.find_upstream(e)
    with pytest.raises(ConfigError, match="source e: its `s3.connection: s3_other`") as err:
        check_connections(cfg)
    assert "source f" not in str(err.value)
    trigger = upstream_trigger(e)
    assert trigger.serialize()[1]["connection_named"] is True
    with pytest.raises(SettingError, match="s3_other"):
        trigger._settings()
    monkeypatch.setenv("AIRFLOW_CONN_S3_OTHER", _s3_conn())
    check_connections(cfg)
    for found in (kind.find_upstream(e), trigger._settings()):
        assert (found.access_key, found.endpoint_url, found.region) == \
            ("AKIACONNECTION", "http://127.0.0.1:9200", "eu-west-1")
    # a spark-submit job (rebuild) finds what the task found: the connection, not the job's AWS variables
    job = kind.job_environment(e)
    assert job["AWS_ACCESS_KEY_ID"] == "AKIACONNECTION"
    monkeypatch.delenv("AIRFLOW_CONN_S3_OTHER")
    for var, value in {**ENV_KEYS, **job}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIASOMEONEELSE")
    found = kind.find_upstream(e)
    assert (found.access_key, found.secret_key, found.endpoint_url, found.region, found.path_style) == \
        ("AKIACONNECTION", "conn-secret", "http://127.0.0.1:9200", "eu-west-1", True)
