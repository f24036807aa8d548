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
