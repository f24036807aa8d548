"""The ingestion cycle: the four steps one ``ingest__<source>`` DAG run performs.

::

    upstream (Kafka)                          Postgres (consensus)                 blob store
    ----------------                          --------------------                 ----------
          |  probe last stable offsets
          v
    +-----------+  append binding (CAS on remap upper)        "bindings before data"
    |   mint    |------------------------------> remap collection
    +-----------+  descriptions (lower = shard upper, upper = newest binding ts + 1)
          |
          v
    +---------------+  read exactly the bound offset ranges, reclock (range join),
    | write_batches |  decode, route; Parquet parts under fresh paths --------------> parts
    +---------------+  (Spark, all executors; nothing visible yet)
          |
          v
    +-----------+  compare_and_append every output shard       "exactly once":
    |  append   |  in ONE transaction ---------> shard uppers  a replay is a no-op,
    +-----------+                                              a conflict changes nothing
          |
          v
    +-----------+  resumption frontier = meet(remap upper, shard uppers)
    |  resume   |  -> offset resumption frontier (source_upper_at) -> commit to the
    +-----------+  consumer group; compact the remap collection   "bounded input reliance"
                   and the shards' small parts; every so often, delete the parts nothing
                   references (past a grace period; a running write's folder is leased)  "bounded state"

A Postgres source runs the same four steps (DESIGN.md, "The Postgres source"): mint binds the flush LSN,
write_batches decodes the slot's transactions below the bound LSN (``reclock.cdc``: one timestamp per
upstream transaction, the first description also carries the snapshot), append puts every table's shard
in the one ``compare_and_append``, resume advances the replication slot.

Each step is a plain function over a :class:`CycleContext`; DAG tasks only call them. Every step records
statistics and a status row; a step that fails records ``stalled`` with the error and re-raises.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from reclock import cdc, remap
from reclock.batch import (BatchDescription, Part, SliceWritten, mint_descriptions, ranges_for, rebuild_window,
                           split_ranges)
from reclock.config import SourceSpec, parse_pg_table, pg_table_shard
from reclock.errors import (ConfigError, DecodeError, RebuildConflict, RemapUpperMismatch, ShardsDisagree,
                            UpperMismatch)
from reclock.explain import summary
from reclock.failpoints import failpoint
from reclock.lending import ConnectionLender
from reclock.part_layout import DATA_KIND, DATA_OUTPUT, ERRORS_KIND, ERRORS_OUTPUT, INTERNAL_PREFIX
from reclock.persist import blob as blobs
from reclock.persist import connect
from reclock.persist.compact import compact_parts
from reclock.persist.gc import claim_gc, collect_garbage, lease_write, release_write
from reclock.persist.remap_store import append_binding, compact_remap, load_remap, register_source
from reclock.persist.shards import (APPENDED, SWAPPED, Append, Swap, advance_since, batches, compare_and_append,
                                    drop_lapsed_holds, holding_rebuild_lock, read_holds, register_shard, shard_info,
                                    swap_batches, window_rows)
from reclock.persist.source_tables import register_tables, registered_tables, replace_tables, snapshot_ts
from reclock.persist.staged import collect_parts, first_rejected, read_state_changes, slice_folder
from reclock.persist.status import prune_history, record_statistics, record_status
from reclock.persist.upsert_state import apply_changes, load_prior
from reclock.read import read_as_of
from reclock.remap import RemapCollection
from reclock.sources.kafka import KafkaUpstream
from reclock.sources.postgres import LSN_PARTITION, PostgresUpstream, lsn_frontier
from reclock.spark import snapshot as spark_snapshot
from reclock.spark.ingest import BindingRange, upsert_keys, write_slice


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class CycleContext:
    """Everything a step needs: the source's spec and where its upstream, consensus and blobs live."""

    spec: SourceSpec
    dsn: str
    bootstrap: str
    blob: blobs.BlobStore
    spark_factory: Callable[[], object] | None = None
    clock: Callable[[], int] = now_ms
    retain_history_ms: int = 0
    gc_grace_s: float = 3600.0  # unreferenced parts younger than this (since written or replaced) are kept
    gc_interval_s: float = 300.0  # resume collects the source's garbage at most this often
    stats_keep_s: float = 7 * 86400.0  # statistics and status rows older than this go with that collection
    upstream_dsn: str | None = None  # a Postgres source's upstream database
    # writes a description's one append-only slice in a Spark job shared with other sources (a continuous
    # group's ``reclock.continuous.JointWriter``): (ctx, ranges, bindings, folder) -> (SliceWritten, how
    # many sources the job wrote), or None when this one must run its own job
    joint_writer: Callable[..., tuple[SliceWritten, int] | None] | None = None
    run_id: str | None = None  # the Airflow run the steps belong to (status rows name it)
    # what the context's appends added, per append that added updates (what an Airflow task reports as asset
    # events: downstream work runs only when data moved, and reads exactly the new range)
    added: list[Added] = field(default_factory=list, init=False, repr=False, compare=False)
    _upstream: KafkaUpstream | PostgresUpstream | None = field(default=None, init=False, repr=False, compare=False)
    _outputs: tuple[cdc.Output, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _spark: object | None = field(default=None, init=False, repr=False, compare=False)
    connections: ConnectionLender = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.connections = ConnectionLender(lambda: connect(self.dsn))

    def upstream(self):
        """The source's upstream (``KafkaUpstream`` or ``PostgresUpstream``); one per context, so a cycle's
        probes share one connected admin client."""
        if self._upstream is None:
            if self.spec.postgres is not None:
                if not self.upstream_dsn:
                    raise ConfigError(f"source {self.spec.name}: this cycle context has no upstream_dsn")
                self._upstream = PostgresUpstream(self.spec.name, self.upstream_dsn, self.spec.postgres.publication)
            else:
                self._upstream = KafkaUpstream(self.spec.name, self.bootstrap, self.spec.kafka.topic)
        return self._upstream

    def outputs(self) -> tuple[cdc.Output, ...]:
        """A Postgres source's tables and their shards, as registered at its first cycle."""
        if self._outputs is None:
            with self.connect() as conn:
                tables = registered_tables(conn, self.spec.name)
            if tables is None:
                raise ConfigError(f"source {self.spec.name}: no tables registered yet (run mint first)")
            self._outputs = tuple(cdc.Output(t, pg_table_shard(self.spec.name, t.table)) for t in tables)
        return self._outputs

    def shards(self) -> tuple[str, ...]:
        """Every output shard of the source: the config's, or a Postgres source's registered tables' and its
        error collection."""
        if self.spec.postgres is None:
            return self.spec.shards
        return (*(o.shard for o in self.outputs()), self.spec.errors_shard)

    def spark(self):
        """The context's Spark session, made by ``spark_factory`` once: a task writing several descriptions
        attaches to Spark Connect (a probe and a setting, two round trips) once, not per description."""
        if self._spark is None:
            if self.spark_factory is None:
                raise ValueError(f"source {self.spec.name}: this cycle context has no spark_factory")
            self._spark = self.spark_factory()
        return self._spark

    def connect(self):
        """A consensus connection (autocommit): while a step is under way in this thread, the one the step
        holds (``reclock.lending``); else a new one."""
        return self.connections.connect()


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
    binding: remap.Binding | None  # the binding this cycle minted, if upstream moved
    descriptions: tuple[BatchDescription, ...]  # what write_batches must write, in order


@dataclass(frozen=True)
class WrittenBatch:
    """The parts one description produced, per shard."""

    desc: BatchDescription
    parts: dict[str, tuple[Part, ...]] = field(default_factory=dict)
    state: tuple[Part, ...] = ()  # upsert: the state changes append applies with the shards
    prefix: str | None = None  # the folder the parts were written under, leased until append is done


@contextlib.contextmanager
def _holding(ctx: CycleContext) -> Iterator[None]:
    """One consensus connection, and for a Postgres source one upstream session, for every step run inside
    (``reclock.lending``, :meth:`~reclock.sources.postgres.PostgresUpstream.holding`): a step holds
    them, and so do :func:`mint_and_append` and :func:`run_cycle` for the steps they run."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(ctx.connections.holding())
        if ctx.spec.postgres is not None:
            stack.enter_context(ctx.upstream().holding())
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
    """Create the source's remap collection, progress view and output shards if they do not exist."""
    if ctx.spec.postgres is not None:
        _register_postgres(ctx)
        return
    with ctx.connect() as conn:
        register_source(conn, ctx.spec.name, kind="kafka")
        register_shard(conn, ctx.spec.data_shard, source=ctx.spec.name, output=DATA_OUTPUT, kind=DATA_KIND)
        register_shard(conn, ctx.spec.errors_shard, source=ctx.spec.name, output=ERRORS_OUTPUT, kind=ERRORS_KIND)


def _register_postgres(ctx: CycleContext) -> None:
    """Register a Postgres source: its tables (oids and columns, once; ``reclock.persist.source_tables``),
    a shard per table (``<source>__<table>``, outputs 0, 2, 3, ...) and its error collection (output 1).
    Every cycle checks the tables are still published with ``REPLICA IDENTITY FULL``. The slot is created
    here while the source has no binding, so the first binding's LSN is at or after the slot's start."""
    name = ctx.spec.name
    up = ctx.upstream()
    with ctx.connect() as conn:
        register_source(conn, name, kind="postgres")
        tables = registered_tables(conn, name)
        bound = bool(load_remap(conn, name).bindings)
    with up.session() as uconn:
        if tables is None:
            infos = _describe_tables(ctx, uconn)
            with ctx.connect() as conn:
                tables = register_tables(conn, name, infos)
        else:
            up.check_tables(uconn, tables)
        if not bound:
            up.ensure_slot(uconn)
    with ctx.connect() as conn:
        for i, t in enumerate(tables):
            register_shard(conn, pg_table_shard(name, t.table), source=name, output=0 if i == 0 else i + 1,
                           kind=DATA_KIND)
        register_shard(conn, ctx.spec.errors_shard, source=name, output=ERRORS_OUTPUT, kind=ERRORS_KIND)


def _describe_tables(ctx: CycleContext, uconn) -> list:
    """The tables a Postgres source takes (its ``tables:``, else every table of its publication), described
    upstream (published, identity FULL) and checked for column names a collection keeps for its own."""
    up, name = ctx.upstream(), ctx.spec.name
    names = ctx.spec.postgres.tables or [parse_pg_table(name, t) for t in up.published_tables(uconn)]
    infos = up.describe(uconn, names)
    for info in infos:
        taken = [c for c, _, _ in info.columns if c in ("ts", "diff") or c.startswith(INTERNAL_PREFIX)]
        if taken:
            raise ConfigError(f"source {name}: table {info.table} has column(s) {', '.join(taken)}, names "
                              "a collection keeps for its own (ts, diff, _reclock_*); rename the column(s) "
                              "upstream, or leave the table out of `tables:`")
    return infos


def resnapshot(ctx: CycleContext) -> dict:
    """Start a Postgres source over from a fresh snapshot at a new binding, after a stall (TRUNCATE, DDL,
    a lost slot): the tables are described again (their new columns), the slot is dropped and created
    anew, and a binding at a new timestamp (never in the past) is appended with the new registration in
    one transaction. The next cycle's write retracts what each collection held and writes the snapshot,
    both at that binding's timestamp, and streams from its LSN on; the bindings between the stall and it
    add nothing of their own (their changes land at once, in the snapshot). A table new to the source
    gets a collection that is empty before it. Readers and sinks see one more timestamp, as for any
    cycle; history before it stays readable as it was.
    """
    if ctx.spec.postgres is None:
        raise ConfigError(f"source {ctx.spec.name}: only a Postgres source is re-snapshotted")
    with _step(ctx, "resnapshot") as m:
        name, up = ctx.spec.name, ctx.upstream()
        with ctx.connect() as conn:
            if registered_tables(conn, name) is None:
                raise ConfigError(f"source {name}: it has not run yet; its first cycle takes the snapshot")
            uppers = {s: shard_info(conn, s).upper for s in ctx.shards()}
        if len(set(uppers.values())) != 1:
            raise ShardsDisagree(name, uppers)
        upper = min(uppers.values())
        with up.session() as uconn:
            infos = _describe_tables(ctx, uconn)
            up.drop_slot(uconn)
            up.ensure_slot(uconn)
            lsn = up.flush_lsn(uconn)
        with ctx.connect() as conn, conn.transaction():
            rc = load_remap(conn, name)
            binding = remap.Binding(remap.next_binding_ts(rc, ctx.clock()),
                                    remap.last_frontier(rc).join(lsn_frontier(lsn)))
            append_binding(conn, name, rc.upper, binding)
            replace_tables(conn, name, infos, binding.ts)
            shards = [pg_table_shard(name, t.table) for t in infos]
            for i, shard in enumerate(shards):
                register_shard(conn, shard, source=name, output=0 if i == 0 else i + 1, kind=DATA_KIND)
            fresh = [s for s in shards if s not in uppers and shard_info(conn, s).upper == 0]
            if upper > 0 and fresh:  # a new table's collection: empty before the re-snapshot
                compare_and_append(conn, [Append(s, BatchDescription(0, upper)) for s in fresh])
        ctx._outputs = None
        m.update(binding_ts=binding.ts, lsn=lsn, tables=[t.table for t in infos], shards_upper=upper)
        return {"ts": binding.ts, "lsn": lsn, "tables": [t.table for t in infos]}


def mint(ctx: CycleContext) -> MintResult:
    """Probe upstream, append a binding if it moved, mint descriptions for the output shards.

    Keeps *definite*: a binding is appended with compare-and-set on the remap upper at
    ``max(now, last + 1)``, never in the past; two concurrent minters cannot both succeed.
    """
    with _step(ctx, "mint") as m, ThreadPoolExecutor(1, "reclock-probe") as pool:
        if ctx.spec.postgres is not None:
            ensure_registered(ctx)  # the slot first: the flush LSN probed after it is covered by it
            upper = ctx.upstream().probe_upper()
        else:
            probe = pool.submit(ctx.upstream().probe_upper)  # Kafka's round trips beside Postgres's
            ensure_registered(ctx)
            upper = probe.result()
        minted = None
        with ctx.connect() as conn:
            rc = load_remap(conn, ctx.spec.name)
            binding = remap.mint(rc, ctx.clock(), upper)
            if binding is not None:
                try:
                    rc = append_binding(conn, ctx.spec.name, rc.upper, binding)
                    minted = binding
                except RemapUpperMismatch:
                    # another cycle minted first: its binding serves us too
                    rc = load_remap(conn, ctx.spec.name)
            failpoint("mint:after_binding")
            descs = _descriptions(conn, ctx, rc)
        m.update(upstream_upper=upper.as_dict(), minted_ts=minted.ts if minted else None,
                 descriptions=len(descs), offsets_known=sum(o for _, o in upper))
        return MintResult(minted, tuple(descs))


def _descriptions(conn, ctx: CycleContext, rc: RemapCollection) -> list[BatchDescription]:
    lower = min(shard_info(conn, s).upper for s in ctx.shards())
    if ctx.spec.postgres is not None:
        # LSN distances are WAL bytes, not changes: one description, its memory bounded by the part size
        return mint_descriptions(lower, rc, 2**62)
    descs = mint_descriptions(lower, rc, ctx.spec.budget.max_records)
    # upsert: a description's retractions read the state as of its lower, which only its predecessor's
    # append produces, so a cycle writes one description (the backlog takes one cycle per budget)
    return descs[:1] if ctx.spec.envelope == "upsert" else descs


def write_batches(ctx: CycleContext, desc: BatchDescription) -> WrittenBatch:
    """Write the updates of ``desc`` for every output shard as Parquet parts (nothing visible yet).

    Keeps *replayable*: the offsets read and the timestamps given depend only on the durable bindings,
    so a rerun writes the same updates (to fresh paths).
    """
    with _step(ctx, "write_batches") as m:
        with ctx.connect() as conn:
            rc = load_remap(conn, ctx.spec.name)
            if ctx.spec.envelope == "upsert" and shard_info(conn, ctx.spec.data_shard).upper >= desc.upper:
                m.update(lower=desc.lower, upper=desc.upper, already_present=True)
                return WrittenBatch(desc)  # a replay: the state has moved on, and append is a no-op
        if ctx.spec.postgres is not None:
            return _write_postgres(ctx, rc, desc, m)
        written = _write(ctx, rc, desc, m)
        if ctx.spec.on_decode_error == "stall" and written.parts.get(ctx.spec.errors_shard):
            # refuse the whole description (nothing is appended) naming the first record that failed; the
            # source stays stalled until the record or the config changes
            first = first_rejected(ctx.blob, written.parts[ctx.spec.errors_shard])
            if first is not None:
                partition, offset, reason = first
                raise DecodeError(ctx.spec.name, partition, offset, f"{reason} (on_decode_error: stall)")
        return written


def _write(ctx: CycleContext, rc: RemapCollection, desc: BatchDescription, m: dict,
           on_slice: Callable[[int, int], None] | None = None, rebuilding: bool = False) -> WrittenBatch:
    """Read the ranges the bindings in ``desc`` cover, one Spark job per budget slice, and collect the
    parts, each slice proved to hold what its job read (``reclock.persist.staged``: else
    ``UnaccountedWrite``, and nothing is appended); ``on_slice(done, total)`` after each job (the
    progress of a long rebuild).

    Upsert: one job for the whole description (a key's records must meet in one job), with the state rows
    of the keys it touches as of ``desc.lower`` (none when rebuilding from 0)."""
    ranges = ranges_for(rc, desc)
    if ranges:
        ctx.upstream().check_retained(
            remap.source_upper_at(rc, desc.lower), remap.source_upper_at(rc, desc.upper))
    bindings = [BindingRange(r.partition, s, e, ts) for r in ranges
                for (s, e, ts) in remap.reclock_ranges(rc, r.partition)
                if s < r.end and e > r.start and desc.lower <= ts < desc.upper]
    prefix = f"{ctx.spec.name}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}"
    upsert = ctx.spec.envelope == "upsert"
    if not ranges:
        slices = []
    elif upsert:
        slices = [ranges]
    else:
        slices = split_ranges(ranges, ctx.spec.budget.max_records)
    spark = ctx.spark() if slices else None
    prior: list[tuple] = []
    if upsert and slices and not rebuilding:
        keys = upsert_keys(spark, ctx.spec, ctx.bootstrap, ranges)
        with ctx.connect() as conn:
            prior = load_prior(conn, ctx.spec.name, ctx.spec.data_shard, desc.lower, keys)
        m.update(keys=len(keys), prior_keys=len(prior))
    if not slices:
        m.update(lower=desc.lower, upper=desc.upper, slices=0, offsets=0, records_read=0)
        return WrittenBatch(desc)
    with ctx.connect() as conn:
        lease_write(conn, ctx.spec.name, prefix)  # garbage collection leaves the folder alone until append
    try:
        failpoint("write_batches:before_job")
        written: list[SliceWritten] = []
        joinable = ctx.joint_writer is not None and len(slices) == 1 and not upsert and not rebuilding
        joint = ctx.joint_writer(ctx, slices[0], bindings, slice_folder(prefix, 0)) if joinable else None
        if joint is not None:
            written.append(joint[0])
            m.update(joint_sources=joint[1])
            failpoint("write_batches:after_slice")
        first = 1 if joinable else 0  # a joint job that failed may have left files in slice 0's folder
        for i, sl in enumerate(slices if joint is None else (), start=first):
            written.append(write_slice(spark, ctx.spec, ctx.bootstrap, sl, bindings,
                                       ctx.blob.url(slice_folder(prefix, i)), prior, index=i))
            with ctx.connect() as conn:
                lease_write(conn, ctx.spec.name, prefix)  # renewed: a long rebuild keeps its first slices
            if on_slice is not None:
                on_slice(i + 1 - first, len(slices))
            failpoint("write_batches:after_slice")
        shards = {DATA_OUTPUT: ctx.spec.data_shard, ERRORS_OUTPUT: ctx.spec.errors_shard}
        parts, state = collect_parts(ctx.blob, ctx.spec.name, shards, prefix, written, upsert)
    except BaseException:
        with contextlib.suppress(Exception), ctx.connect() as conn:
            release_write(conn, prefix)  # what it wrote is garbage (an unreleased lease expires anyway)
        raise
    m.update(lower=desc.lower, upper=desc.upper, slices=len(slices),
             offsets=sum(r.end - r.start for r in ranges),
             records_read=sum(w.records_read for w in written),
             records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
             bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
    return WrittenBatch(desc, parts, state, prefix)


def _write_postgres(ctx: CycleContext, rc: RemapCollection, desc: BatchDescription, m: dict) -> WrittenBatch:
    """The transactions the bindings in ``desc`` cover, and the snapshot if ``desc`` holds the snapshot's
    binding (the first, or a re-snapshot's), as parts per table (``reclock.cdc``; the upstream's
    ``reclock.sources.postgres``).

    A racing cycle cannot make this write append less than it should: the slot is advanced only to the
    resumption frontier, after an append, so a transaction the peek skips (committed below the slot's
    ``confirmed_flush``) is bound at a time below every shard's upper; a description that needed it has
    its ``lower`` below that upper, and its append is then a no-op or an ``UpperMismatch``, never an append.
    """
    up: PostgresUpstream = ctx.upstream()
    outputs = ctx.outputs()
    start = remap.source_upper_at(rc, desc.lower).get(LSN_PARTITION)
    end = remap.source_upper_at(rc, desc.upper).get(LSN_PARTITION)
    bindings = [(b.ts, b.frontier.get(LSN_PARTITION)) for b in rc.bindings]
    with ctx.connect() as conn:
        snap_ts = snapshot_ts(conn, ctx.spec.name)
    if snap_ts is None and start == 0:
        snap_ts = bindings[0][0]  # no data written yet: this description holds the first binding
    snapshot = snap_ts is not None and desc.lower <= snap_ts < desc.upper
    chunk = ctx.spec.budget.max_records
    prefix = f"{ctx.spec.name}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}"
    with ctx.connect() as conn:
        lease_write(conn, ctx.spec.name, prefix)
    try:
        failpoint("write_batches:before_job")
        writer = cdc.PartWriter(ctx.blob, prefix, outputs, chunk)
        rewind, snapshot_rows, upto, spark_done = None, 0, end, set()
        with up.session() as uconn:
            if snapshot:
                t1, l1 = next((ts, lsn) for ts, lsn in bindings if ts == snap_ts)
                start = l1
                if desc.lower > 0:  # a re-snapshot: take back what each collection holds, at t1
                    with ctx.connect() as conn:
                        for out in outputs:
                            if shard_info(conn, out.shard).upper > 0:
                                writer.retract(out.info.relid, read_as_of(conn, ctx.blob, out.shard,
                                                                          desc.lower - 1), t1)
                with up.export_snapshot() as snap:
                    up.check_retained(uconn, min(l1, snap.lsn))
                    with up.snapshot_reader(snap) as sconn:
                        on_spark = _snapshot_on_spark(ctx, sconn, outputs)
                        for out, predicates in on_spark:
                            snapshot_rows += _spark_snapshot(ctx, sconn, snap.name, out, predicates, writer, t1,
                                                             prefix)
                        spark_done = {out.shard for out, _ in on_spark}
                        snapshot_rows += cdc.read_snapshot(sconn, [o for o in outputs if o.shard not in spark_done],
                                                           writer, t1, chunk)
                if snap.lsn != l1:
                    rewind = cdc.Rewind(t1, min(l1, snap.lsn), max(l1, snap.lsn), -1 if snap.lsn > l1 else 1)
                    upto = max(upto, snap.lsn)
                m.update(snapshot_rows=snapshot_rows, snapshot_lsn=snap.lsn, first_lsn=l1,
                         snapshot_on_spark=sorted(spark_done))
            else:
                up.check_retained(uconn, start)
            decoder = cdc.ChangeDecoder(ctx.spec.name, outputs, writer, bindings, start, end, rewind,
                                        strict_tables=not ctx.spec.postgres.tables)
            # the peek's cursor lives in a transaction; the blocks are closed (the helper thread joined) before
            # it ends, also when the decoder stops early
            with uconn.transaction(force_rollback=True), contextlib.closing(
                    up.read_blocks(uconn, upto, batch=max(1, min(chunk, 10_000)))) as blocks:
                stats = decoder.feed_blocks(blocks)
        failpoint("write_batches:after_slice")
        emitted = writer.close()
        parts = cdc.collect(ctx.blob, ctx.spec.name, prefix, emitted, sorted(spark_done))
    except BaseException:
        with contextlib.suppress(Exception), ctx.connect() as conn:
            release_write(conn, prefix)
        raise
    parts[ctx.spec.errors_shard] = ()
    m.update(lower=desc.lower, upper=desc.upper, lsn_from=start, lsn_until=end, transactions=stats.transactions,
             changes=stats.changes, messages=stats.messages, records_read=snapshot_rows + stats.changes,
             records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
             bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
    return WrittenBatch(desc, parts, (), prefix)


def _snapshot_on_spark(ctx: CycleContext, sconn, outputs: Sequence[cdc.Output]) -> list[tuple[cdc.Output, list]]:
    """The tables whose snapshot Spark reads, with their partitions' predicates: those of at least the
    source's ``spark_snapshot_min_bytes`` whose columns Spark converts exactly, when the context has Spark."""
    least = ctx.spec.postgres.spark_snapshot_min_bytes
    if least is None or ctx.spark_factory is None:
        return []
    chosen = []
    for out in outputs:
        size, pages, block = PostgresUpstream.table_size(sconn, out.info.relid)
        if size >= least and spark_snapshot.convertible(out.info):
            chosen.append((out, spark_snapshot.partition_predicates(pages, spark_snapshot.SPLIT_BYTES // block)))
    return chosen


def _spark_snapshot(ctx: CycleContext, sconn, snapshot: str, out: cdc.Output, predicates: Sequence[str],
                    writer: cdc.PartWriter, ts: int, prefix: str) -> int:
    """One table's snapshot written by Spark into the write's folder (``reclock.spark.snapshot``), while
    ``sconn`` holds the exported ``snapshot`` open; its rows (``count(*)`` under the same snapshot) counted
    into ``writer``, so that ``reclock.cdc.collect`` proves the parts hold exactly them."""
    rows = PostgresUpstream.count_rows(sconn, out.info.table)
    spark_snapshot.write_table_snapshot(ctx.spark(), spark_snapshot.jdbc_target(ctx.upstream_dsn), snapshot, out.info,
                                        ts, ctx.blob.url(f"{prefix}/{out.shard}/{cdc.SPARK_SNAPSHOT}"), predicates)
    writer.add_written(out.info.relid, rows)
    failpoint("write_batches:after_spark_snapshot")
    return rows


REBUILD_ATTEMPTS = 3
"""A windowed rebuild whose swap lost to a concurrent change of its window's rows plans and writes again at
most this many times in all."""


def rebuild(ctx: CycleContext, on_slice: Callable[[int, int], None] | None = None,
            window: tuple[int | None, int | None] = (None, None)) -> dict:
    """Re-derive the updates of the bindings at ``window[0] <= ts < window[1]`` (None: unbounded; both: every
    binding) from upstream, with today's decode, and swap them in atomically while cycles go on.

    The window is widened to whole batch rows (``reclock.batch.rebuild_window``: a row's updates are replaced
    whole; bindings at or below the remap collection's since are collapsed into one, so a window reaching
    them starts at 0), clipped to the shards' upper, and for an upsert source taken from 0 to the upper (its
    later updates retract values the window holds, and the state before the window is not kept). Keeps
    *replayable*: the same offsets are bound at the same timestamps, so with an unchanged decode the same
    ``(data, ts, diff)`` updates come back; with a fixed decode, a record that landed in ``<source>_errors``
    comes back in the collection at its original timestamp. Appends above the window go on meanwhile
    (``reclock.persist.shards.swap_batches``); compaction of the source's shards waits; a swap that lost to
    another rebuild plans again (:data:`REBUILD_ATTEMPTS`). Raises ``UpstreamDataLost`` if retention ran past
    the window's offsets, ``UnaccountedWrite`` if what Spark wrote cannot be found whole (nothing is swapped
    then). Never mints a binding.
    """
    if ctx.spec.postgres is not None:
        raise ConfigError(f"source {ctx.spec.name}: a Postgres upstream keeps no history to replay; rebuilding "
                          "means a fresh snapshot at a new binding (`reclock resnapshot`), never timestamps in "
                          "the past")
    name, shards = ctx.spec.name, ctx.spec.shards
    with _step(ctx, "rebuild") as m, holding_rebuild_lock(ctx.dsn, name):
        for attempt in range(1, REBUILD_ATTEMPTS + 1):
            with ctx.connect() as conn:
                rc = load_remap(conn, name)
                uppers = {s: shard_info(conn, s).upper for s in shards}
                if len(set(uppers.values())) != 1:
                    raise ShardsDisagree(name, uppers)
                upper = min(uppers.values())
                rows = [(b.lower, b.upper) for s in shards for b in batches(conn, s)]
                lo, hi = (None, None) if ctx.spec.envelope == "upsert" else window
                desc = rebuild_window(rows, rc.since, upper, lo, hi)
                if desc is None:
                    m.update(window=list(window), upper=upper, parts=0)
                    return {"upper": upper, "lower": None, "parts": 0, "records": {}, "window": None}
                old = {s: window_rows(conn, s, desc.lower, desc.upper) for s in shards}
            written = _write(ctx, rc, desc, m, on_slice, rebuilding=True)
            with ctx.connect() as conn:
                try:
                    outcome = swap_batches(conn, [Swap(s, old[s], desc, written.parts.get(s, ())) for s in shards])
                finally:
                    if written.prefix is not None:
                        release_write(conn, written.prefix)
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
        appends = [Append(s, written.desc, written.parts.get(s, ())) for s in ctx.shards()]
        changes = read_state_changes(ctx.blob, written.state) if ctx.spec.envelope == "upsert" else None
        if changes is not None:
            m.update(state_changes=changes.num_rows)

        def also(conn) -> None:
            """In the append's transaction: the upsert state moves with the shards."""
            if changes is not None:
                apply_changes(conn, ctx.spec.name, changes)
            failpoint("append:in_transaction")
        with ctx.connect() as conn:
            try:
                outcomes = compare_and_append(conn, appends, also)
            except UpperMismatch:
                _release(conn, written)  # our parts became garbage
                raise
            _release(conn, written)  # appended, or already present (our parts are garbage)
        for o in outcomes:
            rows = sum(p.rows for p in written.parts.get(o.shard, ()))
            if o.status == APPENDED and rows:
                ctx.added.append(Added(o.shard, written.desc.lower, written.desc.upper, rows))
        m.update(lower=written.desc.lower, upper=written.desc.upper,
                 outcomes=[str(o) for o in outcomes],
                 committed={s: sum(p.rows for p in written.parts.get(s, ())) for s in ctx.shards()})
        return outcomes


def _release(conn, written: WrittenBatch) -> None:
    if written.prefix is not None:
        release_write(conn, written.prefix)


@dataclass(frozen=True)
class ResumeResult:
    resumption: int
    offsets: dict[int, int]
    since: int


def resume(ctx: CycleContext) -> ResumeResult:
    """Resumption frontier -> offset resumption frontier -> consumer-group commit -> compaction.

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
        ctx.upstream().commit(ctx.spec.consumer_group, offsets)
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


def mint_and_append(ctx: CycleContext) -> tuple[int | None, int]:
    """mint, then write_batches and append for every description: the binding minted (or None) and how
    many descriptions were appended."""
    with _holding(ctx):
        minted = mint(ctx)
        for desc in minted.descriptions:
            append(ctx, write_batches(ctx, desc))
    return (minted.binding.ts if minted.binding else None), len(minted.descriptions)


def run_cycle(ctx: CycleContext) -> dict:
    """All four steps in one process (what ``dag.test()`` and the benchmarks run)."""
    with _holding(ctx):
        minted, appended = mint_and_append(ctx)
        res = resume(ctx)
    return {"minted": minted, "descriptions": appended, "resumption": res.resumption, "offsets": res.offsets}
