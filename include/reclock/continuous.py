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

**Joint writes.** A group's sources also share Spark jobs: a cycle whose description is one append-only
slice hands it to the group's :class:`JointWriter`, which writes the slices that sources of the same
columns hand it at about the same time in one Spark job (the kind's ``reclock.sources.base.JointJobs``) and moves
each source's files into that source's own write folder (``reclock.persist.staged.split_joint``). From there
each source proves its parts and appends them with its own ``compare_and_append``, as after a job of its
own. The first source to hand in a slice while no joint job runs leads: it waits ``gather_s`` for the
others, runs the job for everything handed in, and the slices handed in meanwhile go into the next job
(group commit). A joint job that fails sends each of its sources to a job of its own, so a source whose
slice cannot be read or written fails alone.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from reclock.batch import OffsetRange, SliceWritten
from reclock.cycle import CycleContext, mint_and_append, resume
from reclock.errors import ReclockError
from reclock.failpoints import failpoint
from reclock.part_layout import MEMBER_COLUMN
from reclock.persist.staged import split_joint
from reclock.sources.base import JointJobs, JointSlice
from reclock.spark.reclocking import BindingRange

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
"""The longest pause a group's failing source waits before its next attempt."""

RESUME_S = 1.0
"""Default for how often a continuous source resumes (``resume:`` in the config)."""

GATHER_S = 0.05
"""How long a joint job's leader waits for the group's other sources' slices before it starts the job."""


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


@dataclass
class _Handed:
    ctx: CycleContext
    slice: JointSlice
    folder: str
    key: tuple
    jobs: JointJobs
    done: bool = False
    result: tuple[SliceWritten, int] | None = None
    error: BaseException | None = None


@dataclass
class JointWriter:
    """A continuous group's shared Spark jobs (see the module): a ``CycleContext.joint_writer``."""

    gather_s: float = GATHER_S
    jobs: int = 0
    _cv: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _handed: list[_Handed] = field(default_factory=list, repr=False)
    _busy: bool = False

    def __call__(self, ctx: CycleContext, ranges: Sequence[OffsetRange], bindings: Sequence[BindingRange],
                 folder: str) -> tuple[SliceWritten, int] | None:
        """Write one append-only slice of ``ctx``'s source into the blob folder ``folder`` in a joint job:
        what the job did for it and how many sources the job wrote; None when the source must write it in
        a job of its own (a source that cannot share one, or a joint job that failed)."""
        jobs = ctx.kind.joint
        key = jobs.key(ctx.spec) if jobs is not None else None
        if key is None:
            return None
        root = ctx.blob.url(folder)[:-len(folder)]  # one job writes into one store
        me = _Handed(ctx, JointSlice(ctx.spec, ctx.upstream, ranges, bindings), folder, (ctx.kind.name, *key, root),
                     jobs)
        with self._cv:
            self._handed.append(me)
            while self._busy and not me.done:
                self._cv.wait(1.0)
            if me.done:
                return self._outcome(me)
            self._busy = True
        try:
            time.sleep(self.gather_s)
            with self._cv:
                batch, self._handed = self._handed, []
            for key in dict.fromkeys(h.key for h in batch):
                self._run([h for h in batch if h.key == key])
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
        return self._outcome(me)

    @staticmethod
    def _outcome(h: _Handed) -> tuple[SliceWritten, int] | None:
        if h.error is not None:
            raise h.error
        return h.result

    def _run(self, batch: list[_Handed]) -> None:
        first = batch[0]
        base = f"{first.folder}-joint-{uuid.uuid4().hex[:8]}"  # in the first source's leased write folder
        try:
            failpoint("write_batches:joint_job")
            blob = first.ctx.blob
            written = first.jobs.write(first.ctx.spark(), [h.slice for h in batch], blob.url(base))
            split_joint(blob, first.ctx.spec.name, base, MEMBER_COLUMN, [h.folder for h in batch])
            for h, w in zip(batch, written):
                h.result = (replace(w, url=blob.url(h.folder)), len(batch))
        except Exception as e:  # noqa: BLE001 - each source then tries a job of its own
            if len(batch) == 1:
                first.error = e
            else:
                log.warning("a joint write of %d sources (%s) failed; each writes its slice in a job of its "
                            "own: %s: %s", len(batch), ", ".join(h.ctx.spec.name for h in batch), type(e).__name__, e)
        finally:
            self.jobs += 1
            with self._cv:
                for h in batch:
                    h.done = True


@dataclass(frozen=True)
class Member:
    """One source of a continuous group: its cycle context and its idle pause."""

    ctx: CycleContext
    idle_s: float = 0.2
    resume_s: float = RESUME_S


def run_group(group: str, members: Sequence[Member], seconds: float,
              clock: Callable[[], float] = time.monotonic, stop: threading.Event | None = None,
              joint: JointWriter | None = None) -> dict:
    """Every member's :func:`run_cycles` for ``seconds``, each in its own thread of this process. A member
    whose cycle fails waits and tries again within the lease; the others go on. Returns each member's
    counts (``cycles``, ``with_data``, ``resumes``, ``failures``); raises :class:`GroupFailed` when a
    member's last attempt failed. The members share ``joint`` (a new :class:`JointWriter` by default) for
    their one-slice writes."""
    if not members:
        raise ReclockError(f"group {group}: no sources to run")
    joint = joint or JointWriter()
    for m in members:
        m.ctx.joint_writer = joint
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
