"""The shared Spark Connect session's id and URL (``reclock.spark.connect``); the server side is in the
stack test (two processes share a session; a closed one is left for a new one)."""

from __future__ import annotations

import pytest

from reclock.spark.connect import WINDOW_S, names_session, shared_session_id, with_session_id


def test_a_scope_shares_one_id_per_window_and_scopes_differ():
    t = 1_800_000_000.0
    start = t - t % WINDOW_S
    assert shared_session_id("orders", start) == shared_session_id("orders", start + WINDOW_S - 0.001)
    assert shared_session_id("orders", start) != shared_session_id("orders", start + WINDOW_S)
    assert shared_session_id("orders", start) != shared_session_id("payments", start)


@pytest.mark.parametrize("url, want", [
    ("sc://h:15002", "sc://h:15002/;session_id=S"),
    ("sc://h:15002/", "sc://h:15002/;session_id=S"),
    ("sc://h:15002/;token=t;use_ssl=true", "sc://h:15002/;token=t;use_ssl=true;session_id=S"),
])
def test_the_session_id_joins_the_urls_parameters(url, want):
    got = with_session_id(url, "S")
    assert got == want and names_session(got) and not names_session(url)


def test_a_url_that_is_not_spark_connect_is_refused():
    with pytest.raises(ValueError, match="not a Spark Connect URL"):
        with_session_id("http://h:15002", "S")


def test_the_url_of_a_spark_connect_connection_comes_from_the_providers_hook(monkeypatch):
    """``reclock_spark`` (type spark_connect) as the Spark provider documents it: host and port, the login
    as user_id, the password as token, extra use_ssl; a shared session's id joins its parameters."""
    import json

    from reclock.connections import spark_connect_url

    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_SPARK", json.dumps({
        "conn_type": "spark_connect", "host": "spark-connect", "port": 15002, "login": "reclock",
        "password": "s3cret-token", "extra": {"use_ssl": True}}))
    url = spark_connect_url()
    assert url == "sc://spark-connect:15002/;user_id=reclock;token=s3cret-token;use_ssl=True"
    assert with_session_id(url, "S") == url + ";session_id=S"
    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_SPARK", json.dumps({"conn_type": "spark_connect", "host": "h",
                                                                 "port": 15002}))
    assert with_session_id(spark_connect_url(), "S") == "sc://h:15002/;session_id=S"


def test_every_connect_client_has_keepalive_so_a_silent_connection_fails_a_call():
    """A black-holed path to the server otherwise holds a call forever (tests/integration/test_network_faults.py
    shows the bound end to end)."""
    from reclock.spark.connect import KEEPALIVE, connection

    options = dict(connection("sc://127.0.0.1:15002/;session_id=x")._channel_options)
    assert all(options[k] == v for k, v in KEEPALIVE)
    assert options["grpc.keepalive_time_ms"] <= 60_000 and options["grpc.http2.max_pings_without_data"] == 0
