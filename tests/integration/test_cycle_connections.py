"""A step's consensus connection (``CycleContext.connect`` inside a step): one per step, lent to every call
in it, never joining a caller's transaction, replaced when idle or broken, closed when the step ends."""

from __future__ import annotations

import threading

import pytest

from reclock import cycle
from reclock.config import parse_source
from reclock import lending
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.status import latest_statistics, latest_status


def _pid(conn) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


@pytest.fixture
def ctx(db, tmp_path):
    spec = parse_source("conns", {"kafka": {"topic": "unused", "bootstrap": "127.0.0.1:1"},
                                  "format": {"type": "json", "schema": "id BIGINT"}})
    return cycle.CycleContext(spec=spec, dsn=db, upstream="127.0.0.1:1", blob=LocalBlobStore(tmp_path))


def test_outside_a_step_every_call_gets_its_own_connection(ctx):
    with ctx.connect() as a:
        first = _pid(a)
    assert a.closed
    with ctx.connect() as b:
        assert _pid(b) != first


def test_a_step_lends_one_connection_and_closes_it_at_its_end(ctx):
    with cycle._step(ctx, "probe") as metrics:
        with ctx.connect() as a:
            first = _pid(a)
        with ctx.connect() as b:
            assert b is a and _pid(b) == first
            with ctx.connect() as nested:  # no transaction open: the same connection
                assert nested is a
        metrics["x"] = 1
    assert a.closed  # the step's end closed it (after recording its statistics on it)
    with ctx.connect() as conn:
        assert latest_statistics(conn, "conns", "probe")[0].metrics["x"] == 1
        assert latest_status(conn, "conns").status == "running"


def test_a_loan_never_joins_a_callers_transaction(ctx):
    with cycle._step(ctx, "probe"):
        with ctx.connect() as outer, outer.transaction():
            outer.execute("CREATE TEMP TABLE t (x int)")
            outer.execute("INSERT INTO t VALUES (1)")
            with ctx.connect() as inner:
                assert inner is not outer
                inner.execute("SELECT 1")
            assert outer.execute("SELECT count(*) FROM t").fetchone()[0] == 1  # its transaction is intact
        with ctx.connect() as again:
            assert again is outer


def test_an_idle_or_broken_connection_is_replaced(ctx, monkeypatch):
    with cycle._step(ctx, "probe"):
        with ctx.connect() as a:
            first = _pid(a)
        monkeypatch.setattr(lending, "REUSE_IDLE_S", 0.0)
        with ctx.connect() as b:  # idle longer than allowed: a new one, the old one closed
            assert b is not a and a.closed and _pid(b) != first
        monkeypatch.setattr(lending, "REUSE_IDLE_S", 3600.0)
        monkeypatch.setattr(lending, "PROBE_IDLE_S", 3600.0)  # not probed: the failing call finds it broken
        with ctx.connect() as killer:
            assert killer is b
        with connect(ctx.dsn) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (_pid(b),))
        with pytest.raises(Exception), ctx.connect() as c:
            c.execute("SELECT 1")  # the server cut it: this call fails and marks it broken
        with ctx.connect() as d:
            assert d is not b and d.execute("SELECT 1").fetchone() == (1,)


def test_a_held_connection_cut_while_idle_is_probed_and_replaced(ctx, monkeypatch):
    """A Postgres restart while a step waits on a Spark job cuts the step's held connection; the next loan
    after ``PROBE_IDLE_S`` finds it dead with one ``SELECT 1`` and lends a new one, so the step goes on
    instead of failing after all its work. A live one passes the probe and is lent again."""
    monkeypatch.setattr(lending, "PROBE_IDLE_S", 0.0)
    with cycle._step(ctx, "probe"):
        with ctx.connect() as a:
            first = _pid(a)
        with connect(ctx.dsn) as other:
            assert other.execute("SELECT pg_terminate_backend(%s, 5000)", (first,)).fetchone() == (True,)
        with ctx.connect() as b:
            assert b is not a and _pid(b) != first
        with ctx.connect() as c:
            assert c is b


def test_a_failed_step_records_stalled_and_closes_its_connection(ctx):
    with pytest.raises(RuntimeError, match="boom"), cycle._step(ctx, "probe"):
        with ctx.connect() as a:
            a.execute("SELECT 1")
        raise RuntimeError("boom")
    assert a.closed
    with ctx.connect() as conn:
        st = latest_status(conn, "conns")
    assert (st.status, st.error) == ("stalled", "probe: RuntimeError: boom")  # not a Reclock error: its type named


def test_threads_sharing_a_context_never_share_a_connection(ctx):
    first_has_one, second_done = threading.Event(), threading.Event()
    pids: dict[str, int] = {}

    def first() -> None:
        with cycle._step(ctx, "probe"), ctx.connect() as conn:
            pids["first"] = _pid(conn)
            first_has_one.set()
            second_done.wait(10)  # its step is still under way while the other thread's runs

    def second() -> None:
        first_has_one.wait(10)
        with cycle._step(ctx, "probe"), ctx.connect() as conn:
            pids["second"] = _pid(conn)
        second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(pids) == {"first", "second"} and pids["first"] != pids["second"]


def test_an_upstream_session_is_lent_like_a_consensus_connection(db, monkeypatch):
    """A Postgres source's upstream session (``PostgresUpstream.session``) is lent by the same
    ``reclock.lending`` as the consensus connections: one per ``holding`` block (``cycle._holding``: a step,
    or a whole cycle), shared by a session inside a session, never joining a caller's transaction, dropped
    after an error, replaced when idle or left in a transaction; outside a block, a connection of its own."""
    from reclock.sources.postgres import upstream as pgsrc

    up = pgsrc.PostgresUpstream("x", db, "unused")
    with up.session() as a:
        assert a.execute("SHOW DateStyle").fetchone()[0].startswith("ISO")
    assert a.closed
    with up.holding():
        with up.session() as a:
            first = _pid(a)
        with up.session() as b:
            assert b is a and _pid(b) == first
            with up.session() as nested:
                assert nested is a
            with b.transaction(), up.session() as own:
                assert own is not a
            assert own.closed and not a.closed
        with pytest.raises(RuntimeError, match="a stall"), up.session() as c:
            assert c is a
            raise RuntimeError("a stall")
        assert a.closed, "dropped after an error: the next session starts clean"
        with up.session() as d:
            assert d is not a
        monkeypatch.setattr(lending, "REUSE_IDLE_S", 0.0)
        with up.session() as e:  # idle longer than allowed
            assert e is not d and d.closed
        monkeypatch.setattr(lending, "REUSE_IDLE_S", 3600.0)
        with up.session() as f:
            assert f is e
            f.execute("BEGIN")  # left in a transaction
        with up.session() as g:
            assert g is not f and f.closed
    assert g.closed


def test_a_consensus_connection_gives_up_on_a_server_that_does_not_answer(db, monkeypatch):
    """A request the server never answers (here: a query outlasting the bound; on a network, a black hole)
    ends after RECLOCK_PG_TIMEOUT_S with OperationalError, and the connection is closed, not reused."""
    import time

    import psycopg

    monkeypatch.setenv("RECLOCK_PG_TIMEOUT_S", "1")
    conn = connect(db)
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)  # an answer within the bound: untouched
        t0 = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match=r"no answer from the server in 1 s"):
            conn.execute("SELECT pg_sleep(30)")
        assert time.monotonic() - t0 < 15
        assert conn.closed
    finally:
        conn.close()


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "nan"])
def test_a_bad_answer_timeout_is_refused_with_what_to_set(db, monkeypatch, raw):
    from reclock.errors import SettingError

    monkeypatch.setenv("RECLOCK_PG_TIMEOUT_S", raw)
    with pytest.raises(SettingError, match=r"RECLOCK_PG_TIMEOUT_S must be a (positive )?number of seconds, got"):
        connect(db)
