"""A Postgres source's ``write_batches``: committed transactions below a bound LSN become ``(row, ts,
diff)`` updates in Parquet parts, one part folder per table, every part proved before append sees it.

::

    slot (peek, up to the description's last LSN)        snapshot (the snapshot's description only)
        |  Begin(final_lsn = commit LSN) ... Commit          |  every table, under an exported snapshot
        v                                                     v   at LSN S, each row +1 at t1
    reclock: the transaction's commit LSN c -> the least binding ts whose LSN is beyond c; every change of
    the transaction gets that one ts, in every table (insert +1 new; delete -1 old; update -1 old +1 new)
    rewind: a change with L1 <= c < S is also retracted at t1 (the snapshot already holds it); with
    S < L1, a change with S <= c < L1 is added at t1 instead (the snapshot lacks it)
        |
        v
    per table: rows buffered up to ``budget.max_records``, then one Parquet part
    ``<prefix>/<shard>/part-NNNNN.parquet``  (memory: tables x budget rows, never a whole transaction)
        |
        v
    prove: every file under the prefix read back by its footer; rows per shard == rows the decoder emitted,
    no file missing, none extra (else ``UnaccountedWrite``, and nothing is appended)

**Old rows.** A table of identity FULL sends an update's and a delete's whole old row: it is taken back as
sent. A table of a key identity (``DEFAULT`` with a primary key, or ``USING INDEX``) sends only the key of
the old row (and nothing for an update that keeps its key; an unchanged TOASTed value as ``u``): the old row
is the current row of that key, which the write keeps per table (:class:`_KeyState`, as the Kafka upsert
envelope keeps a key's record): the collection's contents before the write (read AS OF the description's
lower - 1, once, when the table's first update or delete in the write comes) and the write's own updates
since. The old row is taken back as the collection holds it (Arrow values, never a text form again) and
an unchanged TOASTed value of the new row is the old row's. Only where a snapshot was taken past the first
binding (the snapshot's seam) is it otherwise: a key table's changes committed between the binding's LSN
and the snapshot's are in the snapshot at the first binding, and are not taken back there (their old rows
are not in the WAL), nor at their own bindings in later writes (``key_from``: the snapshot's LSN, recorded
when the snapshot is appended): such a table holds, at the bindings below the snapshot's LSN, the table as
of that LSN; from the first binding past it, the table as of each binding's LSN.

Stalls (``reclock.errors.SourceStalled``: nothing of the description is appended, what it wrote is
garbage), for a change
of a table the source outputs, in a transaction the description covers: a ``TRUNCATE`` in the snapshot's
seam of a table of identity FULL (:class:`~reclock.errors.TableTruncated`); a Relation message whose columns
differ from those registered by DDL that does not flow (:class:`~reclock.errors.TableSchemaChanged`: a column
renamed where the catalog cannot tell it from a drop and an add, a key column dropped, a type changed in a way that may change a value, a column added with values in
the rows the table held that the catalog cannot tell, as a volatile DEFAULT's, a column dropped and added again
within one timestamp; any DDL in the snapshot's seam) or
whose replica identity does (:class:`~reclock.errors.ReplicaIdentityChanged`); a key table's update or delete of a key its collection has
no row of (:class:`~reclock.errors.KeyedRowMissing`); a table that was recreated
(:class:`~reclock.errors.PublicationMissing`). A table that joined the publication is skipped until the next
cycle registers it and snapshots it on its own (:class:`TableStart`). An unchanged TOASTed value (``u``) is never written as a
placeholder.

**DDL that flows** (``reclock.sources.postgres.ddl``: an added column, a dropped one, a renamed one, a type
widened without changing a value): from the table's first change under the new Relation, the write's parts of it have the new columns
(:meth:`PartWriter.reshape`), the collection's schema changes at that change's timestamp (a
``SchemaVersion`` handed to append with the parts, ``ChangeDecoder.versions``), and the registration takes
the new columns with the append (``ChangeDecoder.evolved``). Rows before keep their parts' schema; a
retraction of one (an old row FULL sends, or a key table's current row) is the row as every reader projects
it (:func:`conform`): null in an added column (which the WAL's old row holds too), a widened value cast up,
a dropped column left out (which the WAL's old row lacks too); a column dropped and added again in this write
null in the parts before the re-add (``PartWriter.reborn``), as readers read them (``Column.from_ts``); a column
renamed read from the parts' column of its earlier name (``PartWriter.renamed``), as readers read them
(``Column.was``).

A ``TRUNCATE`` of an output table lands as the retraction of every row the collection holds at that point
(its contents before the description, read back, plus what this write wrote of it so far), at the
transaction's timestamp; only one in the snapshot's seam stalls (``TableTruncated``).

The snapshot of a table is read in this process with ``COPY ... TO STDOUT (FORMAT csv)`` parsed by Arrow a
block at a time (:func:`read_snapshot`), or, for a large table, by Spark under the same exported snapshot
(``reclock.sources.postgres.spark_snapshot``), whose parts land in the shard's :data:`SPARK_SNAPSHOT` folder and
are proved with the rest (:func:`collect`). A re-snapshot also retracts what each collection held
(:meth:`PartWriter.retract`).
"""

from __future__ import annotations

import bisect
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from psycopg import sql

from reclock.batch import Part
from reclock.compaction import contents_as_of
from reclock.errors import (KeyedRowMissing, PublicationMissing, ReclockError, ReplicaIdentityChanged,
                            ReplicaIdentityMissing, TableSchemaChanged, TableTruncated, TruncatedUnderSnapshot,
                            UnaccountedWrite)
from reclock.persist.blob import BlobStore
from reclock.persist.parquet import part_from_footer
from reclock.schema_evolution import CollectionSchema, SchemaVersion, evolve
from reclock.schema_projection import arrow_project, null_before, part_schema
from reclock.sources.postgres import ddl
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.chunks import ChunkedTable
from reclock.sources.postgres.upstream import IDENTITY, PostgresUpstream, TableInfo, text_form


@dataclass(frozen=True)
class Output:
    """A table the source writes: its registration and its shard."""

    info: TableInfo
    shard: str

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, po.arrow_type(o, m)) for n, o, m in self.info.columns]
                         + [pa.field("ts", pa.int64()), pa.field("diff", pa.int64())])


@dataclass
class _Buffer:
    out: Output
    rows: list[tuple] = field(default_factory=list)  # updates added one at a time, not yet a piece
    pieces: list[tuple[list, np.ndarray, np.ndarray]] = field(default_factory=list)  # (columns, ts, diff)
    held: int = 0  # rows in pieces
    emitted: int = 0
    parts: int = 0
    typed: list[pa.Table] = field(default_factory=list)  # updates already in the shard's types (add_typed)
    typed_rows: int = 0


CLOSE_WORKERS = 4
"""At most this many tables' last parts are written at once when a write ends (:meth:`PartWriter.close`)."""
DICTIONARY_PAGE_BYTES = 64 << 10
"""A column's dictionary in a part stops growing here (Parquet's writer goes on without one): a column of
few distinct values keeps its dictionary, one of many (ids, texts, times) does not build one of 1 MiB, the
default, only to give it up: a part of the CDC benchmark's tables is written in a third less time, and is
about 4% larger."""


class PartWriter:
    """Per-table buffers of updates, each written as a Parquet part once it holds ``chunk`` rows (parts of
    exactly ``chunk`` rows, the rest at :meth:`close`). Values are buffered as their text forms and
    converted a column at a time when a part is written (:func:`reclock.sources.postgres.pgoutput.text_column`:
    Arrow's vectorized casts). Updates come one at a time (:meth:`add`) or a decoded block at a time
    (:meth:`add_block`), in the order they are added either way."""

    def __init__(self, blob: BlobStore, prefix: str, outputs: Sequence[Output], chunk: int) -> None:
        self.blob, self.prefix, self.chunk = blob, prefix, max(1, chunk)
        self.buffers = {o.info.relid: _Buffer(o) for o in outputs}
        # per table, its columns that DDL dropped and added again in this write: name -> the re-add's ts (the
        # parts before it hold the dropped column's values there: read back as null, as readers read them)
        self.reborn: dict[int, dict[str, int]] = {}
        # per table, its columns that DDL renamed in this write: a name its parts before hold -> its name now
        self.renamed: dict[int, dict[str, str]] = {}

    def add(self, relid: int, values: tuple, ts: int, diff: int) -> None:
        """One update of table ``relid``: its columns' text forms (bytes or str; None for NULL)."""
        b = self.buffers[relid]
        b.rows.append((*values, ts, diff))
        b.emitted += 1
        if b.held + len(b.rows) >= self.chunk:
            self._flush(b, whole_parts_only=True)

    def add_block(self, relid: int, columns: Sequence[pa.Array], ts: np.ndarray, diff: np.ndarray) -> None:
        """Many updates of table ``relid`` in order: its columns' text forms as Arrow binary (or string)
        arrays, and each update's ``ts`` and ``diff``."""
        b = self.buffers[relid]
        self._seal(b)
        n = len(ts)
        b.pieces.append((list(columns), np.asarray(ts, np.int64), np.asarray(diff, np.int64)))
        b.held += n
        b.emitted += n
        if b.held >= self.chunk:
            self._flush(b, whole_parts_only=True)

    def _seal(self, b: _Buffer) -> None:
        """The rows added one at a time become a piece (column lists), behind the pieces before them."""
        if b.rows:
            columns = list(zip(*b.rows))
            b.pieces.append(([list(c) for c in columns[:-2]], np.array(columns[-2], np.int64),
                             np.array(columns[-1], np.int64)))
            b.held += len(b.rows)
            b.rows = []

    def _flush(self, b: _Buffer, whole_parts_only: bool = False) -> None:
        """Write parts of ``chunk`` rows while the buffer holds that many, and then (unless
        ``whole_parts_only``) the rest."""
        self._seal(b)
        while b.held >= self.chunk or (b.held and not whole_parts_only):
            take = min(self.chunk, b.held)
            pieces, got = [], 0
            while got < take:
                cols, ts, diff = b.pieces[0]
                k = min(take - got, len(ts))
                if k == len(ts):
                    pieces.append(b.pieces.pop(0))
                else:
                    pieces.append(([c[:k] if isinstance(c, list) else c.slice(0, k) for c in cols], ts[:k], diff[:k]))
                    b.pieces[0] = ([c[k:] if isinstance(c, list) else c.slice(k) for c in cols], ts[k:], diff[k:])
                got += k
            b.held -= take
            columns = [_concat([p[0][j] for p in pieces]) for j in range(len(b.out.info.columns))]
            self._put(b, _part_table(b.out, columns, np.concatenate([p[1] for p in pieces]),
                                     np.concatenate([p[2] for p in pieces])), "part")

    def add_typed(self, relid: int, rows: pa.Table) -> None:
        """Updates of table ``relid`` already in its shard's schema (data columns, ``ts``, ``diff``): a key
        table's old rows, taken from its collection as they are (never through a text form again). Written
        as parts of their own at :meth:`flush` and :meth:`close`, or once ``chunk`` of them are held."""
        b = self.buffers[relid]
        b.typed.append(rows)
        b.typed_rows += rows.num_rows
        b.emitted += rows.num_rows
        if b.typed_rows >= self.chunk:
            self._flush_typed(b)

    def _flush_typed(self, b: _Buffer) -> None:
        if b.typed_rows:
            table = pa.concat_tables(b.typed).cast(b.out.schema)
            b.typed, b.typed_rows = [], 0
            for start in range(0, table.num_rows, self.chunk):
                self._put(b, table.slice(start, self.chunk), "keyed")

    def add_columns(self, relid: int, columns: Sequence[pa.Array], ts: int, diff: int) -> None:
        """Many updates of table ``relid`` at once: its columns' text forms as Arrow string arrays (a
        snapshot's block), written as parts of at most ``chunk`` rows."""
        b = self.buffers[relid]
        n = len(columns[0]) if columns else 0
        for start in range(0, n, self.chunk):
            part = [c.slice(start, self.chunk) for c in columns]
            rows = len(part[0])
            self._put(b, _part_table(b.out, part, [ts] * rows, [diff] * rows), "part")
            b.emitted += rows

    def _put(self, b: _Buffer, table: pa.Table, kind: str) -> None:
        buf = io.BytesIO()
        pq.write_table(table, buf, dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES)
        self.blob.put_bytes(f"{self.prefix}/{b.out.shard}/{kind}-{b.parts:05d}.parquet", buf.getvalue())
        b.parts += 1

    def add_written(self, relid: int, rows: int) -> None:
        """Rows of table ``relid`` written by others under this writer's folder (Spark's snapshot parts,
        :data:`SPARK_SNAPSHOT`): :func:`collect` proves them with the rest."""
        self.buffers[relid].emitted += rows

    def flush(self, relid: int) -> None:
        """Write every update of table ``relid`` buffered so far as parts (the last one maybe short)."""
        b = self.buffers[relid]
        self._flush(b)
        self._flush_typed(b)

    def written(self, relid: int) -> pa.Table | None:
        """Every update of table ``relid`` this writer has written as parts so far (after :meth:`flush`, all
        it was given; Spark's snapshot parts of it too), read back in its shard's schema; None if none.
        ``UnaccountedWrite`` for a part of other columns (a re-snapshot's retraction of a collection whose
        columns changed)."""
        b = self.buffers[relid]
        folder = f"{self.prefix}/{b.out.shard}"
        tables = []
        for info in self.blob.list(folder):
            rel = info.path[len(folder) + 1:]
            name = rel.rpartition("/")[2]
            if not rel.endswith(".parquet") or name.startswith((".", "_")) or (
                    "/" in rel and rel.partition("/")[0] != SPARK_SNAPSHOT):
                continue  # Spark's markers and hidden files
            with self.blob.open(info.path) as f:
                table = pq.read_table(f)
            conformed = conform(table, b.out, self.reborn.get(relid), self.renamed.get(relid))
            if conformed is None:
                raise UnaccountedWrite(b.out.shard, folder, folder, f"{info.path} holds columns "
                                       f"{table.schema.names}, not the table's {b.out.schema.names}")
            tables.append(conformed)
        return pa.concat_tables(tables) if tables else None

    def reshape(self, relid: int, out: Output) -> None:
        """Table ``relid``'s columns are ``out``'s from now on (DDL that flows, ``reclock.sources.postgres.ddl``):
        what is buffered is written as parts of the columns it came with first; parts keep their own schema."""
        b = self.buffers[relid]
        self._flush(b)
        self._flush_typed(b)
        b.out = out

    def retract(self, relid: int, contents: pa.Table, ts: int) -> None:
        """Retract a collection's ``contents`` (data columns and ``diff``, as a read AS OF gives them) at
        ``ts``: a re-snapshot takes back what the collection held, in the columns it held it."""
        b = self.buffers[relid]
        data = contents.drop_columns(["diff"])
        negated = pc.negate(contents["diff"]).cast(pa.int64())
        table = data.append_column("ts", pa.array([ts] * contents.num_rows, pa.int64())).append_column("diff", negated)
        for start in range(0, table.num_rows, self.chunk):
            self._put(b, table.slice(start, self.chunk), "retract")
        b.emitted += table.num_rows

    def close(self) -> dict[str, int]:
        """Write what is buffered, the tables side by side (Arrow's casts and Parquet's writer release the
        GIL; a table's first error is raised, in the tables' order); the rows emitted per shard."""
        for b in self.buffers.values():
            self._flush_typed(b)
        pending = [b for b in self.buffers.values() if b.held or b.rows]
        workers = min(len(pending), os.cpu_count() or 1, CLOSE_WORKERS)
        if workers > 1:
            with ThreadPoolExecutor(workers, "reclock-parts") as pool:
                for done in [pool.submit(self._flush, b) for b in pending]:
                    done.result()
        else:
            for b in pending:
                self._flush(b)
        return {b.out.shard: b.emitted for b in self.buffers.values()}


def conform(table: pa.Table, out: Output, reborn: Mapping[str, int] | None = None,
            renamed: Mapping[str, str] | None = None) -> pa.Table | None:
    """``table`` (data columns by name, then ``ts`` and/or ``diff``) in ``out``'s data columns and types:
    a table of the columns the table had before DDL that flowed (``reclock.sources.postgres.ddl``) is projected
    as every reader projects a part (``reclock.schema_projection.arrow_project``: an added column null, a
    widened one cast up, a dropped one left out; a column dropped and added again, ``reborn``: name -> the
    re-add's ts, null at the rows before it; a column renamed, ``renamed``: an earlier name -> its name now,
    read from the column of its earlier name when the table has none of its name now); None when it cannot
    be (a type ``out``'s does not widen)."""
    if renamed:
        names_in = table.column_names
        table = table.rename_columns([renamed[n] if n in renamed and renamed[n] not in names_in else n
                                      for n in names_in])
    extra = [n for n in ("ts", "diff") if n in table.column_names]
    names = [n for n, _, _ in out.info.columns]
    fields = [out.schema.field(n) for n in names] + [pa.field(n, pa.int64()) for n in extra]
    want = pa.schema(fields)
    if reborn and "ts" in extra:
        for n, since in reborn.items():
            if n in table.column_names:
                i = table.column_names.index(n)
                table = table.set_column(i, table.schema.field(i), null_before(table[n], table["ts"], since))
    data = [n for n in table.column_names if n not in ("ts", "diff")]
    if data == names:
        try:
            return table.select([*names, *extra]).cast(want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    data = [n for n in data if n in names]  # a column DDL dropped is left out
    have, target = part_schema(table.schema, data), ddl.collection_schema(out.info.columns)
    if evolve(have, target, previous=have).incompatible is not None:
        return None
    arrays = [arrow_project(table[n] if n in data else None, have.column(n).type if n in data else None,
                            target.column(n).type, table.num_rows).cast(f.type) for n, f in zip(names, fields)]
    return pa.Table.from_arrays(arrays + [table[n].combine_chunks() for n in extra], schema=want)


def held_updates(held: pa.Table, out: Output, renamed: Mapping[str, str] | None = None) -> pa.Table | None:
    """A collection's contents read AS OF (data columns and ``diff``) as updates in ``out``'s part schema, at
    ts 0 (:func:`conform`ed to its columns, ``renamed``: as there); None when they cannot be read as them."""
    conformed = conform(held, out, renamed=renamed)
    if conformed is None:
        return None
    return (conformed.select([n for n, _, _ in out.info.columns])
            .append_column("ts", pa.array([0] * held.num_rows, pa.int64()))
            .append_column("diff", conformed["diff"]).cast(out.schema))


def _part_table(out: Output, columns: Sequence, ts, diff) -> pa.Table:
    """A part of ``out``'s shard: each column's text forms converted to its type
    (:func:`reclock.sources.postgres.pgoutput.text_column`), then ``ts`` and ``diff``."""
    info = out.info
    arrays = [po.text_column(o, m, c, f"{info.table}.{name}") for (name, o, m), c in zip(info.columns, columns)]
    arrays += [pa.array(ts, pa.int64()), pa.array(diff, pa.int64())]
    return pa.Table.from_arrays(arrays, schema=out.schema)


def _concat(chunks: list) -> list | pa.Array:
    """One column's text forms from consecutive pieces: a list if every piece is one (as
    :meth:`PartWriter.add` buffers them), else one Arrow array."""
    if all(isinstance(c, list) for c in chunks):
        return [v for c in chunks for v in c]
    arrays = [pa.array(c, pa.binary()) if isinstance(c, list) else c for c in chunks]
    if len({a.type for a in arrays}) > 1:
        arrays = [a.cast(pa.large_binary()) for a in arrays]
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


SPARK_SNAPSHOT = "snapshot"
"""The folder under a shard's folder of a write where Spark writes that table's snapshot
(``reclock.sources.postgres.spark_snapshot``): Spark's part files, its ``_SUCCESS`` marker and its hidden files."""


def collect(blob: BlobStore, source: str, prefix: str, emitted: Mapping[str, int],
            on_spark: Sequence[str] = ()) -> dict[str, tuple[Part, ...]]:
    """The parts under ``prefix``, per shard, proved to hold exactly the rows the decoder emitted (every
    footer read; a file of no known shard, an unreadable one, or a count that differs is
    ``UnaccountedWrite``). The shards ``on_spark`` also have Spark's snapshot folder
    (:data:`SPARK_SNAPSHOT`), which must hold Spark's ``_SUCCESS`` marker."""
    found: dict[str, list[Part]] = {s: [] for s in emitted}
    counted = {s: 0 for s in emitted}
    looked = blob.url(prefix)
    committed = set()
    for info in blob.list(prefix):
        rel = info.path[len(prefix) + 1:].split("/")
        if len(rel) == 3 and rel[0] in on_spark and rel[1] == SPARK_SNAPSHOT:
            if rel[2] == "_SUCCESS":
                committed.add(rel[0])
            if rel[2].startswith((".", "_")):
                continue  # Spark's marker and checksums
            rel = [rel[0], rel[2]]
        if len(rel) != 2 or rel[0] not in found or not rel[1].endswith(".parquet"):
            raise UnaccountedWrite(source, looked, looked, f"{info.path} is no part of this write")
        try:
            with blob.open(info.path) as f:
                md = pq.ParquetFile(f).metadata
        except Exception as e:  # noqa: BLE001 - any unreadable footer is an unaccounted file
            raise UnaccountedWrite(source, looked, looked, f"the footer of {info.path} cannot be read "
                                   f"({type(e).__name__}: {e})") from e
        if not md.num_rows:
            continue  # Spark writes a file of no rows for an empty table
        counted[rel[0]] += md.num_rows
        found[rel[0]].append(part_from_footer(info.path, info.size, md))
    missing = sorted(set(on_spark) - committed)
    if missing:
        raise UnaccountedWrite(source, looked, looked, f"Spark's snapshot of {', '.join(missing)} has no "
                               f"{SPARK_SNAPSHOT}/_SUCCESS marker: its job did not commit")
    if counted != dict(emitted):
        raise UnaccountedWrite(source, looked, looked, f"the decoder emitted {dict(emitted)} rows per shard, "
                               f"the parts hold {counted}")
    return {s: tuple(sorted(ps, key=lambda p: p.path)) for s, ps in found.items()}


def reclock_lsn(bindings: Sequence[tuple[int, int]], commit_lsn: int) -> int | None:
    """The least binding ts whose LSN is beyond ``commit_lsn`` (bindings: ``(ts, lsn)`` in order)."""
    i = bisect.bisect_right([lsn for _, lsn in bindings], commit_lsn)
    return bindings[i][0] if i < len(bindings) else None


@dataclass(frozen=True)
class Rewind:
    """Changes committed in ``[lo, hi)`` also go at ``ts`` with their diff times ``sign`` (the snapshot's
    seam: -1 when the snapshot is past the first binding, +1 when it is before it)."""

    ts: int
    lo: int
    hi: int
    sign: int


@dataclass(frozen=True)
class TableStart:
    """A table snapshotted on its own (a table that joined the publication, ``reclock resnapshot --table``): its
    changes committed below ``from_lsn`` are not taken (its snapshot holds them; before its binding, the
    collection keeps what it held), those in ``rewind`` also go at the snapshot's binding (as :class:`Rewind`), and,
    for a key table, none below ``key_from`` (its snapshot's LSN: the seam, as the source's own snapshot's)."""

    from_lsn: int = 0
    rewind: Rewind | None = None
    key_from: int = 0

    def targets(self, own: list[tuple[int, int]], commit_lsn: int) -> tuple[list, list]:
        """``(targets, key targets)`` of a transaction committed at ``commit_lsn`` whose own are ``own``."""
        got = list(own) if commit_lsn >= self.from_lsn else []
        r = self.rewind
        if r is not None and r.lo <= commit_lsn < r.hi:
            got.append((r.ts, r.sign))
        return got, ([] if commit_lsn < self.key_from else got)


@dataclass
class StreamStats:
    transactions: int = 0
    changes: int = 0
    messages: int = 0
    skipped_transactions: int = 0


_I, _U, _D, _B, _C, _N, _O = (ord(c) for c in "IUDBCNO")
_BEGIN_BYTES, _COMMIT_BYTES = 21, 26  # B, final LSN, time, xid; C, flags, commit LSN, end LSN, time


@dataclass(frozen=True)
class _Tuples:
    """Tuples read column by column, grouped by column count: ``groups[c] = (which tuples, their
    columns)``."""

    count: np.ndarray
    groups: dict

    @property
    def end(self) -> np.ndarray:
        out = np.zeros(len(self.count), np.int64)
        for at, t in self.groups.values():
            out[at] = t.end
        return out

    def columns(self, which: np.ndarray, cols: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(start, length, null)`` of tuples ``which`` (all of ``cols`` columns), ``len(which) x cols``."""
        at, t = self.groups[cols]
        row = np.searchsorted(at, which)
        return t.start[row], t.length[row], t.null[row]


_Row = tuple  # ("text", text forms) or ("typed", a table of the shard's data columns, its row)


class _KeyState:
    """The current row of every key of one key-identity table in a write: the collection's contents before
    the write and the write's own updates so far (read back once, when the table's first update or delete
    needs an old row), then kept up to date change by change. A row is kept as the text forms a change
    brought, or as a row of the collection's own Arrow data (taken back as it is: bit for bit)."""

    def __init__(self, source: str, out: Output, contents: pa.Table) -> None:
        self.source, self.out = source, out
        names = [n for n, _, _ in out.info.columns]
        self.key_at = [names.index(k) for k in out.info.key]
        self.key_types = [out.info.columns[j][1:] for j in self.key_at]
        self.rows: dict[tuple, _Row] = {}
        if not contents.num_rows:
            return
        if contents.schema.names != [*names, "diff"]:
            contents = contents.select([*names, "diff"])
        if not pc.all(pc.equal(contents["diff"], 1)).as_py():
            raise KeyedRowMissing(source, out.info.table, "its collection holds a row more than once, which a table "
                                  f"with a key ({', '.join(out.info.key)}) cannot", "re-snapshot the source")
        data = pa.Table.from_arrays(contents.columns[:-1], schema=pa.schema(list(out.schema)[:-2]))
        keys = zip(*(data.column(j).to_pylist() for j in self.key_at))
        for i, k in enumerate(keys):
            if k in self.rows:
                raise KeyedRowMissing(source, out.info.table, f"its collection holds key {k} twice",
                                      "re-snapshot the source")
            self.rows[k] = ("typed", data, i)

    def key(self, values: Sequence, old: tuple | None = None) -> tuple:
        """The key of a change's tuple (its text forms), as the collection's values of it are compared; an
        unchanged TOASTed key column (``u``) is the ``old`` key's."""
        return tuple(old[i] if values[j] is po.UNCHANGED_TOAST and old is not None else
                     po.convert(o, m, values[j], self.out.info.columns[j][0])
                     for i, (j, (o, m)) in enumerate(zip(self.key_at, self.key_types)))

    def take(self, key: tuple, what: str) -> _Row:
        """The current row of ``key``, no longer current (an update or delete takes it back)."""
        row = self.rows.pop(key, None)
        if row is None:
            raise KeyedRowMissing(self.source, self.out.info.table, f"{what} of key {key} "
                                  f"({', '.join(self.out.info.key)}) found no row of it in the collection",
                                  "re-snapshot the source")
        return row

    def put(self, key: tuple, row: _Row) -> None:
        if key in self.rows:
            raise KeyedRowMissing(self.source, self.out.info.table, f"an insert of key {key} found a row of it "
                                  "in the collection already", "re-snapshot the source")
        self.rows[key] = row


class ChangeDecoder:
    """Turns the slot's messages into updates on a :class:`PartWriter` (see the module)."""

    def __init__(self, source: str, outputs: Sequence[Output], writer: PartWriter,
                 bindings: Sequence[tuple[int, int]], start: int, end: int, rewind: Rewind | None,
                 strict_tables: bool, truncated: Callable[[Output, int], int] | None = None,
                 prior: Callable[[Output], pa.Table | None] | None = None, key_from: int = 0,
                 added_columns: Callable[[Output, tuple], tuple[str | None, dict]] | None = None,
                 refill: Callable[[Output, Output, dict, int], int] | None = None,
                 catalog: Mapping[int, ddl.CatalogTable] | None = None,
                 table_starts: Mapping[int, TableStart] | None = None,
                 chunked: Mapping[int, ChunkedTable] | None = None) -> None:
        self.source, self.writer, self.bindings = source, writer, list(bindings)
        # per relid: a key table snapshotted online in chunks (``reclock.sources.postgres.chunks``): a change of
        # it lands where ChunkedTable.fate says, and the xids of the write's transactions are kept (``seen``)
        self.chunked = dict(chunked or {})
        self.xid = 0  # the current transaction's
        self.seen: set[int] = set()
        # the tables in the catalog as of the write's upper (the mint's): tells a rename from a DROP + ADD
        self.catalog = dict(catalog or {})
        self.table_starts = dict(table_starts or {})  # per relid: a table snapshotted on its own (TableStart)
        self.table_targets: dict[int, tuple[list, list]] = {}  # their (targets, key targets) in this transaction
        # what the rows a table held hold in columns DDL added: (why unknown, or None; {column: text or None})
        self.added_columns = added_columns
        # the rows a table holds retracted and added again with the added columns' values (the updates)
        self.refill = refill
        self.evolved: dict[int, TableInfo] = {}  # tables whose columns DDL changed in this write, as they are now
        self.adopted: dict[int, list[tuple[str, ...]]] = {}  # per table, the column names of each Relation adopted
        self.renamed: dict[int, list[tuple[tuple[str, str], ...]]] = {}  # per table, each adopted one's renames
        self.versions: dict[str, list[SchemaVersion]] = {}  # per shard, the schema versions this write begins
        self.schema_before: dict[str, tuple] = {}  # per shard, its columns before this write's first change
        self.truncated = truncated  # retracts a table's every row at a ts (None: a TRUNCATE stalls)
        self.prior = prior  # a key table's collection before this write (data columns and diff; None: empty)
        self.key_from = key_from  # the snapshot's LSN: a key table takes no transaction committed below it
        self.states: dict[int, _KeyState] = {}  # key tables whose current rows are known, by relid
        self.key_targets: list[tuple[int, int]] = []  # the current transaction's (ts, sign) for key tables
        self.rewinding = False  # the current transaction is in the snapshot's seam (see Rewind)
        self.start, self.end, self.rewind = start, end, rewind
        self.strict = strict_tables  # the source takes every table of its publication
        self.by_relid = {o.info.relid: o for o in outputs}
        self.by_name = {o.info.table: o for o in outputs}
        self.relations: dict[int, po.Relation] = {}
        self.checked: dict[int, Output | None] = {}  # relid -> its output, once its Relation was checked
        self.targets: list[tuple[int, int]] = []  # the current transaction's (ts, sign)
        self.in_txn = False
        self.last_commit = -1
        self.stats = StreamStats()

    def feed(self, messages: Iterable[po.Message]) -> StreamStats:
        """Every message of the slot (decoded), in order."""
        self._messages(messages)
        if self.in_txn:
            raise po.ProtocolError(f"source {self.source}: the slot's last transaction has no Commit")
        return self.stats

    def feed_blocks(self, blocks: Iterable[Sequence[bytes]]) -> StreamStats:
        """Every message of the slot as the peek returns it (undecoded), a block at a time: the same updates,
        in the same order, as :meth:`feed` of the decoded messages, and the same errors.

        A block is read with numpy, all its messages at once: between two messages other than a change,
        Begin or Commit (a Relation, Type, Origin or Truncate: taken one by one), the Begins and Commits are
        taken one by one and the changes column by column over all of them (:func:`~reclock.sources.postgres.pgoutput
        .tuples_at`), a table's updates handed to the writer as Arrow arrays. Where that reading meets
        anything but plain inserts, updates and deletes with the whole old row, of text and NULL values, in
        transactions of tables that pass their checks (an unchanged TOASTed value, a key-only old row, a
        malformed message, a change outside a transaction, a table that stalls the source), that stretch
        is taken again message by message from where it began, which raises what :meth:`feed` raises.

        Law (tested with hypothesis): equal to :meth:`feed` over the decoded messages (updates, parts,
        stats, errors)."""
        for rows in blocks:
            self._block(rows)
        if self.in_txn:
            raise po.ProtocolError(f"source {self.source}: the slot's last transaction has no Commit")
        return self.stats

    def _messages(self, messages: Iterable[po.Message]) -> None:
        change = self._change
        n = 0
        for m in messages:
            n += 1
            kind = type(m)
            if kind is po.Insert or kind is po.Update or kind is po.Delete:
                change(m)
            elif kind is po.Begin:
                self._begin(m.final_lsn, m.xid)
            elif kind is po.Commit:
                self._commit(m)
            elif kind is po.Relation:
                self.relations[m.relid] = m
                self.checked.pop(m.relid, None)
            elif kind is po.Truncate:
                self._truncate(m)
            # Type and Origin change nothing: unknown types are kept as text, origins are not filtered
        self.stats.messages += n

    def _commit(self, m: po.Commit) -> None:
        if not self.in_txn:
            raise po.ProtocolError(f"source {self.source}: Commit at {po.lsn_to_str(m.commit_lsn)} "
                                   "without a Begin")
        self.in_txn = False

    def _block(self, rows: Sequence[bytes]) -> None:
        n = len(rows)
        if n == 0:
            return
        size = np.fromiter(map(len, rows), np.int64, n)
        if not size.all():
            self._messages(map(po.decode, rows))  # an empty message: decode says what is wrong
            return
        buf = np.frombuffer(b"".join(rows), np.uint8)
        end = np.cumsum(size)
        start = end - size
        kind = buf[start]
        plain = (kind == _I) | (kind == _U) | (kind == _D) | (kind == _B) | (kind == _C)
        lo = 0
        for cut in [*np.flatnonzero(~plain).tolist(), n]:
            if cut > lo:
                self._stretch(rows, buf, start[lo:cut], end[lo:cut], kind[lo:cut], lo)
            if cut < n:
                self._messages([po.decode(rows[cut])])
            lo = cut + 1

    def _stretch(self, rows, buf, start, end, kind, first: int) -> None:
        """Messages ``first ...`` of the block (changes, Begins and Commits only), read column by column;
        message by message if that meets anything else (see :meth:`feed_blocks`)."""
        saved = (self.in_txn, self.last_commit, self.targets, self.key_targets, self.rewinding, replace(self.stats),
                 self.table_targets, self.xid)
        try:
            emit = self._read_stretch(rows, buf, start, end, kind, first)
        except (po.Irregular, ReclockError):
            (self.in_txn, self.last_commit, self.targets, self.key_targets, self.rewinding, self.stats,
             self.table_targets, self.xid) = saved
            self._messages(map(po.decode, rows[first:first + len(kind)]))
            return
        self.stats.messages += len(kind)
        for relid, columns, ts, diff in emit:
            self.writer.add_block(relid, columns, ts, diff)
            self.stats.changes += len(ts)

    def _read_stretch(self, rows, buf, start, end, kind, first: int) -> list:
        """The updates of a stretch per table, ``[(relid, text columns, ts, diff)]``, nothing written yet;
        ``Irregular`` (or the error :meth:`feed` would raise, not necessarily the first) where the stretch
        must be taken message by message."""
        # Begins and Commits one by one (their commit LSNs read all at once); each change takes the targets
        # of the transaction it is in
        control = np.flatnonzero((kind == _B) | (kind == _C))
        begins = kind[control] == _B
        if np.any((end[control] - start[control]) != np.where(begins, _BEGIN_BYTES, _COMMIT_BYTES)):
            raise po.Irregular("a Begin or Commit of another length")
        final_lsn = po.be_u64(buf, start[control] + 1)  # a Begin's final LSN (a Commit's flags and more: unused)
        xids = po.be_int(buf, start[control] + 17, 4, signed=False)  # a Begin's xid
        run_from, run_targets = [], []  # per run of changes between two of them: (first index, targets)
        run_keyed = []  # per run: its key tables take the same targets as the others
        at = 0
        for i, begin, lsn, xid in zip(control.tolist(), begins.tolist(), final_lsn.tolist(), xids.tolist()):
            if i > at:
                run_from.append(at)
                run_targets.append(self.targets if self.in_txn else None)
                run_keyed.append(self.key_targets is self.targets)
            if begin:
                self._begin(lsn, xid)
            elif not self.in_txn:
                raise po.Irregular("a Commit without a Begin")  # message by message: the error names its LSN
            else:
                self.in_txn = False
            at = i + 1
        if len(kind) > at:
            run_from.append(at)
            run_targets.append(self.targets if self.in_txn else None)
            run_keyed.append(self.key_targets is self.targets)
        ch = np.flatnonzero((kind == _I) | (kind == _U) | (kind == _D))
        if not len(ch):
            return []
        if any(t is None for t in run_targets):
            raise po.Irregular("a change outside a transaction")
        # the targets as flat arrays: run r's are tgt_ts[base[r]:base[r] + count[r]]
        count = np.array([len(t) for t in run_targets], np.int64)
        base = np.zeros(len(count), np.int64)
        np.cumsum(count[:-1], out=base[1:])
        tgt_ts = np.array([ts for t in run_targets for ts, _ in t] or [0], np.int64)
        tgt_sign = np.array([sign for t in run_targets for _, sign in t] or [0], np.int64)
        run = np.searchsorted(np.array(run_from, np.int64), ch, side="right") - 1
        nt, tb = count[run], base[run]

        s, e, k = start[ch], end[ch], kind[ch]
        if np.any(e - s < 6):
            raise po.Irregular("a change truncated")
        relid = po.be_int(buf, s + 1, 4, signed=False)
        if self.table_starts and np.isin(relid, np.array(list(self.table_starts), np.int64)).any():
            raise po.Irregular("a change of a table snapshotted on its own")
        tag = buf[s + 5]
        if not np.all(np.where(k == _I, tag == _N, tag == _O)):
            raise po.Irregular("an update or delete without the whole old row, or a malformed change")
        first_t = self._tuples(buf, s + 6, e)
        first_end = first_t.end
        is_u = k == _U
        u = np.flatnonzero(is_u)
        second_t = None
        if len(u):
            after = first_end[u]
            if np.any(after >= e[u]) or np.any(buf[np.minimum(after, len(buf) - 1)] != _N):
                raise po.Irregular("an update without N before its new tuple")
            second_t = self._tuples(buf, after + 1, e[u])
            last_end = first_end.copy()
            last_end[u] = second_t.end
        else:
            last_end = first_end
        if np.any(last_end != e):
            raise po.Irregular("trailing bytes")

        emit = []
        for r in np.unique(relid[nt > 0]).tolist():
            out = self._output(r, fast=True)
            if out is None:
                continue
            sel = np.flatnonzero((relid == r) & (nt > 0))
            if out.info.keyed and (r in self.states or np.any(k[sel] != _I)
                                   or not all(run_keyed[i] for i in set(run[sel].tolist()))):
                raise po.Irregular("a key table's update or delete, a change of one whose current rows are kept, "
                                   "or one in the snapshot")
            cols = len(out.info.columns)
            if np.any(first_t.count[sel] != cols) or (second_t is not None and np.any(
                    second_t.count[np.searchsorted(u, sel[is_u[sel]])] != cols)):
                raise po.Irregular("a tuple of another column count than registered")
            per = np.where(is_u[sel], 2, 1)  # rows per target: -1 old, +1 new
            reps = nt[sel] * per
            total = int(reps.sum())
            msg = np.repeat(np.arange(len(sel)), reps)
            offset = np.arange(total) - np.repeat(np.cumsum(reps) - reps, reps)
            per_r = per[msg]
            target = tb[sel][msg] + offset // per_r
            second = (per_r == 2) & (offset % per_r == 1)
            diff = np.where((k[sel][msg] == _I) | second, 1, -1) * tgt_sign[target]
            ts = tgt_ts[target]
            one = sel[msg]  # the message of each row
            st, ln, nl = first_t.columns(one, cols)
            if second_t is not None and second.any():
                two = np.searchsorted(u, one[second])
                st2, ln2, nl2 = second_t.columns(two, cols)
                st[second], ln[second], nl[second] = st2, ln2, nl2
            columns = [po.binary_column(buf, st[:, j], ln[:, j], nl[:, j]) for j in range(cols)]
            emit.append((r, columns, ts, diff))
        return emit

    @staticmethod
    def _tuples(buf, pos, limit) -> "_Tuples":
        """The tuples at ``pos``, grouped by their column count
        (:func:`reclock.sources.postgres.pgoutput.tuples_at`)."""
        if np.any(pos + 2 > limit):
            raise po.Irregular("a tuple truncated")
        count = po.be_int(buf, pos, 2)
        groups = {}
        for c in np.unique(count).tolist():
            if c < 0:
                raise po.Irregular("a negative column count")
            at = np.flatnonzero(count == c)
            groups[c] = (at, po.tuples_at(buf, pos[at], limit[at], c))
        return _Tuples(count, groups)

    def _begin(self, commit_lsn: int, xid: int = 0) -> None:
        if self.in_txn:
            raise po.ProtocolError(f"source {self.source}: Begin inside a transaction")
        if commit_lsn <= self.last_commit:
            raise po.ProtocolError(f"source {self.source}: commit LSN {po.lsn_to_str(commit_lsn)} does not follow "
                                   f"{po.lsn_to_str(self.last_commit)}")
        self.in_txn, self.last_commit = True, commit_lsn
        self.targets = []
        if self.chunked:
            self.xid = xid
            self.seen.add(xid)
        if self.start <= commit_lsn < self.end:
            ts = reclock_lsn(self.bindings, commit_lsn)
            assert ts is not None, "a commit below the last binding's LSN has a binding"
            self.targets.append((ts, 1))
        if self.table_starts:
            self.table_targets = {r: t.targets(self.targets, commit_lsn) for r, t in self.table_starts.items()}
        r = self.rewind
        self.rewinding = r is not None and r.lo <= commit_lsn < r.hi
        if self.rewinding:
            self.targets.append((r.ts, r.sign))
        # a key table's transaction below the snapshot its collection starts from is in it already, and is not
        # taken back at the snapshot's binding: its old rows are not in the WAL (see the module)
        self.key_targets = [] if commit_lsn < self.key_from else self.targets
        if self.targets or any(t for t, _ in self.table_targets.values()):
            self.stats.transactions += 1
        else:
            self.stats.skipped_transactions += 1

    def _output(self, relid: int, fast: bool = False) -> Output | None:
        """The output a change of ``relid`` goes to (None: not one of the source's tables); checks the
        relation against the registration (once per Relation message). ``fast``: for a stretch read column by
        column, where a relation whose columns changed is ``Irregular`` (taken message by message, each
        change in its own transaction)."""
        try:
            return self.checked[relid]
        except KeyError:
            if fast:
                rel, have = self.relations.get(relid), self.by_relid.get(relid)
                if rel is not None and have is not None and tuple(
                        (c.name, c.type_oid, c.typmod) for c in rel.columns) != have.info.columns:
                    raise po.Irregular("a relation whose columns changed")
            out = self._check_relation(relid)
            self.checked[relid] = out
            return out

    def _check_relation(self, relid: int) -> Output | None:
        rel = self.relations.get(relid)
        if rel is None:
            raise po.ProtocolError(f"source {self.source}: a change of relation {relid} before its Relation message")
        out = self.by_relid.get(relid)
        if out is None:
            if rel.qualified in self.by_name:
                raise PublicationMissing(self.source, rel.qualified, f"was dropped and created again (oid "
                                         f"{self.by_name[rel.qualified].info.relid} is now {relid})",
                                         "re-snapshot the source")
            # not (yet) one of the source's tables: for a source of every table of its publication (``strict``),
            # one that joined it since the cycle's registration, which the next cycle registers and snapshots on
            # its own (``reclock.sources.postgres.kind``): its changes before that are in its snapshot
            return None
        got = tuple((c.name, c.type_oid, c.typmod) for c in rel.columns)
        if got != out.info.columns:
            out = self._evolve(out, got)
        key = tuple(c.name for c in rel.columns if c.flags & 1)
        if rel.replica_identity == "f" and out.info.keyed or rel.replica_identity in "di" and (
                not out.info.keyed or set(key) != set(out.info.key)) or rel.replica_identity not in "fdi":
            now = {"f": "FULL", "n": "NOTHING"}.get(rel.replica_identity, f"{IDENTITY.get(rel.replica_identity)} "
                                                    f"(key {', '.join(key) or 'none'})")
            raise ReplicaIdentityChanged(self.source, out.info.table, f"its replica identity is {now} in the WAL, not "
                                         f"{out.info.identity_text()} as when the source took its snapshot",
                                         f"set it back, or `reclock resnapshot {self.source}` to take it as it is")
        return out

    def _evolve(self, out: Output, columns: tuple) -> Output:
        """Table ``out``'s Relation names ``columns``, not its registered ones: DDL. A change that flows
        (``reclock.sources.postgres.ddl``) gives the table its new columns from this transaction on: a schema
        version at its timestamp (when the collection's schema changes), parts of the new columns from here,
        its current rows (a key table's) read again in them; any other stalls (``TableSchemaChanged``)."""
        table, remedy = out.info.table, ddl.resnapshot_remedy(self.source)
        relid = out.info.relid
        change = ddl.classify(out.info.columns, columns, out.info.key,
                              out.info.attnums if out.info.column_list is None else None, self.catalog.get(relid))
        if change.refused is not None:
            raise TableSchemaChanged(self.source, table, f"DDL changed its columns: {change.refused}",
                                     ddl.remedy(self.source, table, change))
        targets, _ = self._targets(out.info.relid)
        if self._seam(out.info.relid) or len(targets) != 1:
            raise TableSchemaChanged(self.source, table, f"DDL changed its columns ({change.describe()}) between the "
                                     "first binding and its snapshot", remedy)
        fills: dict = {}
        if change.added:
            added = tuple(c for c in columns if c[0] in change.added)
            why, fills = ("the source cannot look it up", {}) if self.added_columns is None else \
                self.added_columns(out, added)
            if why is not None:
                raise TableSchemaChanged(self.source, table, f"DDL added column(s) {', '.join(change.added)}, and what "
                                         f"the rows the table held then hold there cannot be told: {why}", remedy)
        ts = targets[0][0]
        renames = self.writer.renamed.setdefault(relid, {})
        again = [a for a, _ in change.renamed if a in renames]
        if again:  # the name went to another column earlier in this write: its parts hold two under it
            raise TableSchemaChanged(self.source, table, f"DDL renamed column(s) {', '.join(again)}, a name another "
                                     "column was renamed from earlier in this write (one binding)", remedy)
        to = dict(change.renamed)
        renames.update({a: to.get(b, b) for a, b in renames.items()} | to)
        # the columns' numbers carry over a rename or a drop (an added column's is known after the write)
        nums = None if change.added or out.info.attnums is None else tuple(
            a for (n, _, _), a in zip(out.info.columns, out.info.attnums) if n not in change.dropped)
        now = Output(replace(out.info, columns=columns, attnums=nums, key=tuple(to.get(k, k) for k in out.info.key)),
                     out.shard)
        self.adopted.setdefault(relid, []).append(tuple(c[0] for c in columns))
        self.renamed.setdefault(relid, []).append(change.renamed)
        mine = self.versions.get(out.shard, [])
        earlier = [self.schema_before.get(out.shard, out.info.columns)] + [ddl.relation_columns(v.upstream) for v in mine]
        # the columns before this timestamp (a version at it is replaced): a name one of them had, added again
        # at it (dropped, or renamed away, then added), would hold two columns' values at one timestamp
        before_ts = earlier[-2] if mine and mine[-1].since_ts == ts else earlier[-1]
        again = [n for n in change.added if n in (c for c, _, _ in before_ts)]
        if again:
            raise TableSchemaChanged(self.source, table, f"DDL dropped or renamed column(s) {', '.join(again)} and "
                                     "added a column of that name again within one timestamp (one binding), so the "
                                     "collection cannot tell the old column's values from the new one's", remedy)
        for name in change.added:  # dropped earlier in this write: its parts before hold the old column there
            if any(name in (n for n, _, _ in cols) for cols in earlier):
                self.writer.reborn.setdefault(relid, {})[name] = ts
        if any(v is not None for v in fills.values()):  # ADD COLUMN ... DEFAULT: the rows it held hold the value
            if self.refill is None:
                raise TableSchemaChanged(self.source, table, f"DDL added column(s) {', '.join(change.added)} with a "
                                         "DEFAULT, which this write cannot fill in", remedy)
            self.stats.changes += self.refill(out, now, fills, ts)  # reshapes the writer's table too
        else:
            self.writer.reshape(relid, now)
        self.states.pop(relid, None)  # a key table's current rows: read again in the new columns when needed
        self.by_relid[relid] = self.by_name[table] = now
        self.evolved[relid] = now.info
        self.schema_before.setdefault(out.shard, out.info.columns)
        old, new = ddl.collection_schema(out.info.columns), ddl.collection_schema(columns)
        if new != old:
            versions = self.versions.setdefault(out.shard, [])
            cause = f"{table}: {change.describe()}"
            was = {b: a for a, b in change.renamed}  # a column's name in the version before this timestamp
            if versions and versions[-1].since_ts == ts:  # two changes at one timestamp are one
                popped = versions.pop()
                cause = f"{popped.cause}; {change.describe()}"
                before = {c.name: c.renamed_from for c in popped.schema.columns if c.renamed_from}
                was = {n: before.get(was.get(n, n), was.get(n)) for n in new.names
                       if before.get(was.get(n, n), was.get(n)) not in (None, n)}
            new = CollectionSchema(tuple(replace(c, renamed_from=was.get(c.name)) for c in new.columns))
            versions.append(SchemaVersion(ts, new, ddl.relation_json(columns), cause))
        return now

    def _values(self, out: Output, tup: po.Tuple, old: po.Tuple | None, what: str) -> tuple:
        """The tuple's text forms, an unchanged TOASTed value taken from the old row (never a placeholder)."""
        cols = out.info.columns
        if len(tup) != len(cols):
            raise po.ProtocolError(f"source {self.source}: table {out.info.table}: a {what} tuple of {len(tup)} "
                                   f"columns, {len(cols)} registered")
        if po.UNCHANGED_TOAST not in tup:
            return tup
        vals = list(tup)
        for i, v in enumerate(tup):
            if v is po.UNCHANGED_TOAST:
                v = old[i] if old is not None else po.UNCHANGED_TOAST
                if v is po.UNCHANGED_TOAST:
                    raise ReplicaIdentityMissing(self.source, out.info.table, "without the old value of an "
                                                 f"unchanged TOASTed column {cols[i][0]}")
                vals[i] = v
        return tuple(vals)

    def _seam(self, relid: int) -> bool:
        """The current transaction is in the seam of the snapshot ``relid``'s collection starts from (see
        :class:`Rewind`)."""
        own = self.table_starts.get(relid)
        return self.rewinding or own is not None and own.rewind is not None and \
            own.rewind.lo <= self.last_commit < own.rewind.hi

    def _targets(self, relid: int) -> tuple[list, list]:
        """``(targets, key targets)`` of a change of ``relid`` in the current transaction."""
        got = self.table_targets.get(relid) if self.table_starts else None
        return (self.targets, self.key_targets) if got is None else got

    def _change(self, m) -> None:
        if not self.in_txn:
            raise po.ProtocolError(f"source {self.source}: a change outside a transaction")
        targets, _ = self._targets(m.relid)
        if not targets:
            return
        out = self._output(m.relid)
        if out is None:
            return
        if out.info.keyed:
            self._keyed_change(out, m)
            return
        if type(m) is po.Insert:
            rows = [(self._values(out, m.new, None, "new"), 1)]
        else:
            if m.old_kind != "O":
                raise ReplicaIdentityChanged(self.source, out.info.table, "an update or delete came without the "
                                             "whole old row, and its identity was FULL when the source took its "
                                             f"snapshot", f"set it back, or `reclock resnapshot {self.source}`")
            old = self._values(out, m.old, None, "old")
            rows = [(old, -1)]
            if type(m) is po.Update:
                rows.append((self._values(out, m.new, m.old, "new"), 1))
        add = self.writer.add
        for ts, sign in targets:
            for values, diff in rows:
                add(out.info.relid, values, ts, diff * sign)
        self.stats.changes += len(rows) * len(targets)

    def _state(self, out: Output) -> _KeyState:
        """The current rows of key table ``out`` (read once a write: its collection before the write, from
        ``prior``, and what the write wrote of it so far)."""
        st = self.states.get(out.info.relid)
        if st is None:
            relid = out.info.relid
            self.writer.flush(relid)
            updates = [self.writer.written(relid)]
            held = self.prior(out) if self.prior is not None else None
            if held is not None and held.num_rows:
                as_updates = held_updates(held, out, self.writer.renamed.get(relid))
                if as_updates is None:
                    names = [n for n, _, _ in out.info.columns]
                    raise KeyedRowMissing(self.source, out.info.table, f"its collection holds columns "
                                          f"{held.column_names}, not the table's {names}", "re-snapshot the source")
                updates.append(as_updates)
            parts = [u for u in updates if u is not None and u.num_rows]
            contents = contents_as_of(pa.concat_tables(parts) if parts else None, 2**63 - 1)
            st = self.states[relid] = _KeyState(self.source, out, contents if parts else
                                                pa.table({"diff": pa.array([], pa.int64())}))
        return st

    def _keyed_change(self, out: Output, m) -> None:
        """A change of a table of key identity: an update or delete names its old row by its key (the
        whole key; none at all for an update that keeps it), and the old row is the current row of that
        key (:class:`_KeyState`): it is taken back, and an unchanged TOASTed value of the new row is taken
        from it."""
        _, targets = self._targets(out.info.relid)
        if not targets:
            return
        relid = out.info.relid
        if relid in self.chunked:
            self._chunked_change(out, m, self.chunked[relid], targets)
            return
        kind = type(m)
        st = self.states.get(relid)
        if kind is po.Insert:
            new = self._values(out, m.new, None, "new")
            if st is not None:
                st.put(st.key(new), ("text", new))
            rows = [(("text", new), 1)]
        else:
            st = self._state(out)
            if m.old is not None:
                if len(m.old) != len(out.info.columns):
                    raise po.ProtocolError(f"source {self.source}: table {out.info.table}: an old key tuple of "
                                           f"{len(m.old)} columns, {len(out.info.columns)} registered")
                old_key = st.key(m.old)
            else:
                old_key = st.key(m.new)
            old = st.take(old_key, "an update" if kind is po.Update else "a delete")
            rows = [(old, -1)]
            if kind is po.Update:
                new = self._filled(out, m.new, old)
                st.put(st.key(m.new, old_key), new)
                rows.append((new, 1))
        add, typed = self.writer.add, self.writer.add_typed
        for ts, sign in targets:
            for row, diff in rows:
                if row[0] == "text":
                    add(relid, row[1], ts, diff * sign)
                else:
                    _, data, i = row
                    one = data.slice(i, 1)
                    typed(relid, one.append_column("ts", pa.array([ts], pa.int64()))
                          .append_column("diff", pa.array([diff * sign], pa.int64())))
        self.stats.changes += len(rows) * len(targets)

    def _chunk_key(self, out: Output, values: Sequence, old: tuple | None = None) -> tuple:
        """The key of a change's tuple as a chunk's range compares it (integers; an unchanged TOASTed key
        column is the ``old`` key's)."""
        names = [n for n, _, _ in out.info.columns]
        key = []
        for i, k in enumerate(out.info.key):
            j = names.index(k)
            v = values[j]
            if v is po.UNCHANGED_TOAST and old is not None:
                key.append(old[i])
            else:
                _, o, m = out.info.columns[j]
                key.append(po.convert(o, m, v, k))
        return tuple(key)

    def _chunked_change(self, out: Output, m, ch: ChunkedTable, targets: list) -> None:
        """A change of a key table snapshotted online in chunks: its old and its new row each land where
        ``ch.fate`` says (at the change's own timestamp, at its chunk's, or nowhere: a range not read yet, or
        one whose chunk holds the change already; ``reclock.sources.postgres.chunks``)."""
        relid, kind = out.info.relid, type(m)
        own = targets[0][0]  # a table snapshotted on its own has no rewind: one target, (ts, +1)
        rows = []
        old = None
        if kind is not po.Insert:
            if m.old is not None and len(m.old) != len(out.info.columns):
                raise po.ProtocolError(f"source {self.source}: table {out.info.table}: an old key tuple of "
                                       f"{len(m.old)} columns, {len(out.info.columns)} registered")
            old_key = self._chunk_key(out, m.old if m.old is not None else m.new)
            at = ch.fate(old_key, self.last_commit, self.xid, own)
            if at is not None:
                st = self._state(out)
                old = st.take(old_key, "an update" if kind is po.Update else "a delete")  # keys: po.convert's
                rows.append((old, -1, at))
        if kind is not po.Delete:
            new_key = self._chunk_key(out, m.new, old_key if kind is po.Update else None)
            at = ch.fate(new_key, self.last_commit, self.xid, own)
            if at is not None:
                if old is not None:
                    new = self._filled(out, m.new, old)
                elif po.UNCHANGED_TOAST in m.new:
                    raise KeyedRowMissing(self.source, out.info.table, f"an update moved key {old_key} into the "
                                          f"range its online snapshot has read ({new_key}) with unchanged TOASTed "
                                          "values, and the old row is in a range not read yet",
                                          f"run `reclock resnapshot {self.source} --table {out.info.table}`")
                else:
                    new = ("text", self._values(out, m.new, None, "new"))
                st = self.states.get(relid) if kind is po.Insert else self._state(out)
                if st is not None:
                    st.put(new_key, new)
                rows.append((new, 1, at))
        add, typed = self.writer.add, self.writer.add_typed
        for row, diff, ts in rows:
            if row[0] == "text":
                add(relid, row[1], ts, diff)
            else:
                _, data, i = row
                typed(relid, data.slice(i, 1).append_column("ts", pa.array([ts], pa.int64()))
                      .append_column("diff", pa.array([diff], pa.int64())))
        self.stats.changes += len(rows)

    def _filled(self, out: Output, new: po.Tuple, old: _Row) -> _Row:
        """An update's new row, each unchanged TOASTed value (``u``) taken from the old row: text forms when
        the old row is (or there is none), else a row of the shard's types, the new values converted as a
        part's are and the unchanged ones the old row's own."""
        cols = out.info.columns
        if len(new) != len(cols):
            raise po.ProtocolError(f"source {self.source}: table {out.info.table}: a new tuple of {len(new)} "
                                   f"columns, {len(cols)} registered")
        if po.UNCHANGED_TOAST not in new:
            return ("text", new)
        if old[0] == "text":
            return ("text", tuple(o if v is po.UNCHANGED_TOAST else v for v, o in zip(new, old[1])))
        _, data, i = old
        arrays = [data.column(j).slice(i, 1) if v is po.UNCHANGED_TOAST else
                  pa.chunked_array([po.text_column(o, tm, [v], f"{out.info.table}.{n}")], data.schema.field(j).type)
                  for j, (v, (n, o, tm)) in enumerate(zip(new, cols))]
        return ("typed", pa.Table.from_arrays(arrays, schema=data.schema), 0)

    def _truncate(self, m: po.Truncate) -> None:
        """A ``TRUNCATE`` of an output table: the retraction of every row it holds at this point, at the
        transaction's ts (``truncated``). One in the snapshot's seam (a transaction the snapshot's rewind
        also covers) stalls the source instead: the rows the rewind would put back are not known yet."""
        for relid in m.relids:
            out = self.by_relid.get(relid)
            targets, key_targets = self._targets(relid)
            if not targets or out is None or out.info.keyed and not key_targets:
                continue  # a key table's TRUNCATE in the snapshot already
            ch = self.chunked.get(relid)
            if ch is not None and not ch.complete:
                raise TableTruncated(self.source, out.info.table, "TRUNCATE while its online snapshot reads it in "
                                     f"chunks (after key {ch.done})", f"run `reclock resnapshot {self.source} --table "
                                     f"{out.info.table}` (its snapshot starts over)")
            self.states.pop(relid, None)  # its rows are read back again when needed
            seam = self._seam(relid)
            if self.truncated is None or seam:
                why = "between the first binding and its snapshot" if seam else "(Reclock cannot retract " \
                      "rows it is not told)"
                own = relid in self.table_starts and not self.rewinding
                raise TableTruncated(self.source, out.info.table, f"TRUNCATE {why}",
                                     f"run `reclock resnapshot {self.source} --table {out.info.table}`" if own
                                     else "re-snapshot the source")
            for ts, _ in targets:  # one target outside the seam: (ts, +1)
                self.stats.changes += self.truncated(out, ts)


class _CopyReader(io.RawIOBase):
    """A ``COPY ... TO STDOUT`` as a readable byte stream (what Arrow's CSV reader reads from)."""

    def __init__(self, copy) -> None:
        self.copy = copy
        self.pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        """Some bytes pending, reading on if needed; False at the end of the COPY."""
        while not self.pending:
            data = self.copy.read()
            if not data:
                return False
            self.pending = memoryview(bytes(data))
        return True

    def at_end(self) -> bool:
        return not self._fill()

    def readinto(self, buf) -> int:
        if not self._fill():
            return 0
        n = min(len(buf), len(self.pending))
        buf[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


SNAPSHOT_BLOCK = 8 << 20
"""Bytes of CSV Arrow parses at a time: a snapshot's memory is a block and a part, not the table."""


def copy_rows(conn, query: sql.Composable, out: Output, writer: PartWriter, ts: int) -> int:
    """The rows of ``query`` (a ``COPY ... TO STDOUT (FORMAT csv)`` of ``out``'s columns' text forms) as +1 at
    ``ts``, parsed by Arrow's streaming CSV reader a block at a time (every value a string; an unquoted empty
    field is NULL, a quoted one the empty string) and converted as the stream's values are; the rows read."""
    from pyarrow import csv

    keys = [f"c{i}" for i in range(len(out.info.columns))]  # names of our own: a table's may repeat in CSV terms
    total = 0
    with conn.cursor() as cur, cur.copy(query) as copy:
        raw = _CopyReader(copy)
        if raw.at_end():
            return 0  # no rows (Arrow's reader refuses an empty file)
        reader = csv.open_csv(
            io.BufferedReader(raw, 1 << 20),
            read_options=csv.ReadOptions(column_names=keys, block_size=SNAPSHOT_BLOCK),
            parse_options=csv.ParseOptions(newlines_in_values=True),
            convert_options=csv.ConvertOptions(column_types={k: pa.string() for k in keys}, null_values=[""],
                                               strings_can_be_null=True, quoted_strings_can_be_null=False))
        for batch in reader:
            writer.add_columns(out.info.relid, batch.columns, ts, 1)
            total += batch.num_rows
    return total


def read_snapshot(conn, outputs: Sequence[Output], writer: PartWriter, ts: int, chunk: int, source: str = "?") -> int:
    """Every row of every table, in the snapshot ``conn``'s transaction holds, as +1 at ``ts``; returns the
    rows read. Each table is read with ``COPY (SELECT col::text, ... FROM ONLY t WHERE <row filter>) TO STDOUT
    (FORMAT csv)`` (the columns and rows its publication publishes: ``TableInfo``; each column's text form as
    pgoutput sends it: :func:`reclock.sources.postgres.upstream.text_form`) in the
    session styles the stream is decoded in, parsed by Arrow's streaming CSV reader a block at a time (every
    value a string; an unquoted empty field is NULL, a quoted one the empty string), and converted as the
    stream's values are, so both give equal values. A table truncated after the snapshot was exported (which
    the snapshot reads as empty) is ``TruncatedUnderSnapshot``."""
    total = 0
    for out in outputs:
        cols = sql.SQL(", ").join(sql.SQL(text_form(n, o)) for n, o, _ in out.info.columns)
        query = sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT (FORMAT csv)").format(
            cols, out.info.relation_sql(), out.info.where_sql())
        total += copy_rows(conn, query, out, writer, ts)
    for out in outputs:  # the COPYs' locks are held to the end of the transaction: a TRUNCATE before them shows
        if PostgresUpstream.truncated_since(conn, out.info):
            raise TruncatedUnderSnapshot(source, out.info.table)
    return total
