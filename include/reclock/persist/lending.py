"""One consensus connection per step: a :class:`ConnectionLender` lends the same Postgres connection to
every ``connect()`` made inside a ``holding()`` block of the same thread (a connection costs ~6 ms; a cycle
used to open a dozen), and a fresh one outside such a block.

The lent connection is opened at the first loan and closed when the block ends. It is replaced when it
broke, or when it sat idle over :data:`REUSE_IDLE_S` with nobody holding it (a proxy or a server timeout
may have cut it during a long Spark job). A loan asked while a caller's transaction is open on it gets a
connection of its own: it never joins that transaction. Threads never share one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from psycopg.pq import TransactionStatus

from reclock.persist import connect

REUSE_IDLE_S = 10.0
"""How long a held connection may sit idle and still be lent again."""


class ConnectionLender:
    """Connections to ``dsn`` (autocommit, as :func:`reclock.persist.connect` makes them), one held per
    thread while a :meth:`holding` block runs."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._local = threading.local()

    @contextlib.contextmanager
    def connect(self) -> Iterator:
        """The held connection of this thread's :meth:`holding` block, if one is running; else a new one."""
        held = getattr(self._local, "held", None)
        if held is not None:
            with held.lend() as conn:
                yield conn
            return
        with connect(self.dsn) as conn:
            yield conn

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Lend one connection to every :meth:`connect` in this thread until the block ends, then close it.
        A block inside a block uses the outer one's connection."""
        if getattr(self._local, "held", None) is not None:
            yield
            return
        held = self._local.held = _HeldConnection(self.dsn)
        try:
            yield
        finally:
            self._local.held = None
            held.close()


class _HeldConnection:
    """The connection one :meth:`ConnectionLender.holding` block lends (see the module)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn = None
        self.used = 0.0
        self.lent = 0

    @contextlib.contextmanager
    def lend(self) -> Iterator:
        conn = self.conn
        usable = conn is not None and not conn.closed and not conn.broken
        if usable and conn.info.transaction_status != TransactionStatus.IDLE:
            with connect(self.dsn) as own:
                yield own
            return
        if not usable or (not self.lent and time.monotonic() - self.used > REUSE_IDLE_S):
            self.close()
            self.conn = conn = connect(self.dsn)
        self.lent += 1
        try:
            yield conn
        finally:
            self.lent -= 1
            self.used = time.monotonic()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
