"""A Schema Registry's settings from an Airflow connection (``reclock.connections.registry_settings``): the URL
from host, port and path, basic auth, TLS files; the password in no repr."""

from __future__ import annotations

import json

import pytest

from reclock.connections import registry_settings
from reclock.errors import ConfigError


def _conn(monkeypatch, **conn) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_REGISTRY", json.dumps({"conn_type": "http", **conn}))


def test_apicurio_over_tls_with_basic_auth(monkeypatch) -> None:
    _conn(monkeypatch, host="https://registry.internal", port=8443, schema="apis/ccompat/v7", login="reclock",
          password="s3cret", extra={"ca_file": "/etc/ssl/ca.pem", "timeout": 3})
    s = registry_settings("shop_registry")
    assert s.url == "https://registry.internal:8443/apis/ccompat/v7"
    assert (s.username, s.password, s.ca_file, s.timeout_s) == ("reclock", "s3cret", "/etc/ssl/ca.pem", 3.0)
    assert "s3cret" not in repr(s)


def test_confluent_without_auth_and_a_whole_url(monkeypatch) -> None:
    _conn(monkeypatch, host="sr.internal", port=8081)
    s = registry_settings("shop_registry")
    assert (s.url, s.username, s.password) == ("http://sr.internal:8081", None, None)
    _conn(monkeypatch, extra={"url": "https://sr.example:443/", "cert_file": "c.pem", "key_file": "k.pem"})
    s = registry_settings("shop_registry")
    assert s.url == "https://sr.example:443/" and (s.cert_file, s.key_file) == ("c.pem", "k.pem")


@pytest.mark.parametrize("conn, words", [
    ({}, "no host"),
    ({"host": "ftp://x"}, "not an http"),
    ({"host": "x", "extra": {"cert_file": "c.pem"}}, "both cert_file and key_file"),
])
def test_a_wrong_connection_says_what(monkeypatch, conn, words) -> None:
    _conn(monkeypatch, **conn)
    with pytest.raises(ConfigError, match=f"connection shop_registry: .*{words}"):
        registry_settings("shop_registry")
