"""The Kinesis kind: a Kinesis Data Stream, FromTime ``(shard_id, sequence_number)``.

==================  ========================================================================================
the interface       here
==================  ========================================================================================
register            the remap collection (progress ``(ts, shard_id, sequence_number)``), the collection
                    (output 0), its error collection (output 1), and the stream's identity
                    (``reclock.sources.kinesis.store``: a stream created again is ``StreamReplaced``)
probe_uppers        Kinesis has no end offsets: every readable shard (``lineage.readable``: children after
                    their parents' ends) is scanned from the newest binding to its tip, and what the scans
                    found is cut into bindings of at most ``budget.max_records`` records, a child's first
                    in a binding after its parents' last (``lineage.plan_bindings``); the scans' record counts
                    are written first, each counted segment's records captured in the blob store
                    (``reclock.sources.kinesis.capture``). Shards the stream lost part way, and records
                    retention may have trimmed since the last scan, are ``KinesisDataLost``; a record just
                    below a position that is not the one read there is ``StreamReplaced``
                    (``reclock.sources.kinesis.marks``, kept per bound position)
descriptions        bindings grouped up to ``budget.max_records`` counted records; upsert: one a cycle
write               the bound ranges cut into counted units at each binding's ts, read by Spark from their
                    captures where those hold the units' counts, else from the stream by Spark tasks
                    (several per shard: ``reclock.sources.kinesis.reader``); every slice's job must read
                    exactly the bound count; decoded and written by the shared decode path
                    (``reclock.spark.decode``), proved by ``reclock.persist.staged``
commit              KCL checkpoints (when configured), finished shards dropped from the frontier, counts
                    compacted (``reclock.sources.kinesis.store``), captures below the frontier deleted
rewrite             the same reads from position 0 (rebuild), shards compaction dropped included
trigger, lag        ``KinesisMoved``; records and milliseconds behind the tip
==================  ========================================================================================

A frontier keeps shard numbers as partitions and positions as offsets (``reclock.sources.kinesis.sequence``):
exact ints, kept as ``numeric`` in the remap store.
"""

from __future__ import annotations

import contextlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from reclock import remap
from reclock.batch import BatchDescription, SliceWritten, check_servable
from reclock.errors import DecodeError, KinesisDataLost, ReclockError, StreamReplaced, UnaccountedWrite
from reclock.failpoints import failpoint
from reclock.part_layout import DATA_KIND, DATA_OUTPUT, ERRORS_KIND, ERRORS_OUTPUT, RecordShape
from reclock.persist.gc import lease_write, release_write
from reclock.persist.remap_store import drop_partitions, load_remap, register_source
from reclock.persist.shards import register_shard, shard_info
from reclock.persist.staged import collect_parts, first_rejected, read_state_changes, slice_folder
from reclock.persist.upsert_state import apply_changes, load_prior
from reclock.remap import RemapCollection
from reclock.sources.base import CycleServices, Lag, SourceKind, SourceRuntime, WrittenBatch
from reclock.sources.kinesis import capture, store
from reclock.sources.kinesis.client import KinesisUpstream, StreamAddress
from reclock.sources.kinesis.lineage import (FINISHED, ShardInfo, ShardScan, done_shards, droppable, entry_position,
                                             foreign_shards, lost_shards, plan_bindings, readable, scan_segments)
from reclock.sources.kinesis.marks import Mark, verdict
from reclock.sources.kinesis.reader import (CountsMissing, ReadTask, parse_lost, plan_tasks, read_frame, slices,
                                            units_for)
from reclock.sources.kinesis.sequence import shard_id
from reclock.sources.kinesis.spec import SCHEDULES, parse_kinesis_source
from reclock.time import PartitionedFrontier

PROGRESS = ("SELECT ts, 'shardId-' || lpad(partition::text, 12, '0') AS shard_id, "
            "CASE WHEN \"offset\" < 10::numeric ^ 129 THEN \"offset\" END AS sequence_number "
            "FROM reclock.remap_offsets WHERE source = {}")
"""The progress view's body: ``(ts, shard_id, sequence_number)``, the sequence number a position (the least
not yet in), NULL for a shard read to its end (``SHARD_END``)."""

SHAPE = RecordShape((("shard_id", "string"), ("sequence_number", "string")),
                    order_sql="lpad(_o, 130, '0')",
                    derived=(("partition_key", "CAST(key AS STRING)"), ("arrival", "timestamp")))
"""A Kinesis record to the shared decode path: where it is, ``(shard_id, sequence_number)`` (the decimal as
a string, ordered as the number it is), its partition key as the upsert key; included metadata columns
``_shard_id``, ``_sequence_number``, ``_partition_key``, ``_arrival``."""

RAW_COLUMNS = ("concat('shardId-', lpad(CAST(shard AS STRING), 12, '0')) AS shard_id", "sequence_number",
               "partition_key", "CAST(partition_key AS BINARY) AS key", "data AS value", "arrival AS timestamp",
               "arrival", "ts")
"""The reader's columns (``reclock.sources.kinesis.reader.READ_SCHEMA``) as ``SHAPE`` wants them."""

RETENTION_MARGIN_MS = 3_600_000
"""A scan is taken as safe from retention if it began less than the retention period minus this ago."""


def effective(shards: Sequence[ShardInfo], positions: Mapping[int, int]) -> dict[int, int]:
    """``positions`` with every listed shard that is done through its descendants (compaction dropped it
    from the frontier) at FINISHED: what the frontier means, for reads that need those shards' ranges (a
    rebuild) and for the KCL checkpoints."""
    out = dict(positions)
    for n in done_shards(shards, positions):
        out[n] = FINISHED
    return out


def bound_ranges(bindings: Sequence[tuple[int, Mapping[int, int]]], lower: int, upper: int
                 ) -> dict[int, list[tuple[int, int, int]]]:
    """Per shard, the ``(start, stop, ts)`` ranges the bindings at ``lower <= ts < upper`` add (each binding's
    positions against the one before; the frontier before ``lower`` is the last binding below it)."""
    prev: dict[int, int] = {}
    out: dict[int, list[tuple[int, int, int]]] = {}
    for ts, positions in bindings:
        if ts >= upper:
            break
        if ts >= lower:
            for n, p in positions.items():
                if p > prev.get(n, 0):
                    out.setdefault(n, []).append((prev.get(n, 0), p, ts))
        prev = dict(positions)
    return out


class KinesisSource(SourceRuntime):
    """A Kinesis source's half of a cycle context: its upstream client (one per context)."""

    probe_after_register = True  # the stream's identity is recorded against the registered source

    def __init__(self, kind: SourceKind, ctx: CycleServices) -> None:
        super().__init__(kind, ctx)
        self._upstream: KinesisUpstream | None = None
        self._probed: dict = {}

    # -- upstream ---------------------------------------------------------------------------------------

    def upstream(self) -> KinesisUpstream:
        if self._upstream is None:
            self._upstream = KinesisUpstream(self.name, self.ctx.upstream)
        return self._upstream

    def _check_stream(self, conn) -> store.StreamRecord:
        ident = self.upstream().identity()
        return store.bind_stream(conn, self.name, self.ctx.upstream.stream, ident.arn, ident.created_ms)

    def register(self) -> None:
        spec = self.ctx.spec
        with self.ctx.connect() as conn:
            register_source(conn, spec.name, kind=self.kind.name, progress=PROGRESS)
            register_shard(conn, spec.data_shard, source=spec.name, output=DATA_OUTPUT, kind=DATA_KIND)
            register_shard(conn, spec.errors_shard, source=spec.name, output=ERRORS_OUTPUT, kind=ERRORS_KIND)
            self._check_stream(conn)

    def shards(self) -> tuple[str, ...]:
        return self.ctx.spec.shards

    # -- mint -------------------------------------------------------------------------------------------

    def probe_upper(self) -> PartitionedFrontier:
        return self.probe_uppers()[-1]

    def probe_uppers(self) -> list[PartitionedFrontier]:
        """Scan every readable shard from the newest binding to its tip (children once their parents' ends
        are in the scans), count, and cut what was found into frontiers to bind (see the module)."""
        spec, up = self.ctx.spec, self.upstream()
        settings = spec.upstream
        began = self.ctx.clock()
        with self.ctx.connect() as conn:
            record = self._check_stream(conn)
            rc = load_remap(conn, self.name)
            positions = dict(remap.last_frontier(rc))
            marks = store.load_marks(conn, self.name, positions)
        listing = up.shards()
        checked = self._check_lost(listing, positions, record, began, marks)
        scans: dict[int, ShardScan] = {}
        simulated = dict(positions)
        capped = False
        budget = settings.scan_max_records
        with self.ctx.connect() as conn:
            lease_write(conn, self.name, capture.folder(self.name))  # the captures stay while mints go on
        writer = capture.CaptureWriter(self.ctx.blob, self.name)
        with ThreadPoolExecutor(min(8, max(1, len(listing)))) as pool:
            while True:
                fresh = [s for s in readable(listing, simulated) if s.number not in scans]
                if not fresh or budget <= 0:
                    break
                starts = {s.number: simulated.get(s.number, 0) or entry_position(s, listing) for s in fresh}
                found = list(pool.map(lambda s: up.scan(s, starts[s.number], settings.stride, budget, writer),
                                  fresh))
                for s, scan in zip(fresh, found):
                    scans[s.number] = scan
                    simulated[s.number] = scan.tip
                    budget -= scan.records
                    capped = capped or (not scan.ended and scan.records >= settings.scan_max_records)
        plan = plan_bindings(listing, positions, scans, spec.budget.max_records)
        bound = {(n, p) for f in plan.frontiers for n, p in f.items()}
        bound_marks = [(n, p, m) for n, scan in scans.items() for p, m in scan.marks if (n, p) in bound]
        arrivals = [s.first_arrival_ms for s in scans.values() if s.first_arrival_ms is not None]
        self._probed = {"offsets_known": None, "lag_records": sum(s.records for s in scans.values()),
                        "lag_ms": max(0, began - min(arrivals)) if arrivals else 0,
                        "lag_capped": capped, "shards_scanned": len(scans), "bindings_planned": len(plan.frontiers),
                        "throttled": up.throttled, "iterators_renewed": up.expired,
                        "captured_files": writer.files, "captured_records": writer.records,
                        "marks_checked": checked}
        with self.ctx.connect() as conn:
            store.add_segments(conn, self.name, plan.segments)  # facts first: the bindings' counts
            store.add_marks(conn, self.name, bound_marks)  # and the records just below their positions
            if not capped and budget > 0:
                store.record_scan(conn, self.name, began)
        failpoint("mint:after_scan")
        frontiers = [PartitionedFrontier.of(f) for f in plan.frontiers]
        return frontiers or [PartitionedFrontier.of(positions)]

    def _check_lost(self, listing: Sequence[ShardInfo], positions: Mapping[int, int],
                    record: store.StreamRecord, now_ms: int, marks: Mapping[int, Mark]) -> int:
        """Shards gone part way, and records retention may have trimmed after the newest binding before any
        scan saw them (the source did not scan for longer than the stream's retention), are lost; a record at
        a position (``marks``) that is not the one read there is a replaced stream (:meth:`_check_marks`).
        Returns how many marks were checked."""
        up = self.upstream()
        for s in foreign_shards(listing, positions):
            # the creation time alone cannot tell a stream created again within its resolution (whole
            # seconds on some endpoints); the shards' first sequence numbers can, unless it was created again
            # within the second of the first creation: then the marks can (_check_marks)
            raise StreamReplaced(self.name, self.ctx.upstream.stream, record.created_ms, up.identity().created_ms,
                                 f"its {shard_id(s.number)} starts at sequence number {s.start}, after position "
                                 f"{positions[s.number]} the source has read to")
        for n in lost_shards(listing, positions):
            raise KinesisDataLost(self.name, shard_id(n), positions[n], None,
                                  "the shard is no longer in the stream (its records expired before the source "
                                  "read it to its end)")
        held = self._check_marks(listing, positions, record, marks)
        retention_ms = up.identity().retention_hours * 3_600_000
        if record.scanned_ms is None or now_ms - record.scanned_ms < retention_ms - RETENTION_MARGIN_MS:
            return len(held)
        for s in readable(listing, positions):
            p = positions.get(s.number, 0)
            if p == 0:
                continue
            if p != s.start and (held[s.number] if s.number in held else up.still_holds(s, p - 1)):
                continue
            first = up.first_retained(s)
            raise KinesisDataLost(
                self.name, shard_id(s.number), p, first,
                f"the source last scanned the stream at {record.scanned_ms} and the stream keeps records "
                f"{retention_ms // 3_600_000} hours; records after position {p} may have been trimmed before "
                "they were bound" + ("" if first is None else f" (the shard now starts at {first})"))
        return len(held)

    def _check_marks(self, listing: Sequence[ShardInfo], positions: Mapping[int, int],
                     record: store.StreamRecord, marks: Mapping[int, Mark]) -> dict[int, bool]:
        """Before a scan reads past a readable shard's position, the record just below it must be the one the
        source read there (``reclock.sources.kinesis.marks``): one ``GetRecords`` of one record per shard that
        has a mark. Another record, or none while an older one is still there, is ``StreamReplaced`` (a stream
        created again within the second of the first has the same creation time and first sequence numbers).
        Returns, per shard checked, whether the record is still there (False: trimmed by retention, which the
        retention check judges)."""
        up = self.upstream()
        shards = {s.number: s for s in readable(listing, positions) if s.number in marks}
        if not shards:
            return {}

        def check(n: int) -> tuple[int, Mark | None, int | None]:
            found = up.record_at(shards[n], marks[n].sequence)
            return n, found, None if found is not None else up.first_retained(shards[n])

        with ThreadPoolExecutor(min(8, len(shards))) as pool:
            results = list(pool.map(check, sorted(shards)))
        held: dict[int, bool] = {}
        for n, found, first in results:
            expected = marks[n]
            v = verdict(expected, found, first)
            if v == "replaced":
                now = f"another record there ({found.describe()})" if found is not None else (
                    f"no record there, while it still holds an older one (sequence number {first}): retention "
                    "trims the oldest records first, so the record was not trimmed")
                raise StreamReplaced(
                    self.name, self.ctx.upstream.stream, record.created_ms, up.identity().created_ms,
                    f"at position {positions[n]} of {shard_id(n)}, the last record the source read there was "
                    f"{expected.describe()}; the stream now holds {now}")
            held[n] = v == "same"
        return held

    def probe_metrics(self) -> dict:
        return dict(self._probed)

    def descriptions(self, rc: RemapCollection, lower: int) -> list[BatchDescription]:
        """Bindings grouped while their counted records stay within the budget (a binding is never split:
        the scans cut backlogs into budget-sized bindings already); upsert: the first group only."""
        pending = [b for b in rc.bindings if b.ts >= lower]
        if not pending:
            return []
        check_servable(rc, lower)
        budget = self.ctx.spec.budget.max_records
        counts = self._binding_counts(rc, [b.ts for b in pending])
        descs, start, total = [], lower, 0
        for i, b in enumerate(pending):
            if total and total + counts[b.ts] > budget:
                descs.append(BatchDescription(start, pending[i - 1].ts + 1))
                start, total = pending[i - 1].ts + 1, 0
            total += counts[b.ts]
        descs.append(BatchDescription(start, pending[-1].ts + 1))
        return descs[:1] if self.ctx.spec.envelope == "upsert" else descs

    def _binding_counts(self, rc: RemapCollection, stamps: Sequence[int]) -> dict[int, int]:
        """Records each binding at ``stamps`` adds (from the counted segments)."""
        listing = self.upstream().shards()
        bindings = [(b.ts, effective(listing, dict(b.frontier))) for b in rc.bindings]
        ranges = bound_ranges(bindings, min(stamps), max(stamps) + 1)
        with self.ctx.connect() as conn:
            segs = store.load_segments(conn, self.name, list(ranges))
        out = {t: 0 for t in stamps}
        try:
            for u in units_for(ranges, segs):
                out[u.ts] += u.records
        except CountsMissing as e:
            raise ReclockError(f"source {self.name}: {e}; the counts the scans wrote before the bindings are "
                               "missing (a bug: report it)") from e
        return out

    # -- write ------------------------------------------------------------------------------------------

    def write(self, rc: RemapCollection, desc: BatchDescription, metrics: dict) -> WrittenBatch:
        ctx, spec = self.ctx, self.ctx.spec
        if spec.envelope == "upsert":
            with ctx.connect() as conn:
                if shard_info(conn, spec.data_shard).upper >= desc.upper:
                    metrics.update(lower=desc.lower, upper=desc.upper, already_present=True)
                    return WrittenBatch(desc)  # a replay: the state has moved on, and append is a no-op
        written = self._write(rc, desc, metrics)
        if spec.on_decode_error == "stall" and written.parts.get(spec.errors_shard):
            first = first_rejected(ctx.blob, written.parts[spec.errors_shard], SHAPE)
            if first is not None:
                shard, seq, reason = first
                raise DecodeError(spec.name, shard, seq, f"{reason} (on_decode_error: stall)",
                                  where=f"shard {shard} sequence number {seq}")
        return written

    def rewrite(self, rc: RemapCollection, desc: BatchDescription, metrics: dict,
                on_slice: Callable[[int, int], None] | None) -> WrittenBatch:
        return self._write(rc, desc, metrics, on_slice, rebuilding=True)

    def _tasks(self, rc: RemapCollection, desc: BatchDescription, rebuilding: bool
               ) -> tuple[list[ReadTask], int, set[tuple[int, int, int]]]:
        """The read tasks of ``desc``, how many records they hold, and the units (``(shard, start, stop)``)
        whose capture holds their records (``reclock.sources.kinesis.capture``)."""
        up = self.upstream()
        listing = {s.number: s for s in up.shards()}
        bindings = [(b.ts, effective(list(listing.values()), dict(b.frontier))) for b in rc.bindings]
        ranges = bound_ranges(bindings, desc.lower, desc.upper)
        missing = [n for n in ranges if n not in listing]
        if missing:
            n = missing[0]
            start, stop, _ = ranges[n][0]
            raise KinesisDataLost(self.name, shard_id(n), start, stop,
                                  "the shard is no longer in the stream (it expired with its records)")
        with self.ctx.connect() as conn:
            segs = store.load_segments(conn, self.name, list(ranges))
            dropped = store.stream_record(conn, self.name).dropped_records if rebuilding else 0
        units = units_for(ranges, segs) if not rebuilding else self._rebuild_units(ranges, segs, listing, dropped)
        held = capture.captured(self.ctx.blob, self.name, units)
        # units read from their captures and units read from the stream never share a task
        per = self.ctx.spec.upstream.task_records
        tasks = sorted(plan_tasks([u for u in units if (u.shard, u.start, u.stop) in held], listing, per)
                       + plan_tasks([u for u in units if (u.shard, u.start, u.stop) not in held], listing, per),
                       key=lambda t: (t.shard, t.start))
        return tasks, sum(u.records for u in units), held

    def _rebuild_units(self, ranges, segs, listing, dropped: int):
        """A rebuild's units: the counted ones, and those of shards compaction dropped (their segments went
        with them; their total is kept): counted now by a scan, checked against that total."""
        counted = {n: r for n, r in ranges.items() if n in segs}
        units = units_for(counted, segs)
        rest = {n: r for n, r in ranges.items() if n not in segs}
        if rest:
            found = 0
            fresh = {}
            for n, rs in rest.items():
                scan = self.upstream().scan(listing[n], 0, self.ctx.spec.upstream.stride)
                fresh[n] = scan_segments(scan)
                found += scan.records
            if found != dropped:
                raise KinesisDataLost(self.name, ", ".join(shard_id(n) for n in sorted(rest)), 0, None,
                                      f"a rebuild needs the {dropped} records these shards (read to their ends "
                                      f"and dropped from the frontier) held, but the stream now holds {found}")
            units += units_for(rest, fresh)
        return units

    def _write(self, rc: RemapCollection, desc: BatchDescription, m: dict,
               on_slice: Callable[[int, int], None] | None = None, rebuilding: bool = False) -> WrittenBatch:
        from reclock.spark import decode

        ctx, spec = self.ctx, self.ctx.spec
        with ctx.connect() as conn:
            self._check_stream(conn)
        tasks, records, held = self._tasks(rc, desc, rebuilding)
        upsert = spec.envelope == "upsert"
        groups = [tasks] if upsert and tasks else slices(tasks, spec.budget.max_records)
        if not groups:
            m.update(lower=desc.lower, upper=desc.upper, slices=0, records_bound=0, records_read=0)
            return WrittenBatch(desc)
        spark = ctx.spark()
        prior: list[tuple] = []
        prefix = f"{spec.name}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}"
        with ctx.connect() as conn:
            lease_write(conn, spec.name, prefix)
        try:
            if upsert and not rebuilding:
                keys = [bytes(r[0]) for r in self._frame(spark, tasks, held).select("key").distinct().collect()]
                with ctx.connect() as conn:
                    prior = load_prior(conn, spec.name, spec.data_shard, desc.lower, keys, SHAPE)
                m.update(keys=len(keys), prior_keys=len(prior))
            failpoint("write_batches:before_job")
            written: list[SliceWritten] = []
            for i, group in enumerate(groups):
                expected = sum(t.records for t in group)
                url = ctx.blob.url(slice_folder(prefix, i))
                try:
                    written.append(decode.write_slice(
                        spark, spec, SHAPE, lambda read, g=group: self._frame(spark, g, held, read),
                        url, prior, index=i, offsets=expected))
                except Exception as e:
                    lost = parse_lost(str(e))
                    if lost is None:
                        raise
                    raise KinesisDataLost(
                        spec.name, shard_id(lost.shard), lost.start, lost.stop,
                        f"{lost.expected} records were bound there but the stream now returns {lost.found} "
                        "(retention trimmed them, or the stream was replaced)") from None
                if written[-1].records_read != expected:
                    # each stream read is checked unit by unit (RangeLost); this also proves the captures
                    raise UnaccountedWrite(spec.name, url, url, f"slice {i}: Spark read {written[-1].records_read} "
                                           f"records of the {expected} the bindings hold")
                with ctx.connect() as conn:
                    lease_write(conn, spec.name, prefix)
                if on_slice is not None:
                    on_slice(i + 1, len(groups))
                failpoint("write_batches:after_slice")
            parts, state = collect_parts(ctx.blob, spec.name, {DATA_OUTPUT: spec.data_shard,
                                                                ERRORS_OUTPUT: spec.errors_shard},
                                         prefix, written, upsert, SHAPE)
        except BaseException:
            with contextlib.suppress(Exception), ctx.connect() as conn:
                release_write(conn, prefix)
            raise
        m.update(lower=desc.lower, upper=desc.upper, slices=len(groups), tasks=len(tasks), records_bound=records,
                 records_read=sum(w.records_read for w in written), throttled=self.upstream().throttled,
                 records_from_captures=sum(u.records for t in tasks if _all_held(t, held) for u in t.units),
                 records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
                 bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
        return WrittenBatch(desc, parts, state, prefix)

    def _frame(self, spark, tasks: Sequence[ReadTask], held: set[tuple[int, int, int]], read_metrics=None):
        """The records of ``tasks`` with the columns the shared decode path takes (``SHAPE``): a task whose
        units are all in ``held`` from their captures, any other from the stream; ``read_metrics`` counts
        them all."""
        from pyspark.sql import functions as F

        from_stream = [t for t in tasks if not _all_held(t, held)]
        units = [u for t in tasks if _all_held(t, held) for u in t.units]
        frames = ([read_frame(spark, self.name, self.ctx.upstream, from_stream)] if from_stream else []) + \
                 ([capture.frame(spark, self.ctx.blob, self.name, units)] if units else [])
        df = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
        if read_metrics is not None:
            df = df.observe(read_metrics, F.count(F.lit(1)).alias("records"))
        return df.selectExpr(*RAW_COLUMNS)

    def lineage_inputs(self) -> tuple:
        """The stream (``reclock.datasets.kinesis_stream``): what the mint's scan and the write read."""
        from reclock.datasets import kinesis_stream

        addr = self.ctx.upstream
        return (kinesis_stream(addr.stream, addr.region, addr.endpoint_url),)

    def append_effects(self, written: WrittenBatch, metrics: dict) -> Callable[[Any], None] | None:
        if self.ctx.spec.envelope != "upsert":
            return None
        changes = read_state_changes(self.ctx.blob, written.state, SHAPE)
        metrics.update(state_changes=changes.num_rows)
        return lambda conn: apply_changes(conn, self.name, changes, SHAPE)

    # -- resume -----------------------------------------------------------------------------------------

    def commit(self, frontier: PartitionedFrontier) -> None:
        """KCL checkpoints of ``frontier`` (the offset resumption frontier) if the source has a table;
        finished shards dropped from every binding once their children are in them all; counts below the
        frontier compacted."""
        spec, up = self.ctx.spec, self.upstream()
        listing = up.shards()
        positions = dict(frontier)
        table = spec.upstream.checkpoints
        if table is not None and positions:
            from reclock.sources.kinesis.checkpoints import ensure_table, write_checkpoints

            ensure_table(table)
            with self.ctx.connect() as conn:
                resumption = min([load_remap(conn, self.name).upper,
                                  *(shard_info(conn, s).upper for s in self.shards())])
            write_checkpoints(table, self.name, resumption, listing, effective(listing, positions))
        with self.ctx.connect() as conn, conn.transaction():
            rc = load_remap(conn, self.name)
            drop = droppable(listing, [dict(b.frontier) for b in rc.bindings])
            if drop:
                drop_partitions(conn, self.name, drop)
            kept = {n: p for n, p in positions.items() if n not in drop}
            store.compact_segments(conn, self.name, kept, drop)
            store.compact_marks(conn, self.name, kept, drop)
        capture.drop_read(self.ctx.blob, self.name, effective(listing, positions), sorted(drop))


def _all_held(task: ReadTask, held: set[tuple[int, int, int]]) -> bool:
    return all((u.shard, u.start, u.stop) in held for u in task.units)


class KinesisKind(SourceKind):
    name = "kinesis"
    title = "Kinesis"
    from_time = "(shard_id, sequence_number)"
    progress_columns = ("ts", "shard_id", "sequence_number")
    schedules = SCHEDULES

    def parse(self, name, raw, base):
        return parse_kinesis_source(name, raw, base)

    def describe(self, spec) -> str:
        return f"Kinesis stream {spec.upstream.stream} into {spec.name}"

    def find_upstream(self, spec, given: str | StreamAddress | None = None) -> StreamAddress:
        """The stream's address: ``given`` if a caller already has it, else from an endpoint ``given`` (a
        command's option), the environment or the config (``find_stream``)."""
        from reclock.sources.kinesis.config import find_stream

        if isinstance(given, StreamAddress):
            return given
        return find_stream(spec.upstream, f"source {spec.name}", given)

    def job_environment(self, spec) -> dict[str, str]:
        addr = self.find_upstream(spec)
        env = {"AWS_REGION": addr.region}
        if addr.endpoint_url:
            env["RECLOCK_KINESIS_ENDPOINT"] = addr.endpoint_url
        return env

    def open(self, ctx: CycleServices) -> KinesisSource:
        return KinesisSource(self, ctx)

    def progress_view(self) -> str:
        return PROGRESS

    def upstream_trigger(self, spec) -> Any:
        from reclock.sources.kinesis.trigger import KinesisMoved

        return KinesisMoved(source=spec.name, stream=spec.upstream.stream, region=spec.upstream.region,
                            endpoint_url=spec.upstream.endpoint_url, poll=spec.poll_s)

    def position_text(self, partition: int, offset: int) -> str:
        """``shardId-000000000001 sequence 4959...`` (the least sequence number not yet in), ``... SHARD_END``."""
        if partition is None:
            return f"sequence {offset}"
        end = offset is not None and int(offset) >= FINISHED
        return f"{shard_id(int(partition))} " + ("SHARD_END" if end else f"sequence {offset}")

    def lag(self, spec, upstream: Any, timeout: float, dsn: str | None = None) -> Lag:
        """Records and milliseconds the stream's tip is beyond the source's offset resumption frontier (read
        from the consensus Postgres ``dsn``, else the settings'): a count up to ``probe.LAG_CAP`` records per
        shard."""
        from reclock.persist import connect
        from reclock.persist.shards import shard_info
        from reclock.settings import find_dsn
        from reclock.sources.kinesis.probe import stream_lag

        with connect(find_dsn(dsn)) as conn:
            rc = load_remap(conn, spec.name)
            resumption = min([rc.upper, *(shard_info(conn, s).upper for s in spec.shards)])
        positions = dict(remap.source_upper_at(rc, resumption))
        up = KinesisUpstream(spec.name, upstream, throttle_patience_s=timeout)
        lag = stream_lag(up, positions)
        return Lag(lag.records, lag.describe())


KINESIS = KinesisKind()
