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
append_effects      a write that took a snapshot: its LSN, recorded with the append
commit              the replication slot advanced to the LSN
resnapshot          a fresh snapshot at a new binding (DDL, a redefined publication, a lost slot); no rebuild (no history)
trigger, lag        ``PublicationChanged``; the slot's lag is not probed
==================  ========================================================================================
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import uuid
from dataclasses import replace
from typing import Any, Callable, ContextManager, Sequence

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reclock import remap
from reclock.batch import BatchDescription, mint_descriptions
from reclock.compaction import contents_as_of
from reclock.datasets import DatasetName, postgres_table
from reclock.errors import (ChunkRaced, ColumnReplaced, ConfigError, ReclockError, ShardsDisagree, SlotAheadOfConsensus, TableSchemaChanged,
                            TableTruncated, TruncatedUnderSnapshot)
from reclock.failpoints import failpoint
from reclock.part_layout import DATA_KIND, ERRORS_KIND, ERRORS_OUTPUT, INTERNAL_PREFIX
from reclock.persist.gc import lease_write, release_write
from reclock.persist.remap_store import append_binding, load_remap, newest_binding, register_source
from reclock.persist.schemas import load_history
from reclock.persist.shards import Append, compare_and_append, register_shard, shard_info
from reclock.read import read_as_of
from reclock.remap import RemapCollection
from reclock.schema_evolution import CollectionSchema, SchemaHistory, SchemaVersion
from reclock.schema_projection import part_schema
from reclock.sources.base import (Acknowledged, CycleServices, Lag, SourceKind, SourceRuntime, WrittenBatch,
                                  human_bytes)
from reclock.sources.postgres import cdc, chunks, ddl
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres import spark_snapshot
from reclock.sources.postgres.registration import (catalog_at, chunk_stages, chunked_snapshots, record_catalog,
                                                   record_chunk_progress, record_chunk_stage, record_snapshot_lsn,
                                                   record_table_snapshots, register_tables, registered_tables,
                                                   replace_tables, request_chunked_snapshot, request_table_snapshot,
                                                   snapshot_lsn, snapshot_ts, table_snapshot_lsns, table_snapshots,
                                                   update_tables)
from reclock.sources.postgres.spec import (SCHEDULES, find_upstream_dsn, parse_pg_table, parse_postgres_source,
                                          pg_table_shard)
from reclock.sources.postgres.upstream import LSN_PARTITION, PostgresUpstream, TableInfo, lsn_frontier, lsn_to_str
from reclock.time import PartitionedFrontier

SNAPSHOT_LSN_FILE = "snapshot_lsn"
"""Under a write's folder, after its parts were proved: the LSN of the snapshot it took, which its append
records."""
TABLE_SNAPSHOTS_FILE = "table_snapshots.json"
"""Under a write's folder, after its parts were proved: the pending snapshots of single tables it took (``{table:
its snapshot's LSN}``, None for one the source's own snapshot took), which its append clears."""
CHUNKS_FILE = "chunks.json"
"""Under a write's folder, after its parts were proved: the progress of the chunked snapshots whose chunks it
landed (``{table: progress, or None once its last chunk is in}``), which its append records."""
TABLES_FILE = "tables.json"
"""Under a write's folder, after its parts were proved: the source's tables with the columns DDL that flowed
gave them (``reclock.sources.postgres.ddl``), which its append registers."""
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

    def lineage_inputs(self) -> tuple[DatasetName, ...]:
        """The published tables the source takes (none before its first mint registers them)."""
        try:
            return tuple(postgres_table(self.ctx.upstream, o.info.table) for o in self.outputs())
        except ConfigError:
            return ()

    def shards(self) -> tuple[str, ...]:
        """The registered tables' shards and the error collection."""
        return (*(o.shard for o in self.outputs()), self.ctx.spec.errors_shard)

    def probe_upper(self) -> PartitionedFrontier:
        """The upstream's upper with its tables' columns in the catalog as of it (``PostgresUpstream.probe_upper``),
        which the write up to it reads (``registration.catalog_at``, :meth:`_numbered`). A continuous source's
        upper stays at its newest binding while nothing calls for another (:meth:`_unmoved`; a table snapshot
        pending, or chunks to read, always does)."""
        with self.ctx.connect() as conn:
            tables = registered_tables(conn, self.name) or []
            chunked = chunked_snapshots(conn, self.name) if tables else {}
            # continuous: may bind nothing, unless a snapshot of a table of its own is pending (it joined the
            # publication, `resnapshot --table`) or chunks are to read
            quiet = (self.ctx.spec.schedule == "continuous" and tables and not chunked
                     and not table_snapshots(conn, self.name))
            newest = newest_binding(conn, self.name) if quiet else None
        if newest is not None:
            unmoved = self._unmoved(*newest)
            if unmoved is not None:
                return unmoved
        stage = self._read_chunks(tables, chunked) if chunked else {}
        upper, catalog = self.upstream().probe_upper(tables)
        if tables:
            with self.ctx.connect() as conn:
                record_catalog(conn, self.name, upper.get(LSN_PARTITION), catalog)
                if stage:
                    record_chunk_stage(conn, self.name, upper.get(LSN_PARTITION), stage)
        return upper

    def _unmoved(self, ts: int, offsets: dict[int, int]) -> PartitionedFrontier | None:
        """The newest binding's upper (``ts``, ``offsets``) when a continuous source has nothing to bind past it
        (``PostgresUpstream.reason_to_bind``: no published change committed since, no WAL to release), so its
        mint binds nothing; else None. The flush LSN moves with any WAL the server writes (other databases,
        checkpoints, Reclock's own consensus on the same server), so binding it at every idle cycle would mint
        a binding every ``poll`` and never let the source idle. Without a replication slot free for the
        look's copy it binds (None), as an interval source would."""
        lsn = offsets.get(LSN_PARTITION, 0)
        up = self.upstream()
        with up.session() as uconn:
            try:
                reason = up.reason_to_bind(uconn, lsn, ts, self.ctx.clock())
            except psycopg.errors.ConfigurationLimitExceeded:
                return None
        return None if reason is not None else lsn_frontier(lsn)

    def _read_chunks(self, tables: Sequence[TableInfo], chunked: dict[str, dict]) -> dict[str, dict]:
        """The next chunks of the tables snapshotted online (``reclock.sources.postgres.chunks``), read before the
        upper the mint binds, so they land at its binding: per table, in key order from its progress, until the
        cycle read ``snapshot_cycle_rows`` rows (one chunk at least) or the table's last key; their rows written
        (ts 0) under a folder of their own, which the write of that binding takes. ``{table: {"prefix", "from",
        "chunks", "rows"}}``."""
        spec, name, up = self.ctx.spec.upstream, self.ctx.spec.name, self.upstream()
        by = {t.table: t for t in tables}
        left, stage = spec.snapshot_cycle_rows, {}
        for table, progress in sorted(chunked.items()):
            info = by.get(table)
            if info is None or left <= 0:
                continue
            out = cdc.Output(info, pg_table_shard(name, table))
            prefix = f"{name}/chunks/{uuid.uuid4().hex}"
            with self.ctx.connect() as conn:
                lease_write(conn, name, prefix)  # garbage once stale: a write takes the rows into parts of its own
            writer = cdc.PartWriter(self.ctx.blob, prefix, [out], self.ctx.spec.budget.max_records)

            def read(conn, query, out=out, writer=writer) -> int:
                self._check_snapshot_columns(conn, [out])
                return cdc.copy_rows(conn, query, out, writer, 0)

            after = None if progress.get("done") is None else tuple(progress["done"])
            stop = progress.get("stop")
            if stop is None:  # the first chunk: the table's last key now ends the snapshot (read_chunk)
                with up.session() as uconn:
                    stop = PostgresUpstream.last_key(uconn, info)
            stop = None if stop is None else tuple(stop)
            got = []
            while left > 0:
                c = up.read_chunk(info, after, min(spec.snapshot_chunk_rows, max(1, left)), read, stop)
                failpoint("mint:after_chunk")
                got.append(c)
                left -= max(1, c.rows)
                if c.last is None:
                    break
                after = c.last
            rows = writer.close().get(out.shard, 0)
            stage[table] = {"prefix": prefix, "from": progress.get("done"), "chunks": [c.to_json() for c in got],
                            "rows": rows, "stop": None if stop is None else list(stop)}
        return stage

    def probe_metrics(self) -> dict:
        """How long the last probe waited for the WAL to be flushed up to its upper (``flush_wait_ms``)."""
        waited = self.upstream().flush_waited_ms
        return {} if waited is None else {"flush_wait_ms": waited}

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
        Every cycle checks the tables are still published with the replica identity they were registered
        with (FULL, or a key: ``reclock.sources.postgres.upstream``). The slot is created
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
                tables = self._joined(uconn, tables) if bound and not self.ctx.spec.upstream.tables else tables
                up.check_tables(uconn, tables)
            if not bound:
                up.ensure_slot(uconn)
        with self.ctx.connect() as conn:
            for i, t in enumerate(tables):
                register_shard(conn, pg_table_shard(name, t.table), source=name, output=0 if i == 0 else i + 1,
                               kind=DATA_KIND)
            register_shard(conn, self.ctx.spec.errors_shard, source=name, output=ERRORS_OUTPUT, kind=ERRORS_KIND)


    def _joined(self, uconn, tables: list) -> list:
        """A source that takes every table of its publication, once its first snapshot is in: each table that
        joined the publication since is registered with a snapshot of its own pending (:meth:`_snapshot_table`:
        taken online by the write of the next binding while the other tables stream); the tables as now
        registered."""
        name = self.ctx.spec.name
        have = {t.table for t in tables}
        joined = [t for t in self.upstream().published_tables(uconn) if parse_pg_table(name, t) not in have]
        if not joined:
            return tables
        with self.ctx.connect() as conn:
            if shard_info(conn, pg_table_shard(name, tables[0].table)).upper == 0:
                return tables  # the first snapshot is still to be appended; it takes every registered table
        for table in joined:
            tables = self._snapshot_table(uconn, parse_pg_table(name, table))
        return tables

    def _snapshot_table(self, uconn, table: str) -> list:
        """Register ``table`` (new to the source, or described again: its columns, oid and identity as they are
        now) with a snapshot of its own pending at the next binding (``registration.table_snapshots``); a new
        table gets a shard of its own, empty up to the others' upper. The tables as now registered."""
        name = self.ctx.spec.name
        info, = self._describe(uconn, [table])
        with self.ctx.connect() as conn, conn.transaction():
            tables = registered_tables(conn, name) or []
            was = next((t for t in tables if t.table == table), None)
            if was is not None:
                refused = ddl.kept_types_refused(was.columns, info.columns)
                if refused:
                    raise TableSchemaChanged(name, table, f"a re-snapshot cannot take it: {refused.refused}, and its "
                                             "collection holds values of the old type", ddl.remedy(name, table, refused))
            shards = [pg_table_shard(name, t.table) for t in tables]
            uppers = {s: shard_info(conn, s).upper for s in [*shards, self.ctx.spec.errors_shard]}
            if len(set(uppers.values())) != 1:
                raise ShardsDisagree(name, uppers)
            upper = next(iter(uppers.values()))
            tables = [info if t.table == table else t for t in tables] if was is not None else [*tables, info]
            at = load_remap(conn, name).upper
            if chunks.chunkable(info):  # read online in chunks (reclock.sources.postgres.chunks)
                per = self.ctx.spec.upstream.snapshot_chunk_rows
                request_chunked_snapshot(conn, name, tables, info, at,
                                         max(1, -(-PostgresUpstream.estimate_rows(uconn, info) // per)))
            else:
                request_table_snapshot(conn, name, tables, info, at)
                record_chunk_progress(conn, name, {table: None})
            shard = pg_table_shard(name, table)
            if was is None:
                register_shard(conn, shard, source=name, output=len(tables), kind=DATA_KIND)
                if upper > 0 and shard_info(conn, shard).upper == 0:  # its collection: empty before its snapshot
                    compare_and_append(conn, [Append(shard, BatchDescription(0, upper))])
        self._outputs = None
        return tables

    def resnapshot_table(self, table: str, metrics: dict) -> dict:
        """``reclock resnapshot <source> --table <t>``: take table ``t`` from a fresh snapshot of its own at the
        next binding while the source's other tables stream on (the slot stays): its registration is described
        again (:meth:`_snapshot_table`), and the write of the next binding retracts what its collection holds
        and writes the snapshot at that binding's timestamp. ``t`` may be new to the source (a table of its
        publication, or of its ``tables:``)."""
        name = self.ctx.spec.name
        with self.ctx.connect() as conn:
            if registered_tables(conn, name) is None:
                raise ConfigError(f"source {name}: it has not run yet; its first cycle takes the snapshot")
        table = parse_pg_table(name, table)
        listed = self.ctx.spec.upstream.tables
        if listed and table not in listed:
            raise ConfigError(f"source {name}: table {table} is not among its `tables:` ({', '.join(listed)}); add "
                              "it there first")
        with self.upstream().session() as uconn:
            tables = self._snapshot_table(uconn, table)
        with self.ctx.connect() as conn:
            at = table_snapshots(conn, name).get(table)
            if at is None:
                at = chunked_snapshots(conn, name)[table]["at"]
        metrics.update(table=table, at_ts=at, tables=[t.table for t in tables])
        return {"table": table, "at_ts": at, "tables": [t.table for t in tables]}

    def _describe(self, uconn, names: Sequence[str]) -> list:
        """``names`` described upstream (``PostgresUpstream.describe``) and checked for column names a
        collection keeps for its own."""
        name = self.ctx.spec.name
        infos = self.upstream().describe(uconn, names)
        for info in infos:
            taken = [c for c, _, _ in info.columns if c in ("ts", "diff") or c.startswith(INTERNAL_PREFIX)]
            if taken:
                raise ConfigError(f"source {name}: table {info.table} has column(s) {', '.join(taken)}, names "
                                  "a collection keeps for its own (ts, diff, _reclock_*); rename the column(s) "
                                  "upstream, or leave the table out of `tables:`")
        return infos

    def _describe_tables(self, uconn) -> list:
        """The tables a Postgres source takes (its ``tables:``, else every table of its publication), described
        upstream (published, with an identity that names old rows) and checked for column names a collection
        keeps for its own."""
        up, name = self.upstream(), self.ctx.spec.name
        names = self.ctx.spec.upstream.tables or [parse_pg_table(name, t) for t in up.published_tables(uconn)]
        return self._describe(uconn, names)

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
        with self.ctx.connect() as conn:
            registered = {t.table: t for t in registered_tables(conn, name) or ()}
        with up.session() as uconn:
            infos = self._describe_tables(uconn)
            for info in infos:
                was = registered.get(info.table)
                refused = was is not None and ddl.kept_types_refused(was.columns, info.columns)
                if refused:
                    raise TableSchemaChanged(name, info.table, f"a re-snapshot cannot take it: {refused.refused}, and "
                                             "its collection holds values of the old type",
                                             ddl.remedy(name, info.table, refused))
            up.drop_slot(uconn)
            up.ensure_slot(uconn)
            lsn, catalog = up.catalog_upper(uconn, infos)
        with self.ctx.connect() as conn, conn.transaction():
            rc = load_remap(conn, name)
            binding = remap.Binding(remap.next_binding_ts(rc, self.ctx.clock()),
                                    remap.last_frontier(rc).join(lsn_frontier(lsn)))
            append_binding(conn, name, rc.upper, binding)
            replace_tables(conn, name, infos, binding.ts)
            record_catalog(conn, name, binding.frontier.get(LSN_PARTITION), catalog)
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
            key_from = snapshot_lsn(conn, self.ctx.spec.name) or 0
            pending, table_lsns = table_snapshots(conn, self.ctx.spec.name), table_snapshot_lsns(conn, self.ctx.spec.name)
        if snap_ts is None and start == 0:
            snap_ts = bindings[0][0]  # no data written yet: this description holds the first binding
        snapshot = snap_ts is not None and desc.lower <= snap_ts < desc.upper
        # tables snapshotted on their own in this write (joined the publication, `resnapshot --table`), each at the
        # first binding at or after its request; the source's own snapshot takes them all
        singles: dict[str, int] = {}
        for out in outputs:
            at = pending.get(out.info.table)
            ts_at = None if at is None or snapshot else next(
                (ts for ts, _ in bindings if ts >= max(at, desc.lower) and ts < desc.upper), None)
            if ts_at is not None:
                singles[out.shard] = ts_at
        done: dict[str, int | None] = {t: None for t in pending} if snapshot else {}
        resnapshot_chunks: dict[str, int] = {}  # shards whose online snapshot lands its first chunks: at that ts
        starts: dict[int, cdc.TableStart] = {}
        chunk = self.ctx.spec.budget.max_records
        prefix = f"{self.ctx.spec.name}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}"
        with self.ctx.connect() as conn:
            lease_write(conn, self.ctx.spec.name, prefix)
        try:
            failpoint("write_batches:before_job")
            writer = cdc.PartWriter(self.ctx.blob, prefix, outputs, chunk)
            rewind, snapshot_rows, upto, spark_done = None, 0, end, set()
            held_before: dict[str, CollectionSchema] = {}  # a re-snapshot: each collection's columns before it
            with up.session() as uconn:
                if snapshot:
                    t1, l1 = next((ts, lsn) for ts, lsn in bindings if ts == snap_ts)
                    start = l1
                    if desc.lower > 0:  # a re-snapshot: take back what each collection holds, at t1
                        with self.ctx.connect() as conn:
                            for out in outputs:
                                if shard_info(conn, out.shard).upper > 0:
                                    held = read_as_of(conn, self.ctx.blob, out.shard, desc.lower - 1)
                                    held_before[out.shard] = part_schema(held.schema, [
                                        n for n in held.column_names if n != "diff"])
                                    writer.retract(out.info.relid, held, t1)
                    with up.export_snapshot() as snap:
                        up.check_retained(uconn, min(l1, snap.lsn))
                        with up.snapshot_reader(snap) as sconn:
                            on_spark = self._snapshot_on_spark(sconn, outputs)
                            for out, predicates in on_spark:
                                snapshot_rows += self._spark_snapshot(sconn, snap.name, out, predicates, writer, t1,
                                                                 prefix)
                            spark_done = {out.shard for out, _ in on_spark}
                            snapshot_rows += cdc.read_snapshot(sconn, [o for o in outputs if o.shard not in spark_done],
                                                               writer, t1, chunk, self.ctx.spec.name)
                            self._check_snapshot_columns(sconn, outputs)
                    key_from = snap.lsn
                    if snap.lsn != l1:
                        rewind = cdc.Rewind(t1, min(l1, snap.lsn), max(l1, snap.lsn), -1 if snap.lsn > l1 else 1)
                        upto = max(upto, snap.lsn)
                    m.update(snapshot_rows=snapshot_rows, snapshot_lsn=snap.lsn, first_lsn=l1,
                             snapshot_on_spark=sorted(spark_done))
                else:
                    up.check_retained(uconn, start)
                if singles:
                    upto = max(upto, self._single_snapshots(uconn, desc, outputs, singles, bindings, key_from, writer,
                                                            held_before, starts, done, spark_done, prefix, m))
                chunked, chunk_progress = self._land_chunks(desc, outputs, bindings, writer, snapshot, held_before,
                                                            resnapshot_chunks, m)
                for out in outputs:  # a key table snapshotted on its own takes no change below its snapshot's LSN
                    lsn = table_lsns.get(out.info.table, 0)
                    if out.info.relid not in starts and not snapshot and out.info.keyed and lsn > max(start, key_from):
                        starts[out.info.relid] = cdc.TableStart(key_from=lsn)
                for relid in chunked:  # their changes message by message (ChangeDecoder._chunked_change)
                    starts.setdefault(relid, cdc.TableStart())
                # the publication as registered (a row filter or column list changed since would land rows
                # filtered another way): checked after the binding was minted, so a change committed below
                # the LSN read up to is seen
                up.check_definitions(uconn, [o.info for o in outputs])
                catalog = self._catalog(uconn, outputs, end)
                decoder = cdc.ChangeDecoder(self.ctx.spec.name, outputs, writer, bindings, start, end, rewind,
                                            strict_tables=not self.ctx.spec.upstream.tables,
                                            truncated=lambda out, ts: self._truncated(writer, desc, out, ts,
                                                                                      spark_done),
                                            prior=lambda out: self._held(desc, out), key_from=key_from,
                                            added_columns=self._added_columns,
                                            refill=lambda out, now, fills, ts: self._refill(
                                                writer, desc, out, now, fills, ts, spark_done),
                                            catalog=catalog, table_starts=starts, chunked=chunked)
                # the peek's cursor lives in a transaction; the blocks are closed (the helper thread joined) before
                # it ends, also when the decoder stops early
                with uconn.transaction(force_rollback=True), contextlib.closing(
                        up.read_blocks(uconn, upto, batch=max(1, min(chunk, 10_000)))) as blocks:
                    stats = decoder.feed_blocks(blocks)
                self._check_raced(outputs, chunked, decoder.seen)
                numbered = self._numbered(outputs, decoder, catalog)
            failpoint("write_batches:after_slice")
            emitted = writer.close()
            parts = cdc.collect(self.ctx.blob, self.ctx.spec.name, prefix, emitted, sorted(spark_done))
            if snapshot:  # the append that makes the snapshot visible records its LSN (append_effects)
                self.ctx.blob.put_bytes(f"{prefix}/{SNAPSHOT_LSN_FILE}", str(key_from).encode())
            if done:  # and the single tables' snapshots it took, no longer pending
                self.ctx.blob.put_bytes(f"{prefix}/{TABLE_SNAPSHOTS_FILE}", json.dumps(done).encode())
            if chunk_progress:  # and the chunked snapshots' progress
                self.ctx.blob.put_bytes(f"{prefix}/{CHUNKS_FILE}", json.dumps(chunk_progress).encode())
            resnapshot_at = {o.shard: t1 for o in outputs} if snapshot and desc.lower > 0 else \
                {**singles, **resnapshot_chunks}
            schemas = self._schema_versions(desc, outputs, decoder, resnapshot_at, held_before)
            if any(numbered[o.info.relid] != o.info for o in outputs):
                # DDL that flowed, column numbers: the append registers the tables' new columns (append_effects)
                tables = [numbered[o.info.relid].to_json() for o in outputs]
                self.ctx.blob.put_bytes(f"{prefix}/{TABLES_FILE}", json.dumps(tables).encode())
        except BaseException:
            with contextlib.suppress(Exception), self.ctx.connect() as conn:
                release_write(conn, prefix)
            raise
        parts[self.ctx.spec.errors_shard] = ()
        if schemas:
            m.update(schema_changes={s: [v.cause for v in vs] for s, vs in schemas.items()})
        m.update(lower=desc.lower, upper=desc.upper, lsn_from=start, lsn_until=end, transactions=stats.transactions,
                 changes=stats.changes, messages=stats.messages, records_read=snapshot_rows + stats.changes,
                 records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
                 bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
        return WrittenBatch(desc, parts, (), prefix, schemas=schemas)


    def append_effects(self, written: WrittenBatch, metrics: dict) -> Callable[[Any], None] | None:
        """A write that took a snapshot: its LSN recorded with the append (``registration.snapshot_lsn``: the
        key tables of the following writes take no change below it). A write in which DDL flowed: the tables'
        new columns registered with the append (the next write compares its Relation messages with them)."""
        if written.prefix is None:
            return None
        effects = []
        path = f"{written.prefix}/{SNAPSHOT_LSN_FILE}"
        if self.ctx.blob.exists(path):
            lsn = int(self.ctx.blob.get_bytes(path))
            metrics.update(snapshot_lsn=lsn)
            effects.append(lambda conn: record_snapshot_lsn(conn, self.ctx.spec.name, lsn))
        path = f"{written.prefix}/{TABLE_SNAPSHOTS_FILE}"
        if self.ctx.blob.exists(path):
            done = json.loads(self.ctx.blob.get_bytes(path))
            metrics.update(table_snapshots=done)
            effects.append(lambda conn: record_table_snapshots(conn, self.ctx.spec.name, done))
        path = f"{written.prefix}/{CHUNKS_FILE}"
        if self.ctx.blob.exists(path):
            progress = json.loads(self.ctx.blob.get_bytes(path))
            metrics.update(chunked_snapshots=progress)
            effects.append(lambda conn: record_chunk_progress(conn, self.ctx.spec.name, progress))
        path = f"{written.prefix}/{TABLES_FILE}"
        if self.ctx.blob.exists(path):
            tables = [TableInfo.from_json(d) for d in json.loads(self.ctx.blob.get_bytes(path))]
            metrics.update(tables_evolved=[t.table for t in tables])
            effects.append(lambda conn: update_tables(conn, self.ctx.spec.name, tables))
            self._outputs = None  # the next write of this context reads the new registration
        if not effects:
            return None

        def apply(conn) -> None:
            for effect in effects:
                effect(conn)
        return apply

    def _added_columns(self, out: cdc.Output, added: tuple) -> tuple[str | None, dict]:
        """What the rows ``out``'s table held when DDL added the columns ``added`` hold there
        (``PostgresUpstream.added_columns``), in a session of its own (the write's holds the peek)."""
        with contextlib.closing(self.upstream().connect()) as conn:
            return PostgresUpstream.added_columns(conn, out.info, added)

    def _catalog(self, uconn, outputs: Sequence[cdc.Output], end: int) -> dict[int, ddl.CatalogTable]:
        """The tables in the catalog as of the write's upper ``end`` (the mint's, ``registration.catalog_at``; as
        it is now if none was kept, which can only stall more, never less): the decoder tells renames by it
        (``ddl.classify``) and :meth:`_numbered` checks the stream against it."""
        with self.ctx.connect() as conn:
            catalog = catalog_at(conn, self.ctx.spec.name, end)
        if catalog is None or any(o.info.relid not in catalog for o in outputs):
            catalog = PostgresUpstream.read_catalog(uconn, [o.info for o in outputs])
        return catalog

    def _numbered(self, outputs: Sequence[cdc.Output], decoder: cdc.ChangeDecoder,
                  catalog: dict[int, ddl.CatalogTable]) -> dict[int, TableInfo]:
        """Each table as the write leaves it (``decoder.evolved``), with its columns' numbers, after checking
        what the stream showed against the catalog as of the write's upper (:meth:`_catalog`):
        ``ColumnReplaced`` (nothing appended) for a column dropped and added again where no Relation message
        showed it (``ddl.number_columns``)."""
        name = self.ctx.spec.name
        numbered = {}
        for out in outputs:
            info = out.info
            got = ddl.number_columns([c for c, _, _ in info.columns], info.attnums, info.attnum_upto,
                                     decoder.adopted.get(info.relid, ()), catalog[info.relid], info.column_list,
                                     decoder.renamed.get(info.relid, ()))
            if got.refused is not None:
                raise ColumnReplaced(name, info.table, got.refused, ddl.resnapshot_remedy(name))
            numbered[info.relid] = replace(decoder.evolved.get(info.relid, info), attnums=got.attnums,
                                           attnum_upto=got.upto if info.attnums is not None or got.attnums is not None
                                           else info.attnum_upto)
        return numbered

    def _check_snapshot_columns(self, sconn, outputs: Sequence[cdc.Output]) -> None:
        """The tables' published columns in the snapshot are the registered ones, by name, type and number: DDL
        between the registration (or a re-snapshot's) and the snapshot would give rows the snapshot read without
        the new columns' values."""
        for out in outputs:
            numbered = PostgresUpstream.numbered_columns(sconn, out.info)
            now = tuple(c for c, _ in numbered)
            if out.info.attnums is not None and now == out.info.columns and \
                    tuple(a for _, a in numbered) != out.info.attnums:
                raise ColumnReplaced(self.ctx.spec.name, out.info.table, "a column was dropped and added again "
                                     "between the source's registration and its snapshot (column numbers "
                                     f"{', '.join(map(str, out.info.attnums))} are now "
                                     f"{', '.join(str(a) for _, a in numbered)})",
                                     ddl.resnapshot_remedy(self.ctx.spec.name))
            if now != out.info.columns:
                change = ddl.classify(out.info.columns, now)
                raise TableSchemaChanged(self.ctx.spec.name, out.info.table, "DDL changed its columns between the "
                                         f"source's registration and its snapshot ({change.refused or change.describe()})",
                                         ddl.resnapshot_remedy(self.ctx.spec.name))

    def _schema_versions(self, desc: BatchDescription, outputs: Sequence[cdc.Output], decoder: cdc.ChangeDecoder,
                         resnapshot_at: dict[str, int], held_before: dict[str, CollectionSchema]
                         ) -> dict[str, tuple[SchemaVersion, ...]]:
        """The schema versions ``desc`` begins, per shard: a re-snapshot's columns at its timestamp when they
        are not the collection's before (``held_before``: what it held, read back; ``resnapshot_at``: the shards a
        snapshot took, at its timestamp), and each change DDL made
        (``decoder.versions``). A collection with no recorded history (its columns were the parts' own) first
        records its columns before the change at the description's lower (when the change is later): reads
        before the change keep them."""
        out_versions: dict[str, tuple[SchemaVersion, ...]] = {}
        with self.ctx.connect() as conn:
            for out in outputs:
                mine = list(decoder.versions.get(out.shard, ()))
                history = load_history(conn, out.shard)
                self._check_renames(out, history, mine, decoder.schema_before.get(out.shard, out.info.columns))
                before = history.latest() or held_before.get(out.shard)
                now = ddl.collection_schema(out.info.columns)
                resnapshot_ts = resnapshot_at.get(out.shard)
                if resnapshot_ts is not None and before is not None and before != now:
                    if not (mine and mine[0].since_ts == resnapshot_ts):
                        mine.insert(0, SchemaVersion(resnapshot_ts, now, ddl.relation_json(out.info.columns),
                                                     f"{out.info.table}: re-snapshot"))
                    if not history.versions and desc.lower < resnapshot_ts:
                        mine.insert(0, SchemaVersion(desc.lower, before, "{}", f"{out.info.table}: its columns "
                                                     "before the re-snapshot"))
                elif mine and not history.versions and mine[0].since_ts > desc.lower:
                    before = decoder.schema_before[out.shard]
                    mine.insert(0, SchemaVersion(desc.lower, ddl.collection_schema(before), ddl.relation_json(before),
                                                 f"{out.info.table}: its columns before DDL"))
                if mine:
                    out_versions[out.shard] = tuple(mine)
        return out_versions

    def _check_renames(self, out: cdc.Output, history: SchemaHistory, mine: Sequence[SchemaVersion],
                       before: Sequence[ddl.PgColumn]) -> None:
        """``TableSchemaChanged`` (nothing appended) for a rename in this write's versions to a name another
        column held in the collection's history (``SchemaHistory.rename_refused``: a read could not tell them
        apart in the parts written then; ``before``: its columns before the write, for a collection with no
        recorded history)."""
        if not any(c.renamed_from for v in mine for c in v.schema.columns):
            return
        if not history.versions:
            history = SchemaHistory((SchemaVersion(-1, ddl.collection_schema(before)),))
        for v in mine:
            for c in v.schema.columns:
                if c.renamed_from:
                    why = history.rename_refused(c.renamed_from, c.name)
                    if why is not None:
                        raise TableSchemaChanged(self.ctx.spec.name, out.info.table, f"DDL renamed column "
                                                 f"{c.renamed_from} to {c.name}: {why}",
                                                 ddl.resnapshot_remedy(self.ctx.spec.name))
            history = history.with_change(v.since_ts, v.schema)

    def _held(self, desc: BatchDescription, out: cdc.Output) -> pa.Table | None:
        """What ``out``'s collection holds before ``desc`` (AS OF its lower - 1: data columns and diff), None
        if nothing: a key table's current rows start from it (``reclock.sources.postgres.cdc``)."""
        if desc.lower == 0:
            return None
        with self.ctx.connect() as conn:
            if shard_info(conn, out.shard).upper == 0:
                return None
            return read_as_of(conn, self.ctx.blob, out.shard, desc.lower - 1)

    def _truncated(self, writer: cdc.PartWriter, desc: BatchDescription, out: cdc.Output, ts: int,
                   on_spark: set) -> int:
        """A ``TRUNCATE`` of ``out``'s table at ``ts``: every row its collection holds at that point retracted at
        ``ts`` (:meth:`_contents`); the rows retracted. A table Spark snapshotted in this write stalls instead
        (``TableTruncated``: its parts are Spark's)."""
        if out.shard in on_spark:
            raise TableTruncated(self.ctx.spec.name, out.info.table, "TRUNCATE in the cycle that took its snapshot "
                                 "on Spark", "run the cycle again after `reclock resnapshot`")
        contents = self._contents(writer, desc, out, ts, lambda: TableTruncated(
            self.ctx.spec.name, out.info.table, "TRUNCATE of a collection whose columns changed in this write",
            "re-snapshot the source"))
        if contents.num_rows:
            writer.retract(out.info.relid, contents, ts)
        return contents.num_rows

    def _refill(self, writer: cdc.PartWriter, desc: BatchDescription, out: cdc.Output, now: cdc.Output,
                fills: dict, ts: int, on_spark: set) -> int:
        """``ADD COLUMN ... DEFAULT`` on ``out``'s table at ``ts`` (``now``: its new columns; ``fills``: each
        added column's value in the rows it held, as text, None for null): every row its collection holds at
        that point (:meth:`_contents`) retracted at ``ts`` and added again with the added columns' values, as
        the table shows them from then on; the writer takes the new columns. The updates written."""
        if out.shard in on_spark:
            raise TableSchemaChanged(self.ctx.spec.name, out.info.table, "ADD COLUMN ... DEFAULT in the cycle that "
                                     "took its snapshot on Spark", f"run `reclock resnapshot {self.ctx.spec.name}`")
        contents = self._contents(writer, desc, out, ts, lambda: TableSchemaChanged(
            self.ctx.spec.name, out.info.table, "ADD COLUMN ... DEFAULT on a collection whose columns it cannot read",
            f"run `reclock resnapshot {self.ctx.spec.name}`"))
        relid = out.info.relid
        if contents.num_rows:
            writer.retract(relid, contents, ts)
        writer.reshape(relid, now)
        if not contents.num_rows:
            return 0
        again = cdc.conform(contents, now)
        n = contents.num_rows
        for i, (name, oid, typmod) in enumerate(now.info.columns):
            if name in fills:
                value = po.text_column(oid, typmod, [fills[name]] * n, f"{now.info.table}.{name}")
                again = again.set_column(i, now.schema.field(i), value.cast(now.schema.field(i).type))
        again = again.append_column("ts", pa.array([ts] * n, pa.int64())).drop_columns(["diff"]) \
            .append_column("diff", again["diff"])
        writer.add_typed(relid, again.select(now.schema.names).cast(now.schema))
        return 2 * n

    def _contents(self, writer: cdc.PartWriter, desc: BatchDescription, out: cdc.Output, ts: int,
                  unreadable: Callable[[], ReclockError]) -> pa.Table:
        """Every row ``out``'s collection holds at ``ts`` in this write (data columns and diff): the contents
        before the description, AS OF its lower - 1, plus this write's updates of the table so far, read back
        (in memory, as a re-snapshot's retraction is); ``unreadable()`` is raised for contents it cannot read
        as ``out``'s columns."""
        writer.flush(out.info.relid)
        updates = [writer.written(out.info.relid)]
        with self.ctx.connect() as conn:
            if desc.lower > 0 and shard_info(conn, out.shard).upper > 0:
                held = read_as_of(conn, self.ctx.blob, out.shard, desc.lower - 1)
                as_updates = cdc.held_updates(held, out) if held.num_rows else None
                if as_updates is not None:
                    updates.append(as_updates)
                elif held.num_rows:
                    raise unreadable()
        parts = [u for u in updates if u is not None]
        contents = contents_as_of(pa.concat_tables(parts) if parts else None, ts)
        if "diff" not in contents.column_names or len(contents.column_names) == 1:
            return out.schema.empty_table().drop_columns(["ts"])
        return contents


    def _single_snapshots(self, uconn, desc: BatchDescription, outputs: Sequence[cdc.Output], singles: dict[str, int],
                          bindings: Sequence[tuple[int, int]], key_from: int, writer: cdc.PartWriter,
                          held_before: dict[str, CollectionSchema], starts: dict[int, cdc.TableStart],
                          done: dict[str, int | None], spark_done: set, prefix: str, m: dict) -> int:
        """The snapshots of single tables (``singles``: shard -> the ts of the binding it lands at), under one
        exported snapshot at LSN S, while the write streams the other tables: at its binding ``t1`` (LSN ``l1``)
        each table's collection retracts what it held before the description and takes the snapshot's rows; its
        changes below ``l1`` are not taken (the bindings before ``t1`` keep what it held), those between ``l1``
        and S are taken back at ``t1`` (a ``FULL`` table: exact at ``t1``) or, for a key table, not at all (the
        snapshot holds them: the seam, as the source's own snapshot's). ``starts``, ``done`` and ``spark_done``
        (the shards Spark wrote) are filled in; the LSN the write must read up to (S) returned."""
        up, name = self.upstream(), self.ctx.spec.name
        mine = [o for o in outputs if o.shard in singles]
        with self.ctx.connect() as conn:
            for out in mine:
                if desc.lower > 0 and shard_info(conn, out.shard).upper > 0:
                    held = read_as_of(conn, self.ctx.blob, out.shard, desc.lower - 1)
                    held_before[out.shard] = part_schema(held.schema, [n for n in held.column_names if n != "diff"])
                    if held.num_rows:
                        writer.retract(out.info.relid, held, singles[out.shard])
        rows = 0
        with up.export_snapshot() as snap:
            with up.snapshot_reader(snap) as sconn:
                on_spark = self._snapshot_on_spark(sconn, mine)
                for out, predicates in on_spark:
                    rows += self._spark_snapshot(sconn, snap.name, out, predicates, writer, singles[out.shard], prefix)
                spark = {o.shard for o, _ in on_spark}
                spark_done |= spark
                for out in mine:
                    if out.shard not in spark:
                        rows += cdc.read_snapshot(sconn, [out], writer, singles[out.shard],
                                                  self.ctx.spec.budget.max_records, name)
                self._check_snapshot_columns(sconn, mine)
                failpoint("write_batches:after_table_snapshot")
        lsn_at = dict(bindings)
        for out in mine:
            t1 = singles[out.shard]
            l1 = lsn_at[t1]
            rewind = None if snap.lsn == l1 else cdc.Rewind(t1, min(l1, snap.lsn), max(l1, snap.lsn),
                                                             -1 if snap.lsn > l1 else 1)
            starts[out.info.relid] = cdc.TableStart(l1, rewind, max(key_from, snap.lsn))
            done[out.info.table] = snap.lsn
        m.update(table_snapshots={o.info.table: singles[o.shard] for o in mine}, table_snapshot_rows=rows,
                 table_snapshot_lsn=snap.lsn, table_snapshot_on_spark=sorted(spark))
        return snap.lsn

    def _land_chunks(self, desc: BatchDescription, outputs: Sequence[cdc.Output], bindings: Sequence[tuple[int, int]],
                     writer: cdc.PartWriter, snapshot: bool, held_before: dict[str, CollectionSchema],
                     first: dict[str, int], m: dict) -> tuple[dict[int, chunks.ChunkedTable], dict[str, dict | None]]:
        """The chunks of the tables snapshotted online that this write lands (``reclock.sources.postgres.chunks``):
        per table, those the mint of the description's latest binding that read any (from the progress as
        appended) read, at that binding's ts: what the collection held in their key ranges retracted there (a
        re-snapshot of the table: ``first`` takes the ts of its first chunks, ``held_before`` its columns before)
        and their rows added. ``({relid: ChunkedTable}, {table: its progress after the append})``; a write that
        takes the source's own snapshot ends every chunked one (it takes the tables whole)."""
        name = self.ctx.spec.name
        with self.ctx.connect() as conn:
            progress = chunked_snapshots(conn, name)
            stages = chunk_stages(conn, name) if progress and not snapshot else {}
        if snapshot:
            return {}, {t: None for t in progress}
        mine = [(ts, lsn) for ts, lsn in bindings if desc.lower <= ts < desc.upper]
        landed: dict[int, chunks.ChunkedTable] = {}
        after: dict[str, dict | None] = {}
        for out in outputs:
            table, relid = out.info.table, out.info.relid
            p = progress.get(table)
            if p is None:
                continue
            done = None if p["done"] is None else tuple(p["done"])
            pick = next(((ts, stages[lsn][table]) for ts, lsn in reversed(mine) if table in stages.get(lsn, {})
                         and stages[lsn][table]["from"] == p["done"] and ts >= p["at"]), None)
            if pick is None:
                landed[relid] = chunks.ChunkedTable(done)  # no chunk: its changes wait for their ranges' chunks
                continue
            ts, stage = pick
            got = tuple(chunks.Chunk.from_json(c) for c in stage["chunks"])
            ch = chunks.ChunkedTable(done, False, got, ts)
            held = self._held(desc, out)
            if held is not None and held.num_rows:  # a re-snapshot of the table: what it held in the ranges, at ts
                if p["chunks"] == 0:
                    held_before[out.shard] = part_schema(held.schema, [n for n in held.column_names if n != "diff"])
                keys = list(zip(*(held[k].to_pylist() for k in out.info.key)))
                mask = pa.array([any(c.holds(k) for c in got) for k in keys], pa.bool_())
                if pc.any(mask).as_py():
                    writer.retract(relid, held.filter(mask), ts)
            if p["chunks"] == 0:
                first[out.shard] = ts
            rows = sum(c.rows for c in got)
            parts = cdc.collect(self.ctx.blob, name, stage["prefix"], {out.shard: rows})
            for part in parts[out.shard]:
                with self.ctx.blob.open(part.path) as f:
                    staged = pq.read_table(f)
                writer.add_typed(relid, staged.set_column(staged.schema.get_field_index("ts"), "ts",
                                                          pa.array([ts] * staged.num_rows, pa.int64())))
            landed[relid] = ch
            failpoint("write_batches:after_table_snapshot")
            after[table] = {**p, "stop": stage.get("stop"), "done": None if ch.last is None else list(ch.last),
                            "chunks": p["chunks"] + len(got),
                            "rows": p["rows"] + rows, "landed": [*p.get("landed", []), [ts, ch.last and list(ch.last)]],
                            "finished": ch.finished}
        if after:
            m.update(chunks={t: {k: p[k] for k in ("chunks", "total", "rows", "done", "finished")}
                             for t, p in after.items()})
        return landed, after

    def _check_raced(self, outputs: Sequence[cdc.Output], chunked: dict[int, chunks.ChunkedTable],
                     seen: set[int]) -> None:
        """``ChunkRaced`` (nothing appended) if a chunk's snapshot missed a transaction that had committed when it
        was read and that the write's stream does not show (it committed before the write's first LSN, where a
        change of a range not read then was dropped: ``reclock.sources.postgres.chunks``)."""
        by = {o.info.relid: o for o in outputs}
        for relid, ch in chunked.items():
            for c in ch.chunks:
                missed = [x for x in c.raced if (x & 0xFFFFFFFF) not in seen]
                if missed:
                    raise ChunkRaced(self.ctx.spec.name, by[relid].info.table, missed)

    def _snapshot_on_spark(self, sconn, outputs: Sequence[cdc.Output]) -> list[tuple[cdc.Output, list]]:
        """The tables whose snapshot Spark reads, with their partitions' predicates: those of at least the
        source's ``spark_snapshot_min_bytes`` whose columns Spark converts exactly, when the context has Spark."""
        least = self.ctx.spec.upstream.spark_snapshot_min_bytes
        if least is None or self.ctx.spark_factory is None:
            return []
        chosen, slots = [], None
        for out in outputs:
            if out.info.partitioned:  # its rows are in its partitions' heaps: no page ranges of its own
                continue
            size, pages, block = PostgresUpstream.table_size(sconn, out.info.relid)
            if size >= least and spark_snapshot.convertible(out.info):
                slots = slots or spark_snapshot.task_slots(self.ctx.spark())
                chosen.append((out, spark_snapshot.partition_predicates(pages, spark_snapshot.SPLIT_BYTES // block,
                                                                        slots)))
        return chosen


    def _spark_snapshot(self, sconn, snapshot: str, out: cdc.Output, predicates: Sequence[str],
                        writer: cdc.PartWriter, ts: int, prefix: str) -> int:
        """One table's snapshot written by Spark into the write's folder (``reclock.sources.postgres.spark_snapshot``),
        while ``sconn`` holds the exported ``snapshot`` open; its rows (``count(*)`` under the same snapshot) counted
        into ``writer``, so that ``reclock.sources.postgres.cdc.collect`` proves the parts hold exactly them. The
        ``count(*)`` runs on ``sconn`` in a thread while Spark's job runs (the job does not use ``sconn``), so its
        scan is not added to the job's time; both are done before this returns, also when one fails."""
        plain = spark_snapshot.plain_columns(sconn, out.info)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="snapshot-count") as pool:
            counted = pool.submit(PostgresUpstream.count_rows, sconn, out.info)
            spark_snapshot.write_table_snapshot(self.ctx.spark(), spark_snapshot.jdbc_target(self.ctx.upstream),
                                                snapshot, out.info, ts,
                                                self.ctx.blob.url(f"{prefix}/{out.shard}/{cdc.SPARK_SNAPSHOT}"),
                                                predicates, plain=plain)
            rows = counted.result()
        writer.add_written(out.info.relid, rows)
        if PostgresUpstream.truncated_since(sconn, out.info):  # Spark's sessions may have read it truncated
            raise TruncatedUnderSnapshot(self.ctx.spec.name, out.info.table)
        failpoint("write_batches:after_spark_snapshot")
        return rows


class PostgresKind(SourceKind):
    name = "postgres"
    title = "Postgres"
    from_time = "commit LSN"
    progress_columns = ("ts", "lsn")
    schedules = SCHEDULES
    writes_on_spark = False

    def parse(self, name, raw, base):
        return parse_postgres_source(name, raw, base)

    def describe(self, spec) -> str:
        return f"Postgres publication {spec.upstream.publication} into {spec.name}__<table>"

    def find_upstream(self, spec, given: str | None = None) -> str:
        return given or find_upstream_dsn(spec.upstream, f"source {spec.name}")

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

    lag_unit = "bytes"

    def position_text(self, partition: int, offset: int) -> str:
        return f"LSN {lsn_to_str(offset)}"

    def lag(self, spec, upstream: Any, timeout: float, dsn: str | None = None) -> Lag:
        """The WAL the server flushed beyond the slot's confirmed position (bytes; what the next cycle has
        to look at), with the WAL the slot retains (from its restart LSN) in ``detail``."""
        up = PostgresUpstream(spec.name, upstream, spec.upstream.publication, timeout=timeout)
        with up.session() as conn:
            state = up.slot_state(conn)
            flush = up.flush_lsn(conn)
        if state is None:
            return Lag(None, f"unknown: slot {up.slot} does not exist", "bytes")
        return Lag(max(0, flush - state.confirmed_flush),
                   f"slot {up.slot}: confirmed {lsn_to_str(state.confirmed_flush)}, flush {lsn_to_str(flush)}; "
                   f"retains {human_bytes(max(0, flush - state.restart))} of WAL", "bytes")


POSTGRES = PostgresKind()
