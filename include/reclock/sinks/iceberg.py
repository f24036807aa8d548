"""The exactly-once Iceberg export: a collection's consolidated updates, in timestamp order, appended to an
Iceberg table in commits that also record the sink's frontier (issue 18, part 3).

::

    shard (complete times < upper)                    Iceberg table (SQL catalog in Postgres)
    ------------------------------                    ---------------------------------------
    read [F, U) a cluster at a time -> consolidate    one transaction per budget of rows:
        -> layout (append / changelog) -> stream        data files of ts F .. T-1  (written, not visible)
                                                        snapshot summary reclock.frontier = T
                                                      commit: the catalog row swings from the snapshot
                                                        F was read from to the new one, or fails
    downgrade the read hold to T - 1                  F := T

**Where the sink is.** The frontier lives in the table itself: every commit the sink makes carries the
snapshot summary properties ``reclock.sink`` (its name) and ``reclock.frontier`` (every update of the
collection at ``ts < frontier`` is in the table). On start the sink walks back from the table's current
snapshot through its parents to the newest snapshot carrying them (snapshots other writers added, such as
a maintenance job's rewrite, are passed over); a lineage that breaks before one is found (expired
snapshots) cannot prove where the sink is, and the sink refuses to start rather than guess.

**Exactly once.** A commit is one catalog transaction: the data files and the frontier become visible
together, or neither does. The SQL catalog swings the table's metadata pointer with a compare-and-set on
the previous pointer, and the append requires the branch to still be at the snapshot the frontier was read
from, so a commit made on a stale view fails (``CommitFailedException``) instead of adding data a second
time. pyiceberg would otherwise *retry* such a commit by re-applying the append on top of the other
writer's snapshot -- exactly how Iceberg's Kafka Connect sink commits the same files twice -- so the sink
sets the table property ``commit.retry.num-retries`` to 0 and checks it before every commit. A sink that
loses a race (another instance committed first) re-reads the frontier from the refreshed table and
carries on after it. A crash before the commit leaves only unreferenced files (Iceberg's orphan-file
cleanup removes them); a crash after it leaves the frontier in the table, and the restart resumes after it.

**Layouts** (``layout:`` in the sink's config):

=============  =======================================  ==============================================
layout         table columns                            reading the collection AS OF t
=============  =======================================  ==============================================
``append``     the collection's columns, ``_reclock_ts``  ``WHERE _reclock_ts <= t`` (a row of
               (the default for append-only collections)  multiplicity n appears n times)
``changelog``  the collection's columns, ``_reclock_ts``,  ``SELECT cols, sum(_reclock_diff) ... WHERE
               ``_reclock_diff`` (the default for upsert  _reclock_ts <= t GROUP BY cols HAVING sum <> 0``
               collections)
=============  =======================================  ==============================================

An append layout refuses a retraction (it cannot express one) and fails the run before committing.
Every timestamp's updates are consolidated (summed by row, zeros dropped) before they are written (a
copied part, below, keeps its rows as they are: in an append layout a row of multiplicity n is n rows
either way); a new sink first writes the collection AS OF its since, at ``_reclock_ts = since``, streamed a
cluster of parts at a time (so in a changelog table that first timestamp may hold pairs of rows that
cancel out).

**Reading and writing.** The parts are read a cluster of row groups at a time
(:class:`reclock.read.UpdateReader`), two clusters ahead on a helper thread; a string column that the
parts keep as a small dictionary (nearly every value an index into it, as Parquet writers keep repeated
strings) is read as a dictionary array and written from it, so neither the read nor the write copies or
hashes each value. A commit's rows are cut into chunks of a data file's worth (the table's
``write.target-file-size-bytes``, counting dictionary columns as decoded, as pyiceberg counts an
append's rows) and each chunk is written on a writer thread by the sink's own copy of pyiceberg's file
writer (:func:`write_data_file`: field ids, the table's Parquet settings and the footer's statistics, but
no Arrow schema in the file, so a dictionary-written column reads back as the table's type). The next
commit is gathered and written while the files of the one before are still being written, so every core
writes even when a commit is one file. Memory is bounded by two files' worth of chunks being written and
the clusters read ahead, also in a new sink's snapshot commit, whatever its size. Private pyiceberg
functions (pinned with pyiceberg 0.12.0) do the projection, the statistics and, for a partitioned table
(the sink only creates unpartitioned ones), the whole write.

**Copies.** In an append layout, a part of at least the sink's ``copy_min_bytes`` whose footer proves its
rows are exactly the table's (:func:`copy_plan`: every row group's ts in the range, every diff 1, the
internal columns empty, the columns of the table's types) is not read at all: its bytes are copied into a
data file, up to its footer, and a new footer follows them (:mod:`reclock.parquet_footer`: the table's
names and field ids, ``diff`` and the internal columns dropped), so the export costs a file copy. A commit
never ends inside a copied part's ts range; the budget cuts only what is written anew.

**Schemas that change.** When the collection's schema evolves (``reclock.persist.schemas``: a new column, a
struct field, a widened type, a dropped column), the table evolves with it in the commit that first holds an
update of the new schema: a run's commits stop before the first timestamp whose schema the table cannot
hold (or whose schema drops a column the table has), and the next commit adds the columns, widens the types
(pyiceberg ``update_schema().union_by_name``) and deletes the dropped columns in the same catalog
transaction as its data files, which are written with the evolved schema's field ids. Rows exported before
have null in a column added later (Iceberg's reading of an older data file); a dropped column is gone from
every row, as from the collection read AS OF a time after the drop, so a row written before it and retracted
after it cancels; a column added again under a dropped one's name is a new field id. A renamed column (a
Postgres ``RENAME COLUMN``: ``Column.was``) is renamed in the table (``rename_column``: its field id kept, so
the rows exported before read under the new name, as the collection's do), before the other changes of that
commit; a column added under its old name is then a new field. A change
Iceberg cannot make (a decimal's scale, ``date`` to ``timestamp``) stops the sink with ``SinkRefused``
naming the column; nothing is committed.

The table is created by the sink (unpartitioned, format version 2) when it does not exist; a table that
already holds data written by anyone but this sink is refused unless the sink starts ``fresh``, which
replaces the table's contents with the snapshot in its first commit. The sink holds a read hold on the
shard at ``frontier - 1``, like the Kafka sink, so compaction never passes what it still has to export.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reclock import compaction
from reclock import parquet_footer as pf
from reclock.ahead import read_ahead
from reclock.config import IcebergSinkSpec
from reclock.errors import MigrationError, ReclockError, SinceViolation, SinkRefused
from reclock.failpoints import failpoint
from reclock.part_layout import DATA_KIND, INTERNAL_PREFIX
from reclock.persist import blob as blobs
from reclock.persist import connect
from reclock.persist.migrate import check_schema
from reclock.persist.objectstore import S3Settings, pyiceberg_options
from reclock.persist.parquet import column_stats, holds_type
from reclock.persist.shards import (BatchRow, acquire_read_hold, downgrade_read_hold, release_read_hold,
                                    shard_info)
from reclock.persist.status import record_statistics, record_status
from reclock.persist.schemas import load_history
from reclock.read import UpdateReader, updates_parts
from reclock.schema_evolution import CollectionSchema, SchemaHistory
from reclock.schema_projection import arrow_type

FRONTIER = "reclock.frontier"
"""Snapshot summary property: every update at ``ts <`` it is in the table."""
SINK = "reclock.sink"
"""Snapshot summary property: the sink that made the snapshot."""
COLLECTION = "reclock.collection"
TS_COLUMN = "_reclock_ts"
DIFF_COLUMN = "_reclock_diff"
NO_RETRIES = {"commit.retry.num-retries": "0"}
"""A retried append would be re-applied on top of another writer's snapshot: a duplicate (see the module)."""
TABLE_PROPERTIES = {**NO_RETRIES, "format-version": "2", "write.target-file-size-bytes": str(128 * 1024 * 1024)}
"""A table the sink creates: no commit retries; data files of 128 MiB of Arrow data (pyiceberg counts the
in-memory size: some 15-40 MiB of Parquet), the chunk a commit is written in, so memory stays small and
a commit's first files are written while its later updates are still read."""
CONFLICT_RETRIES = 5
READ_AHEAD = 2
"""Tables of updates read (and consolidated) ahead on a helper thread while pyiceberg writes (bounds memory)."""
COPY_BLOCK_BYTES = 8 << 20
"""A copy is read and written this much at a time."""
WRITERS = 4
"""Threads writing data files (more than the cores, so that none idles while a commit's last file is
written); what they hold at once is bounded by :data:`WRITING_FILES`."""
WRITING_FILES = 2
"""At most this many data files' worth (``write.target-file-size-bytes``) of Arrow data is being written
at once (bounds memory; a chunk read as dictionaries takes less than its worth, so more of them fit)."""


class RetractionInAppendTable(ReclockError):
    """An update of an append-layout sink's collection retracts a row, which an append-only table cannot hold."""

    def __init__(self, sink: str, collection: str, ts: int) -> None:
        super().__init__(f"sink {sink}: {collection} retracts a row at ts {ts}, but the sink's layout is append; "
                         "nothing was committed (use `layout: changelog`, and start it fresh into a new table)")
        self.sink, self.collection, self.ts = sink, collection, ts


# -- settings ------------------------------------------------------------------------------------------------


def catalog_uri(dsn: str) -> str:
    """The SQLAlchemy URL (psycopg 3 driver) of the Postgres database a libpq DSN names (URI or key=value)."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    d = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    user, password, host = d.pop("user", None), d.pop("password", None), d.pop("host", None)
    port, db = d.pop("port", None), d.pop("dbname", None)
    return URL.create("postgresql+psycopg", username=user, password=password, host=host,
                      port=int(port) if port else None, database=db, query=d).render_as_string(hide_password=False)


@dataclass(frozen=True)
class CatalogSettings:
    """Where the SQL catalog's rows live (``uri``, a SQLAlchemy URL) and where tables' files go
    (``warehouse``: a folder, ``file://`` or ``s3://`` URL; ``s3`` its keys)."""

    uri: str
    warehouse: str
    s3: S3Settings | None = None

    def properties(self) -> dict[str, str]:
        props = {"uri": self.uri, "warehouse": self.warehouse}
        if self.s3 is not None:
            props.update(pyiceberg_options(self.s3))
        return props


def load_catalog(settings: CatalogSettings, name: str):
    """The pyiceberg SQL catalog ``name`` (its tables are created in the database on first use)."""
    from pyiceberg.catalog.sql import SqlCatalog

    warehouse = settings.warehouse
    if "://" not in warehouse:
        warehouse = "file://" + warehouse
    return SqlCatalog(name, **{**settings.properties(), "warehouse": warehouse})


@dataclass
class IcebergSinkContext:
    spec: IcebergSinkSpec
    dsn: str
    blob: blobs.BlobStore
    catalog: CatalogSettings

    @contextlib.contextmanager
    def connect(self) -> Iterator:
        with connect(self.dsn) as conn:
            yield conn


@dataclass(frozen=True)
class SinkResult:
    frontier: int
    commits: int
    rows: int
    bytes: int


# -- the frontier in the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableFrontier:
    """What the table says of the sink: its ``frontier`` (None: the sink never committed) as of snapshot
    ``snapshot_id`` (the current one), and whether the table holds any data file."""

    frontier: int | None
    snapshot_id: int | None
    has_data: bool


def read_frontier(table, sink: str) -> TableFrontier:
    """Walk back from ``table``'s current snapshot to the newest one ``sink`` made and read its frontier.

    ``SinkRefused`` if another Reclock sink wrote the table, or the lineage breaks (an expired parent)
    before a snapshot of ``sink`` is found while the table holds data: the frontier cannot be proven."""
    current = table.current_snapshot()
    if current is None:
        return TableFrontier(None, None, False)
    has_data = int(current.summary.get("total-data-files") or 0) > 0
    snap = current
    while snap is not None:
        summary = snap.summary
        if summary.get(FRONTIER) is not None:
            if summary.get(SINK) != sink:
                raise SinkRefused(sink, f"table {'.'.join(table.name())} is written by sink {summary.get(SINK)}; "
                                  "one table takes one sink")
            return TableFrontier(int(summary[FRONTIER]), current.snapshot_id, has_data)
        if snap.parent_snapshot_id is None:
            return TableFrontier(None, current.snapshot_id, has_data)
        parent = table.metadata.snapshot_by_id(snap.parent_snapshot_id)
        if parent is None:
            raise SinkRefused(sink, f"table {'.'.join(table.name())}: snapshot {snap.parent_snapshot_id}, a parent "
                              "of the current one, was expired before one of this sink's snapshots was found, so "
                              "its frontier cannot be proven; start it fresh (`--fresh`) to rewrite the table")
        snap = parent
    return TableFrontier(None, current.snapshot_id, has_data)


# -- layout ------------------------------------------------------------------------------------------------


def table_schema(columns: pa.Schema, layout: str) -> pa.Schema:
    """The Iceberg table's Arrow schema for a collection whose parts have ``columns`` (data, ts, diff):
    the data columns (all nullable), then ``_reclock_ts`` and, for a changelog, ``_reclock_diff``."""
    data = [f.with_nullable(True) for f in columns if f.name not in ("ts", "diff")]
    extra = [pa.field(TS_COLUMN, pa.int64())]  # optional, as the parts' ts is: so parts can be copied
    if layout == "changelog":
        extra.append(pa.field(DIFF_COLUMN, pa.int64(), nullable=False))
    return pa.schema(data + extra)


def shape(updates: pa.Table, schema: pa.Schema, spec: IcebergSinkSpec) -> pa.Table:
    """Consolidated ``updates`` (data, ts, diff) as rows of the table with ``schema``: a changelog keeps
    ``diff``; an append layout repeats each row ``diff`` times (``RetractionInAppendTable`` for a
    retraction). A data column the table lacks is refused (the run evolves the table first: the module's
    "Schemas that change"); one it has but the updates lack is null; one read as a dictionary of the table's
    type stays one (the data files are written from it)."""
    missing = [n for n in updates.column_names if n not in ("ts", "diff") and schema.get_field_index(n) < 0]
    if missing:
        raise SinkRefused(spec.name, f"table {spec.table} has no column(s) {', '.join(missing)} that the collection "
                          "has at this time; nothing was committed")
    if spec.layout == "append" and updates.num_rows:
        diff = updates["diff"].to_numpy()
        if (diff <= 0).any():
            raise RetractionInAppendTable(spec.name, spec.collection,
                                          int(updates["ts"].to_numpy()[int(np.argmax(diff <= 0))]))
        if (diff > 1).any():
            updates = updates.take(pa.array(np.repeat(np.arange(len(diff)), diff)))
    cols = []
    for f in schema:
        name = {TS_COLUMN: "ts", DIFF_COLUMN: "diff"}.get(f.name, f.name)
        col = updates[name] if name in updates.column_names else pa.nulls(updates.num_rows, f.type)
        cols.append(col if holds_type(col.type, f.type) else col.cast(f.type))
    return pa.Table.from_arrays(cols, schema=pa.schema(
        [f if c.type == f.type else f.with_type(c.type) for f, c in zip(schema, cols)], schema.metadata))


def consolidate(updates: pa.Table, advance_to: int | None = None) -> pa.Table:
    """Sum ``diff`` per ``(ts, row)`` and drop zeros (every ``ts`` below ``advance_to`` first advanced to
    it), sorted by ts; without retractions nothing can cancel, so only the sort (and advance) remains."""
    if updates.num_rows == 0:
        return updates
    if compaction.has_retractions(updates):
        return compaction.sorted_by_ts(compaction.consolidate(updates, advance_to))
    if advance_to is not None:
        i = updates.schema.get_field_index("ts")
        updates = updates.set_column(i, "ts", pc.max_element_wise(updates["ts"], pa.scalar(advance_to, pa.int64())))
    return compaction.sorted_by_ts(updates)


# -- the sink ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Begin:
    """Where a run begins: the frontier, the snapshot it was read from, and for a new sink the time of the
    snapshot to write first (``replace``: over a table's old contents, which the first commit deletes)."""

    frontier: int
    snapshot_id: int | None
    snapshot_at: int | None = None
    replace: bool = False


class _Peek:
    """An iterator one can look one item ahead in (the next item is fetched when looked at, not when the
    one before is taken, so a consumer may act on an item before the next one is ready)."""

    _EMPTY = object()

    def __init__(self, items: Iterator) -> None:
        self._it, self._next = items, self._EMPTY

    def peek(self):
        if self._next is self._EMPTY:
            self._next = next(self._it, None)
        return self._next

    def take(self):
        item = self.peek()
        self._next = self._EMPTY
        return item


class IcebergSink:
    """A running instance of an Iceberg sink: ``start`` once (find the frontier in the table, take the read
    hold), then ``step`` as often as wanted (each exports what became complete since the last)."""

    def __init__(self, ctx: IcebergSinkContext) -> None:
        self.ctx = ctx
        self.catalog = None
        self.table = None
        self.begin: _Begin | None = None
        self.reported = False
        self._droppable: frozenset[str] = frozenset()  # the columns the collection's schema history names
        self._renames: dict[str, str] = {}  # the table's columns the collection renamed since: old -> new name

    @property
    def identifier(self) -> str:
        return self.ctx.spec.table

    def _guard(self, fn, *args):
        """Run ``fn``; on failure record ``stalled`` with the cause and raise."""
        try:
            return fn(*args)
        except Exception as e:
            if not isinstance(e, MigrationError):  # a schema not this release's takes no status row
                with self.ctx.connect() as conn:
                    record_status(conn, self.ctx.spec.name, "stalled", error=str(e))
            raise

    def start(self, fresh: bool = False) -> None:
        self._guard(self._start, fresh)

    def _start(self, fresh: bool) -> None:
        from pyiceberg.exceptions import NoSuchTableError

        spec = self.ctx.spec
        with self.ctx.connect() as conn:
            check_schema(conn, self.ctx.dsn)
        self.catalog = load_catalog(self.ctx.catalog, spec.catalog)
        self.catalog.create_namespace_if_not_exists(spec.namespace)
        try:
            self.table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            self.table = None
        found = read_frontier(self.table, spec.name) if self.table is not None else TableFrontier(None, None, False)
        if self.table is not None and self.table.metadata.properties.get("commit.retry.num-retries") != "0":
            with self.table.transaction() as tx:  # a property change: no snapshot, the frontier stays put
                tx.set_properties(NO_RETRIES)
        if found.frontier is not None and not fresh:
            with self.ctx.connect() as conn:
                upper = shard_info(conn, spec.collection).upper
                if found.frontier > upper:  # written from another shard, or the database went back
                    raise SinkRefused(spec.name, f"table {spec.table} says frontier {found.frontier}, beyond "
                                      f"{spec.collection}'s upper {upper}: it was written from another collection "
                                      "(a rebuild, another database), or the consensus database lost commits it "
                                      "had acknowledged (a failover to an asynchronous standby, a restored backup; "
                                      "docs/operations.md, Consensus failover), and resuming would skip or repeat "
                                      "the times in between; start it fresh (`--fresh`) to rewrite the table")
                try:  # frontier <= since: the shard was compacted past what the table holds
                    acquire_read_hold(conn, spec.collection, spec.holder, found.frontier - 1)
                except SinceViolation:
                    raise SinkRefused(spec.name, f"table {spec.table} says frontier {found.frontier}, but "
                                      f"{spec.collection} was compacted past it (its read hold was released); it "
                                      "can only start fresh (`--fresh`), rewriting the table") from None
            self.begin = _Begin(found.frontier, found.snapshot_id)
            return
        if found.has_data and not fresh:
            raise SinkRefused(spec.name, f"table {spec.table} already holds data that this sink did not write "
                              "(no snapshot carries its frontier): exporting into it would mix the two; start "
                              "fresh (`--fresh`) to replace its contents, or export into a new table")
        for _ in range(10):
            with self.ctx.connect() as conn:
                info = shard_info(conn, spec.collection)
                start = info.since if spec.start is None else spec.start
                try:
                    acquire_read_hold(conn, spec.collection, spec.holder, start)
                except SinceViolation:
                    if spec.start is not None:
                        raise SinkRefused(spec.name, f"start {spec.start} is below {spec.collection}'s since "
                                          f"{info.since}") from None
                    continue  # since moved between the two statements: take the new one
            self.begin = _Begin(start, found.snapshot_id, snapshot_at=start, replace=found.has_data)
            return
        raise SinkRefused(spec.name, f"{spec.collection}'s since kept moving; try again")

    def _resume_after_conflict(self) -> None:
        """Another writer committed first: re-read the frontier from the refreshed table and go on after it."""
        spec = self.ctx.spec
        self.table = self.catalog.load_table(self.identifier)
        found = read_frontier(self.table, spec.name)
        if found.frontier is None:
            raise SinkRefused(spec.name, f"table {spec.table} changed under the sink and carries no frontier of "
                              "it; nothing was committed")
        with self.ctx.connect() as conn:
            acquire_read_hold(conn, spec.collection, spec.holder, found.frontier - 1)
        self.begin = _Begin(found.frontier, found.snapshot_id)

    def step(self) -> SinkResult:
        """Export every complete timestamp not yet in the table; record statistics and a status row."""
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

        if self.begin is None:
            raise RuntimeError("start() the sink first")

        def go() -> SinkResult:
            with self.ctx.connect() as conn:  # one connection a step
                for _ in range(CONFLICT_RETRIES):
                    try:
                        r = self._write_on(conn)
                        break
                    except (CommitFailedException, TableAlreadyExistsError):
                        self._resume_after_conflict()
                else:
                    raise SinkRefused(self.ctx.spec.name, f"table {self.ctx.spec.table}: {CONFLICT_RETRIES} "
                                      "commits in a row lost to another writer; is a second instance of the sink "
                                      "running?")
                if r.commits or not self.reported:
                    record_status(conn, self.ctx.spec.name, "running")
                    self.reported = True
            return r

        return self._guard(go)

    # -- reading -----------------------------------------------------------------------------------------

    def _readers(self, conn, begin: _Begin, upper: int,
                 history: SchemaHistory) -> tuple[UpdateReader | None, UpdateReader]:
        """The readers of what to export: a new sink's snapshot (the updates at ``ts <= snapshot_at``, None
        for a sink that has a frontier) and the rest, up to ``upper``; each with the collection's schema at its
        last time (``history``)."""
        spec, blob = self.ctx.spec, self.ctx.blob
        lower = begin.frontier
        snap = None
        kind = shard_info(conn, spec.collection).kind
        if begin.snapshot_at is not None:
            rows, _ = updates_parts(conn, spec.collection, 0, begin.snapshot_at + 1)
            snap = UpdateReader(blob, spec.collection, rows, 0, begin.snapshot_at + 1, kind, dictionaries=True,
                                history=history)
            lower = begin.snapshot_at + 1
        rows, upper = updates_parts(conn, spec.collection, lower, upper) if lower < upper else ([], upper)
        return snap, UpdateReader(blob, spec.collection, rows, lower, upper, kind, dictionaries=True,
                                  history=history)

    def _stream(self, snap: UpdateReader | None, rest: UpdateReader) -> Iterator[tuple[pa.Table, bool]]:
        """The consolidated updates to export, in ts order: ``(table, cut)`` pairs, ``cut`` false inside the
        snapshot (a new sink's first commit holds all of it: the updates at ``ts <= snapshot_at`` advanced
        to it). An append layout reads a ts in two tables where the parts hold no retraction (nothing to
        consolidate across them), so reading and writing overlap; a commit still ends only where the next
        table's first ts is past the last one written."""
        if snap is not None:
            for i, t in enumerate(snap.tables()):
                yield consolidate(t, advance_to=snap.upper - 1), i == 0
        for t in rest.tables(split_ts=self.ctx.spec.layout == "append"):
            yield consolidate(t), True

    # -- writing -----------------------------------------------------------------------------------------

    def _ensure_table(self, columns: pa.Schema | None):
        """The table, created from the collection's ``columns`` (and the layout) if it does not exist."""
        from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC

        if self.table is None:
            self.table = self.catalog.create_table(
                self.identifier, schema=table_schema(columns, self.ctx.spec.layout),
                partition_spec=UNPARTITIONED_PARTITION_SPEC,
                properties=TABLE_PROPERTIES)
        return self.table

    def _write_on(self, conn) -> SinkResult:
        """Export every complete time not yet in the table, in runs (:meth:`_write_run`): a run stops before
        the first time whose schema the table cannot hold, and the next one evolves the table in its first
        commit."""
        total = SinkResult(self.begin.frontier, 0, 0, 0)
        while True:
            r, more = self._write_run(conn)
            total = SinkResult(r.frontier, total.commits + r.commits, total.rows + r.rows, total.bytes + r.bytes)
            if not more:
                return total

    def _write_run(self, conn) -> tuple[SinkResult, bool]:
        """One run of commits from the frontier, up to the shard's upper or to the first time after the
        frontier whose schema the table cannot hold (then True: another run follows)."""
        spec = self.ctx.spec
        begin = self.begin
        upper = shard_info(conn, spec.collection).upper
        first = begin.snapshot_at if begin.snapshot_at is not None else begin.frontier
        if upper <= first:
            return SinkResult(begin.frontier, 0, 0, 0), False  # nothing complete beyond the frontier
        t0 = time.monotonic()
        history = load_history(conn, spec.collection)
        self._droppable = frozenset(n for v in history.versions for n in v.schema.names)
        cut = self._schema_cut(history, first, upper)
        snap, rest = self._readers(conn, begin, cut or upper, history)
        schemas = [r.schema for r in (snap, rest) if r is not None and len(r.schema)]
        if self.table is None and not schemas:
            return SinkResult(begin.frontier, 0, 0, 0), False  # no part yet: no schema to create the table with
        table = self._ensure_table(pa.unify_schemas(schemas, promote_options="permissive") if schemas else None)
        self._renames = _renames(table.schema(), [r.target for r in (snap, rest) if r is not None])
        evolve, metadata = self._evolution(table, schemas)
        copies = _Copies(copy_plan(self.ctx.blob, table, rest, spec.copy_min_bytes, metadata)
                         if spec.layout == "append" and spec.copy_min_bytes is not None else [])
        ahead = read_ahead(self._stream(snap, rest.without(copies.indexes)), READ_AHEAD, "iceberg-read")
        try:
            arrow = (metadata or table.metadata).schema().as_arrow()
            r = self._commit_all(conn, table, arrow, _Peek(ahead), copies, cut or upper, t0, evolve, metadata)
        finally:
            ahead.close()
        return r, cut is not None

    def _schema_cut(self, history: SchemaHistory, first: int, upper: int) -> int | None:
        """The first time in ``(first, upper)`` at which the collection's schema holds a column or a type the
        table lacks (None: none; the table as it is, or as the run's first commit evolves it, holds every
        update up to ``upper``)."""
        if self.table is None:
            return None
        current = self.table.schema()
        at_first = history.read_as(first)
        for v in history.versions:
            if first < v.since_ts < upper and v.schema != at_first:
                new, _ = _union(self.ctx.spec, self.table, _data_schema(v.schema), self._droppable,
                                _renames(current, [history.read_as(v.since_ts)]))
                if new != current:
                    return v.since_ts
        return None

    def _evolution(self, table, schemas: list[pa.Schema]) -> tuple[pa.Schema | None, object | None]:
        """What the run's first commit adds to the table's schema: the collection's columns as Arrow (for
        ``update_schema().union_by_name``) and the table's metadata with the schema evolved, to write data files
        with; ``(None, None)`` when the table holds the columns already."""
        if not schemas:
            return None, None
        columns = pa.unify_schemas(schemas, promote_options="permissive")
        data = pa.schema([f.with_nullable(True) for f in columns if f.name not in ("ts", "diff")])
        new, metadata = _union(self.ctx.spec, table, data, self._droppable, self._renames)
        if new == table.schema():
            return None, None
        return data, metadata

    def _commit_all(self, conn, table, schema: pa.Schema, items: _Peek, copies: "_Copies", upper: int,
                    t0: float, evolve: pa.Schema | None = None, metadata=None) -> SinkResult:
        """Commit ``items`` in budget-sized commits, each with its frontier, up to ``upper``.

        A commit's data files are written a chunk (a file's worth) at a time on :data:`WRITERS` threads,
        :data:`WRITING_FILES` files' worth at most at once, so memory holds that and the updates read ahead,
        however large the commit (a new sink's snapshot is one commit whatever its size). The next commit's
        chunks are gathered and written while the files of the one before are still being written: each
        commit is staged (its files handed to the writers, its frontier known), then committed once the
        next is staged (or the run ends or fails), so every core writes even when a commit is one file.
        ``evolve``: columns the first commit adds to the table (``metadata``: the table's metadata with them,
        which the data files are written with).
        ``copies`` (parts exported as copies of their bytes) go into the commit whose range holds them: a
        commit never ends inside one's range."""
        spec = self.ctx.spec
        commits = rows = nbytes = 0
        frontier = self.begin.frontier
        replace = self.begin.replace
        with _DataFileWriter(table, self.ctx.blob, WRITERS, WRITING_FILES * _chunk_bytes(table),
                             metadata) as writer:
            pending: _Staged | None = None
            while True:
                try:
                    staged = self._stage(items, copies, upper, schema, writer, replace, evolve)
                except Exception:
                    if pending is not None:  # what was staged before the failure is whole: commit it
                        self._commit(conn, table, pending)
                    raise
                replace, evolve = False, None
                if pending is not None:
                    self._commit(conn, table, pending)
                    commits, rows, nbytes = commits + 1, rows + pending.rows, nbytes + pending.bytes
                pending = staged
                if staged.frontier >= upper:
                    break
            self._commit(conn, table, pending)
            commits, rows, nbytes = commits + 1, rows + pending.rows, nbytes + pending.bytes
            frontier = pending.frontier
        upper_now = shard_info(conn, spec.collection).upper
        record_statistics(conn, spec.name, "sink", {
            "commits": commits, "messages": rows, "bytes": nbytes, "frontier": frontier,
            "lag_ms": max(0, upper_now - frontier), "seconds": round(time.monotonic() - t0, 3)})
        return SinkResult(frontier, commits, rows, nbytes)

    def _stage(self, items: _Peek, copies: "_Copies", upper: int, schema: pa.Schema, writer: "_DataFileWriter",
               replace: bool, evolve: pa.Schema | None = None) -> "_Staged":
        """The next commit's updates from ``items``, handed to ``writer`` a chunk at a time, up to where the
        budget lets the commit end (its frontier), and the ``copies`` below that frontier."""
        props = {SINK: self.ctx.spec.name, COLLECTION: self.ctx.spec.collection}
        counts = [0, 0]
        files = [writer.submit(chunk) for chunk in
                 _chunks(self._shaped(items, copies, props, counts, upper, schema), schema, writer.chunk_bytes)]
        frontier = int(props[FRONTIER])
        for c in copies.take_below(frontier):
            files.append(writer.submit_copy(c))
            counts[0] += c.row.rows
            counts[1] += c.row.bytes
        return _Staged(props, frontier, files, counts[0], counts[1], replace, evolve)

    def _commit(self, conn, table, staged: "_Staged") -> None:
        """One catalog transaction: ``staged``'s data files (waited for) and its frontier in the snapshot
        summary, on the snapshot the sink's frontier was read from (else nothing is committed); then the
        read hold moves to the new frontier."""
        from pyiceberg.expressions import AlwaysTrue

        spec = self.ctx.spec
        data_files = [f for written in staged.files for f in written.result()]
        if table.metadata.properties.get("commit.retry.num-retries") != "0":
            raise SinkRefused(spec.name, f"table {spec.table}: commit.retry.num-retries is not 0, so a "
                              "conflicting commit would be re-applied (a duplicate); nothing was committed")
        parent = table.metadata.current_snapshot_id
        tx = table.transaction()
        if staged.evolve is not None:  # the collection's new columns, in the commit that first holds them
            _evolve_tx(tx, staged.evolve, self._droppable, self._renames)
        if staged.replace:
            tx.delete(AlwaysTrue())
        with tx.update_snapshot(snapshot_properties=staged.props).fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
        snapshot = tx.table_metadata.current_snapshot()
        if snapshot is None or snapshot.summary.get(FRONTIER) != str(staged.frontier) or (
                not staged.replace and snapshot.parent_snapshot_id != parent):
            raise ReclockError(f"sink {spec.name}: the staged snapshot does not carry frontier {staged.frontier} "
                               "on the snapshot the frontier was read from; nothing was committed")
        failpoint("iceberg:before_commit")
        tx.commit_transaction()  # CommitFailedException: another writer committed first
        failpoint("iceberg:after_commit")
        downgrade_read_hold(conn, spec.collection, spec.holder, staged.frontier - 1)
        self.begin = _Begin(staged.frontier, table.metadata.current_snapshot_id)

    def _shaped(self, items: _Peek, copies: "_Copies", props: dict, counts: list[int], upper: int,
                schema: pa.Schema) -> Iterator[tuple[pa.Table, int]]:
        """One commit's rows, shaped, each table with its :func:`decoded_bytes`: tables from ``items`` until
        the budget is reached at a point where a commit may end (not inside the range of one of ``copies``);
        sets ``props[FRONTIER]`` to where the commit ends (the next table's first ts, or ``upper``) before it
        stops (``_commit`` checks the staged summary carries it before committing)."""
        budget = self.ctx.spec.budget
        last_ts = None  # the last ts written in this commit
        while True:
            nxt = items.peek()
            if nxt is None:
                props[FRONTIER] = str(upper)
                return
            updates, cut = nxt
            if updates.num_rows == 0:
                items.take()
                continue
            first_ts = int(updates["ts"][0].as_py())
            if counts[0] and cut and first_ts > last_ts and not copies.straddle(first_ts) and (
                    counts[0] >= budget.max_rows or counts[1] >= budget.max_bytes):
                props[FRONTIER] = str(first_ts)
                return
            items.take()
            shaped = shape(updates, schema, self.ctx.spec)
            size = decoded_bytes(shaped)
            counts[0] += shaped.num_rows
            counts[1] += size
            last_ts = int(updates["ts"][-1].as_py())
            yield shaped, size


def _data_schema(schema: CollectionSchema) -> pa.Schema:
    """A collection schema's columns as the nullable Arrow fields a table takes."""
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in schema.columns])


def _renames(current, targets) -> dict[str, str]:
    """The columns of the table (Iceberg schema ``current``) the collection renamed since (a column of a read's
    ``targets`` the table lacks whose earlier name it has, ``Column.was``): old name -> new name."""
    have = {f.name for f in current.fields}
    out = {}
    for target in targets:
        for c in (target.columns if target is not None else ()):
            if c.name not in have:
                old = next((w for w in c.was if w in have), None)
                if old is not None:
                    out[old] = c.name
    return out


def _evolve_tx(tx, data: pa.Schema, droppable: frozenset[str], renames: dict[str, str]) -> None:
    """In transaction ``tx``: the table's columns renamed as the collection's were (``renames``: the same field
    ids, so the data files written before read under the new names), then :func:`_evolve_schema` against the
    renamed schema (a column added under a renamed one's old name is a new field)."""
    if renames:
        with tx.update_schema() as update:
            for old, new in renames.items():
                update.rename_column(old, new)
    with tx.update_schema() as update:
        _evolve_schema(update, tx.table_metadata.schema(), data, droppable)


def _union(spec: IcebergSinkSpec, table, data: pa.Schema, droppable: frozenset[str] = frozenset(),
           renames: dict[str, str] | None = None):
    """The table's schema with ``data``'s columns added and types widened (pyiceberg's ``union_by_name``,
    not committed), its columns renamed first as the collection's were (``renames``), and the table's metadata
    with it; ``SinkRefused`` naming what Iceberg cannot change."""
    from pyiceberg.exceptions import ValidationError

    tx = table.transaction()
    try:
        _evolve_tx(tx, data, droppable, renames or {})
    except (ValidationError, ValueError, TypeError) as e:
        raise SinkRefused(spec.name, f"table {spec.table} cannot take the collection's schema change ({e}); "
                          "nothing was committed (Iceberg adds columns and widens int to long, float to double "
                          "and a decimal's precision only; export into a new table)") from None
    metadata = tx.table_metadata
    return metadata.schema(), metadata


def _evolve_schema(update, current, data: pa.Schema, droppable: frozenset[str] = frozenset()) -> None:
    """In a schema update of a table whose schema is ``current``: ``data``'s columns added and types widened
    (``union_by_name``), each new top-level column placed before the sink's own columns (the table's user
    columns stay first, as in the collection), and the table's columns of the collection's schema history
    (``droppable``) that ``data`` lacks deleted (the collection dropped them: Postgres ``DROP COLUMN``; a column
    of that name added later is a new field, so no older data file's values are read as its)."""
    have = {f.name for f in current.fields}
    for name in sorted((have & droppable) - set(data.names) - {TS_COLUMN, DIFF_COLUMN}):
        update.delete_column(name)
    update.union_by_name(data)
    for f in data:
        if f.name not in have and TS_COLUMN in have:
            update.move_before(f.name, TS_COLUMN)


def decoded_bytes(data: pa.Table | pa.RecordBatch) -> int:
    """``data``'s Arrow bytes, its dictionary columns counted as if decoded (values and offsets): what the
    same rows take handed to pyiceberg as plain columns, whose target file size counts them so; a data
    file's worth of rows is then the same however they were read."""
    n = 0
    for col in data.columns:
        if not pa.types.is_dictionary(col.type):
            n += col.nbytes
            continue
        for chunk in col.chunks if isinstance(col, pa.ChunkedArray) else [col]:
            lengths = pc.binary_length(chunk.dictionary)
            n += ((pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0) + 4 * (len(chunk) + 1)
                  + ((len(chunk) + 7) // 8 if chunk.null_count else 0))
    return n


def _chunk_bytes(table) -> int:
    """A chunk of a commit: one data file's worth of Arrow bytes (the table's target file size)."""
    return int(table.metadata.properties.get("write.target-file-size-bytes", 512 * 1024 * 1024))


def _chunks(tables: Iterator[tuple[pa.Table, int]], schema: pa.Schema, size: int) -> Iterator[pa.Table]:
    """``tables`` (with their :func:`decoded_bytes`) gathered into chunks of at most ``size`` bytes (a larger
    table is a chunk of its own), as pyiceberg bins an append's rows into files; a chunk is handed on as
    soon as another table like its last would not fit (so its file is written without waiting for the
    next table to be read). A chunk's dictionary columns share one dictionary (so the Parquet writer
    writes its indices as they are); a column read as a dictionary in some of a chunk's tables only is
    decoded to ``schema``'s type."""
    buf: list[pa.Table] = []
    n = 0
    for t, k in tables:
        if buf and n + k > size:
            yield _chunk(buf, schema)
            buf, n = [], 0
        buf.append(t)
        n += k
        if n + k > size:
            yield _chunk(buf, schema)
            buf, n = [], 0
    if buf:
        yield _chunk(buf, schema)


def _chunk(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    if any(t.schema != tables[0].schema for t in tables):
        tables = [t.cast(schema) for t in tables]
    return pa.concat_tables(tables).unify_dictionaries()


@dataclass(frozen=True)
class _Staged:
    """A commit ready to be made: its snapshot summary ``props`` (with the ``frontier`` it ends at), its data
    files being written (futures of lists of ``DataFile``), its rows and Arrow bytes, and whether it
    replaces the table's old contents (a fresh sink's first commit)."""

    props: dict[str, str]
    frontier: int
    files: list[Future]
    rows: int
    bytes: int
    replace: bool
    evolve: pa.Schema | None = None  # the collection's columns the table takes in this commit (update_schema)


class _DataFileWriter:
    """Writes chunks of a table's rows into data files on ``threads`` threads, with at most ``max_bytes`` of
    chunks (their Arrow bytes in memory) being written at once: :meth:`submit` waits for the oldest writes
    beyond that (one chunk is always let through). Leaving the ``with`` block waits for every write (an
    abandoned commit's files stay unreferenced)."""

    def __init__(self, table, blob: blobs.BlobStore, threads: int, max_bytes: int, metadata=None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.table, self.blob, self.max_bytes = table, blob, max_bytes
        self._metadata = metadata  # the table's metadata with its schema evolved (not committed yet), if it is
        self.chunk_bytes = _chunk_bytes(table)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="iceberg-write")
        self._in_flight: collections.deque[tuple[Future, int]] = collections.deque()
        self._counter = itertools.count(0)
        self._uuid = uuid.uuid4()

    def submit(self, chunk: pa.Table) -> Future:
        """A future of ``chunk``'s data files."""
        while self._in_flight and sum(n for _, n in self._in_flight) + chunk.nbytes > self.max_bytes:
            self._in_flight.popleft()[0].result()
        future = self._pool.submit(self._write, self.metadata, self.table.io, chunk)
        self._in_flight.append((future, chunk.nbytes))
        return future

    def submit_copy(self, part: "_Copy") -> Future:
        """A future of the data file copied from ``part`` (read and written a block at a time)."""
        return self._pool.submit(lambda: [copy_data_file(self.metadata, self.table.io, self.blob, part,
                                                         self._name())])

    @property
    def metadata(self):
        """The metadata data files are written with: the evolved schema's, else the table's."""
        return self._metadata if self._metadata is not None else self.table.metadata

    def _name(self) -> str:
        return f"00000-{next(self._counter)}-{self._uuid}.parquet"

    def _write(self, metadata, io, chunk: pa.Table) -> list:
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        if not metadata.spec().is_unpartitioned():  # pyiceberg's own writer, which splits by partition
            return list(_dataframe_to_data_files(metadata, chunk.cast(metadata.schema().as_arrow()), io,
                                                 write_uuid=self._uuid, counter=self._counter))
        return [write_data_file(metadata, io, chunk, self._name())]

    def __enter__(self) -> "_DataFileWriter":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def write_data_file(metadata, io, rows: pa.Table, name: str):
    """``rows`` (the table's columns, some maybe dictionary-encoded) as one data file ``name`` of the
    unpartitioned table with ``metadata``: what pyiceberg's writer does for one file of an append
    (``pyiceberg.io.pyarrow.write_file``: field ids, the table's Parquet properties, row groups, the
    footer's statistics), except that the file keeps no Arrow schema, so a column written from a dictionary
    array reads back as the table's type (pyiceberg 0.12's scan would otherwise read it as a dictionary and
    fail to join it with other files' columns). Private pyiceberg functions: pinned with pyiceberg 0.12.0."""
    from pyiceberg.io.fileformat import FileFormatFactory
    from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, _to_requested_schema
    from pyiceberg.manifest import FileFormat
    from pyiceberg.schema import sanitize_column_names
    from pyiceberg.table import TableProperties
    from pyiceberg.utils.properties import property_as_int

    schema = metadata.schema()
    file_schema = sanitize_column_names(schema)
    model = FileFormatFactory.get(FileFormat.PARQUET)
    batches = [_to_requested_schema(file_schema, schema, b, include_field_ids=True, format_model=model)
               for b in rows.to_batches()]
    table = pa.Table.from_batches(batches) if batches else pa.Table.from_batches([], file_schema.as_arrow())
    path = _data_location(metadata, name)
    output = io.new_output(path)
    row_group = property_as_int(metadata.properties, TableProperties.PARQUET_ROW_GROUP_LIMIT,
                                TableProperties.PARQUET_ROW_GROUP_LIMIT_DEFAULT)
    with output.create(overwrite=True) as out:
        writer = pq.ParquetWriter(out, table.schema, store_schema=False, store_decimal_as_integer=True,
                                  **_get_parquet_writer_kwargs(metadata.properties))
        with writer:
            writer.write_table(table, row_group_size=row_group)
    return _data_file(metadata, path, len(output), writer.writer.metadata)


def _data_location(metadata, name: str) -> str:
    from pyiceberg.table.locations import load_location_provider

    return load_location_provider(table_location=metadata.location,
                                  table_properties=metadata.properties).new_data_location(data_file_name=name)


def _data_file(metadata, path: str, size: int, parquet_metadata: pq.FileMetaData):
    """The ``DataFile`` entry of the Parquet file at ``path`` of ``size`` bytes with footer
    ``parquet_metadata``, in the unpartitioned table with ``metadata``: its column statistics as pyiceberg
    takes them from a footer (by the field ids the file's columns carry)."""
    from pyiceberg.io.pyarrow import (compute_statistics_plan, data_file_statistics_from_parquet_metadata,
                                      parquet_path_to_id_mapping)
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.schema import sanitize_column_names
    from pyiceberg.typedef import Record

    file_schema = sanitize_column_names(metadata.schema())
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(file_schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(file_schema))
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET, partition=Record(),
        file_size_in_bytes=size, sort_order_id=None, spec_id=metadata.default_spec_id,
        equality_ids=None, key_metadata=None, **statistics.to_serialized_dict())


# -- parts exported as copies ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Copy:
    """A part exported by copying it: its index among the reader's parts, its batch row, its ts bounds,
    the bytes before its footer (copied as they are) and the new end of the file (:func:`rewrite`), with
    the footer that end holds."""

    index: int
    row: BatchRow
    lo: int
    hi: int
    start: int
    tail: bytes
    footer: pq.FileMetaData


class _Copies:
    """The copies of a run, handed out to the commits whose ranges hold them."""

    def __init__(self, copies: list[_Copy]) -> None:
        self._left = sorted(copies, key=lambda c: (c.lo, c.hi))
        self.indexes = {c.index for c in copies}

    def straddle(self, ts: int) -> bool:
        """Whether a commit ending at ``ts`` (every update below it in) would cut a copy's range."""
        return any(c.lo < ts <= c.hi for c in self._left)

    def take_below(self, frontier: int) -> list[_Copy]:
        """The copies not handed out yet whose updates all lie below ``frontier``."""
        out = [c for c in self._left if c.hi < frontier]
        self._left = [c for c in self._left if c.hi >= frontier]
        return out


def _stat_bounds(md: pq.FileMetaData, column: str) -> list[tuple[object, object, int | None]] | None:
    """Each row group's (min, max, null count) of ``column`` from the footer; None if the column is missing
    or a row group kept no bounds."""
    stats = column_stats(md, column)
    if stats is None or any(st is None or not st.has_min_max for st in stats):
        return None
    return [(st.min, st.max, st.null_count if st.has_null_count else None) for st in stats]


def _all_null(md: pq.FileMetaData, column: str) -> bool:
    stats = column_stats(md, column)
    return stats is not None and all(st is not None and st.has_null_count and st.null_count == md.row_group(i).num_rows
                                     for i, st in enumerate(stats))


def _read_footer(blob: blobs.BlobStore, path: str) -> pf.Footer:
    """The footer of the part at ``path``, read from its end."""
    with blob.open(path) as f:
        size = f.seek(0, 2)
        want = min(size, 64 << 10)
        while True:
            f.seek(size - want)
            tail = f.read(want)
            try:
                return pf.read_footer(tail, size)
            except pf.FooterError as e:
                if e.need is None or e.need <= want:
                    raise
                want = e.need


def copy_plan(blob: blobs.BlobStore, table, reader: UpdateReader, min_bytes: int, metadata=None) -> list[_Copy]:
    """The parts of ``reader`` (a data collection's updates at ``reader.lower <= ts < reader.upper``, for an
    append layout) that become data files of ``table`` as copies of their bytes with a new footer
    (:mod:`reclock.parquet_footer`) instead of being read and written again: parts of at least
    ``min_bytes`` (the sink's ``copy_min_bytes``) whose rows are exactly what the table gets, as the footer proves it: every row
    group's ``ts`` inside the range and ``diff`` 1, the internal columns all null; whose other columns
    are the table's (``ts`` becomes ``_reclock_ts``; ``diff`` and the internal columns are dropped from the
    footer), each of exactly the type, and nullable where the table's is, that the table has. Everything
    else is read and written as rows. An unpartitioned table only. ``metadata``: the table's with its schema
    evolved by the run (its fields are what the copies must match), else the table's."""
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.schema import sanitize_column_names

    if not table.metadata.spec().is_unpartitioned() or reader.kind != DATA_KIND:
        return []
    schema = (metadata or table.metadata).schema()
    file_names = {f.field_id: f.name for f in sanitize_column_names(schema).fields}
    names = {f.name: file_names[f.field_id] for f in schema.fields}  # the table's name -> the files' name
    ids = {file_names[f.field_id]: f.field_id for f in schema.fields}
    plan = []
    for i, (row, md) in enumerate(zip(reader.rows, reader.footers)):
        if row.bytes < min_bytes:
            continue
        ts, diff = _stat_bounds(md, "ts"), _stat_bounds(md, "diff")
        if ts is None or diff is None or any(lo < reader.lower or hi >= reader.upper for lo, hi, _ in ts) \
                or any((lo, hi) != (1, 1) for lo, hi, _ in diff):
            continue
        keep: dict[str, str] = {}
        columns = md.schema.to_arrow_schema().names
        if any(c.startswith(INTERNAL_PREFIX) and not _all_null(md, c) for c in columns):
            continue
        for c in columns:
            if c == "ts":
                keep[c] = names[TS_COLUMN]
            elif c != "diff" and not c.startswith(INTERNAL_PREFIX):
                keep[c] = names.get(c, "")
        if "" in keep.values():
            continue  # a column the table lacks: the rows' path says so
        try:
            footer = _read_footer(blob, row.path)
            tail = pf.rewrite(footer, keep, ids)
            new = pq.read_metadata(pa.BufferReader(pf.MAGIC + tail))
            found = pyarrow_to_schema(new.schema.to_arrow_schema())
        except (pf.FooterError, ValueError, TypeError, NotImplementedError):
            continue  # a footer of a shape not rewritten, or a type Iceberg reads otherwise
        if footer.num_rows != row.rows or any(
                f.field_type != schema.find_field(f.field_id).field_type
                or (schema.find_field(f.field_id).required and not f.required) for f in found.fields):
            continue
        plan.append(_Copy(i, row, min(lo for lo, _, _ in ts), max(hi for _, hi, _ in ts), footer.start, tail, new))
    return plan


def copy_data_file(metadata, io, blob: blobs.BlobStore, part: _Copy, name: str):
    """``part`` copied into the table with ``metadata`` as data file ``name``: its bytes before the footer as
    they are, then its new footer; the data file's entry (its statistics from the new footer).
    A part shorter than its footer said fails the run."""
    path = _data_location(metadata, name)
    with blob.open(part.row.path) as src, io.new_output(path).create(overwrite=True) as out:
        left = part.start
        while left:
            block = src.read(min(left, COPY_BLOCK_BYTES))
            if not block:
                raise ReclockError(f"shard {part.row.shard}: part {part.row.path} ended {left} bytes before its "
                                   "footer: the file was replaced or truncated since it was read; nothing was "
                                   "committed (restore the file, or rebuild the collection from upstream)")
            out.write(block)
            left -= len(block)
        out.write(part.tail)
    return _data_file(metadata, path, part.start + len(part.tail), part.footer)


def run_once(ctx: IcebergSinkContext, fresh: bool = False) -> SinkResult:
    """Start the sink and export every complete timestamp of the collection not yet in the table."""
    sink = IcebergSink(ctx)
    sink.start(fresh)
    return sink.step()


def table_frontier(ctx: IcebergSinkContext) -> TableFrontier | None:
    """What the table says of the sink (None: the table does not exist)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        table = load_catalog(ctx.catalog, ctx.spec.catalog).load_table(ctx.spec.table)
    except NoSuchTableError:
        return None
    return read_frontier(table, ctx.spec.name)


def drop(ctx: IcebergSinkContext) -> bool:
    """Drop the sink: release its read hold (compaction may pass its frontier from now on). The table keeps
    its data; recreating the sink then needs ``--fresh``."""
    with ctx.connect() as conn:
        released = release_read_hold(conn, ctx.spec.collection, ctx.spec.holder)
        record_status(conn, ctx.spec.name, "paused", error="dropped: read hold released")
    return released
