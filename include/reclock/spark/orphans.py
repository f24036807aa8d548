"""Spark work that a source's dead writer left running, interrupted by the source's next writer.

A process that dies while its write waits on Spark Connect (an Airflow task killed, a cycle SIGKILLed, a
machine lost) leaves its operations running on the server: the server goes on with an operation whose client
went away until it ends or until ``spark.connect.execute.manager.detachedTimeout`` has passed (5 minutes by
default; docs/deployment.md recommends a minute). Meanwhile the retry, a few seconds
later, runs the same write beside it on the same executors, and its output is thrown away: issue 37's fault
campaign killed a try every minute or two, and each left such a job behind the next.

So the Spark operations of every ``write_batches`` step carry its source's write tag (:func:`write_tag`), and a
step that holds the source's write lock (a Postgres advisory lock on a connection of its own,
``reclock.persist.shards.WriteLock``: a process that dies releases it with its connection) first interrupts
the operations that still carry that tag in the source's shared session (``reclock.spark.connect``): no live
writer of the source runs them. A step that does not get the lock (another writer of the source is alive, a
``reclock cycle`` run by hand beside Airflow's) interrupts nothing. A writer whose lock connection was cut (its
Postgres restarted) counts as dead: the fault campaign saw it twice, each time a try Airflow had already
given up for its retry. Interrupting is only ever a failure of work nobody waits for: nothing a write does is
visible before its ``append``.

Out of reach, and left to the server's timeout: a dead writer's operations on another server (several
servers, ``reclock.spark.connect``), in another window's session, or on a session in the writer's own
process (no Spark Connect: the process took its driver with it).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from reclock.spark.connect import add_tag, is_connect, remove_tag

log = logging.getLogger(__name__)

TAG_PREFIX = "reclock-write-"


def write_tag(source: str) -> str:
    """The tag of ``source``'s write operations (Spark refuses a tag with a comma, and an empty one)."""
    return TAG_PREFIX + source.replace(",", "_")


class OrphanedWrites:
    """One write step's side of it (see the module): :meth:`attach` each session the step uses (in the thread
    that runs its operations); ``claim()`` takes the source's write lock for the rest of the step and says
    whether it got it (asked once, when the step first attaches a Spark Connect session)."""

    def __init__(self, source: str, claim: Callable[[], bool]) -> None:
        self.source = source
        self.tag = write_tag(source)
        self._claim = claim
        self._claimed: bool | None = None
        self._attached: list[Any] = []
        self.interrupted = 0
        """How many operations of a dead writer the step interrupted (the server's count)."""

    def attach(self, session: Any) -> None:
        """Interrupt what a dead writer of the source left in ``session`` (a Spark Connect one, when the step
        holds the lock), then tag the step's operations on it. Each session once."""
        if any(s is session for s in self._attached):
            return
        self._attached.append(session)
        if is_connect(session):  # operations outlive their client
            if self._claimed is None:
                self._claimed = self._claim()
            if self._claimed:
                try:
                    ids = session.interruptTag(self.tag) or []
                except Exception as e:  # noqa: BLE001 - the session may be gone: the step's own work finds out
                    log.warning("source %s: interrupting what a dead writer left running failed: %s", self.source, e)
                    ids = []
                if ids:
                    log.warning("source %s: interrupted %d Spark operation(s) a dead writer of the source left "
                                "running", self.source, len(ids))
                self.interrupted += len(ids)
        add_tag(session, self.tag)

    def detach(self) -> None:
        """Untag the step's sessions in this thread (a later step's operations are not the write's)."""
        for session in self._attached:
            remove_tag(session, self.tag)
        self._attached.clear()
