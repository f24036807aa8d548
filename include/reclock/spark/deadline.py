"""A deadline on the Spark work of one step: past it, the step's Spark operations are interrupted and the
step fails with :class:`~reclock.errors.StepDeadlineExceeded`, naming the step and the deadline.

Why: a Spark job has no time limit of its own. Under load a step's job can queue behind other jobs on a
cluster that lost executors, or run on after its client is gone (issue 37's campaign: one Airflow try sat
12.5 minutes in a Spark Connect job until the campaign killed it). A failed try is safe (a rerun writes the
same updates to fresh paths, nothing is visible before ``append``); a try that never ends holds the source's
only active run. So a step's Spark work ends by its deadline, and the try fails in a way Airflow retries.

How: every operation the step runs carries a job tag (``SparkSession.addTag``, in the thread that runs the
step; Spark Connect and classic sessions both have tags); a timer interrupts that tag once the deadline has
passed (``SparkSession.interruptTag``), and again every :data:`REPEAT_S` until the step ends, so an
operation started after the first interrupt does not escape it. Other processes' operations in a shared
Spark Connect session (``reclock.spark.connect``) carry other tags and are left alone. A step that ends
without an error past its deadline (its last operation ended before the interrupt reached it) keeps its
result: what it wrote is as good as any. A step that fails past its deadline while none of its operations
was interrupted (it was waiting on something else: a Kafka client's own timeout) raises its own error, the
true cause.

Spark work alone is bounded here; the Airflow task's ``execution_timeout`` bounds a whole try
(``reclock.orchestration.ingest``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any, Callable

from reclock.errors import StepDeadlineExceeded
from reclock.spark.connect import add_tag, remove_tag

log = logging.getLogger(__name__)

REPEAT_S = 5.0
"""How often the tag is interrupted again once the deadline has passed, until the step ends."""


class SparkDeadline:
    """A context manager for one step: ``what`` names it in the error, ``seconds`` is its deadline, and
    ``current`` returns the step's Spark session when it has one (None before the step asks for one).

    The step calls :meth:`tag` on each session it uses, in the thread that runs its Spark operations."""

    def __init__(self, what: str, seconds: float, current: Callable[[], Any]) -> None:
        if seconds <= 0:
            raise ValueError(f"{what}: a deadline must be positive, got {seconds}")
        self.what = what
        self.seconds = seconds
        self.job_tag = f"reclock-deadline-{uuid.uuid4().hex[:16]}"
        self._current = current
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.interrupted = 0
        """How many operations the interrupts reached (Spark's count of the operation ids it interrupted)."""
        self.fired = False
        """Whether the deadline passed while the step ran."""

    def tag(self, session: Any) -> None:
        """Tag ``session``'s operations from this thread with the step's tag (a session without tags, e.g. a
        test's stand-in, is left as it is)."""
        add_tag(session, self.job_tag)

    def _untag(self) -> None:
        remove_tag(self._current(), self.job_tag)

    def _watch(self) -> None:
        if self._done.wait(self.seconds):
            return
        self.fired = True
        log.warning("%s: past its deadline of %g s; interrupting its Spark operations", self.what, self.seconds)
        while True:
            session = self._current()
            if session is not None:
                try:
                    self.interrupted += len(session.interruptTag(self.job_tag) or [])
                except Exception as e:  # noqa: BLE001 - the session may be gone; the step then fails anyway
                    log.warning("%s: interrupting its Spark operations failed: %s", self.what, e)
            if self._done.wait(REPEAT_S):
                return

    def __enter__(self) -> "SparkDeadline":
        self._thread = threading.Thread(target=self._watch, name="reclock-deadline", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        self._untag()
        if exc is not None and self.interrupted and isinstance(exc, Exception):
            raise StepDeadlineExceeded(self.what, self.seconds, self.interrupted, exc) from exc
        return False
