"""The ingestion cycle: the four steps one ``ingest__<source>`` DAG run performs.

::

    upstream (its kind)                       consensus                            blob store
    -------------------                       ---------                            ----------
          |  probe the upper (SourceRuntime.probe_upper)
          v
    +-----------+  append binding (CAS on remap upper)        "bindings before data"
    |   mint    |------------------------------> remap collection
    +-----------+  descriptions (lower = shard upper, upper = newest binding ts + 1)
          |
          v
    +---------------+  the kind reads exactly the bound ranges, reclocks, decodes,
    | write_batches |  routes; Parquet parts under fresh paths ----------------------> parts
    +---------------+  (SourceRuntime.write; nothing visible yet)
          |
          v
    +-----------+  compare_and_append every output shard       "exactly once":
    |  append   |  in ONE transaction ---------> shard uppers  a replay is a no-op,
    +-----------+                                              a conflict changes nothing
          |
          v
    +-----------+  resumption frontier = meet(remap upper, shard uppers)
    |  resume   |  -> offset resumption frontier (source_upper_at) -> committed
    +-----------+  upstream (SourceRuntime.commit); compact the remap collection   "bounded input reliance"
                   and the shards' small parts; every so often, delete the parts nothing
                   references (past a grace period; a running write's folder is leased)  "bounded state"

Every kind runs the same four steps: what differs between kinds (the upstream's upper, how a bound range
is read and written, what is committed upstream) is the kind's, behind ``reclock.sources.base``
(:class:`~reclock.sources.base.SourceRuntime`), found in ``reclock.sources.registry``; this module names
no kind.

Each step is a plain function over a :class:`CycleContext`; DAG tasks only call them. Every step records
statistics and a status row; a step that fails records ``stalled`` with the error and re-raises.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from reclock import remap
from reclock.batch import BatchDescription, SliceWritten, holds_binding, rebuild_window
from reclock.specs import SourceSpec
from reclock.errors import (AcknowledgedStateLost, ConfigError, MigrationError, RebuildConflict, RemapUpperMismatch,
                            ShardsDisagree, UpperMismatch)
from reclock.explain import summary
from reclock.failpoints import failpoint
from reclock.lending import ConnectionLender
from reclock.persist import blob as blobs
from reclock.persist import connect
from reclock.persist.compact import compact_parts
from reclock.persist.gc import claim_gc, collect_garbage, release_write
from reclock.persist.migrate import check_schema
from reclock.persist.remap_store import advance_remap_upper, append_binding, compact_remap, load_remap
from reclock.persist.shards import (APPENDED, SWAPPED, Append, Swap, advance_since, batches, compare_and_append,
                                    drop_lapsed_holds, holding_rebuild_lock, read_holds, shard_info, swap_batches,
                                    window_rows, WriteLock)
from reclock.persist.status import prune_history, record_statistics, record_status
from reclock.remap import RemapCollection
from reclock.sources.base import SourceKind, SourceRuntime, WrittenBatch
from reclock.sources.registry import kind_of
from reclock.spark import connect as spark_connect
from reclock.spark.deadline import SparkDeadline
from reclock.spark.orphans import OrphanedWrites

log = logging.getLogger(__name__)

__all__ = ["CycleContext", "MintResult", "WrittenBatch", "ResumeResult", "ensure_registered", "mint",
           "write_batches", "append", "resume", "rebuild", "resnapshot", "mint_and_append", "mint_and_write", "run_cycle", "check_acknowledged"]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class CycleContext:
    """Everything a step needs: the source's spec and where its upstream, consensus and blobs live (a
    ``reclock.sources.base.CycleServices`` for the source's kind)."""

    spec: SourceSpec
    dsn: str
    blob: blobs.BlobStore
    upstream: Any = None  # where the upstream is, as the kind's find_upstream resolved it (e.g. the brokers)
    spark_factory: Callable[[], object] | None = None
    clock: Callable[[], int] = now_ms
    retain_history_ms: int = 0
    gc_grace_s: float = 3600.0  # unreferenced parts younger than this (since written or replaced) are kept
    gc_interval_s: float = 300.0  # resume collects the source's garbage at most this often
    stats_keep_s: float = 7 * 86400.0  # statistics and status rows older than this go with that collection
    # writes a description's one append-only slice in a Spark job shared with other sources (a continuous
    # group's ``reclock.continuous.JointWriter``): (ctx, ranges, bindings, folder) -> (SliceWritten, how
    # many sources the job wrote), or None when this one must run its own job
    joint_writer: Callable[..., tuple[SliceWritten, int] | None] | None = None
    run_id: str | None = None  # the Airflow run the steps belong to (status rows name it)
    # what the context's appends added, per append that added updates (what an Airflow task reports as asset
    # events: downstream work runs only when data moved, and reads exactly the new range)
    added: list[Added] = field(default_factory=list, init=False, repr=False, compare=False)
    _source: SourceRuntime | None = field(default=None, init=False, repr=False, compare=False)
    _spark: object | None = field(default=None, init=False, repr=False, compare=False)
    _deadline: SparkDeadline | None = field(default=None, init=False, repr=False, compare=False)
    _orphans: OrphanedWrites | None = field(default=None, init=False, repr=False, compare=False)
    connections: ConnectionLender = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.connections = ConnectionLender(lambda: connect(self.dsn))

    @property
    def kind(self) -> SourceKind:
        """The source's kind (``reclock.sources.registry``)."""
        return kind_of(self.spec)

    def source(self) -> SourceRuntime:
        """The kind's half of this context (its upstream client, what it keeps for the steps); one per
        context, so a cycle's probes share one connected client."""
        if self._source is None:
            self._source = self.kind.open(self)
        return self._source

    def shards(self) -> tuple[str, ...]:
        """Every output shard of the source, the error collection included (the kind's)."""
        return self.source().shards()

    def spark(self):
        """The context's Spark session, made by ``spark_factory`` once: a task writing several descriptions
        attaches to Spark Connect (a probe and a setting, two round trips) once, not per description. A
        session a failed step found gone (:meth:`drop_spark`), or stopped meanwhile, is made anew."""
        if self._spark is not None and getattr(self._spark, "is_stopped", False):
            self._spark = None
        if self._spark is None:
            if self.spark_factory is None:
                raise ValueError(f"source {self.spec.name}: this cycle context has no spark_factory")
            self._spark = self.spark_factory()
        if self._deadline is not None:
            self._deadline.tag(self._spark)
        if self._orphans is not None:
            self._orphans.attach(self._spark)
        return self._spark

    @contextlib.contextmanager
    def spark_deadline(self, step: str) -> Iterator[SparkDeadline]:
        """The Spark operations of ``step`` (those run on sessions :meth:`spark` returns meanwhile, in this
        thread) are interrupted once ``spec.step_timeout_s`` has passed, and the step then fails with
        ``StepDeadlineExceeded`` (``reclock.spark.deadline``)."""
        deadline = SparkDeadline(f"source {self.spec.name}: {step}", self.spec.step_timeout_s, lambda: self._spark)
        self._deadline = deadline
        try:
            with deadline:
                yield deadline
        finally:
            self._deadline = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[OrphanedWrites]:
        """A write step: its Spark operations (on sessions :meth:`spark` returns meanwhile, in this thread)
        carry the source's write tag, and what a dead writer of the source left running on a Spark Connect
        session is interrupted first if this step gets the source's write lock (``reclock.spark.orphans``)."""
        lock = WriteLock(self.dsn, self.spec.name)
        orphans = OrphanedWrites(self.spec.name, lock.take)
        self._orphans = orphans
        try:
            yield orphans
        finally:
            self._orphans = None
            orphans.detach()
            lock.release()

    def connect(self):
        """A consensus connection (autocommit): while a step is under way in this thread, the one the step
        holds (``reclock.lending``); else a new one."""
        return self.connections.connect()

    def drop_spark(self, error: BaseException | None = None) -> bool:
        """Close the context's Spark Connect session if ``error`` says it is gone (a restarted server forgets
        its sessions, and a client still bound to one fails every later call; ``None``: close it anyway), so
        the next step attaches anew. True if it was closed."""
        if self._spark is None or (error is not None and not spark_connect.session_lost(error)):
            return False
        spark, self._spark = self._spark, None
        with contextlib.suppress(Exception):
            spark_connect.close(spark)
        return True

    def drop_spark_to_retry(self, error: BaseException) -> bool:
        """Close the context's Spark Connect session if Spark work that failed with ``error`` may run again
        at once in a new one (``reclock.spark.connect.attach_anew``: its server restarted, or another server
        stands in for one that stopped answering). True if it was closed."""
        return self._spark is not None and spark_connect.attach_anew(error, self._spark) and self.drop_spark(error)

    def close(self) -> None:
        """End what the context opened for its steps that would outlive it: the Spark Connect client (the
        server-side session stays for the source's next task). A task calls it when it ends, so its process
        exits at once instead of sending PySpark's exit-time call to a server that may be gone."""
        self.drop_spark()


@dataclass(frozen=True)
class Added:
    """One append that added updates to ``shard``: its description ``[lower, upper)`` and the rows (updates)
    it added. An append that only moved the upper (nothing upstream, or nothing for this shard), or found
    its range already present, adds none."""

    shard: str
    lower: int
    upper: int
    rows: int


def merge_added(added: Sequence[Added]) -> dict[str, Added]:
    """Per shard, the range covering every append in ``added`` (``[least lower, greatest upper)``) and their
    rows: a reader of that range's updates reads exactly what they added (the appends between them added
    nothing to the shard)."""
    out: dict[str, Added] = {}
    for a in added:
        b = out.get(a.shard)
        out[a.shard] = a if b is None else Added(a.shard, min(a.lower, b.lower), max(a.upper, b.upper),
                                                 a.rows + b.rows)
    return out


@dataclass(frozen=True)
class MintResult:
    binding: remap.Binding | None  # the (newest) binding this cycle minted, if upstream moved
    descriptions: tuple[BatchDescription, ...]  # what write_batches must write, in order
    with_bindings: int = 0  # how many of them hold a binding (the rest: an idle advance of the uppers)


@contextlib.contextmanager
def _holding(ctx: CycleContext) -> Iterator[None]:
    """One consensus connection, and what the kind holds for a step (an upstream session), for every step
    run inside (``reclock.lending``, ``SourceRuntime.holding``): a step holds them, and so do
    :func:`mint_and_append` and :func:`run_cycle` for the steps they run."""
    with ctx.connections.holding(), ctx.source().holding():
        yield


@contextlib.contextmanager
def _step(ctx: CycleContext, step: str) -> Iterator[dict]:
    """Record ``running`` and statistics around a step; on failure record ``stalled`` with the cause (one line,
    and a short trace beside it: ``reclock.explain``). Status rows name the step and the Airflow run."""
    metrics: dict = {}
    t0 = time.monotonic()
    with _holding(ctx):
        try:
            yield metrics
        except Exception as e:
            ctx.drop_spark(e)
            if isinstance(e, MigrationError):  # a schema not this release's takes no status row; the error says why
                raise
            s = summary(e)
            with ctx.connect() as conn:
                record_status(conn, ctx.spec.name, "stalled", error=f"{step}: {s.message}", step=step,
                              run_id=ctx.run_id, trace=s.trace)
            raise
        metrics["seconds"] = round(time.monotonic() - t0, 3)
        with ctx.connect() as conn:
            with conn.transaction():
                record_statistics(conn, ctx.spec.name, step, metrics)
                record_status(conn, ctx.spec.name, "running", step=step, run_id=ctx.run_id)


def ensure_registered(ctx: CycleContext) -> None:
    """Create the source's remap collection, progress view and output shards (and what its kind keeps
    upstream) if they do not exist, after checking (once per process) that the database's schema is this
    release's (``check_schema``)."""
    with ctx.connect() as conn:
        check_schema(conn, ctx.dsn)
    ctx.source().register()


def resnapshot(ctx: CycleContext, table: str | None = None) -> dict:
    """Start a source over from a fresh snapshot at a new binding, after a stall (a kind that takes a
    snapshot: ``SourceRuntime.resnapshot``); never a time in the past. Readers and sinks see one more
    timestamp, as for any cycle; history before it stays readable as it was. ``table``: that table alone, at
    the next binding, while the source's other tables stream on (``SourceRuntime.resnapshot_table``)."""
    refused = ctx.kind.resnapshot_refused(ctx.spec)
    if refused is not None:
        raise ConfigError(refused)
    with _step(ctx, "resnapshot") as m:
        return ctx.source().resnapshot(m) if table is None else ctx.source().resnapshot_table(table, m)


IDLE_ADVANCE_MS = 1000
"""A mint that finds nothing new moves the remap upper to the clock once it is this far behind (at most a
small write a second for a source cycling back to back)."""


def mint(ctx: CycleContext) -> MintResult:
    """Probe upstream, append a binding if it moved (else move the remap upper to now), mint descriptions
    for the output shards.

    Keeps *definite*: a binding is appended with compare-and-set on the remap upper at
    ``max(now, last + 1)``, never in the past; two concurrent minters cannot both succeed.
    """
    with _step(ctx, "mint") as m, ThreadPoolExecutor(1, "reclock-probe") as pool:
        source = ctx.source()
        if source.probe_after_register:
            ensure_registered(ctx)
            acked = source.acknowledged()
            uppers = source.probe_uppers()
        else:  # upstream's round trips beside the consensus's
            probe = pool.submit(lambda: (source.acknowledged(), source.probe_uppers()))
            ensure_registered(ctx)
            acked, uppers = probe.result()
        minted = None
        with ctx.connect() as conn:
            rc = load_remap(conn, ctx.spec.name)
            check_acknowledged(ctx, conn, rc, acked)
            for upper in uppers:  # in order, one binding each (a kind may bind a position before another)
                binding = remap.mint(rc, ctx.clock(), upper)
                if binding is None:
                    continue
                try:
                    rc = append_binding(conn, ctx.spec.name, rc.upper, binding)
                    minted = binding
                except RemapUpperMismatch:
                    # another cycle minted first: its binding serves us too
                    rc = load_remap(conn, ctx.spec.name)
                    break
            failpoint("mint:after_binding")
            now = ctx.clock()
            if minted is None and rc.bindings and now - rc.upper >= IDLE_ADVANCE_MS:
                # nothing new upstream: the times up to now are complete, so the remap upper (and, through
                # an empty description, the shards' uppers) follow the clock and an idle source's upper age
                # is its freshness
                try:
                    rc = advance_remap_upper(conn, ctx.spec.name, rc.upper, now)
                except RemapUpperMismatch:
                    rc = load_remap(conn, ctx.spec.name)
            descs = _descriptions(conn, ctx, rc)
        upper = uppers[-1] if uppers else remap.last_frontier(rc)
        held = sum(holds_binding(rc, d) for d in descs)
        m.update(upstream_upper=upper.as_dict(), minted_ts=minted.ts if minted else None,
                 descriptions=len(descs), idle_advance=held < len(descs), offsets_known=sum(o for _, o in upper))
        m.update(source.probe_metrics())
        return MintResult(minted, tuple(descs), held)


def check_acknowledged(ctx: CycleContext, conn, rc: RemapCollection, acked) -> None:
    """An error (``AcknowledgedStateLost`` for most kinds: the kind's ``SourceRuntime.acknowledged_beyond``)
    if what resume acknowledged upstream (``acked``: ``SourceRuntime.acknowledged``, read before ``rc`` and
    the shards' uppers, which only grow) is beyond the offset resumption frontier the database holds now:
    the database went back (a failover to an asynchronous standby, a restored backup), and minting would
    stamp records again at new timestamps. Nothing before the first binding counts (upstream may acknowledge
    from its own start, e.g. a replication slot created at or below the first binding), nor before the binding
    the kind's ``SourceRuntime.acknowledged_since`` names (a slot a re-snapshot created)."""
    if acked is None or not rc.bindings:
        return
    resumption = min([rc.upper, *(shard_info(conn, s).upper for s in ctx.shards())])
    since = ctx.source().acknowledged_since(conn)
    start = rc.bindings[0].ts if since is None else since
    ours = remap.source_upper_at(rc, resumption).join(remap.source_upper_at(rc, start + 1))
    if not acked.frontier.less_equal(ours):
        raise ctx.source().acknowledged_beyond(acked, ours, resumption)


def _descriptions(conn, ctx: CycleContext, rc: RemapCollection) -> list[BatchDescription]:
    lower = min(shard_info(conn, s).upper for s in ctx.shards())
    return ctx.source().descriptions(rc, lower)


def write_batches(ctx: CycleContext, desc: BatchDescription) -> WrittenBatch:
    """Write the updates of ``desc`` for every output shard as Parquet parts (nothing visible yet): the
    kind reads exactly the range its bindings cover (``SourceRuntime.write``), and returns only parts an
    accounted write proved.

    Keeps *replayable*: the offsets read and the timestamps given depend only on the durable bindings,
    so a rerun writes the same updates (to fresh paths).

    A Spark Connect session lost meanwhile (the server restarted: its sessions and jobs went with it; or it
    is unreachable and another server stands in, ``reclock.spark.connect.attach_anew``) is dropped and the
    write runs again in a new one, in this step and under its deadline, up to :data:`SESSION_REATTACHES`
    times: nothing of the lost attempt is visible, and a rerun is exact.
    """
    with _step(ctx, "write_batches") as m, ctx.spark_deadline("write_batches"), ctx.writing() as orphans:
        with ctx.connect() as conn:
            rc = load_remap(conn, ctx.spec.name)
        for attempt in itertools.count():
            tried: dict = {}  # an attempt's own statistics (a kind adds to them as it goes)
            try:
                written = ctx.source().write(rc, desc, tried)
            except Exception as e:
                if attempt == SESSION_REATTACHES or not ctx.drop_spark_to_retry(e):
                    raise
                log.warning("source %s: write_batches [%s, %s): the Spark Connect session is gone (%s); "
                            "writing again in a new session", ctx.spec.name, desc.lower, desc.upper,
                            summary(e).message)
                continue
            m.update(tried, **({"session_reattached": attempt} if attempt else {}),
                     **({"orphans_interrupted": orphans.interrupted} if orphans.interrupted else {}))
            return written


SESSION_REATTACHES = 2
"""How many times one ``write_batches`` step writes again in a new Spark Connect session after its session was
lost to a server restart (``reclock.spark.connect.server_restarted``), or to a server that stopped answering
while another stands in (``reclock.spark.connect.attach_anew``; with one server, an unreachable one fails the
step as before, after the client's minute of retries). Before, the step failed and Airflow's retry
ran the whole task again a few seconds later: the fault campaign's longest Airflow stall (issue 37) was
three tries in a row ended that way or killed, then a slow one."""


REBUILD_ATTEMPTS = 3
"""A windowed rebuild whose swap lost to a concurrent change of its window's rows plans and writes again at
most this many times in all."""


def rebuild(ctx: CycleContext, on_slice: Callable[[int, int], None] | None = None,
            window: tuple[int | None, int | None] = (None, None)) -> dict:
    """Re-derive the updates of the bindings at ``window[0] <= ts < window[1]`` (None: unbounded; both: every
    binding) from upstream, with today's decode, and swap them in atomically while cycles go on.

    The window is widened to whole batch rows (``reclock.batch.rebuild_window``: a row's updates are replaced
    whole; bindings at or below the remap collection's since are collapsed into one, so a window reaching
    them starts at 0), clipped to the shards' upper, and taken from 0 to the upper where the kind says its rebuild must be whole
    (``SourceKind.rebuild_whole``: a kind whose later updates retract values the window holds, e.g. an upsert envelope).
    The kind writes it (``SourceRuntime.rewrite``). Keeps
    *replayable*: the same offsets are bound at the same timestamps, so with an unchanged decode the same
    ``(data, ts, diff)`` updates come back; with a fixed decode, a record that landed in ``<source>_errors``
    comes back in the collection at its original timestamp. Appends above the window go on meanwhile
    (``reclock.persist.shards.swap_batches``); compaction of the source's shards waits; a swap that lost to
    another rebuild plans again (:data:`REBUILD_ATTEMPTS`). Raises ``UpstreamDataLost`` if retention ran past
    the window's offsets, ``UnaccountedWrite`` if what Spark wrote cannot be found whole (nothing is swapped
    then). Never mints a binding; ``ConfigError`` for a kind whose upstream keeps no history to replay.
    """
    refused = ctx.kind.rebuild_refused(ctx.spec)
    if refused is not None:
        raise ConfigError(refused)
    name = ctx.spec.name
    with _step(ctx, "rebuild") as m, holding_rebuild_lock(ctx.dsn, name):
        shards = ctx.shards()
        for attempt in range(1, REBUILD_ATTEMPTS + 1):
            with ctx.connect() as conn:
                rc = load_remap(conn, name)
                uppers = {s: shard_info(conn, s).upper for s in shards}
                if len(set(uppers.values())) != 1:
                    raise ShardsDisagree(name, uppers)
                upper = min(uppers.values())
                rows = [(b.lower, b.upper) for s in shards for b in batches(conn, s)]
                lo, hi = (None, None) if ctx.kind.rebuild_whole(ctx.spec) else window
                desc = rebuild_window(rows, rc.since, upper, lo, hi)
                if desc is None:
                    m.update(window=list(window), upper=upper, parts=0)
                    return {"upper": upper, "lower": None, "parts": 0, "records": {}, "window": None}
                old = {s: window_rows(conn, s, desc.lower, desc.upper) for s in shards}
            written = ctx.source().rewrite(rc, desc, m, on_slice)
            with ctx.connect() as conn:
                try:
                    outcome = swap_batches(conn, [Swap(s, old[s], desc, written.parts.get(s, ())) for s in shards])
                finally:
                    release_write(conn, *written.leased)
            if outcome == SWAPPED:
                records = {s: sum(p.rows for p in written.parts.get(s, ())) for s in shards}
                m.update(window=list(window), rebuilt=[desc.lower, desc.upper], upper=upper, attempts=attempt,
                         replaced={s: len(old[s]) for s in shards})
                return {"upper": upper, "lower": desc.lower, "window": [desc.lower, desc.upper],
                        "parts": sum(len(p) for p in written.parts.values()), "records": records}
        raise RebuildConflict(name, desc.lower, desc.upper, REBUILD_ATTEMPTS)


def append(ctx: CycleContext, written: WrittenBatch) -> list:
    """``compare_and_append`` every output shard of the source in ONE transaction.

    Keeps *exactly once*: a replay whose range is already in the shards is a no-op; a partial overlap
    raises ``UpperMismatch`` and changes nothing (the next cycle re-mints from the actual upper).
    """
    with _step(ctx, "append") as m:
        appends = [Append(s, written.desc, written.parts.get(s, ()), written.schemas.get(s, ())) for s in ctx.shards()]
        effects = ctx.source().append_effects(written, m)

        def also(conn) -> None:
            """In the append's transaction: what the kind moves with the shards (an upsert state)."""
            if effects is not None:
                effects(conn)
            failpoint("append:in_transaction")
        with ctx.connect() as conn:
            try:
                outcomes = compare_and_append(conn, appends, also)
            except UpperMismatch:
                release_write(conn, *written.leased)  # our parts became garbage
                raise
            release_write(conn, *written.leased)  # appended, or already present (our parts are garbage)
        for o in outcomes:
            rows = sum(p.rows for p in written.parts.get(o.shard, ()))
            if o.status == APPENDED and rows:
                ctx.added.append(Added(o.shard, written.desc.lower, written.desc.upper, rows))
        m.update(lower=written.desc.lower, upper=written.desc.upper,
                 outcomes=[str(o) for o in outcomes],
                 committed={s: sum(p.rows for p in written.parts.get(s, ())) for s in ctx.shards()})
        return outcomes


@dataclass(frozen=True)
class ResumeResult:
    resumption: int
    offsets: dict[int, int]
    since: int


def resume(ctx: CycleContext) -> ResumeResult:
    """Resumption frontier -> offset resumption frontier -> committed upstream -> compaction.

    Keeps *bounded input reliance*: after it, upstream may drop every offset below the committed
    frontier and no restart will ever need it; compaction respects read holds. Keeps *bounded state*:
    the remap collection is compacted to the new since, each shard's small parts at or below it are
    merged (``reclock.persist.compact``), and at most every ``gc_interval_s`` the blobs no batch references
    are deleted once ``gc_grace_s`` has passed since they were written or replaced, unless a running
    write leases their folder (``reclock.persist.gc``); the same pass prunes statistics and status rows
    older than ``stats_keep_s`` (``reclock.persist.status.prune_history``).
    """
    with _step(ctx, "resume") as m:
        with ctx.connect() as conn:
            rc = load_remap(conn, ctx.spec.name)
            infos = [shard_info(conn, s) for s in ctx.shards()]
        resumption = min([rc.upper, *(i.upper for i in infos)])
        offsets = remap.source_upper_at(rc, resumption)
        ctx.source().commit(offsets)
        failpoint("resume:after_commit")
        # the last complete time stays readable: since may reach resumption - 1, never the upper itself
        target = max(0, resumption - 1)
        if ctx.retain_history_ms:
            target = min(target, max(0, ctx.clock() - ctx.retain_history_ms))
        with ctx.connect() as conn:
            for s in ctx.shards():
                holds = [h.ts for h in read_holds(conn, s)]
                target = min([target, *holds])
            since = target
            if since > rc.since:
                compact_remap(conn, ctx.spec.name, since)
            ctx.source().compact(conn, since)
            for s in ctx.shards():
                advance_since(conn, s, since)
            compacted = {s: compact_parts(conn, ctx.blob, s).parts_merged for s in ctx.shards()}
            if claim_gc(conn, ctx.spec.name, ctx.gc_interval_s):
                # the cycle's parts sit under the source's folder, compaction's under each shard's
                reports = [collect_garbage(conn, ctx.blob, folder, ctx.gc_grace_s)
                           for folder in dict.fromkeys([ctx.spec.name, *ctx.shards()])]
                pruned = prune_history(conn, ctx.stats_keep_s)
                lapsed = drop_lapsed_holds(conn)
                m.update(gc_deleted=sum(r.deleted for r in reports), gc_deleted_bytes=sum(r.deleted_bytes for r in reports),
                         gc_kept=sum(r.referenced + r.kept_young + r.kept_leased + r.kept_read for r in reports),
                         history_pruned=sum(pruned), lapsed_holds=lapsed)
        m.update(resumption=resumption, offsets_committed=offsets.as_dict(), since=since, compacted=compacted)
        return ResumeResult(resumption, offsets.as_dict(), since)


def mint_and_write(ctx: CycleContext, run_s: float | None = None) -> list[WrittenBatch]:
    """mint, then write_batches of the pending descriptions oldest first, starting no further one once
    ``run_s`` seconds have passed (the first is always written): the first task of a two-task run, whose
    parts become visible only when the run's ``append`` task appends them. The descriptions left over are
    minted again by the next run, which writes them first.

    Why a run stops early: a retried run mints again and writes everything from the shards' upper, and a
    failed try leaves a bigger backlog (one more binding) for the next. Without a bound, a try's work grows
    with every try that failed, and once a try takes longer than the time between the faults that kill it,
    no try ever finishes (issue 37: 44 failed tries, 3 runs in 56 minutes of a fault campaign). Bounded, a
    try's work stays about ``run_s`` (or one description), whatever came before it."""
    t0 = time.monotonic()
    with _holding(ctx):
        written: list[WrittenBatch] = []
        for desc in mint(ctx).descriptions:
            if written and run_s is not None and time.monotonic() - t0 >= run_s:
                break
            written.append(write_batches(ctx, desc))
    return written


def mint_and_append(ctx: CycleContext) -> tuple[int | None, int]:
    """mint, then write_batches and append for every description: the binding minted (or None) and how
    many descriptions holding a binding were appended (an idle cycle's advance of the uppers not counted)."""
    with _holding(ctx):
        minted = mint(ctx)
        for desc in minted.descriptions:
            append(ctx, write_batches(ctx, desc))
    return (minted.binding.ts if minted.binding else None), minted.with_bindings


def run_cycle(ctx: CycleContext) -> dict:
    """All four steps in one process (what ``dag.test()`` and the benchmarks run)."""
    with _holding(ctx):
        minted, appended = mint_and_append(ctx)
        res = resume(ctx)
    return {"minted": minted, "descriptions": appended, "resumption": res.resumption, "offsets": res.offsets}
