"""Which errors mean a Spark Connect session is gone (``reclock.spark.connect.session_lost``), and how long a
Reclock session retries an unreachable server (``RETRY``)."""

from __future__ import annotations

import pytest

from reclock.spark.connect import RETRY, retry_policy, server_restarted, session_lost


class GrpcLike(Exception):
    """Stands for the errors PySpark raises (their text is what ``session_lost`` reads)."""


@pytest.mark.parametrize("text", [
    "[INVALID_HANDLE.SESSION_CHANGED] The handle 99536ffd is invalid. The existing Spark server driver "
    "instance has restarted. Please reconnect. SQLSTATE: HY000",
    "[INVALID_HANDLE.SESSION_NOT_FOUND] The handle 5170 is invalid. Session not found.",
    "[INVALID_HANDLE.OPERATION_NOT_FOUND] The handle x is invalid. Operation not found.",
    "[NO_ACTIVE_SESSION] No active Spark session found. Please create a new Spark session",
    "<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE "
    'details = "failed to connect to all addresses"',
    "[RETRIES_EXCEEDED] The maximum number of retries has been exceeded.",
    "Cannot invoke RPC on closed channel!",
])
def test_errors_of_a_session_that_is_gone(text):
    assert session_lost(GrpcLike(text))


@pytest.mark.parametrize("text, restarted", [
    ("[INVALID_HANDLE.SESSION_CHANGED] The existing Spark server driver instance has restarted.", True),
    ("[RESPONSE_ALREADY_RECEIVED] ... INVALID_HANDLE.SESSION_NOT_FOUND", True),  # issue 37's campaign, 5 tries
    ("[NO_ACTIVE_SESSION] No active Spark session found.", True),
    ('StatusCode.UNAVAILABLE details = "failed to connect to all addresses"', False),  # still down: no rewrite
    ("[RETRIES_EXCEEDED] The maximum number of retries has been exceeded.", False),
    ("Cannot invoke RPC on closed channel!", False),
])
def test_a_restarted_server_is_told_from_one_still_down(text, restarted):
    """``write_batches`` writes again at once only for a server that answers without the session."""
    assert session_lost(GrpcLike(text))
    assert not server_restarted(RuntimeError("write_batches failed"))
    try:
        raise RuntimeError("slice 0 failed") from GrpcLike(text)
    except RuntimeError as e:
        assert server_restarted(e) is restarted


@pytest.mark.parametrize("text", [
    "[PATH_NOT_FOUND] Path does not exist: file:/x",
    "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column with name `idd` cannot be resolved",
    "Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 times",
])
def test_other_errors_keep_the_session(text):
    assert not session_lost(GrpcLike(text))


def test_a_cause_or_context_counts_and_cycles_end():
    try:
        try:
            raise GrpcLike("[INVALID_HANDLE.SESSION_CHANGED] restarted")
        except GrpcLike as inner:
            raise RuntimeError("write_batches: slice 0 failed") from inner
    except RuntimeError as outer:
        assert session_lost(outer)
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a  # a cycle of contexts: still an answer
    assert not session_lost(a)


def test_an_unreachable_server_is_retried_for_about_a_minute_not_ten():
    """The waits PySpark's policy takes with Reclock's settings (without jitter): about a minute in all."""
    from reclock.spark.connect import _total_wait_s

    assert 45 <= _total_wait_s(RETRY) <= 75
    policy = retry_policy()
    assert (policy.max_retries, policy.max_backoff) == (RETRY["max_retries"], RETRY["max_backoff"])


def test_every_client_reclock_makes_retries_under_its_policy(monkeypatch):
    """The session-id probe's bare client and a session both give up on an unreachable server under
    :data:`RETRY` (here shortened to two retries): PySpark's default would wait ten minutes (issue 37)."""
    import socket
    import time

    from reclock.spark import connect

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(connect, "RETRY", {**RETRY, "max_retries": 2, "max_backoff": 100})
    url = f"sc://127.0.0.1:{port}"
    t0 = time.monotonic()
    with pytest.raises(Exception) as probe:
        connect._accepted(connect.with_session_id(url, connect.shared_session_id("s")))
    assert session_lost(probe.value)
    session = connect.remote_session(url)
    try:
        assert [(p.max_retries, p.max_backoff) for p in session.client.get_retry_policies()] == [(2, 100)]
    finally:
        connect.close(session)
    assert time.monotonic() - t0 < 30


def test_several_servers_are_named_by_commas_each_once():
    from reclock.spark.connect import remotes

    assert remotes("sc://a:1") == ("sc://a:1",)
    assert remotes("sc://a:1, sc://b:2/;use_ssl=true;token=t") == ("sc://a:1", "sc://b:2/;use_ssl=true;token=t")
    with pytest.raises(ValueError, match="not a Spark Connect URL"):
        remotes("sc://a:1,b:2")
    with pytest.raises(ValueError, match="not a Spark Connect URL"):
        remotes("sc://a:1,")
    with pytest.raises(ValueError, match="named twice"):
        remotes("sc://a:1,sc://a:1")


def test_a_lost_session_is_attached_anew_at_once_only_where_another_server_stands_in():
    """A restarted server (it answers, the session is gone) is attached anew with one server or several; an
    unreachable one only when another server stands in; any other error never."""
    from reclock.spark.connect import FAILOVER_RETRY, _total_wait_s, attach_anew

    class Session:
        def __init__(self, *urls: str) -> None:
            self.reclock_remotes = urls

    one, two = Session("sc://a:1"), Session("sc://a:1", "sc://b:1")
    restarted = GrpcLike("[INVALID_HANDLE.SESSION_CHANGED] The existing Spark server driver instance has restarted")
    unreachable = GrpcLike("<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE")
    assert attach_anew(restarted, one) and attach_anew(restarted, two)
    assert not attach_anew(unreachable, one) and attach_anew(unreachable, two)
    assert not attach_anew(RuntimeError("[DIVIDE_BY_ZERO] division by zero"), two)
    assert not attach_anew(unreachable, object())  # a session of this process: never
    assert 3 <= _total_wait_s(FAILOVER_RETRY) <= 10  # a standing-in server is tried within seconds


def test_a_bad_list_of_servers_is_a_setting_error_before_any_session(monkeypatch):
    from reclock.errors import SettingError
    from reclock.settings import find_spark

    monkeypatch.delenv("RECLOCK_SPARK_MASTER", raising=False)
    monkeypatch.setenv("RECLOCK_SPARK_REMOTE", "sc://a:1,localhost:2")
    with pytest.raises(SettingError, match="RECLOCK_SPARK_REMOTE.*not a Spark Connect URL.*'localhost:2'"):
        find_spark()
    assert find_spark(remote="sc://a:1,sc://b:2").remote == "sc://a:1,sc://b:2"


def test_with_every_server_unreachable_the_pick_gives_up_after_its_budget():
    """No server answers: they are asked again until the budget has passed, then the last error says the
    session is gone (the step fails as with one server, and Airflow retries it)."""
    import socket
    import time

    from reclock.spark import connect

    ports = []
    for _ in range(2):
        with socket.socket() as s:  # ports nothing listens on
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    urls = tuple(f"sc://127.0.0.1:{p}" for p in ports)
    t0 = time.monotonic()
    with pytest.raises(Exception) as picked:
        connect._pick(urls, "s", budget_s=2.0)
    assert session_lost(picked.value)
    assert 2.0 <= time.monotonic() - t0 < 60


def test_a_server_that_dies_between_the_pick_and_the_settings_is_picked_again(monkeypatch):
    """Over several servers, a session whose settings cannot reach the server picked (it died meanwhile: here
    a port nothing listens on) is closed and a server picked again, once more than there are servers; then
    the error says the session is gone (before, a write's session failed its try here, issue 37's campaign)."""
    import socket

    from reclock.spark import connect

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    urls = [f"sc://127.0.0.1:{p}" for p in ports]
    picks = []

    def pick(candidates, scope, budget_s=None):
        picks.append(candidates)
        return urls[len(picks) % 2]

    monkeypatch.setattr(connect, "_pick", pick)
    with pytest.raises(Exception) as made:
        connect.shared_session(",".join(urls), "s")
    assert session_lost(made.value)
    assert len(picks) == 3


def test_each_session_is_its_own_and_closing_one_leaves_the_others():
    """Two sources in one process (a continuous group) get a session each, on their own server-side session
    ids; closing one (a source that lost its server) does not stop the other's. PySpark's getOrCreate
    handed every later caller the first session whatever its URL. No server is needed: a session connects
    on its first call."""
    import socket

    from reclock.spark import connect

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"sc://127.0.0.1:{port}"
    a = connect.remote_session(connect.with_session_id(url, connect.shared_session_id("a")))
    b = connect.remote_session(connect.with_session_id(url, connect.shared_session_id("b")))
    try:
        assert a is not b
        assert (a.client._session_id, b.client._session_id) == (connect.shared_session_id("a"),
                                                                connect.shared_session_id("b"))
        connect.close(a)
        assert a.is_stopped and not b.is_stopped
        c = connect.remote_session(url)
        assert c is not b and c.client._session_id not in (a.client._session_id, b.client._session_id)
        connect.close(c)
    finally:
        connect.close(b)
