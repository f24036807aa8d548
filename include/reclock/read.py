"""Reading a collection: its updates in a time range, or its contents AS OF a time (consolidated).

A read AS OF ``t`` (``since <= t < upper``) takes the shard's updates with ``ts <= t`` and sums ``diff``
by row, dropping rows whose sum is zero. Parts are read with pyarrow straight from the blob store, so
DuckDB, pandas or Spark can consume the result (``spark.createDataFrame(table.to_pandas())`` or read the
part paths directly).

A collection whose schema evolved (a recorded history, ``reclock.persist.schemas``) is read AS OF ``t`` with
the schema in force at ``t``, each part projected from the schema it was written with
(``reclock.schema_projection``); :class:`UpdateReader` gives a range's updates with the newest schema of the
range, and :meth:`UpdateReader.by_version` cuts them where the schema changes, each piece with its own.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Collection, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reclock.compaction import contents_as_of, sorted_by_ts
from reclock.errors import BeyondUpper, NothingComplete, SinceViolation
from reclock.part_layout import own_columns
from reclock.persist.blob import BlobStore
from reclock.persist.parquet import check_rows, column_stats, conform, dictionary_columns, may_retract
from reclock.persist.schemas import load_history
from reclock.persist.shards import BatchRow, batches, shard_info
from reclock.schema_evolution import CollectionSchema, SchemaHistory
from reclock.schema_projection import part_schema, project_part, target_arrow_schema, unify_tables


def _read_part(blob: BlobStore, path: str, kind: str, row_groups: Sequence[int] | None = None,
               row: BatchRow | None = None, dictionaries: Collection[str] = ()) -> pa.Table:
    """The columns of a shard of ``kind`` in the part at ``path``, named as the shard names them (only the
    row groups ``row_groups`` if given); with ``row`` (the part's batch row), checked to hold its rows; the
    file's columns ``dictionaries`` read as dictionary arrays."""
    with blob.open(path) as f:
        pf = pq.ParquetFile(f, read_dictionary=list(dictionaries) or None)
        if row is not None:
            check_rows(pf.metadata, row.shard, path, row.rows)
        own, renames = own_columns(kind, pf.schema_arrow.names)
        t = pf.read(columns=own) if row_groups is None else pf.read_row_groups(row_groups, columns=own)
    return t.rename_columns([renames.get(n, n) for n in t.column_names]) if renames else t


def _read_parts(blob: BlobStore, rows: Sequence[BatchRow], kind: str,
                target: CollectionSchema | None = None, as_of: int | None = None) -> pa.Table | None:
    """The parts' updates in one table: unified by name (a column a part lacks is null there), or, with
    ``target``, each part projected to it (``reclock.schema_projection.project_part``). With ``as_of``, only
    the updates at ``ts <= as_of``, kept before projecting: a part of a newer schema may hold updates after
    ``as_of`` whose values the older ``target`` cannot hold (a widened type), and they are not read."""
    tables = [_read_part(blob, row.path, kind, row=row) for row in rows]
    if as_of is not None:
        tables = [t.filter(pc.less_equal(t["ts"], as_of)) for t in tables]
    if target is not None:
        tables = unify_tables([project_part(t, target) for t in tables]) or [target_arrow_schema(target, []).empty_table()]
    return pa.concat_tables(tables, promote_options="default") if tables else None


def read_updates(conn, blob: BlobStore, shard: str, lower: int = 0, upper: int | None = None) -> pa.Table | None:
    """Every ``(data..., ts, diff)`` update of ``shard`` with ``lower <= ts < upper`` (upper defaults to the
    shard's upper), sorted by ts; None if the shard has no parts."""
    rows, hi = updates_parts(conn, shard, lower, upper)
    if not rows:
        return None
    reader = UpdateReader(blob, shard, rows, lower, hi, shard_info(conn, shard).kind,
                          history=load_history(conn, shard))
    tables = list(reader.tables())
    return pa.concat_tables(tables) if tables else reader.schema.empty_table()


def updates_parts(conn, shard: str, lower: int = 0, upper: int | None = None) -> tuple[list[BatchRow], int]:
    """The batch rows of ``shard`` that may hold updates at ``lower <= ts < upper`` (upper capped at the
    shard's upper, and returned)."""
    info = shard_info(conn, shard)
    hi = info.upper if upper is None else min(upper, info.upper)
    return [b for b in batches(conn, shard) if (b.max_ts is None or b.max_ts >= lower)
            and (b.min_ts is None or b.min_ts < hi)], hi


@dataclass(frozen=True)
class _RowGroup:
    lo: float  # the footer's ts bounds (infinite where it kept none)
    hi: float
    part: int  # index into the reader's parts
    index: int


class UpdateReader:
    """The updates of some parts of a shard at ``lower <= ts < upper``, read a cluster of row groups at a
    time in ts order, without holding them all (what the sink streams from).

    The footers give each row group's ts bounds. Row groups are taken by their lower bound and gathered
    into clusters whose ranges overlap; each cluster is read, filtered to the range (only where its bounds
    cross it), and sorted by ts (only if it is not already). Clusters never overlap, so the tables come out
    in ts order. Two clusters may share their boundary ts only with ``split_ts`` and when no part may hold
    a retraction (consolidation and keyed encoding need a ts's updates together); otherwise every ts lies in
    one table. Every table has :attr:`schema`: the parts' columns of this shard (both outputs of a source
    share files), unified; a column a part lacks is null there. With ``dictionaries``, and when no part may
    hold a retraction (nothing is grouped by row), a string column that every row group of a cluster keeps
    as a small dictionary (:func:`reclock.persist.parquet.dictionary_columns`) comes as a dictionary array
    of its type, not decoded.

    With a ``history`` (the shard's recorded schemas), :attr:`schema` is the schema a read AS OF
    ``upper - 1`` gives (:attr:`target`), every part projected to it; :meth:`by_version` cuts the tables where
    the schema changes and gives each piece the schema of its time. With ``across``, the target also holds
    the columns a version in the range had and a later one dropped
    (``SchemaHistory.read_across``), so a piece before the drop keeps their values (a reader that
    consolidates across versions, AS OF one time, must not: a dropped column's values never meet the
    retractions written without it).
    """

    def __init__(self, blob: BlobStore, shard: str, rows: Sequence[BatchRow], lower: int, upper: int,
                 kind: str, dictionaries: bool = False, history: SchemaHistory | None = None,
                 across: bool = False) -> None:
        self.blob, self.shard, self.lower, self.upper, self.kind = blob, shard, lower, upper, kind
        self.dictionaries = dictionaries
        self.history = history if history is not None else SchemaHistory()
        self.target = (self.history.read_across(lower, upper) if across
                       else self.history.read_as(max(lower, upper - 1)))
        self.rows: list[BatchRow] = list(rows)
        self.parts: list[str] = []  # paths
        self.footers: list[pq.FileMetaData] = []
        self.groups: list[_RowGroup] = []
        self.retractions = False
        schemas = []
        for row in rows:
            with blob.open(row.path) as f:
                pf = pq.ParquetFile(f)
                md, arrow = pf.metadata, pf.schema_arrow
            check_rows(md, row.shard, row.path, row.rows)
            own, renames = own_columns(kind, arrow.names)
            schemas.append(pa.schema([arrow.field(n).with_name(renames.get(n, n)) for n in own]))
            self.retractions = self.retractions or may_retract(md)
            stats = column_stats(md, "ts") or [None] * md.num_row_groups
            for i, st in enumerate(stats):
                known = st is not None and st.has_min_max
                lo = st.min if known else (row.min_ts if row.min_ts is not None else -math.inf)
                hi = st.max if known else (row.max_ts if row.max_ts is not None else math.inf)
                if hi >= lower and lo < upper and md.row_group(i).num_rows:
                    self.groups.append(_RowGroup(lo, hi, len(self.parts), i))
            self.parts.append(row.path)
            self.footers.append(md)
        self.part_schemas = [part_schema(s, [n for n in s.names if n not in ("ts", "diff")]) for s in schemas]
        if self.target is not None:
            self.schema = target_arrow_schema(self.target, schemas)
        else:
            self.schema = pa.unify_schemas(schemas, promote_options="default") if schemas else pa.schema([])

    def without(self, parts: Collection[int]) -> UpdateReader:
        """This reader less the parts at indexes ``parts`` (of :attr:`rows`): their updates are not read.
        :attr:`rows`, :attr:`footers` and :attr:`schema` stay those of every part."""
        other = copy.copy(self)
        other.groups = [g for g in self.groups if g.part not in parts]
        return other

    def tables(self, split_ts: bool = False) -> Iterator[pa.Table]:
        """The clusters' updates, each a table sorted by ts, in ts order (see the class)."""
        split = split_ts and not self.retractions
        cluster: list[_RowGroup] = []
        top = -math.inf
        for g in sorted(self.groups, key=lambda g: (g.lo, g.hi, g.part, g.index)):
            if cluster and (g.lo > top or (split and g.lo == top)):
                yield from self._read(cluster, top)
                cluster = []
            cluster.append(g)
            top = max(top, g.hi) if len(cluster) > 1 else g.hi
        if cluster:
            yield from self._read(cluster, top)

    def by_version(self, tables: Iterator[pa.Table]) -> Iterator[tuple[CollectionSchema | None, pa.Table]]:
        """``tables`` (of :meth:`tables`) cut where the recorded schema changes, each piece read as the schema
        in force at its times: ``(that schema, the piece)`` (``(None, table)`` without a history)."""
        for table in tables:
            if self.target is None or table.num_rows == 0:
                yield self.target, table
                continue
            ts = table["ts"]
            lo, hi = pc.min(ts).as_py(), pc.max(ts).as_py()
            cuts = [v.since_ts for v in self.history.versions if lo < v.since_ts <= hi]
            bounds = [lo, *cuts, hi + 1]
            for a, b in zip(bounds, bounds[1:]):
                piece = table if len(bounds) == 2 else table.filter(
                    pc.and_(pc.greater_equal(ts, a), pc.less(ts, b)))
                schema = self.history.read_as(a)
                yield schema, (piece if schema == self.target else project_part(piece, schema))

    def conform(self, table: pa.Table) -> pa.Table:
        """``table`` with :attr:`schema`'s columns, in its order (a missing one null; a dictionary of a
        column's type kept; with a history, the part's columns projected to :attr:`target` first)."""
        if self.target is not None and table.schema != self.schema:
            table = project_part(table, self.target)
        if table.schema == self.schema:
            return table
        batches = [conform(b, self.schema) for b in table.to_batches()]
        return pa.Table.from_batches(batches) if batches else self.schema.empty_table()

    def _dictionaries(self, groups: dict[int, list[int]]) -> dict[int, set[str]]:
        """Per part of a cluster (its row groups ``groups``), the file columns to read as dictionaries: those
        whose shard column every part of the cluster keeps as a small dictionary (so the cluster's tables
        agree on its type)."""
        if not self.dictionaries or self.retractions:
            return {}
        per_part = {}
        for part, indexes in groups.items():
            names = dictionary_columns(self.footers[part], indexes)
            own, renames = own_columns(self.kind, list(names))
            per_part[part] = {renames.get(n, n): n for n in own if n in names}
        common = set.intersection(*(set(m) for m in per_part.values()))
        return {part: {m[n] for n in common} for part, m in per_part.items()}

    def _read(self, cluster: list[_RowGroup], top: float) -> Iterator[pa.Table]:
        groups = {part: [g.index for g in cluster if g.part == part] for part in sorted({g.part for g in cluster})}
        dictionaries = self._dictionaries(groups)
        table = pa.concat_tables([
            self.conform(_read_part(self.blob, self.parts[part], self.kind, indexes,
                                    dictionaries=dictionaries.get(part, ())))
            for part, indexes in groups.items()])
        if cluster[0].lo < self.lower or top >= self.upper:
            table = table.filter(pc.and_(pc.greater_equal(table["ts"], self.lower),
                                         pc.less(table["ts"], self.upper)))
        if table.num_rows:
            yield sorted_by_ts(table)


def read_as_of(conn, blob: BlobStore, shard: str, t: int | None = None) -> pa.Table:
    """The contents of ``shard`` AS OF ``t`` (default: the latest complete time, ``upper - 1``):
    data columns plus ``diff`` (the multiplicity), zero rows dropped."""
    info = shard_info(conn, shard)
    if info.upper == 0:
        raise NothingComplete(shard)
    if t is None:
        t = info.upper - 1
    if t < info.since:
        raise SinceViolation(shard, t, info.since)
    if t >= info.upper:
        raise BeyondUpper(shard, t, info.upper)
    target = load_history(conn, shard).read_as(t)
    return contents_as_of(_read_parts(blob, batches(conn, shard, as_of=t), info.kind, target, as_of=t), t)
