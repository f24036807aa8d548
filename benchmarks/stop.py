"""How every benchmark command stops on a signal: the first SIGINT or SIGTERM raises ``KeyboardInterrupt`` in
the main thread, so the ``finally`` blocks (:func:`benchmarks.env.services`, each command's own) stop every
service the command started; any further one is ignored, so the clean-up itself is never cut short.

:func:`install` puts that handler on both signals: a command that starts services calls it first (without it
a SIGTERM ends Python at once and the servers, each in a session of its own, outlive it). The test suite puts
it on SIGTERM (``tests/conftest.py``), so a killed session tears its fixtures down as on Ctrl-C.

:func:`kept` runs code that installs signal handlers of its own with ours still in force. Airflow's
``dag.test()`` runs each task in this process through the task SDK's ``task_runner.run()``, which sets
SIGTERM to a handler that only calls the operator's ``on_kill()`` and never puts the previous one back: after
the first ``dag.test()`` a SIGTERM did nothing, and the services leaked when the killer gave up and SIGKILLed
(SIGINT, which it leaves alone, still worked). And the task runner catches ``BaseException``: a task
interrupted by either signal only fails, and ``dag.test()`` goes on.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_set_handler = signal.signal  # the real one, also while :func:`kept` stands in for it
_stopping: int | None = None  # the signal that stopped this process


def _interrupt(signum: int, frame: object) -> None:
    """The first SIGINT or SIGTERM stops the run; any further one is ignored."""
    global _stopping
    _stopping = signum
    for s in SIGNALS:
        _set_handler(s, signal.SIG_IGN)
    print(f"\nsignal {signum}: stopping every service this run started; please wait", flush=True)
    raise KeyboardInterrupt(f"signal {signum}")


def install(*signals: int) -> None:
    """``signals`` (default: SIGINT and SIGTERM) stop this process through its ``finally`` blocks (call it in
    the main thread)."""
    for s in signals or SIGNALS:
        _set_handler(s, _interrupt)


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Run the block with :func:`install`'s handling in force whatever the block does with signal handlers.

    While the block runs, ``signal.signal`` for SIGINT or SIGTERM does not replace our handler: it records the
    block's handler, which a signal then calls before ours (Airflow's task runner's, to call ``on_kill()``).
    After the block, our handlers are in place again, and a stop the block caught (a task that only failed)
    is raised again as ``KeyboardInterrupt``. Main thread only, as ``signal.signal`` itself."""
    if _stopping is not None:
        raise KeyboardInterrupt(f"signal {_stopping}")
    theirs: dict[int, Any] = {}

    def chained(signum: int, frame: object) -> None:
        handler = theirs.get(signum)
        try:
            if callable(handler):
                handler(signum, frame)
        finally:
            _interrupt(signum, frame)

    def recorded(signum: int, handler: Any) -> Any:
        if signum not in SIGNALS:
            return _set_handler(signum, handler)
        previous = theirs.get(signum, chained)
        theirs[signum] = handler
        return previous

    before = {s: signal.getsignal(s) for s in SIGNALS}
    for s in SIGNALS:
        _set_handler(s, chained)
    signal.signal = recorded
    try:
        yield
    finally:
        signal.signal = _set_handler
        if _stopping is None:
            for s, handler in before.items():
                _set_handler(s, handler)
    if _stopping is not None:
        raise KeyboardInterrupt(f"signal {_stopping}")
