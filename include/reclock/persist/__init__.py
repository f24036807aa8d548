"""Persistence: consensus in Postgres (schema ``reclock``) and immutable parts in a blob store.

=================  ======================================================================================
``migrate``        ``migrate(dsn_or_conn)``: the schema's versioned, checksummed, lock-serialized migrations
``remap_store``    a source's durable remap collection: ``register_source``, ``load_remap``,
                   ``append_binding`` (compare-and-set on the remap upper), ``compact_remap``; the
                   ``<source>_progress`` view and ``reclock.progress_as_of(source, t)``
``shards``         shards' ``upper``/``since``, their batches of parts, ``compare_and_append`` over several
                   shards in one transaction, reads AS OF t, read holds, ``advance_since``
``blob``           the ``BlobStore`` protocol: ``LocalBlobStore`` (default), ``FsspecBlobStore`` (S3, ...)
``compact``        ``compact_parts``: merge a shard's small parts at or below its since (bounded batches)
``gc``             ``collect_garbage``: unreferenced parts older than a grace period
``status``         status history and statistics rows
=================  ======================================================================================

Every function takes a psycopg 3 connection and does its work in one transaction of its own (a
savepoint when the caller already has one open). Every query is parameterised; names that become SQL
identifiers are validated (``names``) and quoted with ``psycopg.sql.Identifier``.
"""

import os
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict

from reclock.errors import SettingError

CONNECT_RETRY_S = 20.0
"""How long :func:`connect` keeps trying while the server cannot take connections yet (a restart, a
failover's promotion): a step started meanwhile waits it out instead of failing after its other work."""

TRANSIENT = ("starting up", "not yet accepting connections", "shutting down", "in recovery mode",
             "Connection refused", "server closed the connection unexpectedly", "timeout expired",
             "session is read-only", "hot standby mode")
"""What libpq says when the server is (re)starting, stopping or unreachable for now, or (a DSN naming a
primary and its standby, ``target_session_attrs=read-write``) no server accepts writes yet: a failover's
promotion under way."""

NETWORK_DEFAULTS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "30",
                    "keepalives_interval": "10", "keepalives_count": "3", "tcp_user_timeout": "60000"}
"""libpq settings every consensus connection gets unless its DSN sets them: a connection attempt gives up
after 10 s, an idle connection whose peer vanished (a black-holed network) is found dead after about a
minute of unanswered keepalives, and a request the server never acknowledges fails after 60 s
(``tcp_user_timeout``) instead of the kernel's ~15 minutes of retransmissions."""


IO_TIMEOUT_S = 120.0
"""The longest a consensus connection waits for the server's answer to one request (a query, a commit)
before it gives up, closes the connection and raises ``psycopg.OperationalError`` ("no answer from the
server in 120 s"): a hung server or a network that swallows data behind a peer that still acknowledges it
(a proxy, a load balancer) is never noticed by TCP, so without this a step would wait forever.
``RECLOCK_PG_TIMEOUT_S`` sets it (tests lower it); Reclock's queries take well under a second."""


def io_timeout_s() -> float:
    """:data:`IO_TIMEOUT_S`, or ``RECLOCK_PG_TIMEOUT_S`` when set."""
    raw = os.environ.get("RECLOCK_PG_TIMEOUT_S")
    if raw is None or not raw.strip():
        return IO_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"RECLOCK_PG_TIMEOUT_S must be a number of seconds, got {raw!r} (e.g. 120)") from None
    if not value > 0:
        raise SettingError(f"RECLOCK_PG_TIMEOUT_S must be a positive number of seconds, got {raw!r}")
    return value


class BoundedConnection(psycopg.Connection):
    """A psycopg connection whose every wait for the server ends after :attr:`io_timeout` seconds: the
    connection is then closed (its protocol state is unknown) and ``OperationalError`` raised."""

    io_timeout: float = IO_TIMEOUT_S

    def wait(self, gen, interval=0.1, timeout=None):  # type: ignore[override]  # psycopg's own signature
        limit = self.io_timeout if timeout is None else min(timeout, self.io_timeout)
        try:
            return super().wait(gen, interval=interval, timeout=limit)
        except psycopg.OperationalError as e:
            if "wait timeout expired" not in str(e):
                raise
            self.pgconn.finish()
            raise psycopg.OperationalError(
                f"no answer from the server in {limit:g} s (a hung server or a network that drops data): "
                "connection closed; the step fails and the next one connects anew") from e


def connect(dsn: str) -> psycopg.Connection:
    """A connection for the persist functions: autocommit, so a read never leaves an implicit transaction
    open (that would hold a compare-and-set's row locks past the function); each function opens its
    own transaction, and callers may still group several in ``with conn.transaction():``.

    A server (or database, or role) set to ``synchronous_commit = off`` acknowledges a commit before its
    WAL is flushed, and a crash then forgets it: an append a sink has already exported, or a frontier a
    slot has already been advanced to. So where the setting is ``off`` the session turns it ``on``
    (``local`` and the replication levels already flush locally and are kept).

    While the server cannot take connections yet (:data:`TRANSIENT`) it tries again for up to
    :data:`CONNECT_RETRY_S`; the DSN gets :data:`NETWORK_DEFAULTS` for what it does not set, and every wait
    for an answer ends after :func:`io_timeout_s` (:class:`BoundedConnection`)."""
    given = conninfo_to_dict(dsn)
    extra = {k: v for k, v in NETWORK_DEFAULTS.items() if k not in given}
    timeout = io_timeout_s()
    deadline, pause = time.monotonic() + CONNECT_RETRY_S, 0.1
    while True:
        try:
            conn = BoundedConnection.connect(dsn, autocommit=True, **extra)
            conn.io_timeout = timeout
            break
        except psycopg.OperationalError as e:
            if time.monotonic() + pause > deadline or not any(t in str(e) for t in TRANSIENT):
                raise
            time.sleep(pause)
            pause = min(2 * pause, 2.0)
    try:
        conn.execute("SELECT set_config('synchronous_commit', 'on', false) "
                     "WHERE current_setting('synchronous_commit') = 'off'")
    except BaseException:
        conn.close()
        raise
    return conn
