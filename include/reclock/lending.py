"""One connection per block: a :class:`ConnectionLender` lends the same connection to every ``connect()`` made
inside a ``holding()`` block of the same thread (a Postgres connection costs ~6 ms; a cycle used to open a
dozen), and a fresh one outside such a block. The cycle lends its consensus connections this way, and a
Postgres source its upstream sessions.

The lent connection is opened at the first loan and closed when the block ends. It is replaced when it
broke, when a loan that ended left it inside a transaction, when an error left the outermost loan (the next
loan starts clean), when it sat idle over :data:`REUSE_IDLE_S` with nobody holding it (a proxy or a
server timeout may have cut it during a long Spark job), or when a ``SELECT 1`` finds it dead after it sat
idle over :data:`PROBE_IDLE_S` (a server restarted meanwhile: a connection learns that only when next used,
and the step would fail after all its work). A loan asked while a caller's transaction is open
on it gets a connection of its own: it never joins that transaction. Threads never share one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

from psycopg import Connection
from psycopg.pq import TransactionStatus

REUSE_IDLE_S = 10.0
"""How long a held connection may sit idle and still be lent again."""

PROBE_IDLE_S = 1.0
"""A held connection idle longer than this is probed (``SELECT 1``, one round trip) before it is lent again."""


class ConnectionLender:
    """Connections made by ``opener`` (autocommit ones), one held per thread while a :meth:`holding` block
    runs."""

    def __init__(self, opener: Callable[[], Connection]) -> None:
        self.opener = opener
        self._local = threading.local()

    @contextlib.contextmanager
    def connect(self) -> Iterator[Connection]:
        """The held connection of this thread's :meth:`holding` block, if one is running; else a new one."""
        held = getattr(self._local, "held", None)
        if held is not None:
            with held.lend() as conn:
                yield conn
            return
        with self.opener() as conn:
            yield conn

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Lend one connection to every :meth:`connect` in this thread until the block ends, then close it.
        A block inside a block uses the outer one's connection."""
        if getattr(self._local, "held", None) is not None:
            yield
            return
        held = self._local.held = _HeldConnection(self.opener)
        try:
            yield
        finally:
            self._local.held = None
            held.close()


class _HeldConnection:
    """The connection one :meth:`ConnectionLender.holding` block lends (see the module)."""

    def __init__(self, opener: Callable[[], Connection]) -> None:
        self.opener = opener
        self.conn: Connection | None = None
        self.used = 0.0
        self.lent = 0

    @contextlib.contextmanager
    def lend(self) -> Iterator[Connection]:
        conn = self.conn
        usable = conn is not None and not conn.closed and not conn.broken
        if usable and conn.info.transaction_status != TransactionStatus.IDLE:
            if self.lent:  # a caller's transaction is open on it: never join it
                with self.opener() as own:
                    yield own
                return
            usable = False  # left inside a transaction by a loan that ended: not to be trusted
        idle = 0.0 if self.lent else time.monotonic() - self.used
        if usable and PROBE_IDLE_S < idle <= REUSE_IDLE_S:
            usable = _alive(conn)
        if not usable or idle > REUSE_IDLE_S:
            self.close()
            self.conn = conn = self.opener()
        self.lent += 1
        try:
            yield conn
        except BaseException:
            if self.lent == 1:
                self.close()
            raise
        finally:
            self.lent -= 1
            self.used = time.monotonic()

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


def _alive(conn: Connection) -> bool:
    """Whether ``conn`` (idle, in no transaction) still answers; a connection outside autocommit is not
    probed (the probe would open a transaction on it)."""
    if not conn.autocommit:
        return True
    try:
        conn.execute("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - any failure: not to be lent again
        return False
