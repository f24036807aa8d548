"""The Postgres kind: a publication read through a logical replication slot, FromTime the commit LSN.

==================  ========================================================================================
the interface       here
==================  ========================================================================================
register            the remap collection (progress ``(ts, lsn)``), the tables (oids and columns, once;
                    ``reclock.sources.postgres.registration``), a shard per table (outputs 0, 2, 3, ...) and
                    the error collection (output 1), the replication slot (while the source has no binding)
probe_upper         the flush LSN, as partition 0's offset (``reclock.sources.postgres.upstream``)
descriptions        one: LSN distances are WAL bytes, not changes; memory is bounded by the part size
write               the slot's transactions below the bound LSN decoded in the task
                    (``reclock.sources.postgres.cdc``), the first description's snapshot too (large tables on
                    Spark: ``reclock.sources.postgres.spark_snapshot``)
commit              the replication slot advanced to the LSN
resnapshot          a fresh snapshot at a new binding (DDL, a redefined publication, a lost slot); no rebuild (no history)
trigger, lag        ``PublicationChanged``; the slot's lag is not probed
==================  ========================================================================================
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, ContextManager, Sequence

import pyarrow as pa

from reclock import remap
from reclock.batch import BatchDescription, mint_descriptions
from reclock.compaction import contents_as_of
from reclock.errors import ConfigError, ReclockError, ShardsDisagree, SlotAheadOfConsensus, TableTruncated
from reclock.failpoints import failpoint
from reclock.part_layout import DATA_KIND, ERRORS_KIND, ERRORS_OUTPUT, INTERNAL_PREFIX
from reclock.persist.gc import lease_write, release_write
from reclock.persist.remap_store import append_binding, load_remap, register_source
from reclock.persist.shards import Append, compare_and_append, register_shard, shard_info
from reclock.read import read_as_of
from reclock.remap import RemapCollection
from reclock.sources.base import Acknowledged, CycleServices, Lag, SourceKind, SourceRuntime, WrittenBatch
from reclock.sources.postgres import cdc
from reclock.sources.postgres import spark_snapshot
from reclock.sources.postgres.registration import register_tables, registered_tables, replace_tables, snapshot_ts
from reclock.sources.postgres.spec import find_upstream_dsn, parse_pg_table, parse_postgres_source, pg_table_shard
from reclock.sources.postgres.upstream import LSN_PARTITION, PostgresUpstream, lsn_frontier, lsn_to_str
from reclock.time import PartitionedFrontier

LSN_PROGRESS = ("SELECT ts, '0/0'::pg_lsn + \"offset\" AS lsn FROM reclock.remap_offsets WHERE partition = 0 "
                "AND source = {}")
"""The ``<source>_progress`` view of a Postgres source: ``(ts, lsn)``."""


class PostgresSource(SourceRuntime):
    """A Postgres source's half of a cycle context: its upstream (the publication, the slot) and its tables."""

    probe_after_register = True  # the slot first: the flush LSN probed after it is covered by it

    def __init__(self, kind: SourceKind, ctx: CycleServices) -> None:
        super().__init__(kind, ctx)
        self._upstream: PostgresUpstream | None = None
        self._outputs: tuple[cdc.Output, ...] | None = None

    def upstream(self) -> PostgresUpstream:
        """The source's upstream; one per context, so a cycle's steps share its held session."""
        if self._upstream is None:
            if not self.ctx.upstream:
                raise ConfigError(f"source {self.name}: this cycle context has no upstream (the upstream "
                                  "Postgres's DSN)")
            self._upstream = PostgresUpstream(self.name, self.ctx.upstream, self.ctx.spec.upstream.publication)
        return self._upstream

    def holding(self) -> ContextManager[None]:
        """One upstream session for every step run inside (``reclock.lending``,
        :meth:`~reclock.sources.postgres.upstream.PostgresUpstream.holding`)."""
        return self.upstream().holding()

    def outputs(self) -> tuple[cdc.Output, ...]:
        """The source's tables and their shards, as registered at its first cycle."""
        if self._outputs is None:
            with self.ctx.connect() as conn:
                tables = registered_tables(conn, self.name)
            if tables is None:
                raise ConfigError(f"source {self.name}: no tables registered yet (run mint first)")
            self._outputs = tuple(cdc.Output(t, pg_table_shard(self.name, t.table)) for t in tables)
        return self._outputs

    def shards(self) -> tuple[str, ...]:
        """The registered tables' shards and the error collection."""
        return (*(o.shard for o in self.outputs()), self.ctx.spec.errors_shard)

    def probe_upper(self) -> PartitionedFrontier:
        return self.upstream().probe_upper()

    def descriptions(self, rc: RemapCollection, lower: int) -> list[BatchDescription]:
        # LSN distances are WAL bytes, not changes: one description, its memory bounded by the part size
        return mint_descriptions(lower, rc, 2**62)

    def commit(self, frontier: PartitionedFrontier) -> None:
        self.upstream().commit(frontier)

    def acknowledged(self) -> Acknowledged:
        up = self.upstream()
        return Acknowledged(up.acknowledged(), f"replication slot {up.slot} is confirmed at")

    def acknowledged_since(self, conn: Any) -> int | None:
        return snapshot_ts(conn, self.ctx.spec.name)  # a re-snapshot's slot starts at its binding

    def acknowledged_beyond(self, acked: Acknowledged, ours: PartitionedFrontier, upper: int) -> ReclockError:
        """A slot past the changes the shards need: the consensus database lost the commits that moved it, or
        someone moved it by hand (``pg_replication_slot_advance``, a consumer of the slot)."""
        return SlotAheadOfConsensus(self.ctx.spec.name, self.upstream().slot,
                                    lsn_to_str(acked.frontier.get(LSN_PARTITION)),
                                    lsn_to_str(ours.get(LSN_PARTITION)), upper)

    def register(self) -> None:
        """Register the source: its tables (oids and columns, once; ``reclock.sources.postgres.registration``),
        a shard per table (``<source>__<table>``, outputs 0, 2, 3, ...) and its error collection (output 1).
        Every cycle checks the tables are still published with ``REPLICA IDENTITY FULL``. The slot is created
        here while the source has no binding, so the first binding's LSN is at or after the slot's start."""
        name = self.ctx.spec.name
        up = self.upstream()
        with self.ctx.connect() as conn:
            register_source(conn, name, kind=self.kind.name, progress=self.kind.progress_view())
            tables = registered_tables(conn, name)
            bound = bool(load_remap(conn, name).bindings)
        with up.session() as uconn:
            if tables is None:
                infos = self._describe_tables(uconn)
                with self.ctx.connect() as conn:
                    tables = register_tables(conn, name, infos)
            else:
                up.check_tables(uconn, tables)
            if not bound:
                up.ensure_slot(uconn)
        with self.ctx.connect() as conn:
            for i, t in enumerate(tables):
                register_shard(conn, pg_table_shard(name, t.table), source=name, output=0 if i == 0 else i + 1,
                               kind=DATA_KIND)
            register_shard(conn, self.ctx.spec.errors_shard, source=name, output=ERRORS_OUTPUT, kind=ERRORS_KIND)


    def _describe_tables(self, uconn) -> list:
        """The tables a Postgres source takes (its ``tables:``, else every table of its publication), described
        upstream (published, identity FULL) and checked for column names a collection keeps for its own."""
        up, name = self.upstream(), self.ctx.spec.name
        names = self.ctx.spec.upstream.tables or [parse_pg_table(name, t) for t in up.published_tables(uconn)]
        infos = up.describe(uconn, names)
        for info in infos:
            taken = [c for c, _, _ in info.columns if c in ("ts", "diff") or c.startswith(INTERNAL_PREFIX)]
            if taken:
                raise ConfigError(f"source {name}: table {info.table} has column(s) {', '.join(taken)}, names "
                                  "a collection keeps for its own (ts, diff, _reclock_*); rename the column(s) "
                                  "upstream, or leave the table out of `tables:`")
        return infos

    def resnapshot(self, metrics: dict) -> dict:
        """Start a Postgres source over from a fresh snapshot at a new binding, after a stall (DDL, a publication,
        a lost slot): the tables are described again (their new columns), the slot is dropped and created
        anew, and a binding at a new timestamp (never in the past) is appended with the new registration in
        one transaction. The next cycle's write retracts what each collection held and writes the snapshot,
        both at that binding's timestamp, and streams from its LSN on; the bindings between the stall and it
        add nothing of their own (their changes land at once, in the snapshot). A table new to the source
        gets a collection that is empty before it. Readers and sinks see one more timestamp, as for any
        cycle; history before it stays readable as it was.
        """
        m = metrics
        name, up = self.ctx.spec.name, self.upstream()
        with self.ctx.connect() as conn:
            if registered_tables(conn, name) is None:
                raise ConfigError(f"source {name}: it has not run yet; its first cycle takes the snapshot")
            uppers = {s: shard_info(conn, s).upper for s in self.shards()}
        if len(set(uppers.values())) != 1:
            raise ShardsDisagree(name, uppers)
        upper = min(uppers.values())
        with up.session() as uconn:
            infos = self._describe_tables(uconn)
            up.drop_slot(uconn)
            up.ensure_slot(uconn)
            lsn = up.flush_lsn(uconn)
        with self.ctx.connect() as conn, conn.transaction():
            rc = load_remap(conn, name)
            binding = remap.Binding(remap.next_binding_ts(rc, self.ctx.clock()),
                                    remap.last_frontier(rc).join(lsn_frontier(lsn)))
            append_binding(conn, name, rc.upper, binding)
            replace_tables(conn, name, infos, binding.ts)
            shards = [pg_table_shard(name, t.table) for t in infos]
            for i, shard in enumerate(shards):
                register_shard(conn, shard, source=name, output=0 if i == 0 else i + 1, kind=DATA_KIND)
            fresh = [s for s in shards if s not in uppers and shard_info(conn, s).upper == 0]
            if upper > 0 and fresh:  # a new table's collection: empty before the re-snapshot
                compare_and_append(conn, [Append(s, BatchDescription(0, upper)) for s in fresh])
        self._outputs = None
        m.update(binding_ts=binding.ts, lsn=lsn, tables=[t.table for t in infos], shards_upper=upper)
        return {"ts": binding.ts, "lsn": lsn, "tables": [t.table for t in infos]}

    def write(self, rc: RemapCollection, desc: BatchDescription, m: dict) -> WrittenBatch:
        """The transactions the bindings in ``desc`` cover, and the snapshot if ``desc`` holds the snapshot's
        binding (the first, or a re-snapshot's), as parts per table (``reclock.sources.postgres.cdc``; the upstream's
        ``reclock.sources.postgres.upstream``).

        A racing cycle cannot make this write append less than it should: the slot is advanced only to the
        resumption frontier, after an append, so a transaction the peek skips (committed below the slot's
        ``confirmed_flush``) is bound at a time below every shard's upper; a description that needed it has
        its ``lower`` below that upper, and its append is then a no-op or an ``UpperMismatch``, never an append.
        """
        up: PostgresUpstream = self.upstream()
        outputs = self.outputs()
        start = remap.source_upper_at(rc, desc.lower).get(LSN_PARTITION)
        end = remap.source_upper_at(rc, desc.upper).get(LSN_PARTITION)
        bindings = [(b.ts, b.frontier.get(LSN_PARTITION)) for b in rc.bindings]
        with self.ctx.connect() as conn:
            snap_ts = snapshot_ts(conn, self.ctx.spec.name)
        if snap_ts is None and start == 0:
            snap_ts = bindings[0][0]  # no data written yet: this description holds the first binding
        snapshot = snap_ts is not None and desc.lower <= snap_ts < desc.upper
        chunk = self.ctx.spec.budget.max_records
        prefix = f"{self.ctx.spec.name}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}"
        with self.ctx.connect() as conn:
            lease_write(conn, self.ctx.spec.name, prefix)
        try:
            failpoint("write_batches:before_job")
            writer = cdc.PartWriter(self.ctx.blob, prefix, outputs, chunk)
            rewind, snapshot_rows, upto, spark_done = None, 0, end, set()
            with up.session() as uconn:
                if snapshot:
                    t1, l1 = next((ts, lsn) for ts, lsn in bindings if ts == snap_ts)
                    start = l1
                    if desc.lower > 0:  # a re-snapshot: take back what each collection holds, at t1
                        with self.ctx.connect() as conn:
                            for out in outputs:
                                if shard_info(conn, out.shard).upper > 0:
                                    writer.retract(out.info.relid, read_as_of(conn, self.ctx.blob, out.shard,
                                                                              desc.lower - 1), t1)
                    with up.export_snapshot() as snap:
                        up.check_retained(uconn, min(l1, snap.lsn))
                        with up.snapshot_reader(snap) as sconn:
                            on_spark = self._snapshot_on_spark(sconn, outputs)
                            for out, predicates in on_spark:
                                snapshot_rows += self._spark_snapshot(sconn, snap.name, out, predicates, writer, t1,
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
                # the publication as registered (a row filter or column list changed since would land rows
                # filtered another way): checked after the binding was minted, so a change committed below
                # the LSN read up to is seen
                up.check_definitions(uconn, [o.info for o in outputs])
                decoder = cdc.ChangeDecoder(self.ctx.spec.name, outputs, writer, bindings, start, end, rewind,
                                            strict_tables=not self.ctx.spec.upstream.tables,
                                            truncated=lambda out, ts: self._truncated(writer, desc, out, ts,
                                                                                      spark_done))
                # the peek's cursor lives in a transaction; the blocks are closed (the helper thread joined) before
                # it ends, also when the decoder stops early
                with uconn.transaction(force_rollback=True), contextlib.closing(
                        up.read_blocks(uconn, upto, batch=max(1, min(chunk, 10_000)))) as blocks:
                    stats = decoder.feed_blocks(blocks)
            failpoint("write_batches:after_slice")
            emitted = writer.close()
            parts = cdc.collect(self.ctx.blob, self.ctx.spec.name, prefix, emitted, sorted(spark_done))
        except BaseException:
            with contextlib.suppress(Exception), self.ctx.connect() as conn:
                release_write(conn, prefix)
            raise
        parts[self.ctx.spec.errors_shard] = ()
        m.update(lower=desc.lower, upper=desc.upper, lsn_from=start, lsn_until=end, transactions=stats.transactions,
                 changes=stats.changes, messages=stats.messages, records_read=snapshot_rows + stats.changes,
                 records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
                 bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
        return WrittenBatch(desc, parts, (), prefix)


    def _truncated(self, writer: cdc.PartWriter, desc: BatchDescription, out: cdc.Output, ts: int,
                   on_spark: set) -> int:
        """A ``TRUNCATE`` of ``out``'s table at ``ts``: every row its collection holds at that point retracted at
        ``ts`` (the contents before the description, AS OF its lower - 1, plus this write's updates of the
        table so far, read back; in memory, as a re-snapshot's retraction is); the rows retracted. A table
        Spark snapshotted in this write stalls instead (``TableTruncated``: its parts are Spark's)."""
        if out.shard in on_spark:
            raise TableTruncated(self.ctx.spec.name, out.info.table, "TRUNCATE in the cycle that took its snapshot "
                                 "on Spark", "run the cycle again after `reclock resnapshot`")
        writer.flush(out.info.relid)
        updates = [writer.written(out.info.relid)]
        with self.ctx.connect() as conn:
            if desc.lower > 0 and shard_info(conn, out.shard).upper > 0:
                held = read_as_of(conn, self.ctx.blob, out.shard, desc.lower - 1)
                names = [n for n, _, _ in out.info.columns]
                if held.num_rows and sorted(held.column_names) == sorted([*names, "diff"]):
                    updates.append(held.select(names).append_column("ts", pa.array([0] * held.num_rows, pa.int64()))
                                   .append_column("diff", held["diff"]).cast(out.schema))
                elif held.num_rows:
                    raise TableTruncated(self.ctx.spec.name, out.info.table, "TRUNCATE of a collection whose columns "
                                         "changed in this write", "re-snapshot the source")
        parts = [u for u in updates if u is not None]
        contents = contents_as_of(pa.concat_tables(parts) if parts else None, ts)
        if "diff" in contents.column_names and contents.num_rows and len(contents.column_names) > 1:
            writer.retract(out.info.relid, contents, ts)
        return contents.num_rows


    def _snapshot_on_spark(self, sconn, outputs: Sequence[cdc.Output]) -> list[tuple[cdc.Output, list]]:
        """The tables whose snapshot Spark reads, with their partitions' predicates: those of at least the
        source's ``spark_snapshot_min_bytes`` whose columns Spark converts exactly, when the context has Spark."""
        least = self.ctx.spec.upstream.spark_snapshot_min_bytes
        if least is None or self.ctx.spark_factory is None:
            return []
        chosen = []
        for out in outputs:
            if out.info.partitioned:  # its rows are in its partitions' heaps: no page ranges of its own
                continue
            size, pages, block = PostgresUpstream.table_size(sconn, out.info.relid)
            if size >= least and spark_snapshot.convertible(out.info):
                chosen.append((out, spark_snapshot.partition_predicates(pages, spark_snapshot.SPLIT_BYTES // block)))
        return chosen


    def _spark_snapshot(self, sconn, snapshot: str, out: cdc.Output, predicates: Sequence[str],
                        writer: cdc.PartWriter, ts: int, prefix: str) -> int:
        """One table's snapshot written by Spark into the write's folder (``reclock.sources.postgres.spark_snapshot``),
        while ``sconn`` holds the exported ``snapshot`` open; its rows (``count(*)`` under the same snapshot) counted
        into ``writer``, so that ``reclock.sources.postgres.cdc.collect`` proves the parts hold exactly them."""
        rows = PostgresUpstream.count_rows(sconn, out.info)
        spark_snapshot.write_table_snapshot(self.ctx.spark(), spark_snapshot.jdbc_target(self.ctx.upstream), snapshot,
                                            out.info, ts, self.ctx.blob.url(f"{prefix}/{out.shard}/{cdc.SPARK_SNAPSHOT}"),
                                            predicates)
        writer.add_written(out.info.relid, rows)
        failpoint("write_batches:after_spark_snapshot")
        return rows


class PostgresKind(SourceKind):
    name = "postgres"
    title = "Postgres"
    from_time = "commit LSN"
    progress_columns = ("ts", "lsn")
    schedules = ("interval", "upstream")
    writes_on_spark = False

    def parse(self, name, raw, base):
        return parse_postgres_source(name, raw, base)

    def describe(self, spec) -> str:
        return f"Postgres publication {spec.upstream.publication} into {spec.name}__<table>"

    def find_upstream(self, spec, given: str | None = None) -> str:
        return find_upstream_dsn(spec.upstream, f"source {spec.name}")

    def open(self, ctx: CycleServices) -> PostgresSource:
        return PostgresSource(self, ctx)

    def progress_view(self) -> str:
        return LSN_PROGRESS

    def rebuild_refused(self, spec) -> str | None:
        return (f"source {spec.name}: a Postgres upstream keeps no history to replay; rebuilding means a fresh "
                "snapshot at a new binding (drop the source's shards and remap collection and let the next cycle "
                "snapshot it), never timestamps in the past")

    def resnapshot_refused(self, spec) -> str | None:
        return None

    def upstream_trigger(self, spec) -> Any:
        from reclock.sources.postgres.trigger import PublicationChanged

        return PublicationChanged(source=spec.name, publication=spec.upstream.publication,
                                  connection=spec.upstream.connection, dsn_env=spec.upstream.dsn_env,
                                  poll=spec.poll_s)

    def lag(self, spec, upstream: Any, timeout: float, dsn: str | None = None) -> Lag:
        return Lag(None, "a Postgres source: its slot's lag is not probed here")


POSTGRES = PostgresKind()
