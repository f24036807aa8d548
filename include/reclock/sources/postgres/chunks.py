"""A table snapshotted online in chunks (issue 33 part 3; Netflix's DBLog, Flink CDC's incremental snapshot),
fitted to Reclock's cycle and to collections of differences: the pure reconciliation of a chunk with the log.

A table whose snapshot of its own is pending (a table that joined the publication, ``reclock resnapshot
<source> --table <t>``) and that has a key identity on integer columns is read by **key ranges**: each chunk
is ``WHERE (key) > (after) ORDER BY key LIMIT n`` (its row filter too). Key ranges, not CTID ranges: a change
in the WAL names its key, so whether a change is of a range already read is told from the change itself; a
CTID is not in the WAL, and an updated row moves to another page.

Each chunk is read by the mint (``reclock.sources.postgres.kind``), before the upper it binds, between two
watermarks written into the WAL (``pg_logical_emit_message``, prefix :data:`WATERMARK_PREFIX`): the low one
(``low``), then the chunk's ``SELECT`` in a ``REPEATABLE READ`` transaction whose snapshot ``S``
(``pg_current_snapshot()``: ``xmin``, ``xmax``, the in-progress ``xip``) is recorded, then the high one
(``high``). Every transaction visible in ``S`` committed below ``high`` (it ended before ``S`` was taken);
every transaction committed at or past ``high`` is not in ``S``. The chunk's rows land at the binding that
mint appends (LSN ``U > high``), its timestamp ``t``.

**The log against the chunk** (:meth:`ChunkedTable.fate`), for a change of key ``k`` in a transaction of xid
``x`` committed at LSN ``c`` (its own binding ``ts``):

- ``k`` in a range read by chunks appended before: taken at ``ts``, as any table's change;
- ``k`` in a chunk of this write: ``c >= high``: taken at ``ts`` (``>= t``); ``c < high`` and ``x`` visible in
  ``S``: dropped (the chunk holds it); ``c < high`` and ``x`` not visible in ``S``: taken at ``max(ts, t)``;
- ``k`` in no range read yet: dropped (a later chunk reads the row as it is then).

DBLog drops from the chunk the rows whose keys the log changed between the watermarks, and the log's event
wins: right for a sink of upserts. A collection of differences cannot drop the chunk's row and keep the log's
``-old +new`` (the retraction would match no row); so the window is decided the other way round, per
transaction, by the chunk's own snapshot: the log's changes the chunk already holds are dropped, the others
taken, none before the chunk. That is exact where the LSN window is not: a transaction whose commit record is
written before ``low`` may still be invisible to ``S`` (it commits, then leaves the process array). One such
transaction is not in the write's stream if it committed before the write's first LSN (its change of a range
not read then was dropped): the chunk records the xids of ``S.xip`` that were committed when it was read
(``raced``), and a write whose stream does not show each of them fails (``ChunkRaced``, nothing appended; the
next cycle reads the chunk again).

Hence, AS OF every binding ``t``, the table's collection holds exactly the upstream table as of ``t``'s LSN
restricted to the keys of the chunks appended by ``t`` (and, for ``--table``, what it held before outside
them: each chunk retracts the rows its collection held in its range at ``t``); from the binding of the last
chunk (open-ended: ``last`` None) on, the whole table.

Law (tested with hypothesis, ``tests/unit/test_pg_chunks.py``): for any history of transactions, chunk reads and
snapshots, the updates :meth:`ChunkedTable.fate` keeps, with the chunks' rows, give the table restricted to
the chunks' ranges at every binding.
"""

from __future__ import annotations

from dataclasses import dataclass
WATERMARK_PREFIX = "reclock.chunk"
"""The prefix of the watermark messages a chunk's read writes into the WAL (``pg_logical_emit_message``, not
transactional: they are in the WAL at once; pgoutput does not send them without ``messages``)."""

Key = tuple[int, ...]


@dataclass(frozen=True)
class XidSnapshot:
    """A snapshot as ``pg_current_snapshot()`` gives it (64-bit xids): ``xmin``, ``xmax``, in progress ``xip``."""

    xmin: int
    xmax: int
    xip: tuple[int, ...] = ()

    @staticmethod
    def parse(text: str) -> "XidSnapshot":
        """``xmin:xmax:xip,...`` (a ``pg_snapshot``'s text)."""
        lo, hi, xip = text.split(":")
        return XidSnapshot(int(lo), int(hi), tuple(int(x) for x in xip.split(",") if x))

    def full(self, xid32: int) -> int:
        """The 64-bit xid of a 32-bit one near this snapshot (pgoutput's Begin carries 32 bits)."""
        x = (self.xmax & ~0xFFFFFFFF) | (xid32 & 0xFFFFFFFF)
        return x - (1 << 32) if x > self.xmax + (1 << 31) else x

    def visible(self, xid32: int) -> bool:
        """Whether a committed transaction of xid ``xid32`` is visible in the snapshot."""
        x = self.full(xid32)
        return x < self.xmin or (x < self.xmax and x not in self.xip)

    def to_json(self) -> str:
        return f"{self.xmin}:{self.xmax}:{','.join(map(str, self.xip))}"


@dataclass(frozen=True)
class Chunk:
    """A chunk read: the keys in ``(after, last]`` (``after`` None: from the first key; ``last`` None: to the
    end, the table's last chunk), ``rows`` of them, between watermarks ``low`` and ``high``, under ``snapshot``;
    ``raced``: the xids of ``snapshot.xip`` committed when it was read (see the module)."""

    after: Key | None
    last: Key | None
    rows: int
    low: int
    high: int
    snapshot: XidSnapshot
    raced: tuple[int, ...] = ()

    def holds(self, key: Key) -> bool:
        return (self.after is None or key > self.after) and (self.last is None or key <= self.last)

    def to_json(self) -> dict:
        return {"after": None if self.after is None else list(self.after),
                "last": None if self.last is None else list(self.last), "rows": self.rows, "low": self.low,
                "high": self.high, "snapshot": self.snapshot.to_json(), "raced": list(self.raced)}

    @staticmethod
    def from_json(d: dict) -> "Chunk":
        return Chunk(None if d["after"] is None else tuple(d["after"]), None if d["last"] is None else tuple(d["last"]),
                     int(d["rows"]), int(d["low"]), int(d["high"]), XidSnapshot.parse(d["snapshot"]),
                     tuple(int(x) for x in d.get("raced", ())))


@dataclass(frozen=True)
class ChunkedTable:
    """One table's chunked snapshot in one write: ``done`` the last key of the chunks appended before (None:
    none yet; ``complete``: every chunk is, the table streams), ``chunks`` the chunks this write lands, in key
    order from ``done``, at binding ``ts`` (None: none)."""

    done: Key | None = None
    complete: bool = False
    chunks: tuple[Chunk, ...] = ()
    ts: int | None = None

    def __post_init__(self) -> None:
        after = self.done
        for c in self.chunks:
            if c.after != after:
                raise ValueError(f"chunk after {c.after} does not follow {after}")
            if c.last is None and c is not self.chunks[-1]:
                raise ValueError("an open-ended chunk before another")
            after = c.last

    def read(self, key: Key) -> bool:
        """Whether ``key`` is in a range appended before this write."""
        return self.complete or (self.done is not None and key <= self.done)

    def fate(self, key: Key, commit_lsn: int, xid: int, own_ts: int) -> int | None:
        """The timestamp a change of ``key`` (in transaction ``xid``, committed at ``commit_lsn``, its binding
        ``own_ts``) lands at, None if it is dropped (see the module)."""
        if self.read(key):
            return own_ts
        for c in self.chunks:
            if c.holds(key):
                if commit_lsn >= c.high:
                    return own_ts
                if c.snapshot.visible(xid):
                    return None
                assert self.ts is not None
                return max(own_ts, self.ts)
        return None

    @property
    def finished(self) -> bool:
        """Whether the table's every key is read once this write's chunks are appended."""
        return self.complete or bool(self.chunks) and self.chunks[-1].last is None

    @property
    def last(self) -> Key | None:
        return self.chunks[-1].last if self.chunks else self.done


INTEGER_TYPES = (20, 21, 23)  # int8, int2, int4
"""The key column types a chunked snapshot takes: their order in Postgres is Python's."""


def chunkable(info) -> bool:
    """Whether a table (``upstream.TableInfo``) is snapshotted online in chunks: a key identity (its key named
    by every change in the WAL) on integer columns (``INTEGER_TYPES``), not a partitioned root. Any other table
    snapshotted on its own is read under one exported snapshot (``reclock.sources.postgres.kind``)."""
    if not info.keyed or info.partitioned or not info.key:
        return False
    types = {n: o for n, o, _ in info.columns}
    return all(types.get(k) in INTEGER_TYPES for k in info.key)
