"""The Postgres upstream: a publication read through a logical replication slot with ``pgoutput``.

FromTime is the commit LSN. Reclock keeps it in a :class:`~reclock.time.PartitionedFrontier` with a single
partition :data:`LSN_PARTITION` (the LSN is the "offset"), so the remap collection, descriptions and
compaction are the same code as for Kafka; a binding ``(t, {0: L})`` says "every transaction whose commit
record starts below ``L`` is in at ``t`` or earlier".

==================  ========================================================================================
step                what this module does
==================  ========================================================================================
mint                :meth:`PostgresUpstream.probe_upper`: check the publication, the tables and their replica
                    identity, make sure the slot ``reclock_<source>`` exists and is healthy, and return an
                    upper LSN with the tables' columns in the catalog as of it (:meth:`~PostgresUpstream
                    .catalog_upper`: the tables locked ``IN ACCESS SHARE MODE`` for a few milliseconds)
write_batches       :meth:`~PostgresUpstream.read_blocks`: the slot's messages up to an LSN, through
                    ``pg_logical_slot_peek_binary_changes`` on a server-side cursor (peek does not consume,
                    so a retried write reads the same), fetched on a helper thread ahead of the decoding;
                    :meth:`~PostgresUpstream.export_snapshot`: the initial snapshot
resume              :meth:`~PostgresUpstream.commit`: ``pg_replication_slot_advance`` to the offset resumption
                    frontier (idle cycles too: any WAL moves the flush LSN, so a binding follows and the slot
                    with it; a continuous source binds idle WAL as :meth:`~PostgresUpstream.reason_to_bind`
                    says; the slot never pins WAL Reclock no longer needs)
==================  ========================================================================================

**The snapshot, Materialize's way.** The slot itself is created with ``pg_create_logical_replication_slot``
(no snapshot). An exported snapshot (``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')``) lives only as long
as the replication connection that created it stays open and idle, while mint and write_batches run in
different processes (two Airflow tasks) and a retried write must be able to read the snapshot again. So
the snapshot is taken where it is read, in the first description's write: a *temporary* slot is created
over a ``replication=database`` connection with ``SNAPSHOT 'export'``; its consistent point ``S`` is the
snapshot's exact position in commit-LSN order (it sees exactly the transactions whose commit is below
``S``). The snapshot is read under it (``SET TRANSACTION SNAPSHOT``) while that connection stays open, and
then *rewound* to the first binding's LSN ``L1``: every change the main slot shows committed in
``[L1, S)`` is retracted at the first binding's timestamp (those changes come again, positively, at their
own bindings). The contents at the first binding are exactly the tables as of ``L1``: nothing lost or
doubled at the seam, whichever of ``S`` and ``L1`` is larger (below ``L1`` the changes in ``[S, L1)`` are
added instead). A retried write takes a new snapshot and gives the same contents at every timestamp.

Checks that fail loudly (``reclock.errors``): the slot gone, invalidated (``wal_status = lost``) or advanced
past what a shard needs is :class:`~reclock.errors.SlotLost` (an ``UpstreamDataLost``); a missing
publication or table is :class:`~reclock.errors.PublicationMissing`; a table whose updates and deletes carry
neither the old row (``REPLICA IDENTITY FULL``) nor a key (a primary key under ``DEFAULT``, or ``USING
INDEX``) is :class:`~reclock.errors.ReplicaIdentityMissing` naming the ``ALTER TABLE`` to run; one whose
identity changed since the snapshot is :class:`~reclock.errors.ReplicaIdentityChanged`.

**Publications as they are.** A table lands as its publication publishes it: the columns of its column
list, the rows its row filter passes (the snapshot reads them with the same ``WHERE``; ``pgoutput`` turns
an update that moves a row into or out of the filter into an insert or a delete), the partitions of a
partitioned table as tables of their own or, with ``publish_via_partition_root``, the whole tree as its
root. A publication that leaves out ``update``, ``delete`` or ``truncate`` is refused
(:class:`~reclock.errors.PublicationUnsupported`); a row filter or column list changed after the snapshot
stalls the source until a re-snapshot (:class:`~reclock.errors.PublicationRedefined`).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import scalar_row

from reclock.ahead import read_ahead
from reclock.errors import (CatalogBusy, PublicationMissing, PublicationRedefined, PublicationUnsupported, ReclockError,
                            ReplicaIdentityChanged, ReplicaIdentityMissing, SlotBusy, SlotLost, TruncatedUnderSnapshot)
from reclock.lending import ConnectionLender
from reclock.sources.postgres.ddl import CatalogTable
from reclock.sources.postgres.pgoutput import BPCHAR, lsn_to_int, lsn_to_str
from reclock.time import PartitionedFrontier

LSN_PARTITION = 0
"""The one partition of a Postgres source's frontier: its offset is the commit LSN."""
IDLE_S = 60.0
"""A Postgres source without changes binds once its newest binding is this old and WAL was written since, so
its slot follows the flush LSN and WAL is released (:meth:`PostgresUpstream.reason_to_bind`)."""
IDLE_WAL_BYTES = 16 << 20
"""... or as soon as this much WAL lies past its position."""
SLOT_PREFIX = "reclock_"
SESSION = ("SET DateStyle = ISO", "SET IntervalStyle = postgres", "SET bytea_output = hex", "SET TimeZone = 'UTC'",
           "SET extra_float_digits = 3")
"""The text forms ``reclock.sources.postgres.pgoutput.convert`` reads (pgoutput writes values in the session's
styles)."""
IDENTITY = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}
Identity = Literal["full", "default", "index"]
"""How a table's updates and deletes name the old row: the whole row (``full``), or its key (``default``: the
primary key; ``index``: ``REPLICA IDENTITY USING INDEX``)."""
_IDENTITY_OF: dict[str, Identity] = {"f": "full", "d": "default", "i": "index"}


class UpstreamUnavailable(ReclockError):
    """The upstream Postgres cannot be reached."""


def pg_ident(name: str) -> str:
    """``name`` as a quoted Postgres identifier."""
    return '"' + name.replace('"', '""') + '"'


def text_form(column: str, type_oid: int) -> str:
    """SQL giving column ``column``'s value as its type's output function writes it, which is what
    ``pgoutput`` sends: ``col::text``, except for ``char(n)``, whose cast to text drops the padding."""
    if type_oid == BPCHAR:
        return f"textin(bpcharout({pg_ident(column)}))"
    return f"{pg_ident(column)}::text"


def _columns(names: Sequence[str] | None) -> str:
    return "(every column)" if names is None else "(" + ", ".join(names) + ")"


def slot_name(source: str) -> str:
    """The replication slot of a source: ``reclock_<source>``."""
    return f"{SLOT_PREFIX}{source}"


def lsn_frontier(lsn: int) -> PartitionedFrontier:
    return PartitionedFrontier.of({LSN_PARTITION: lsn})


@dataclass(frozen=True)
class TableInfo:
    """A published table as registered at the source's first cycle: its oid and the columns the publication
    publishes ``(name, type oid, typmod)`` in order (all of them, or its column list's). A Relation message
    with other columns stalls the source.

    ``row_filter`` is the publication's ``WHERE`` for the table as Postgres prints it
    (``pg_publication_tables.rowfilter``; None: every row): the snapshot reads only the rows it passes, as
    ``pgoutput`` sends only their changes (an update moving a row into the filter comes as an insert, out
    of it as a delete). ``column_list`` is the publication's column list (None: every column, also the
    columns added later). ``partitions``: of a partitioned table published through its root
    (``publish_via_partition_root``), the oids of its partitions (its snapshot reads every one, its changes
    come as the root's; attaching or detaching one moves rows without a change to see, so it stalls the
    source); None for a table.

    ``identity`` and ``key``: how its updates and deletes name the old row (:data:`Identity`), and for a
    key identity the key's columns in the key's order (``()`` for ``full``). A key table's old rows come
    from the collection (``reclock.sources.postgres.cdc``).

    ``attnum_upto``: the table's highest column number (``attnum``, dropped columns too) when it was
    registered: a column of a higher number that is dropped now was added and dropped since, which makes a
    later column of the same name ambiguous (``reclock.sources.postgres.ddl``; None for a registration older
    than it). ``attnums``: each column's number, in the columns' order (None for a registration older than
    them): a column's identity, which a Relation message does not carry; each write checks them against the
    catalog as of its upper (``ddl.number_columns``), which catches a column dropped and added again under its
    name where no Relation message shows it."""

    table: str  # schema.table
    relid: int
    columns: tuple[tuple[str, int, int], ...]
    row_filter: str | None = None
    column_list: tuple[str, ...] | None = None
    partitions: tuple[int, ...] | None = None
    identity: Identity = "full"
    key: tuple[str, ...] = ()
    attnum_upto: int | None = None  # the table's highest column number (dropped ones too) when registered
    attnums: tuple[int, ...] | None = None  # each column's number (attnum), in the columns' order

    def __post_init__(self) -> None:
        if self.attnums is not None and len(self.attnums) != len(self.columns):
            raise ValueError(f"table {self.table}: {len(self.attnums)} column numbers for {len(self.columns)} columns")

    @property
    def partitioned(self) -> bool:
        return self.partitions is not None

    def to_json(self) -> dict:
        out = {"table": self.table, "relid": self.relid, "columns": [list(c) for c in self.columns]}
        if self.row_filter is not None:
            out["row_filter"] = self.row_filter
        if self.column_list is not None:
            out["column_list"] = list(self.column_list)
        if self.partitions is not None:
            out["partitions"] = list(self.partitions)
        if self.identity != "full":
            out["identity"], out["key"] = self.identity, list(self.key)
        if self.attnum_upto is not None:
            out["attnum_upto"] = self.attnum_upto
        if self.attnums is not None:
            out["attnums"] = list(self.attnums)
        return out

    @staticmethod
    def from_json(d: dict) -> "TableInfo":
        columns, partitions = d.get("column_list"), d.get("partitions")
        return TableInfo(d["table"], int(d["relid"]), tuple((str(n), int(o), int(m)) for n, o, m in d["columns"]),
                         d.get("row_filter"), None if columns is None else tuple(columns),
                         None if partitions is None else tuple(int(p) for p in partitions),
                         d.get("identity", "full"), tuple(d.get("key", ())), d.get("attnum_upto"),
                         None if d.get("attnums") is None else tuple(int(a) for a in d["attnums"]))

    @property
    def keyed(self) -> bool:
        """Its old rows are named by a key, not sent whole."""
        return self.identity != "full"

    def identity_text(self) -> str:
        """``FULL``, or ``DEFAULT (primary key (id))`` / ``USING INDEX (a, b)``."""
        if not self.keyed:
            return "FULL"
        cols = ", ".join(self.key)
        return f"DEFAULT (primary key ({cols}))" if self.identity == "default" else f"USING INDEX ({cols})"

    def relation_sql(self) -> sql.Composable:
        """The table as a snapshot reads it: ``ONLY schema.table`` (a publication takes a table's
        inheritance children as tables of their own), the whole tree of a partitioned root."""
        schema, _, name = self.table.partition(".")
        ident = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))
        return ident if self.partitioned else sql.SQL("ONLY {}").format(ident)

    def where_sql(self) -> sql.Composable:
        """`` WHERE (<row filter>)`` (Postgres's own text of it), or nothing."""
        return sql.SQL("") if self.row_filter is None else sql.SQL(" WHERE ({})").format(sql.SQL(self.row_filter))


PUBLISHED_OPERATIONS = ("insert", "update", "delete", "truncate")
"""What a publication must publish for its tables to land exactly: without updates, deletes or truncates a
collection would keep rows its table no longer holds."""


@dataclass(frozen=True)
class SlotState:
    confirmed_flush: int
    restart: int
    wal_status: str | None


@dataclass(frozen=True)
class Snapshot:
    """An exported snapshot at ``lsn`` (a temporary slot's consistent point), valid while it is open."""

    name: str
    lsn: int


class PostgresUpstream:
    """One source's upstream Postgres: its publication, its slot, its tables."""

    def __init__(self, source: str, dsn: str, publication: str, timeout: float = 15.0) -> None:
        self.source = source
        self.dsn = dsn
        self.publication = publication
        self.slot = slot_name(source)
        self.timeout = timeout
        self.flush_waited_ms: float | None = None  # the last catalog_upper's wait for the WAL flush
        self._sessions = ConnectionLender(lambda: self.connect())  # resolved at each call (tests wrap it)

    # -- connections ----------------------------------------------------------------------------------

    def holding(self):
        """Lend one upstream session to every :meth:`session` of this thread until the block ends, then
        close it (``reclock.lending``; a connection costs ~6 ms: a cycle used to open four)."""
        return self._sessions.holding()

    def session(self):
        """An autocommit session (:meth:`connect`): inside a :meth:`holding` block of this thread, the
        block's (``reclock.lending``: replaced when it broke, was left in a transaction, an error left it,
        or it sat idle); else a new connection, closed at the end."""
        return self._sessions.connect()

    def connect(self, autocommit: bool = True) -> psycopg.Connection:
        """A session on the upstream database with the text styles the decoder reads."""
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=int(self.timeout))
        except psycopg.OperationalError as e:
            raise UpstreamUnavailable(f"source {self.source}: the upstream Postgres is unreachable: {e}") from e
        try:
            conn.execute("; ".join(SESSION))  # one round trip (the simple query protocol: no parameters)
            conn.autocommit = autocommit
        except BaseException:
            conn.close()
            raise
        return conn

    # -- checks -----------------------------------------------------------------------------------------

    def published_tables(self, conn) -> list[str]:
        """``schema.table`` of every table in the publication; ``PublicationMissing`` if there is none."""
        return sorted(self._publication(conn))

    def _publication(self, conn) -> dict[str, tuple[tuple[str, ...], str | None]]:
        """``{schema.table: (published column names, row filter)}`` of the publication
        (``pg_publication_tables``: the leaf partitions, or the roots of a ``publish_via_partition_root``
        one; a ``FOR TABLES IN SCHEMA`` / ``FOR ALL TABLES`` one's tables as of now), after checking it
        publishes every operation (:data:`PUBLISHED_OPERATIONS`). ``PublicationMissing`` if it does not
        exist, ``PublicationUnsupported`` if it leaves an operation out."""
        row = conn.execute("SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = %s",
                           (self.publication,)).fetchone()
        if row is None:
            raise PublicationMissing(self.source, "(all)", f"publication {self.publication} does not exist",
                                     f"CREATE PUBLICATION {self.publication} FOR TABLE ...")
        left_out = [op for op, on in zip(PUBLISHED_OPERATIONS, row) if not on]
        if left_out:
            published = ", ".join(op for op, on in zip(PUBLISHED_OPERATIONS, row) if on) or "nothing"
            raise PublicationUnsupported(
                self.source, "(all)", f"publication {self.publication} publishes {published}, not "
                f"{' or '.join(left_out)}: the collections would keep rows the tables no longer hold",
                f"run: ALTER PUBLICATION {pg_ident(self.publication)} SET (publish = "
                f"'{', '.join(PUBLISHED_OPERATIONS)}');")
        rows = conn.execute("SELECT schemaname, tablename, attnames, rowfilter FROM pg_publication_tables "
                            "WHERE pubname = %s", (self.publication,)).fetchall()
        return {f"{s}.{t}": (tuple(a or ()), f) for s, t, a, f in rows}

    def describe(self, conn, tables: Sequence[str]) -> list[TableInfo]:
        """Each table's oid, published columns, row filter and column list, after checking the publication
        (:meth:`_publication`), that the table is in it, and that it (every partition of a partitioned
        root too) has an identity that names its old rows (:meth:`_identity`)."""
        published = self._publication(conn)
        out = []
        for table in tables:
            if table not in published:
                self._not_published(conn, table, published)
            names, row_filter = published[table]
            schema, _, name = table.partition(".")
            row = conn.execute("SELECT c.oid::int8, c.relreplident, c.relkind FROM pg_class c JOIN pg_namespace n "
                               "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                               (schema, name)).fetchone()
            if row is None:  # dropped between the two queries
                raise PublicationMissing(self.source, table, "does not exist", "re-snapshot the source")
            relid, ident, relkind = row
            identity, key = self._identity(conn, table, relid, ident)
            partitions = None
            if relkind == "p":  # published via its root: each partition's WAL must name old rows as the root's does
                members = conn.execute(
                    "SELECT c.oid::int8, n.nspname || '.' || c.relname, c.relreplident FROM pg_partition_tree(%s::oid) "
                    "p JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE p.level > 0 ORDER BY p.level, 2", (relid,)).fetchall()
                for member_oid, member, member_ident in members:
                    member_identity, _ = self._identity(conn, member, member_oid, member_ident,
                                                        f" (a partition of {table}, which the publication publishes "
                                                        "through its root)")
                    if (member_identity == "full") != (identity == "full"):
                        raise ReplicaIdentityMissing(self.source, member, f"{IDENTITY[member_ident]}, and its root "
                                                     f"{table}'s is {IDENTITY[ident]} (the publication publishes the "
                                                     "partitions through their root: give them one kind of identity)")
                partitions = tuple(sorted(int(oid) for oid, _, _ in members))
            cols = conn.execute("SELECT attname, atttypid::int8, atttypmod, attnum::int FROM pg_attribute WHERE "
                                "attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (relid,)).fetchall()
            listed = conn.execute("SELECT pr.prattrs IS NOT NULL FROM pg_publication_rel pr JOIN pg_publication p "
                                  "ON p.oid = pr.prpubid WHERE p.pubname = %s AND pr.prrelid = %s",
                                  (self.publication, relid)).fetchone()
            column_list = tuple(names) if listed is not None and listed[0] else None
            if column_list is not None:
                cols = [c for c in cols if c[0] in column_list]
                outside = [k for k in key if k not in column_list]
                if outside:
                    raise PublicationUnsupported(
                        self.source, table, f"publication {self.publication}'s column list {_columns(column_list)} "
                        f"leaves out key column(s) {', '.join(outside)} of its replica identity",
                        f"add them to the column list: ALTER PUBLICATION {pg_ident(self.publication)} SET TABLE "
                        f"{table} ({', '.join([*column_list, *outside])})")
            (upto,) = conn.execute("SELECT max(attnum)::int FROM pg_attribute WHERE attrelid = %s AND attnum > 0",
                                   (relid,)).fetchone()
            out.append(TableInfo(table, relid, tuple((n, o, m) for n, o, m, _ in cols), row_filter, column_list,
                                 partitions, identity, key, upto, tuple(a for _, _, _, a in cols)))
        return out

    def _identity(self, conn, table: str, relid: int, ident: str, where: str = "") -> tuple[Identity, tuple[str, ...]]:
        """``(identity, key columns)`` of a table whose ``relreplident`` is ``ident``: ``FULL``, ``DEFAULT``
        with a primary key, or ``USING INDEX``; ``ReplicaIdentityMissing`` for ``NOTHING`` and for ``DEFAULT``
        without a primary key (its updates and deletes name no old row)."""
        if ident == "f":
            return "full", ()
        if ident in ("d", "i"):
            key = tuple(n for (n,) in conn.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = "
                "ANY(i.indkey::int2[]) WHERE i.indrelid = %s AND " + ("i.indisprimary" if ident == "d" else
                                                                         "i.indisreplident")
                + " ORDER BY array_position(i.indkey::int2[], a.attnum)", (relid,)).fetchall())
            if key:
                return _IDENTITY_OF[ident], key
            raise ReplicaIdentityMissing(self.source, table, f"{IDENTITY[ident]} without a primary key{where}")
        raise ReplicaIdentityMissing(self.source, table, IDENTITY.get(ident, ident) + where)

    def _not_published(self, conn, table: str, published: dict) -> None:
        """``PublicationMissing`` for a table the publication does not publish; for a partitioned table whose
        partitions it publishes as tables of their own, saying so and what to choose."""
        schema, _, name = table.partition(".")
        parts = conn.execute("SELECT n.nspname || '.' || c.relname FROM pg_class r JOIN pg_namespace rn ON rn.oid = "
                             "r.relnamespace, pg_partition_tree(r.oid) p JOIN pg_class c ON c.oid = p.relid JOIN "
                             "pg_namespace n ON n.oid = c.relnamespace WHERE rn.nspname = %s AND r.relname = %s "
                             "AND r.relkind = 'p' AND p.isleaf ORDER BY 1", (schema, name)).fetchall()
        leaves = [p for (p,) in parts if p in published]
        if leaves:
            raise PublicationMissing(self.source, table, f"is partitioned, and publication {self.publication} "
                                     f"publishes its partitions as tables of their own ({', '.join(leaves)})",
                                     f"list the partitions under `tables:`, or run ALTER PUBLICATION "
                                     f"{pg_ident(self.publication)} SET (publish_via_partition_root = true); to take "
                                     "the whole tree as one collection")
        raise PublicationMissing(self.source, table, f"not in publication {self.publication} (dropped, "
                                 "or removed from the publication)",
                                 f"ALTER PUBLICATION {self.publication} ADD TABLE {table}, or re-snapshot")

    @staticmethod
    def published_columns(conn, info: TableInfo) -> tuple[tuple[str, int, int], ...]:
        """The columns of ``info``'s table the publication publishes now (in ``conn``'s snapshot): all of them
        in order, or those of its column list."""
        return tuple(c for c, _ in PostgresUpstream.numbered_columns(conn, info))

    @staticmethod
    def numbered_columns(conn, info: TableInfo) -> tuple[tuple[tuple[str, int, int], int], ...]:
        """:meth:`published_columns` with each one's column number: ``((name, type oid, typmod), attnum)``."""
        cols = conn.execute("SELECT attname, atttypid::int8, atttypmod, attnum::int FROM pg_attribute WHERE "
                            "attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (info.relid,)).fetchall()
        return tuple(((n, o, m), a) for n, o, m, a in cols if info.column_list is None or n in info.column_list)

    @staticmethod
    def read_catalog(conn, tables: Sequence[TableInfo]) -> dict[int, CatalogTable]:
        """Each table's columns in the catalog as ``conn``'s statement sees it (``ddl.CatalogTable``, by oid)."""
        out: dict[int, tuple[list, list]] = {t.relid: ([], []) for t in tables}
        for relid, name, num, gone in conn.execute(
                "SELECT attrelid::int8, attname, attnum::int, attisdropped FROM pg_attribute WHERE attrelid = "
                "ANY(%s::oid[]) AND attnum > 0 ORDER BY attrelid, attnum", ([t.relid for t in tables],)).fetchall():
            out[int(relid)][1 if gone else 0].append(num if gone else (name, num))
        return {r: CatalogTable(tuple(live), tuple(dropped)) for r, (live, dropped) in out.items()}

    def catalog_upper(self, conn, tables: Sequence[TableInfo], lock_timeout_ms: int = 2000,
                      flush_wait_s: float = 30.0) -> tuple[int, dict[int, CatalogTable]]:
        """An upper LSN ``U`` and the tables' columns in the catalog as of it (``ddl.CatalogTable``, by oid).

        In one transaction: every table locked ``IN ACCESS SHARE MODE`` (it conflicts only with the ``ACCESS
        EXCLUSIVE`` lock ``ALTER TABLE`` takes; DML goes on), then the catalog read and ``U`` =
        ``pg_current_wal_insert_lsn()``: every ``ALTER TABLE`` committed before the lock was granted is in the
        read and its commit record below ``U``; none commits until the lock is released, and then above ``U``.
        ``U`` is the insert position, not the flush position, as an ``ALTER`` of a session with
        ``synchronous_commit = off`` is visible before its commit record is flushed; so this then waits until
        the flush position reaches ``U`` (a peek decodes only what is flushed: an upper the slot cannot deliver
        yet is never returned). :class:`~reclock.errors.CatalogBusy` if a lock is not granted within
        ``lock_timeout_ms`` (an ``ALTER`` holds it, or waits for a long transaction with it queued ahead)."""
        with conn.transaction(force_rollback=True):
            conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
            for t in tables:
                schema, _, name = t.table.partition(".")
                try:
                    conn.execute(sql.SQL("LOCK TABLE {}.{} IN ACCESS SHARE MODE").format(
                        sql.Identifier(schema), sql.Identifier(name)))
                except psycopg.errors.LockNotAvailable as e:
                    raise CatalogBusy(self.source, t.table, str(e).strip()) from e
                except psycopg.errors.UndefinedTable as e:
                    raise PublicationMissing(self.source, t.table, "does not exist (dropped or renamed)",
                                             f"`reclock resnapshot {self.source}`") from e
            catalog = self.read_catalog(conn, tables)
            upper, block = conn.execute("SELECT pg_current_wal_insert_lsn()::text, "
                                        "current_setting('wal_block_size')::int").fetchone()
        upper = lsn_to_int(upper)
        if 0 < upper % block <= 40:  # the insert position is past a page header, where no record starts
            upper -= upper % block
        t0 = time.monotonic()
        while self.flush_lsn(conn) < upper:
            if time.monotonic() - t0 > flush_wait_s:
                raise UpstreamUnavailable(f"source {self.source}: the upstream's WAL was not flushed up to "
                                          f"{lsn_to_str(upper)} within {flush_wait_s:g} s")
            time.sleep(0.005)
        self.flush_waited_ms = round((time.monotonic() - t0) * 1000, 1)
        return upper, catalog

    @staticmethod
    def added_columns(conn, info: TableInfo, added: Sequence[tuple[str, int, int]]
                      ) -> tuple[str | None, dict[str, str | None]]:
        """What the rows a table held when the columns ``added`` (``(name, type oid, typmod)``, as a Relation
        message named them; ``info``: the table as registered before them) were added hold in them:
        ``(None, {column: text form or None})`` when it is known, else ``(why not, {})``. They hold the
        column's missing value (``atthasmissing``: an ``ADD COLUMN ... DEFAULT`` of a non-volatile default,
        kept in the catalog, its text form as the stream's) or else null, when each column is in the table
        now, of that type, not an identity or generated column, without a default unless it has a missing
        value (a volatile default rewrote the table), and no column was added and dropped since the table
        was registered (then the column the WAL named may be another of that name). Looked up in the
        catalog as it is now (in a session of the stream's styles): anything it cannot tell is a reason."""
        rows = conn.execute(
            "SELECT a.attname, a.attnum, a.attisdropped, a.atttypid::int8, a.atttypmod, a.atthasmissing, "
            "d.oid IS NOT NULL, a.attidentity <> '' OR a.attgenerated <> '', "
            "CASE WHEN a.atthasmissing THEN (a.attmissingval::text::text[])[1] END FROM pg_attribute a LEFT JOIN "
            "pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE a.attrelid = %s AND a.attnum > 0",
            (info.relid,)).fetchall()
        live = {r[0]: r for r in rows if not r[2]}
        upto = info.attnum_upto
        if upto is None:  # a registration older than attnum_upto: its columns' numbers now
            upto = max((live[n][1] for n, _, _ in info.columns if n in live), default=0)
        dropped = sorted(r[1] for r in rows if r[2] and r[1] > upto)
        if dropped:
            return (f"a column added after the source registered the table was dropped since (column number "
                    f"{dropped[0]}), so which column the WAL names cannot be told from the catalog"), {}
        fills: dict[str, str | None] = {}
        for name, oid, typmod in added:
            row = live.get(name)
            if row is None:
                return f"column {name} is not in the table any more", {}
            _, _, _, now_oid, now_typmod, missing, default, special, value = row
            if (now_oid, now_typmod) != (oid, typmod):
                return f"column {name} has changed type since", {}
            if special or default and not missing:
                return (f"column {name} is an identity or generated column, or was added with a volatile DEFAULT "
                        "(or has a DEFAULT now): the rows the table held then may hold values the WAL does not "
                        "carry"), {}
            fills[name] = value if missing else None
        return None, fills

    def check_tables(self, conn, registered: Sequence[TableInfo]) -> None:
        """Every registered table is still there (same oid), published as it was registered
        (:meth:`check_definitions`), and of the replica identity it had (:meth:`describe`;
        ``ReplicaIdentityChanged`` otherwise)."""
        for info, now in zip(registered, self.describe(conn, [t.table for t in registered])):
            if now.relid != info.relid:
                raise PublicationMissing(self.source, info.table, f"was dropped and created again (oid {info.relid} "
                                         f"is now {now.relid})", "re-snapshot the source")
            if (now.keyed, now.key) != (info.keyed, info.key):
                raise ReplicaIdentityChanged(self.source, info.table, f"its replica identity is {now.identity_text()}, "
                                             f"not {info.identity_text()} as when the source took its snapshot",
                                             f"set it back, or `reclock resnapshot {self.source}` to take it as it is")
            self._compare(info, now.row_filter, now.column_list, now.partitions)

    def check_definitions(self, conn, registered: Sequence[TableInfo]) -> None:
        """The publication still publishes every operation, and every registered table with the row filter
        and column list it was registered with, a partitioned root with the same partitions:
        ``PublicationUnsupported``, ``PublicationMissing`` or ``PublicationRedefined`` otherwise. At most four
        queries whatever the number of tables: a write runs it
        after its binding was minted, so a redefinition committed below the LSN it reads up to is seen."""
        published = self._publication(conn)
        listed = {int(r): bool(a) for r, a in conn.execute(
            "SELECT pr.prrelid::int8, pr.prattrs IS NOT NULL FROM pg_publication_rel pr JOIN pg_publication p "
            "ON p.oid = pr.prpubid WHERE p.pubname = %s", (self.publication,)).fetchall()}
        roots = [t.relid for t in registered if t.partitions is not None]
        trees: dict[int, list[int]] = {r: [] for r in roots}
        if roots:
            for root, member in conn.execute("SELECT r.root::int8, p.relid::int8 FROM unnest(%s::oid[]) r(root), "
                                             "pg_partition_tree(r.root) p WHERE p.level > 0", (roots,)).fetchall():
                trees[int(root)].append(int(member))
        for info in registered:
            if info.table not in published:
                raise PublicationMissing(self.source, info.table, f"not in publication {self.publication} (dropped, "
                                         "or removed from the publication)",
                                         f"ALTER PUBLICATION {self.publication} ADD TABLE {info.table}, or re-snapshot")
            names, row_filter = published[info.table]
            self._compare(info, row_filter, tuple(names) if listed.get(info.relid) else None,
                          None if info.partitions is None else tuple(sorted(trees[info.relid])))

    def _compare(self, info: TableInfo, row_filter: str | None, column_list: tuple[str, ...] | None,
                 partitions: tuple[int, ...] | None) -> None:
        changed = []
        if partitions != info.partitions:
            was, now = set(info.partitions or ()), set(partitions or ())
            moved = [f"{len(now - was)} attached" if now - was else "",
                     f"{len(was - now)} detached" if was - now else ""]
            changed.append(f"its partitions changed ({', '.join(m for m in moved if m)}: their rows came or went "
                           "without a change Reclock can read)")
        if row_filter != info.row_filter:
            changed.append(f"its row filter changed from {info.row_filter or '(none)'} to {row_filter or '(none)'}")
        if column_list != info.column_list:
            changed.append(f"its column list changed from {_columns(info.column_list)} to {_columns(column_list)}")
        if changed:
            raise PublicationRedefined(self.source, info.table, f"in publication {self.publication}, "
                                       + " and ".join(changed) + " since the source took its snapshot",
                                       f"`reclock resnapshot {self.source}` lands it as now defined")

    def slot_state(self, conn) -> SlotState | None:
        row = conn.execute("SELECT confirmed_flush_lsn::text, restart_lsn::text, wal_status, plugin, database "
                           "FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)).fetchone()
        if row is None:
            return None
        confirmed, restart, status, plugin, database = row
        if plugin != "pgoutput" or database != conn.info.dbname:
            raise SlotLost(self.source, self.slot, f"is not a pgoutput slot of database {conn.info.dbname} "
                           f"(plugin {plugin}, database {database})")
        return SlotState(lsn_to_int(confirmed) if confirmed else 0, lsn_to_int(restart) if restart else 0, status)

    def healthy_slot(self, conn) -> SlotState:
        """The slot's state; ``SlotLost`` if it is gone or invalidated."""
        state = self.slot_state(conn)
        if state is None:
            raise SlotLost(self.source, self.slot, "does not exist (it was dropped)")
        if state.wal_status == "lost" or state.restart == 0:
            raise SlotLost(self.source, self.slot, f"was invalidated (wal_status {state.wal_status}: the WAL it "
                           "needed was removed, e.g. past max_slot_wal_keep_size)")
        return state

    def ensure_slot(self, conn) -> SlotState:
        """Create the slot if it does not exist (only a source with no binding yet may; see the cycle)."""
        if self.slot_state(conn) is None:
            with contextlib.suppress(psycopg.errors.DuplicateObject):
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))
        return self.healthy_slot(conn)

    def drop_slot(self, conn) -> None:
        """Drop the slot if it exists (a re-snapshot starts a new one)."""
        if self.slot_state(conn) is not None:
            with contextlib.suppress(psycopg.errors.UndefinedObject):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))

    def flush_lsn(self, conn) -> int:
        return lsn_to_int(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])

    # -- the cycle's calls ------------------------------------------------------------------------------

    def probe_upper(self, tables: Sequence[TableInfo] = ()) -> tuple[PartitionedFrontier, dict[int, CatalogTable]]:
        """The upper (:meth:`catalog_upper`: every transaction below it is flushed) as a frontier, with the
        catalog of ``tables`` as of it (the slot must exist and be healthy; ``SlotLost`` otherwise)."""
        with self.session() as conn:
            self.healthy_slot(conn)
            upper, catalog = self.catalog_upper(conn, tables)
            return lsn_frontier(upper), catalog

    def acknowledged(self) -> PartitionedFrontier:
        """What resume has acknowledged upstream: the slot's confirmed position (nothing if there is no slot)."""
        with self.session() as conn:
            state = self.slot_state(conn)
        return lsn_frontier(state.confirmed_flush) if state is not None else PartitionedFrontier.of({})

    def check_retained(self, conn, needed_from: int) -> SlotState:
        """``SlotLost`` unless the slot still holds every transaction committed at or after ``needed_from``."""
        state = self.healthy_slot(conn)
        if state.confirmed_flush > needed_from:
            raise SlotLost(self.source, self.slot, f"is at {lsn_to_str(state.confirmed_flush)}, past "
                           f"{lsn_to_str(needed_from)} where the shards need changes from")
        return state

    def peek_blocks(self, conn, upto: int, batch: int = 10_000) -> Iterator[list[bytes]]:
        """The slot's messages of transactions committed below ``upto`` (and maybe one more, see
        ``pg_logical_slot_peek_binary_changes``), undecoded, in lists of ``batch`` fetched at a time on a
        server-side cursor. ``conn`` must not be in autocommit (a named cursor lives in a transaction)."""
        with conn.cursor(name=f"peek_{uuid.uuid4().hex[:8]}", binary=True,  # bytea as is, not hex
                         row_factory=scalar_row) as cur:
            try:
                cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, "
                            "'proto_version', '1', 'publication_names', %s)",
                            (self.slot, lsn_to_str(upto), self.publication))
                while True:
                    rows = cur.fetchmany(batch)
                    if not rows:
                        break
                    yield rows
            except psycopg.errors.UndefinedObject as e:  # the slot or the publication vanished meanwhile
                if "publication" in str(e):
                    raise PublicationMissing(self.source, "(all)", str(e), "create the publication again "
                                             "and re-snapshot") from e
                raise SlotLost(self.source, self.slot, f"could not be read: {e}") from e
            except psycopg.errors.ObjectNotInPrerequisiteState as e:
                raise SlotLost(self.source, self.slot, f"could not be read: {e}") from e
            except psycopg.errors.ObjectInUse as e:
                raise SlotBusy(self.source, self.slot, str(e).strip()) from e

    @contextlib.contextmanager
    def temporary_copy(self, conn) -> Iterator[str]:
        """A temporary copy of the slot, at the slot's position, named ``<slot>_<8 hex>``: it can be read
        while a cycle holds the slot itself, never moves the slot, and is dropped on leaving (or with the
        session, if the process dies first). ``SlotLost`` if the slot is gone or invalidated."""
        self.healthy_slot(conn)
        copy = f"{self.slot[:50]}_{uuid.uuid4().hex[:8]}"
        try:
            conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, true)", (self.slot, copy))
        except psycopg.errors.UndefinedObject as e:  # dropped since the check
            raise SlotLost(self.source, self.slot, f"could not be copied: {e}") from e
        try:
            yield copy
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_drop_replication_slot(%s)", (copy,))

    def pending_changes(self, conn, since: int | None = None) -> bool:
        """Whether a transaction that changed a published table committed at or after ``since`` (the slot's
        position when None or below it): one transaction peeked from a :meth:`temporary_copy`, advanced to
        ``since`` first (pgoutput sends no empty transactions from Postgres 15 on; before, any transaction of
        the database counts). ``PublicationMissing`` if the publication is gone."""
        with self.temporary_copy(conn) as copy:
            try:
                if since is not None:  # never backwards (Postgres refuses it): a copy at or past `since` stays
                    conn.execute("SELECT pg_replication_slot_advance(slot_name, %s::pg_lsn) FROM pg_replication_slots "
                                 "WHERE slot_name = %s AND confirmed_flush_lsn < %s::pg_lsn",
                                 (lsn_to_str(since), copy, lsn_to_str(since)))
                return conn.execute("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, 1, "
                                    "'proto_version', '1', 'publication_names', %s)",
                                    (copy, self.publication)).fetchone()[0] > 0
            except psycopg.errors.UndefinedObject as e:
                raise PublicationMissing(self.source, "(all)", str(e).strip(), "create the publication again "
                                         "and re-snapshot") from e

    def reason_to_bind(self, conn, since: int, newest_ts: int, now_ms: int, idle_s: float | None = None) -> str | None:
        """Why a binding past LSN ``since`` is worth minting now, in words (None: nothing calls for one): a
        transaction that changed a published table committed at or after it (:meth:`pending_changes`); or
        none did, but :data:`IDLE_WAL_BYTES` of WAL lie past it, or some WAL does and the newest binding
        (minted at ``newest_ts``, ms) is ``idle_s`` (:data:`IDLE_S`) old, so a binding lets the slot follow
        and release that WAL (an idle source never pins WAL). The flush LSN is read after the peek: a change that commits between
        them is seen at the next look. Used by ``schedule: upstream``'s trigger (``since``: the slot's position)
        and a continuous source's mint (``since``: its newest binding's LSN)."""
        if self.pending_changes(conn, since):
            return "the publication has changes"
        behind = self.flush_lsn(conn) - since
        idle_s = IDLE_S if idle_s is None else idle_s
        if behind >= IDLE_WAL_BYTES or (behind > 0 and now_ms - newest_ts >= idle_s * 1000):
            return f"idle: {behind} bytes of WAL behind the slot to release"
        return None

    def read_blocks(self, conn, upto: int, batch: int = 10_000, ahead: int = 2) -> Iterator[list[bytes]]:
        """:meth:`peek_blocks` on a helper thread, up to ``ahead`` blocks ahead of the caller
        (``reclock.ahead.read_ahead``): the next blocks cross the network while the caller decodes this one.
        The peek's errors are raised here; a caller that stops early cancels a peek still running."""
        cancel = getattr(conn, "cancel_safe", None) or conn.cancel
        return read_ahead(self.peek_blocks(conn, upto, batch), ahead, f"reclock-peek-{self.source}", cancel)

    def commit(self, frontier: PartitionedFrontier) -> None:
        """Advance the slot to the frontier's LSN (never backwards; a slot already there is left alone)."""
        lsn = frontier.get(LSN_PARTITION)
        if lsn == 0:
            return
        with self.session() as conn:
            state = self.healthy_slot(conn)
            if lsn > state.confirmed_flush:
                try:
                    conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, lsn_to_str(lsn)))
                except psycopg.errors.ObjectInUse as e:
                    raise SlotBusy(self.source, self.slot, str(e).strip()) from e

    @contextlib.contextmanager
    def export_snapshot(self) -> Iterator[Snapshot]:
        """A snapshot exported by a temporary slot created over a ``replication=database`` connection, at the
        slot's consistent point; valid inside the ``with`` (the connection stays open and idle), the
        temporary slot dropped when it closes. Replication commands go over the simple query protocol
        (``pgconn.exec_``)."""
        try:
            repl = psycopg.connect(self.dsn, autocommit=True, replication="database",
                                   connect_timeout=int(self.timeout))
        except psycopg.OperationalError as e:
            raise UpstreamUnavailable(f"source {self.source}: the upstream Postgres is unreachable: {e}") from e
        try:
            tmp = f"{self.slot}_snap_{uuid.uuid4().hex[:8]}"
            res = repl.pgconn.exec_(f"CREATE_REPLICATION_SLOT {tmp} TEMPORARY LOGICAL pgoutput "
                                    "(SNAPSHOT 'export')".encode())
            if res.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise UpstreamUnavailable(f"source {self.source}: creating the snapshot's temporary slot failed: "
                                          f"{res.error_message.decode(errors='replace')}")
            consistent, snapshot = res.get_value(0, 1).decode(), res.get_value(0, 2).decode()
            yield Snapshot(snapshot, lsn_to_int(consistent))
        finally:
            repl.close()

    @staticmethod
    def table_size(conn, relid: int) -> tuple[int, int, int]:
        """``(bytes, pages, page size)`` of a table: ``pg_table_size`` (its TOAST included), its heap's
        pages, and the server's ``block_size``."""
        row = conn.execute("SELECT pg_table_size(%s::oid), pg_relation_size(%s::oid), "
                           "current_setting('block_size')::int8", (relid, relid)).fetchone()
        block = int(row[2])
        return int(row[0] or 0), int(row[1] or 0) // block, block

    @staticmethod
    def truncated_since(conn, info: TableInfo) -> bool:
        """Whether the table (every partition of a root) has another storage now than ``conn``'s snapshot
        sees in ``pg_class``: a ``TRUNCATE`` (or a rewrite) committed after the snapshot was taken. A
        snapshot reads a table truncated after it as empty (``TRUNCATE`` is not MVCC-safe): call it after
        reading the table, in the reading transaction (whose lock keeps the table as it was read)."""
        oids = [info.relid, *(info.partitions or ())]
        rows = conn.execute("SELECT c.relfilenode::int8, pg_relation_filenode(c.oid)::int8 FROM pg_class c WHERE "
                            "c.oid = ANY(%s::oid[]) AND c.relkind IN ('r', 'm')", (oids,)).fetchall()
        return any(seen != now for seen, now in rows)

    @staticmethod
    def estimate_rows(conn, info: TableInfo) -> int:
        """The planner's estimate of the rows the publication publishes of a table (its statistics, or its
        pages when it has none yet): an online snapshot's chunks expected, without reading the table."""
        query = sql.SQL("EXPLAIN (FORMAT JSON) SELECT 1 FROM {}{}").format(info.relation_sql(), info.where_sql())
        plan = conn.execute(query).fetchone()[0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
        return max(0, int(plan[0]["Plan"]["Plan Rows"]))

    @staticmethod
    def count_rows(conn, info: TableInfo) -> int:
        """``count(*)`` of the rows the publication publishes of a table (its row filter's) in ``conn``'s
        transaction (under a snapshot: what it holds)."""
        query = sql.SQL("SELECT count(*) FROM {}{}").format(info.relation_sql(), info.where_sql())
        return int(conn.execute(query).fetchone()[0])

    def watermark(self, conn, which: str) -> int:
        """A chunk's watermark written into the WAL now (``pg_logical_emit_message``, not transactional;
        ``reclock.sources.postgres.chunks``): its LSN."""
        from reclock.sources.postgres.chunks import WATERMARK_PREFIX

        row = conn.execute("SELECT pg_logical_emit_message(false, %s, %s)::text",
                           (WATERMARK_PREFIX, f"{self.source} {which}")).fetchone()
        return lsn_to_int(row[0])

    def read_chunk(self, info: TableInfo, after: tuple | None, limit: int, read: Callable[[Any, Any], int],
                   stop: tuple | None = None):
        """One chunk of ``info``'s keys past ``after`` (at most ``limit`` rows, in key order) between a low and a
        high watermark (``reclock.sources.postgres.chunks``): ``read(conn, query)`` reads the rows of ``query`` (a
        ``COPY``) in a ``REPEATABLE READ`` transaction whose snapshot is recorded, and returns how many; the
        :class:`~reclock.sources.postgres.chunks.Chunk` (``last`` None when it read the table's last key). A chunk
        reaching ``stop`` (the table's last key when its first chunk was read) reads every key past ``after``: keys
        inserted past it while the snapshot runs come in its last chunk, so the snapshot ends."""
        from reclock.sources.postgres.chunks import Chunk, XidSnapshot

        with self.session() as conn:
            low = self.watermark(conn, "low")
        rconn = self.connect(autocommit=False)
        try:
            rconn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            snap = XidSnapshot.parse(rconn.execute("SELECT pg_current_snapshot()::text").fetchone()[0])
            raced = tuple(int(x) for (x,) in rconn.execute(
                "SELECT x::text::int8 FROM unnest(%s::int8[]) x WHERE pg_xact_status(x::text::xid8) = 'committed'",
                (list(snap.xip),)).fetchall())
            keys = sql.SQL(", ").join(sql.Identifier(k) for k in info.key)

            def where(lo: tuple | None, hi: tuple | None = None) -> sql.Composable:
                conds = [sql.SQL("({})").format(sql.SQL(info.row_filter))] if info.row_filter is not None else []
                for op, at in ((">", lo), ("<=", hi)):
                    if at is not None:
                        conds.append(sql.SQL("({}) " + op + " ({})").format(
                            keys, sql.SQL(", ").join(sql.Literal(int(v)) for v in at)))
                return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conds) if conds else sql.SQL("")

            bound = rconn.execute(sql.SQL("SELECT {} FROM {}{} ORDER BY {} OFFSET {} LIMIT 1").format(
                keys, info.relation_sql(), where(after), keys, sql.Literal(max(0, limit - 1)))).fetchone()
            last = None
            if bound is not None:  # the chunk's last key, unless no key follows it
                more = rconn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {}{})").format(
                    info.relation_sql(), where(tuple(bound)))).fetchone()[0]
                last = tuple(int(v) for v in bound) if more else None
                if last is not None and stop is not None and last >= stop:
                    last = None
            cols = sql.SQL(", ").join(sql.SQL(text_form(n, o)) for n, o, _ in info.columns)
            query = sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT (FORMAT csv)").format(
                cols, info.relation_sql(), where(after, last))
            rows = read(rconn, query)
            if self.truncated_since(rconn, info):
                raise TruncatedUnderSnapshot(self.source, info.table)
            rconn.rollback()
        finally:
            rconn.close()
        with self.session() as conn:
            high = self.watermark(conn, "high")
        return Chunk(after, last, rows, low, high, snap, raced)

    @staticmethod
    def last_key(conn, info: TableInfo) -> tuple | None:
        """The table's greatest key (of the rows its publication publishes), None if it has no row."""
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in info.key)
        desc = sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(k)) for k in info.key)
        row = conn.execute(sql.SQL("SELECT {} FROM {}{} ORDER BY {} LIMIT 1").format(
            keys, info.relation_sql(), info.where_sql(), desc)).fetchone()
        return None if row is None else tuple(int(v) for v in row)

    @contextlib.contextmanager
    def snapshot_reader(self, snapshot: Snapshot) -> Iterator[psycopg.Connection]:
        """A connection in a REPEATABLE READ transaction on ``snapshot`` (read only)."""
        conn = self.connect(autocommit=False)
        try:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot.name)))
            yield conn
        finally:
            conn.rollback()
            conn.close()
