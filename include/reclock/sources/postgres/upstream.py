"""The Postgres upstream: a publication read through a logical replication slot with ``pgoutput``.

FromTime is the commit LSN. Reclock keeps it in a :class:`~reclock.time.PartitionedFrontier` with a single
partition :data:`LSN_PARTITION` (the LSN is the "offset"), so the remap collection, descriptions and
compaction are the same code as for Kafka; a binding ``(t, {0: L})`` says "every transaction whose commit
record starts below ``L`` is in at ``t`` or earlier".

==================  ========================================================================================
step                what this module does
==================  ========================================================================================
mint                :meth:`PostgresUpstream.probe_upper`: check the publication, the tables and their replica
                    identity, make sure the slot ``reclock_<source>`` exists and is healthy, and return the
                    flush LSN (``pg_current_wal_flush_lsn()``)
write_batches       :meth:`~PostgresUpstream.read_blocks`: the slot's messages up to an LSN, through
                    ``pg_logical_slot_peek_binary_changes`` on a server-side cursor (peek does not consume,
                    so a retried write reads the same), fetched on a helper thread ahead of the decoding;
                    :meth:`~PostgresUpstream.export_snapshot`: the initial snapshot
resume              :meth:`~PostgresUpstream.commit`: ``pg_replication_slot_advance`` to the offset resumption
                    frontier (idle cycles too: any WAL moves the flush LSN, so a binding follows and the slot
                    with it; the slot never pins WAL Reclock no longer needs)
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
publication or table is :class:`~reclock.errors.PublicationMissing`; a table without ``REPLICA IDENTITY
FULL`` is :class:`~reclock.errors.ReplicaIdentityNotFull` naming the ``ALTER TABLE`` to run.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Iterator, Sequence

import psycopg
from psycopg import sql
from psycopg.rows import scalar_row

from reclock.ahead import read_ahead
from reclock.errors import PublicationMissing, ReclockError, ReplicaIdentityNotFull, SlotBusy, SlotLost
from reclock.lending import ConnectionLender
from reclock.sources.postgres.pgoutput import BPCHAR, lsn_to_int, lsn_to_str
from reclock.time import PartitionedFrontier

LSN_PARTITION = 0
"""The one partition of a Postgres source's frontier: its offset is the commit LSN."""
SLOT_PREFIX = "reclock_"
SESSION = ("SET DateStyle = ISO", "SET IntervalStyle = postgres", "SET bytea_output = hex", "SET TimeZone = 'UTC'",
           "SET extra_float_digits = 3")
"""The text forms ``reclock.sources.postgres.pgoutput.convert`` reads (pgoutput writes values in the session's
styles)."""
IDENTITY = {"d": "DEFAULT", "n": "NOTHING", "f": "FULL", "i": "USING INDEX"}


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


def slot_name(source: str) -> str:
    """The replication slot of a source: ``reclock_<source>``."""
    return f"{SLOT_PREFIX}{source}"


def lsn_frontier(lsn: int) -> PartitionedFrontier:
    return PartitionedFrontier.of({LSN_PARTITION: lsn})


@dataclass(frozen=True)
class TableInfo:
    """A published table as registered at the source's first cycle: its oid and its columns ``(name, type
    oid, typmod)`` in order. A Relation message with other columns stalls the source."""

    table: str  # schema.table
    relid: int
    columns: tuple[tuple[str, int, int], ...]

    def to_json(self) -> dict:
        return {"table": self.table, "relid": self.relid, "columns": [list(c) for c in self.columns]}

    @staticmethod
    def from_json(d: dict) -> "TableInfo":
        return TableInfo(d["table"], int(d["relid"]), tuple((str(n), int(o), int(m)) for n, o, m in d["columns"]))


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
        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,)).fetchone() is None:
            raise PublicationMissing(self.source, "(all)", f"publication {self.publication} does not exist",
                                     f"CREATE PUBLICATION {self.publication} FOR TABLE ...")
        rows = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
                            "ORDER BY schemaname, tablename", (self.publication,)).fetchall()
        return [f"{s}.{t}" for s, t in rows]

    def describe(self, conn, tables: Sequence[str]) -> list[TableInfo]:
        """Each table's oid and columns, after checking it is published and has ``REPLICA IDENTITY FULL``."""
        published = set(self.published_tables(conn))
        out = []
        for table in tables:
            if table not in published:
                raise PublicationMissing(self.source, table, f"not in publication {self.publication} (dropped, "
                                         "or removed from the publication)",
                                         f"ALTER PUBLICATION {self.publication} ADD TABLE {table}, or re-snapshot")
            schema, _, name = table.partition(".")
            row = conn.execute("SELECT c.oid::int8, c.relreplident FROM pg_class c JOIN pg_namespace n "
                               "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                               (schema, name)).fetchone()
            if row is None:  # dropped between the two queries
                raise PublicationMissing(self.source, table, "does not exist", "re-snapshot the source")
            relid, ident = row
            if ident != "f":
                raise ReplicaIdentityNotFull(self.source, table, IDENTITY.get(ident, ident))
            cols = conn.execute("SELECT attname, atttypid::int8, atttypmod FROM pg_attribute WHERE attrelid = %s "
                                "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (relid,)).fetchall()
            out.append(TableInfo(table, relid, tuple((n, o, m) for n, o, m in cols)))
        return out

    def check_tables(self, conn, registered: Sequence[TableInfo]) -> None:
        """Every registered table is still there (same oid), published, and of identity FULL."""
        for info, now in zip(registered, self.describe(conn, [t.table for t in registered])):
            if now.relid != info.relid:
                raise PublicationMissing(self.source, info.table, f"was dropped and created again (oid {info.relid} "
                                         f"is now {now.relid})", "re-snapshot the source")

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

    def probe_upper(self) -> PartitionedFrontier:
        """The flush LSN as a frontier (the slot must exist and be healthy; ``SlotLost`` otherwise)."""
        with self.session() as conn:
            self.healthy_slot(conn)
            return lsn_frontier(self.flush_lsn(conn))

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

    def pending_changes(self, conn) -> bool:
        """Whether a transaction that changed a published table committed at or after the slot's position:
        one transaction peeked from a :meth:`temporary_copy` (pgoutput sends no empty transactions from
        Postgres 15 on; before, any transaction of the database counts). ``PublicationMissing`` if the
        publication is gone."""
        with self.temporary_copy(conn) as copy:
            try:
                return conn.execute("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, 1, "
                                    "'proto_version', '1', 'publication_names', %s)",
                                    (copy, self.publication)).fetchone()[0] > 0
            except psycopg.errors.UndefinedObject as e:
                raise PublicationMissing(self.source, "(all)", str(e).strip(), "create the publication again "
                                         "and re-snapshot") from e

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
    def count_rows(conn, table: str) -> int:
        """``count(*)`` of ``schema.table`` in ``conn``'s transaction (under a snapshot: what it holds)."""
        schema, _, name = table.partition(".")
        query = sql.SQL("SELECT count(*) FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(name))
        return int(conn.execute(query).fetchone()[0])

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
