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

Each step is a plain function over a :class:`CycleContext`; DAG tasks only call them. Every step records
statistics and a status row; a step that fails records ``stalled`` with the error and re-raises.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator

from psycopg.pq import TransactionStatus

from reclock import remap
from reclock.batch import BatchDescription, Part, mint_descriptions, ranges_for, split_ranges
from reclock.config import SourceSpec
from reclock.persist import blob as blobs
from reclock.persist import connect
from reclock.persist.remap_store import append_binding, compact_remap, load_remap, register_source
from reclock.persist.shards import Append, compare_and_append, register_shard, shard_info, advance_since, read_holds
from reclock.persist.status import record_statistics, record_status
from reclock.remap import RemapCollection
from reclock.sources.kafka import KafkaUpstream
from reclock.errors import RemapUpperMismatch
from reclock.failpoints import failpoint


REUSE_IDLE_S = 10.0
"""How long a step's connection may sit idle and still be lent again (see :class:`_StepConnection`)."""


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
    _upstream: KafkaUpstream | None = field(default=None, init=False, repr=False, compare=False)
    _spark: object | None = field(default=None, init=False, repr=False, compare=False)
    _local: threading.local = field(default_factory=threading.local, init=False, repr=False, compare=False)

    def upstream(self) -> KafkaUpstream:
        """The source's upstream; one per context, so a cycle's probes share one connected admin client."""
        if self._upstream is None:
            self._upstream = KafkaUpstream(self.spec.name, self.bootstrap, self.spec.kafka.topic)
        return self._upstream

    def spark(self):
        """The context's Spark session, made by ``spark_factory`` once: a task writing several descriptions
        attaches to Spark Connect (a probe and a setting, two round trips) once, not per description."""
        if self._spark is None:
            if self.spark_factory is None:
                raise ValueError(f"source {self.spec.name}: this cycle context has no spark_factory")
            self._spark = self.spark_factory()
        return self._spark

    @contextlib.contextmanager
    def connect(self) -> Iterator:
        """A consensus connection (autocommit): while a step is under way in this thread, the step's own
        (:class:`_StepConnection`; threads sharing a context never share one); else a new one."""
        held = getattr(self._local, "held", None)
        if held is not None:
            with held.lend() as conn:
                yield conn
            return
        with connect(self.dsn) as conn:
            yield conn

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """Let :meth:`connect` lend one connection in this thread until the block ends, then close it."""
        if getattr(self._local, "held", None) is not None:
            yield  # a step inside a step: the outer one's connection serves both
            return
        held = self._local.held = _StepConnection(self.dsn)
        try:
            yield
        finally:
            self._local.held = None
            held.close()


class _StepConnection:
    """The one connection a step lends to every ``ctx.connect()`` in it (a connection costs ~6 ms; a cycle
    used to open a dozen). Opened at the first loan. Replaced when it broke, or when it sat idle over
    :data:`REUSE_IDLE_S` with nobody holding it (a proxy or a timeout may have cut it). A loan asked while a
    caller's transaction is open on it gets a new connection of its own: it never joins that transaction."""

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


@contextlib.contextmanager
def _step(ctx: CycleContext, step: str) -> Iterator[dict]:
    """Record ``running`` and statistics around a step; on failure record ``stalled`` with the cause."""
    metrics: dict = {}
    t0 = time.monotonic()
    with ctx._holding():
        try:
            yield metrics
        except Exception as e:
            with ctx.connect() as conn:
                record_status(conn, ctx.spec.name, "stalled", error=f"{step}: {e}")
            raise
        metrics["seconds"] = round(time.monotonic() - t0, 3)
        with ctx.connect() as conn:
            with conn.transaction():
                record_statistics(conn, ctx.spec.name, step, metrics)
                record_status(conn, ctx.spec.name, "running")


def ensure_registered(ctx: CycleContext) -> None:
    """Create the source's remap collection, progress view and output shards if they do not exist."""
    with ctx.connect() as conn:
        register_source(conn, ctx.spec.name, kind="kafka")
        for output, shard in enumerate(ctx.spec.shards):
            register_shard(conn, shard, source=ctx.spec.name, output=output)


def mint(ctx: CycleContext) -> MintResult:
    """Probe upstream, append a binding if it moved, mint descriptions for the output shards.

    Keeps *definite*: a binding is appended with compare-and-set on the remap upper at
    ``max(now, last + 1)``, never in the past; two concurrent minters cannot both succeed.
    """
    with _step(ctx, "mint") as m, ThreadPoolExecutor(1, "reclock-probe") as pool:
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
    lower = min(shard_info(conn, s).upper for s in ctx.spec.shards)
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
        written = _write(ctx, rc, desc, m)
        if ctx.spec.on_decode_error == "stall" and written.parts.get(ctx.spec.errors_shard):
            _stall_on_first_error(ctx, written.parts[ctx.spec.errors_shard])
        return written


def _write(ctx: CycleContext, rc: RemapCollection, desc: BatchDescription, m: dict,
           on_slice: Callable[[int, int], None] | None = None, rebuilding: bool = False) -> WrittenBatch:
    """Read the ranges the bindings in ``desc`` cover, one Spark job per budget slice, and collect the
    parts (``on_slice(done, total)`` after each job: the progress of a long rebuild).

    Upsert: one job for the whole description (a key's records must meet in one job), with the state rows
    of the keys it touches as of ``desc.lower`` (none when rebuilding from 0)."""
    from reclock.spark.ingest import BindingRange, upsert_keys, write_slice

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
        from reclock.persist.upsert_state import load_prior

        keys = upsert_keys(spark, ctx.spec, ctx.bootstrap, ranges)
        with ctx.connect() as conn:
            prior = load_prior(conn, ctx.spec.name, ctx.spec.data_shard, desc.lower, keys)
        m.update(keys=len(keys), prior_keys=len(prior))
    failpoint("write_batches:before_job")
    for i, sl in enumerate(slices):
        write_slice(spark, ctx.spec, ctx.bootstrap, sl, bindings, ctx.blob.url(f"{prefix}/slice-{i:04d}"), prior)
        if on_slice is not None:
            on_slice(i + 1, len(slices))
        failpoint("write_batches:after_slice")
    parts, state = _collect_parts(ctx, prefix)
    m.update(lower=desc.lower, upper=desc.upper, slices=len(slices),
             offsets=sum(r.end - r.start for r in ranges),
             records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
             bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
    return WrittenBatch(desc, parts, state)


def rebuild(ctx: CycleContext, on_slice: Callable[[int, int], None] | None = None) -> dict:
    """Rebuild the source's shards from the recorded bindings (while upstream still holds the data) and
    swap them in atomically: the same ``(data, ts, diff)`` updates at the same timestamps (*replayable*),
    at every time at or after the shards' since. Raises ``UpstreamDataLost`` if retention ran past them.
    """
    with _step(ctx, "rebuild") as m:
        with ctx.connect() as conn:
            rc = load_remap(conn, ctx.spec.name)
            uppers = {s: shard_info(conn, s).upper for s in ctx.spec.shards}
        upper = min(uppers.values())
        if len(set(uppers.values())) != 1:
            raise ValueError(f"source {ctx.spec.name}: its shards' uppers differ ({uppers}); run a cycle first")
        if upper == 0:
            return {"upper": 0, "parts": 0}
        written = _write(ctx, rc, BatchDescription(0, upper), m, on_slice, rebuilding=True)
        from reclock.persist.shards import replace_batches

        with ctx.connect() as conn:
            replace_batches(conn, [Append(s, written.desc, written.parts.get(s, ())) for s in ctx.spec.shards])
        return {"upper": upper, "parts": sum(len(p) for p in written.parts.values()),
                "records": m.get("records")}


def _stall_on_first_error(ctx: CycleContext, error_parts: tuple[Part, ...]) -> None:
    """``on_decode_error: stall``: refuse the whole description (nothing is appended) naming the first
    record that failed; the source stays stalled until the record or the config changes."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from reclock.errors import DecodeError
    from reclock.spark.ingest import ERR_PREFIX

    cols = [ERR_PREFIX + c for c in ("partition", "offset", "reason")]
    first = None
    for part in error_parts:
        with ctx.blob.open(part.path) as f:
            t = pq.read_table(f, columns=cols)
        t = t.filter(pc.is_valid(t[cols[0]]))
        for row in t.to_pylist():
            key = (row[cols[0]], row[cols[1]])
            if first is None or key < first[:2]:
                first = (*key, row[cols[2]])
    if first is not None:
        raise DecodeError(ctx.spec.name, first[0], first[1], f"{first[2]} (on_decode_error: stall)")


def _collect_parts(ctx: CycleContext, prefix: str) -> tuple[dict[str, tuple[Part, ...]], tuple[Part, ...]]:
    """The Parquet files under ``prefix``, assigned to shards, with row counts and ts bounds read from the
    footers; and the upsert state's change parts.

    An upsert slice's files sit in ``_output=N`` folders. An append-only slice's files hold the collection's
    rows and, packed in one column, the records that did not decode: a file whose footer says that column
    is all null is a part of the data shard as it is; the rare one holding rejected records is split into
    a data part and an errors part beside it, and those are the parts (the original is garbage)."""
    import pyarrow.parquet as pq

    from reclock.spark.ingest import DATA_OUTPUT, ERRORS_OUTPUT, REJECTED_COLUMN, STATE_OUTPUT

    state_key = "(upsert state)"
    out: dict[str, list[Part]] = {s: [] for s in (*ctx.spec.shards, state_key)}
    shard_of = {DATA_OUTPUT: ctx.spec.data_shard, ERRORS_OUTPUT: ctx.spec.errors_shard, STATE_OUTPUT: state_key}
    for info in ctx.blob.list(prefix):
        if not info.path.endswith(".parquet"):
            continue
        with ctx.blob.open(info.path) as f:
            md = pq.ParquetFile(f).metadata
        if not md.num_rows:
            continue
        folder = next((o for o in shard_of if f"/_output={o}/" in info.path), None)
        if folder is not None:
            out[shard_of[folder]].append(_part_from_footer(info.path, info.size, md))
            continue
        nulls = _null_count(md, REJECTED_COLUMN)
        if nulls is None:
            continue  # not a file of ours
        if nulls == md.num_rows:
            out[ctx.spec.data_shard].append(_part_from_footer(info.path, info.size, md))
            continue
        for output, part in _split_rejected(ctx, info.path):
            out[shard_of[output]].append(part)
    done = {s: tuple(sorted(ps, key=lambda p: p.path)) for s, ps in out.items()}
    return {s: done[s] for s in ctx.spec.shards}, done[state_key]


def _null_count(md, column: str) -> int | None:
    """Nulls in ``column`` over the file's row groups, from the footer (None: no such column; -1: unknown)."""
    from reclock.persist.compact import column_stats

    stats = column_stats(md, column)
    if stats is None:
        return None
    if any(st is None or st.null_count is None for st in stats):
        return -1
    return sum(st.null_count for st in stats)


def _column_range(md, column: str) -> tuple | None:
    """``(min, max)`` of ``column`` over the file's row groups, from the footer (None: no such column)."""
    from reclock.persist.compact import column_stats

    stats = column_stats(md, column)
    if stats is None:
        return None
    if any(st is None or not st.has_min_max for st in stats):
        return (None, None)  # unknown: treat as mixed
    if not stats:
        return (None, None)
    return min(st.min for st in stats), max(st.max for st in stats)


def _part_from_footer(path: str, size: int, md) -> Part:
    lo, hi = _column_range(md, "ts") or (None, None)
    return Part(path, md.num_rows, size, lo, hi)


def _split_rejected(ctx: CycleContext, path: str) -> list[tuple[int, Part]]:
    """Write the collection's rows of the file at ``path``, and its rejected records unpacked into the error
    collection's columns, to files of their own beside it."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from reclock.persist.compact import parquet_bytes, uses_int96
    from reclock.spark.ingest import DATA_OUTPUT, ERRORS_OUTPUT, REJECTED_COLUMN, unpack_rejected

    with ctx.blob.open(path) as f:
        pf = pq.ParquetFile(f)
        int96 = uses_int96(pf)
        table = pf.read()
    rejected = pc.is_valid(table[REJECTED_COLUMN])
    good = table.filter(pc.invert(rejected)).drop_columns([REJECTED_COLUMN])
    bad = table.filter(rejected)
    errors = unpack_rejected(bad[REJECTED_COLUMN].to_pylist())
    errors = pa.table({**{c: errors[c] for c in errors.column_names}, "ts": bad["ts"], "diff": bad["diff"]})
    parts = []
    for output, rows in ((DATA_OUTPUT, good), (ERRORS_OUTPUT, errors)):
        if not rows.num_rows:
            continue
        data = parquet_bytes(rows, int96, f"source {ctx.spec.name}: output {output} of {path}")
        split = f"{path[:-len('.parquet')]}.output{output}.parquet"
        ctx.blob.put_bytes(split, data)
        ts = pc.min_max(rows["ts"]).as_py()
        parts.append((output, Part(split, rows.num_rows, len(data), ts["min"], ts["max"])))
    return parts


def append(ctx: CycleContext, written: WrittenBatch) -> list:
    """``compare_and_append`` every output shard of the source in ONE transaction.

    Keeps *exactly once*: a replay whose range is already in the shards is a no-op; a partial overlap
    raises ``UpperMismatch`` and changes nothing (the next cycle re-mints from the actual upper).
    """
    with _step(ctx, "append") as m:
        appends = [Append(s, written.desc, written.parts.get(s, ())) for s in ctx.spec.shards]
        changes = _read_state_changes(ctx, written.state) if ctx.spec.envelope == "upsert" else None
        if changes is not None:
            m.update(state_changes=changes.num_rows)

        def also(conn) -> None:
            """In the append's transaction: the upsert state moves with the shards."""
            if changes is not None:
                from reclock.persist.upsert_state import apply_changes

                apply_changes(conn, ctx.spec.name, changes)
            failpoint("append:in_transaction")
        with ctx.connect() as conn:
            outcomes = compare_and_append(conn, appends, also)
        m.update(lower=written.desc.lower, upper=written.desc.upper,
                 outcomes=[str(o) for o in outcomes],
                 committed={s: sum(p.rows for p in written.parts.get(s, ())) for s in ctx.spec.shards})
        return outcomes


def _read_state_changes(ctx: CycleContext, parts: tuple[Part, ...]):
    """The upsert state changes a description's parts carry (an empty table when none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reclock.spark.ingest import STATE_COLUMNS, STATE_PREFIX

    tables = []
    for p in parts:
        with ctx.blob.open(p.path) as f:
            t = pq.read_table(f, columns=[STATE_PREFIX + c for c in STATE_COLUMNS])
        tables.append(t.rename_columns(list(STATE_COLUMNS)))
    if not tables:
        return pa.table({c: pa.array([], t) for c, t in zip(STATE_COLUMNS, (pa.binary(), pa.binary(), pa.int32(),
                                                                          pa.int64(), pa.int64()))})
    return pa.concat_tables(tables)


@dataclass(frozen=True)
class ResumeResult:
    resumption: int
    offsets: dict[int, int]
    since: int


def resume(ctx: CycleContext) -> ResumeResult:
    """Resumption frontier -> offset resumption frontier -> consumer-group commit -> compaction.

    Keeps *bounded input reliance*: after it, upstream may drop every offset below the committed
    frontier and no restart will ever need it; compaction respects read holds. Keeps *bounded state*:
    the remap collection is compacted to the new since, and each shard's small parts at or below it are
    merged (``reclock.persist.compact``).
    """
    from reclock.persist.compact import compact_parts

    with _step(ctx, "resume") as m:
        with ctx.connect() as conn:
            rc = load_remap(conn, ctx.spec.name)
            infos = [shard_info(conn, s) for s in ctx.spec.shards]
        resumption = min([rc.upper, *(i.upper for i in infos)])
        offsets = remap.source_upper_at(rc, resumption)
        ctx.upstream().commit(ctx.spec.consumer_group, offsets)
        failpoint("resume:after_commit")
        # the last complete time stays readable: since may reach resumption - 1, never the upper itself
        target = max(0, resumption - 1)
        if ctx.retain_history_ms:
            target = min(target, max(0, ctx.clock() - ctx.retain_history_ms))
        with ctx.connect() as conn:
            for s in ctx.spec.shards:
                holds = [h.ts for h in read_holds(conn, s)]
                target = min([target, *holds])
            since = target
            if since > rc.since:
                compact_remap(conn, ctx.spec.name, since)
            for s in ctx.spec.shards:
                advance_since(conn, s, since)
            compacted = {s: compact_parts(conn, ctx.blob, s).parts_merged for s in ctx.spec.shards}
        m.update(resumption=resumption, offsets_committed=offsets.as_dict(), since=since, compacted=compacted)
        return ResumeResult(resumption, offsets.as_dict(), since)


def run_cycle(ctx: CycleContext) -> dict:
    """All four steps in one process (what ``dag.test()`` and the benchmarks run)."""
    minted = mint(ctx)
    appended = 0
    for desc in minted.descriptions:
        append(ctx, write_batches(ctx, desc))
        appended += 1
    res = resume(ctx)
    return {"minted": minted.binding.ts if minted.binding else None, "descriptions": appended,
            "resumption": res.resumption, "offsets": res.offsets}
