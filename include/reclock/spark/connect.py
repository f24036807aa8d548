"""Spark Connect sessions that a source's task processes share on the server.

Every Airflow task is a fresh process, and a fresh Spark Connect client gets a fresh server-side session
by default: the server builds its session state again, and the task's first query pays for it (measured
here: a 2,000-record slice's first write 1.22-1.28 s in a new session, 0.70-0.75 s in one an earlier
process had used). So a source's tasks attach to one server-side session, named by a ``session_id``
derived from the source's name and a :data:`WINDOW_S` time window:

- Nothing coordinates it: every process derives the same id.
- The server closes a session after an idle hour by default
  (``spark.connect.session.manager.defaultSessionTimeout``), and refuses a closed session's id from then
  on. A window's id is asked for only during its window, so it is never closed while in use. The session
  of a past window is closed by the server's timeout.
- Should the id be refused all the same (a shorter timeout, or someone stopped the session), the task
  goes on in a new session of its own: a cold first query, nothing worse.
- Every process sets the same :data:`reclock.spark.session.SESSION_CONF` on it (one round trip), and no
  other configuration, so sharing the session changes no query. Concurrent queries in one session (a
  rebuild beside a cycle) are supported by Spark Connect.

A URL that names a ``session_id`` itself is used as it is.

**Several servers.** ``sc://a:15002,sc://b:15002`` names Connect servers (each its own driver, on the same
cluster) that stand in for each other: a session goes to the longest-running one that answers (its executors
are warm; one restarted a moment ago has none yet), and a step whose server dies under it writes again on
another (:func:`attach_anew`) instead of waiting for that one to come back. Such a session gives up on an
unreachable server after a few seconds (:data:`FAILOVER_RETRY`) rather than the minute of :data:`RETRY`.

TLS: a URL with ``use_ssl=true`` (the Spark provider's connection extra) reaches a TLS endpoint (a proxy in
front of the server, which has none of its own) and its ``token`` authenticates. The CAs trusted are the
system's, or those of the file ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` names (gRPC's own variable), read when
the session is made (:func:`connection`), not only when the process started as gRPC itself reads it.

**When the server goes away.** PySpark's client retries a call that finds the server unreachable for at
least ten minutes (its ``DefaultPolicy``), and at interpreter exit it sends one more call (its ML cache
clean-up) under the same policy. A task whose Connect server was restarted (its session and jobs are gone
with the old driver) would wait that long for a step that can only fail, and a finished task process that
long to exit. So a Reclock session retries for about a minute (:data:`RETRY`), :func:`close` ends a
session's client without the exit call (and without releasing the server-side session other processes
share), and :func:`session_lost` tells an error that means the session is gone (the next step must attach
anew) from any other.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

WINDOW_S = 1800
"""How long one shared session id is asked for (less than the server's idle timeout, an hour)."""
NAMESPACE = uuid.UUID("6f1d2c1e-9b1a-4f57-8a8e-2f7d4c1b0a33")


def shared_session_id(scope: str, now: float | None = None) -> str:
    """The session id ``scope``'s processes share in the window holding ``now`` (default: the clock)."""
    window = int((time.time() if now is None else now) // WINDOW_S)
    return str(uuid.uuid5(NAMESPACE, f"{scope}/{window}"))


def with_session_id(url: str, session_id: str) -> str:
    """``url`` (``sc://host:port[/;param=value...]``) with ``session_id`` added to its parameters."""
    if not url.startswith("sc://"):
        raise ValueError(f"not a Spark Connect URL (sc://host:port): {url!r}")
    base, sep, params = url.partition("/;")
    if not sep:
        base = base.rstrip("/")
    kept = [p for p in params.split(";") if p]
    return f"{base}/;" + ";".join([*kept, f"session_id={session_id}"])


def names_session(url: str) -> bool:
    _, _, params = url.partition("/;")
    return any(p.split("=", 1)[0] == "session_id" for p in params.split(";"))


ROOTS = "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"


KEEPALIVE = (("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000),
             ("grpc.http2.max_pings_without_data", 0), ("grpc.min_reconnect_backoff_ms", 5_000))
"""gRPC channel options of every Reclock Connect client. Without keepalive a call waits forever on a
connection that went silent (a black-holed network path, a peer gone without a reset): the client pings
after a minute without a frame and drops a connection whose ping is not answered within 20 s, so the call
fails and PySpark's retries (:data:`RETRY`) take over; a connection attempt that gets no answer gives up
after 5 s (gRPC's default is 20 s), so a retry against a dead path costs seconds, not minutes. A ping a
minute stays within what Spark's server (gRPC-Java, which permits one every five minutes while idle and
forgives two more) accepts, since its answers and the reattachment of long executions every two minutes
reset that count."""


def connection(url: str):
    """What a Spark Connect client is made with: a channel builder for ``url`` with :data:`KEEPALIVE`; for a
    TLS URL while :data:`ROOTS` names a file, one that trusts the CAs in it (and sends the URL's token)."""
    import grpc
    from pyspark.sql.connect.client import DefaultChannelBuilder

    roots = os.environ.get(ROOTS)
    if not roots or "use_ssl=true" not in url.lower():
        return DefaultChannelBuilder(url, channelOptions=list(KEEPALIVE))
    pem = Path(roots).read_bytes()

    class TrustingChannelBuilder(DefaultChannelBuilder):
        def toChannel(self):  # noqa: N802 - pyspark's name
            creds = grpc.ssl_channel_credentials(root_certificates=pem)
            if self.token is not None:
                creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
            return self._secure_channel(self.endpoint, creds)

    return TrustingChannelBuilder(url, channelOptions=list(KEEPALIVE))


def remotes(url: str) -> tuple[str, ...]:
    """The Spark Connect URLs ``url`` names: one, or several separated by commas (servers that stand in for
    each other, see the module doc). Each must be ``sc://``; none may repeat."""
    urls = tuple(u.strip() for u in url.split(","))
    for u in urls:
        if not u.startswith("sc://"):
            raise ValueError(f"not a Spark Connect URL (sc://host:port): {u!r} in {url!r}")
    if len(set(urls)) != len(urls):
        raise ValueError(f"a Spark Connect URL is named twice: {url!r}")
    return urls


def remote_session(url: str, retry: dict | None = None):
    """A new Spark Connect session to ``url`` (see :func:`connection`; its own client and channel, whatever
    sessions the process has) that retries an unreachable server for about a minute (:data:`RETRY`), or under
    ``retry``."""
    # the Connect client's own builder: the classic builder refuses a remote session in a process that also
    # runs a classic one (SESSION_ALREADY_EXIST), and has no channelBuilder
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    target = connection(url)
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"  # pyspark.sql.functions dispatch on it (as remote() sets it)
    # a session of its own (create, not getOrCreate: that returns the process's default session whatever the
    # URL, so the sources of a continuous group would all be on the first one's, and one stopping it would
    # stop it under the others)
    session = ConnectSession.builder.channelBuilder(target).create()
    session.client.set_retry_policies([retry_policy(retry)])
    return session


def shared_session(url: str, scope: str):
    """A Spark Connect session for ``url`` on the server-side session ``scope``'s tasks share (see the
    module doc), or a new one of its own when the server refuses the shared id; with
    :data:`~reclock.spark.session.SESSION_CONF` set. ``url`` may name several servers (:func:`remotes`): the
    session is on the longest-running one that answers, and knows the others (:func:`attach_anew`)."""
    from reclock.spark.session import SESSION_CONF

    urls = remotes(url)
    if len(urls) == 1:
        if not names_session(url):
            shared = with_session_id(url, shared_session_id(scope))
            url = shared if _accepted(shared) else url
        session = remote_session(url)
        _configure(session, SESSION_CONF)
    else:
        for attempt in range(len(urls) + 1):
            # the server picked may die before the settings reach it: then another is picked
            session = remote_session(_pick(urls, scope), FAILOVER_RETRY)
            try:
                _configure(session, SESSION_CONF)
                break
            except Exception as e:
                close(session)
                if attempt == len(urls) or not session_lost(e):
                    raise
    session.reclock_remotes = urls
    return session


def _configure(session, conf: dict[str, str]) -> None:
    for key, value in conf.items():
        session.conf.set(key, value)


def attach_anew(error: BaseException, session) -> bool:
    """Whether a step whose Spark work failed with ``error`` on ``session`` may attach anew and run the work
    again at once: its server restarted (:func:`server_restarted`), or the session is gone
    (:func:`session_lost`) and another server stands in (a session :func:`shared_session` made over several
    URLs)."""
    if server_restarted(error):
        return True
    return len(getattr(session, "reclock_remotes", ())) > 1 and session_lost(error)


RETRY = {"max_retries": 15, "initial_backoff": 50, "backoff_multiplier": 4.0, "max_backoff": 5000}
"""PySpark's retry policy with its waits capped at 5 s: 15 retries wait 0.05, 0.2, 0.8, 3.2 s and then 5 s each,
about a minute in all (PySpark's own default caps them at 60 s: at least ten minutes)."""

LOST_MARKERS = ("INVALID_HANDLE", "NO_ACTIVE_SESSION", "StatusCode.UNAVAILABLE", "RETRIES_EXCEEDED",
                "closed channel")
"""What the errors of a session that is gone say: the server restarted or forgot it
(``INVALID_HANDLE.SESSION_CHANGED``, ``SESSION_NOT_FOUND``, ``SESSION_CLOSED``, ``OPERATION_NOT_FOUND``), no
session is active, the server cannot be reached (``UNAVAILABLE`` after the retries), or the client was closed
(gRPC: "Cannot invoke RPC on closed channel")."""


FAILOVER_RETRY = {"max_retries": 4, "initial_backoff": 50, "backoff_multiplier": 4.0, "max_backoff": 5000}
"""The retry policy of a session over several servers: 0.05, 0.2, 0.8 and 3.2 s, about 4 s in all, and then the
call fails (another server stands in for an unreachable one)."""


def retry_policy(retry: dict | None = None):
    """:data:`RETRY` (or ``retry``) as PySpark's ``DefaultPolicy`` (which errors it retries is PySpark's
    choice)."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    return DefaultPolicy(**(RETRY if retry is None else retry))


RESTART_MARKERS = ("INVALID_HANDLE", "NO_ACTIVE_SESSION")
"""Of :data:`LOST_MARKERS`, those of a server that answers but lost the session (it restarted, or forgot it):
a new session works at once. (An unreachable server's errors come after the client's minute of retries.)"""


def session_lost(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says the Spark Connect session is gone, so a step
    must attach anew rather than use it again (see :data:`LOST_MARKERS`)."""
    return _says(error, LOST_MARKERS)


def server_restarted(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says a server that answers lost the session
    (:data:`RESTART_MARKERS`): attaching anew and running the work again can succeed right away."""
    return _says(error, RESTART_MARKERS)


def _says(error: BaseException, markers: tuple[str, ...]) -> bool:
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(m in f"{type(e).__name__}: {e}" for m in markers):
            return True
        e = e.__cause__ or e.__context__
    return False


def add_tag(session: Any, tag: str) -> None:
    """Tag ``session``'s operations from this thread with ``tag`` (``SparkSession.addTag``); a session
    without tags (a test's stand-in) is left as it is."""
    add = getattr(session, "addTag", None)
    if add is not None:
        add(tag)


def remove_tag(session: Any, tag: str) -> None:
    """Undo :func:`add_tag` in this thread; nothing to undo (never tagged here, a session without tags, or
    one that is gone) is fine."""
    remove = getattr(session, "removeTag", None)
    if remove is None:
        return
    try:
        remove(tag)
    except Exception:  # noqa: BLE001 - not tagged in this thread, or the session is gone: nothing to undo
        pass


def is_connect(session) -> bool:
    """Whether ``session`` is a Spark Connect one (a classic session's ``client`` raises PySpark's "only
    supported with Spark Connect", not an ``AttributeError``)."""
    try:
        return getattr(session, "client", None) is not None
    except Exception:  # noqa: BLE001 - PySpark's ONLY_SUPPORTED_WITH_SPARK_CONNECT
        return False


def close(session) -> None:
    """End a Spark Connect session's client: its channel closed, the session no longer the process's default
    (a later ``getOrCreate`` makes a new one), no call at interpreter exit, and the server-side session left
    alone (other processes share it; the server's idle timeout closes it). A session in this process (not a
    Connect one) is left alone too: it is the process's, not the caller's."""
    if not is_connect(session):
        return
    session.release_session_on_close = False
    session.stop()


def _accepted(url: str) -> bool:
    """Whether the server takes ``url``'s session id: one round trip (~5 ms) on a bare client, closed at
    once. (A session object refused its id, left to the interpreter's exit, hangs there closing its
    channel.) The client retries an unreachable server as a session does (:data:`RETRY`, about a minute):
    with PySpark's default policy a task that came up while the server was down waited here ten minutes,
    and up to a minute after the server was back (issue 37's Airflow stall)."""
    return _ask(url, RETRY)[0]


def _ask(url: str, retry: dict) -> tuple[bool, int]:
    """One round trip on a bare client (closed at once) retried under ``retry``: whether the server takes
    ``url``'s session id (it refuses a closed one: ``SESSION_CLOSED``), and when its driver started (epoch ms,
    :data:`START_TIME`; 0 when refused). Any other error is raised."""
    from pyspark.sql.connect.client import SparkConnectClient

    client = SparkConnectClient(connection(url), retry_policy=retry)
    try:
        (started,) = client.get_configs(START_TIME)
        return True, int(started) if started else 0
    except Exception as e:
        if "SESSION_CLOSED" not in str(e):
            raise
        return False, 0
    finally:
        client.close()


PICK_RETRY = {"max_retries": 2, "initial_backoff": 50, "backoff_multiplier": 4.0, "max_backoff": 5000}
"""How a server is asked whether it answers when several stand in for each other: 0.05 and 0.2 s, then the
next one is asked (:func:`_pick` asks them all again while none answers)."""

START_TIME = "spark.app.startTime"
"""The driver's start (epoch milliseconds): Spark sets it in every application's configuration."""


def _pick(urls: tuple[str, ...], scope: str, budget_s: float | None = None) -> str:
    """Of several servers, the URL of the longest-running one that answers (on ``scope``'s shared session id
    when it takes it, else a new session of its own; a URL that names a session keeps it): one round trip a
    server, each retried for a moment only (:data:`PICK_RETRY`). While none answers, the servers are asked
    again, for about as long as :data:`RETRY` would wait for one (``budget_s``); then the last server's error
    is raised. A server that answers with an error of another kind (a wrong token) raises it at once."""
    budget = _total_wait_s(RETRY) if budget_s is None else budget_s
    give_up = time.monotonic() + budget
    while True:
        answered: list[tuple[int, int, str]] = []
        error: BaseException | None = None
        for i, url in enumerate(urls):
            candidate = url if names_session(url) else with_session_id(url, shared_session_id(scope))
            try:
                accepted, started = _ask(candidate, PICK_RETRY)
            except Exception as e:  # noqa: BLE001 - this server cannot serve: the others may
                if not session_lost(e):
                    raise  # it answered with a refusal (a wrong token, say): no other server is asked
                error = e
                continue
            # refused the shared id: it answers, on a session of its own
            answered.append((started, i, candidate if accepted else url))
        if answered:
            return min((started or 2**63, i, u) for started, i, u in answered)[2]
        if time.monotonic() >= give_up:
            assert error is not None
            raise error
        time.sleep(1.0)


def _total_wait_s(retry: dict) -> float:
    """How long PySpark's policy ``retry`` waits in all before it gives up (without jitter)."""
    waits, backoff = 0.0, float(retry["initial_backoff"])
    for _ in range(retry["max_retries"]):
        waits += min(backoff, retry["max_backoff"])
        backoff *= retry["backoff_multiplier"]
    return waits / 1000.0
