"""Continuous mode: whole cycles back to back for a lease, for one source or for a group of sources in one
process (``schedule: continuous``, ``group:``).

::

    lease ----------------------------------------------------------------------------->
    source a:  [mint write append] [mint write append] resume [mint write append] ... resume
    source b:  [mint write append] (idle) [mint write append] resume ...                 resume
               one thread per source of a group; each its own cycles, bindings and compare_and_append

Each cycle is still mint -> write_batches -> append (``reclock.cycle``), each step recording statistics
and status. **resume** (the consumer-group commit, the remap collection's and the shards' compaction,
garbage collection) runs at most every ``resume_s`` and once more when the lease ends: it only moves the
upstream's retention and the state's bounds forward, never what is visible, so running it after every
cycle of a continuous source would cost Postgres and Kafka calls on the path between one cycle's append
and the next one's mint (about a fifth of a small cycle) and buy nothing. A lease killed anywhere loses
nothing: the next one resumes from the shards (cycles are safe to repeat and to run two at once).

A group's sources share one process and its Spark sessions: one Airflow task supervises them all, so
Airflow pays for one running task and not one per source. One source's failure does not stop the others:
its thread records the error (the cycle's ``stalled`` status row), waits (doubling from ``poll`` to
``MAX_BACKOFF_S``) and tries again within the lease; when the lease ends, :class:`GroupFailed` names every
source whose last attempt failed, so the run fails and Airflow retries it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from reclock.cycle import CycleContext, mint_and_append, resume
from reclock.errors import ReclockError

MAX_BACKOFF_S = 30.0
"""The longest pause a group's failing source waits before its next attempt."""

RESUME_S = 1.0
"""Default for how often a continuous source resumes (``resume:`` in the config)."""


class GroupFailed(ReclockError):
    """A continuous group's lease ended with sources whose last cycle failed."""

    def __init__(self, group: str, failed: dict[str, BaseException]) -> None:
        self.group = group
        self.failed = failed
        causes = "; ".join(f"{name}: {type(e).__name__}: {e}" for name, e in sorted(failed.items()))
        super().__init__(f"group {group}: {len(failed)} source(s) failed their last cycle of the lease ({causes}); "
                         "the others kept cycling; their status rows say when each failure began")


def run_cycles(ctx: CycleContext, seconds: float, idle_s: float = 0.2, resume_s: float = RESUME_S,
               clock: Callable[[], float] = time.monotonic, stop: threading.Event | None = None) -> dict:
    """Cycles back to back for ``seconds`` (the lease): each mint -> write_batches -> append, the next one
    started as soon as the last ends, or ``idle_s`` later when it found nothing new; resume at most every
    ``resume_s`` and once at the end. The last cycle started before the lease ends runs to its end; ``stop``
    ends the lease early. A failing step raises (after its ``stalled`` status row)."""
    until = clock() + seconds
    cycles = with_data = resumes = 0
    last_resume: float | None = None
    stop = stop or threading.Event()
    while clock() < until and not stop.is_set():
        minted, appended = mint_and_append(ctx)
        cycles += 1
        if last_resume is None or clock() - last_resume >= resume_s:
            resume(ctx)
            resumes += 1
            last_resume = clock()
        if minted is None and appended == 0:
            stop.wait(max(0.0, min(idle_s, until - clock())))
        else:
            with_data += 1
    if cycles:
        resume(ctx)
        resumes += 1
    return {"cycles": cycles, "with_data": with_data, "resumes": resumes}


@dataclass(frozen=True)
class Member:
    """One source of a continuous group: its cycle context and its idle pause."""

    ctx: CycleContext
    idle_s: float = 0.2
    resume_s: float = RESUME_S


def run_group(group: str, members: Sequence[Member], seconds: float,
              clock: Callable[[], float] = time.monotonic, stop: threading.Event | None = None) -> dict:
    """Every member's :func:`run_cycles` for ``seconds``, each in its own thread of this process. A member
    whose cycle fails waits and tries again within the lease; the others go on. Returns each member's
    counts (``cycles``, ``with_data``, ``resumes``, ``failures``); raises :class:`GroupFailed` when a
    member's last attempt failed."""
    if not members:
        raise ReclockError(f"group {group}: no sources to run")
    until = clock() + seconds
    stop = stop or threading.Event()
    results: dict[str, dict] = {}
    last_error: dict[str, BaseException] = {}

    def one(m: Member) -> None:
        name = m.ctx.spec.name
        totals = {"cycles": 0, "with_data": 0, "resumes": 0, "failures": 0}
        backoff = max(m.idle_s, 0.1)
        while clock() < until and not stop.is_set():
            try:
                out = run_cycles(m.ctx, until - clock(), m.idle_s, m.resume_s, clock, stop)
            except Exception as e:  # recorded as the cycle's stalled status; tried again after a pause
                last_error[name] = e
                totals["failures"] += 1
                stop.wait(max(0.0, min(backoff, until - clock())))
                backoff = min(2 * backoff, MAX_BACKOFF_S)
                continue
            last_error.pop(name, None)
            for k in ("cycles", "with_data", "resumes"):
                totals[k] += out[k]
            backoff = max(m.idle_s, 0.1)
        results[name] = totals

    threads = [threading.Thread(target=one, args=(m,), name=f"reclock-{m.ctx.spec.name}", daemon=True)
               for m in members]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException:  # an interrupted task (KeyboardInterrupt, SystemExit) ends every member's lease too
        stop.set()
        for t in threads:
            t.join()
        raise
    if last_error:
        raise GroupFailed(group, dict(last_error))
    return results
