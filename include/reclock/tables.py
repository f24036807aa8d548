"""Collections as tables: Spark and DuckDB read exactly the parts a shard lists, AS OF a time.

Reading a collection's blob folder directly is wrong: it holds parts of failed writes, parts a compaction or
a rebuild replaced, internal columns, and updates with ``diff`` rather than rows. A read here

1. takes a **read hold** on the shard at the time it reads (a lease, renewed while the read is open), so
   since cannot pass that time and garbage collection keeps every part retired while the hold is in effect
   (``reclock.persist.gc``);
2. lists the parts from Postgres (``batches(conn, shard, as_of=t)``), after the hold is in effect;
3. lets the engine read those parts itself (Spark's executors, DuckDB's scan), never through this process's
   memory: the data columns (the shard's own, renamed as the shard names them), ``ts <= t``, and the
   updates consolidated: rows summed by ``diff`` and each row repeated by its multiplicity, zero rows
   dropped. When the parts' footers show that no update retracts (every ``diff`` is 1, as in an append-only
   collection) the rows are taken as they are, without an aggregation.

A collection whose schema evolved (a recorded history, ``reclock.persist.schemas``) is read AS OF ``t`` with
the schema in force at ``t``: the parts are scanned in groups of one schema each, every group filtered to
the read's times and projected to that schema (``reclock.schema_projection``: a column a part lacks is
null, a widened one cast), and the groups' rows unioned before they are consolidated.

Consolidation is bit for bit, as ``read_as_of``'s and compaction's (``reclock.compaction``): an engine's own
grouping is not (Spark and DuckDB put ``0.0`` and ``-0.0``, and every NaN, in one group), so each groups
by a bit-exact key instead and carries every value through as it was (``reclock.bitexact``). A column
DuckDB would read as another type (a decimal wider than 38 digits becomes a DOUBLE there) is refused with
``ValueNotCarried``; Spark refuses such a column itself.

::

    with read_table("orders", as_of=t) as r:            # the hold lasts for the block
        df = r.spark(spark)                             # a DataFrame over exactly the listed parts
        df.groupBy("region").count().write.parquet(...)
        rel = r.duckdb(duckdb.connect())                # a DuckDB relation over the same parts

    df = spark_as_of(spark, "orders")                   # or one call: a hold leased for READ_LEASE_S

:func:`spark_updates` gives the raw ``(data..., ts, diff)`` updates at ``lower <= ts < upper``. Settings
(the consensus DSN, the blob store) come as for every command (``reclock.settings``) unless
given. Spark must be able to read the blob store: for ``s3://`` the session needs the ``s3a`` settings
(``reclock.persist.objectstore.spark_s3a_conf``), which Reclock's own sessions have.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reclock.bitexact import duckdb_key, spark_key
from reclock.errors import (BeyondUpper, NothingComplete, ReclockError, SinceViolation, UnknownReadHold,
                            ValueNotCarried)
from reclock.part_layout import own_columns
from reclock.persist import connect
from reclock.persist.blob import BlobStore, FsspecBlobStore
from reclock.persist.parquet import check_rows, column_stats, may_retract
from reclock.persist.schemas import load_history
from reclock.persist.shards import (BatchRow, acquire_read_hold, batches, release_read_hold, renew_read_hold,
                                    shard_info)
from reclock.schema_evolution import CollectionSchema, source_names
from reclock.schema_projection import duckdb_sql, duckdb_type, from_ts_sql, part_schema, spark_sql

MAX_ENGINE_DECIMAL = 38
"""The most digits a decimal of Spark or DuckDB holds (Reclock writes wider ones for ``numeric(p, s)`` with
``p`` above it: ``read_as_of`` reads them; Spark refuses them; DuckDB would read them as DOUBLE)."""

READ_LEASE_S = 600.0
"""How long a reader's hold lasts without renewal. :class:`TableRead` renews it every third of this while
open; :func:`spark_as_of` takes one lease and leaves it to lapse (the DataFrame is lazy)."""


class ReadLost(ReclockError):
    """A reader's hold lapsed or was released while it read: since may have passed its time and the parts it
    listed may be gone. Read again."""

    def __init__(self, shard: str, holder: str) -> None:
        super().__init__(f"collection {shard}: the read hold {holder} lapsed while reading; read again")


@dataclass(frozen=True)
class PartList:
    """What a read of ``shard`` at ``lower <= ts <= as_of`` needs: the parts, and what their footers say."""

    shard: str
    kind: str  # the shard's kind: which of the files' columns are its own
    as_of: int
    lower: int
    paths: tuple[str, ...]  # the parts, relative to the blob store, in the shard's (lower, path) order
    rows: int  # updates in those parts (all times)
    retractions: bool  # some part may hold a diff below 1
    multiples: bool  # some part may hold a diff above 1 (identical rows consolidated by compaction)
    schema_path: str | None  # a part of the shard to take the columns from when ``paths`` is empty
    uniform: bool = True  # every part has the same columns and types (no schema merging needed)
    wide_decimals: tuple[str, ...] = ()  # the shard's columns that are decimals of more than 38 digits
    target: CollectionSchema | None = None  # the schema read (the one in force at as_of), if recorded
    part_schemas: tuple[CollectionSchema, ...] = ()  # with a target: each part's own user columns


def _footer(blob: BlobStore, row: BatchRow) -> tuple[bool, bool, Any]:
    """(may retract, may hold a diff above 1, the Arrow schema) from a part's footer (unknown bounds count as
    both), checked to hold the part's rows."""
    with blob.open(row.path) as f:
        pf = pq.ParquetFile(f)
        md, schema = pf.metadata, pf.schema_arrow
    check_rows(md, row.shard, row.path, row.rows)
    stats = column_stats(md, "diff") or [None]
    multiples = any(st is None or not st.has_min_max or st.max > 1 for st in stats)
    return may_retract(md), multiples, schema.remove_metadata()


def list_parts(conn, blob: BlobStore, shard: str, as_of: int, lower: int = 0) -> PartList:
    """The parts a read of ``shard`` at ``lower <= ts <= as_of`` needs (``since <= as_of < upper``)."""
    rows: list[BatchRow] = [b for b in batches(conn, shard, as_of=as_of) if b.max_ts is None or b.max_ts >= lower]
    info = shard_info(conn, shard)
    retractions = multiples = False
    schemas = []
    for b in rows:
        r, m, schema = _footer(blob, b)
        retractions, multiples = retractions or r, multiples or m
        schemas.append(schema)
    schema_path = None
    target = load_history(conn, shard).read_as(as_of)
    if not rows and target is None:
        every = batches(conn, shard)
        schema_path = every[-1].path if every else None
    own, renames = own_columns(info.kind, sorted({f.name for s in schemas for f in s}))
    wide = sorted({renames.get(f.name, f.name) for s in schemas for f in s if f.name in own
                   and pa.types.is_decimal(f.type) and f.type.precision > MAX_ENGINE_DECIMAL})
    own_schemas = []
    if target is not None:
        for schema in schemas:
            own, renames = own_columns(info.kind, schema.names)
            fields = [schema.field(c).with_name(renames.get(c, c)) for c in own]
            own_schemas.append(part_schema(pa.schema(fields), [f.name for f in fields if f.name not in ("ts", "diff")]))
    return PartList(shard, info.kind, as_of, lower, tuple(b.path for b in rows), sum(b.rows for b in rows),
                    retractions, multiples, schema_path, all(s.equals(schemas[0]) for s in schemas[1:]),
                    tuple(wide), target, tuple(own_schemas))


def _holder() -> str:
    return f"reader:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _settings(dsn: str | None, blob: BlobStore | None) -> tuple[str, BlobStore]:
    if dsn is None or blob is None:
        from reclock import settings

        dsn = settings.find_dsn(dsn)
        blob = blob if blob is not None else settings.find_blob_store()
    return dsn, blob


def _time(conn, shard: str, as_of: int | None) -> int:
    info = shard_info(conn, shard)
    if info.upper == 0:
        raise NothingComplete(shard)
    t = info.upper - 1 if as_of is None else as_of
    if t < info.since:
        raise SinceViolation(shard, t, info.since)
    if t >= info.upper:
        raise BeyondUpper(shard, t, info.upper)
    return t


class TableRead:
    """A read of ``collection`` AS OF ``as_of`` (default: its latest complete time) that holds the shard for
    the ``with`` block: the hold is taken and the parts listed on entry, the hold renewed while open and
    released on exit. :meth:`spark` and :meth:`duckdb` read the same part list. Updates at
    ``lower <= ts <= as_of`` only (``lower`` > 0: :meth:`spark` and :meth:`duckdb` give the updates then,
    not contents)."""

    def __init__(self, collection: str, as_of: int | None = None, *, dsn: str | None = None,
                 blob: BlobStore | None = None, lease_s: float = READ_LEASE_S) -> None:
        self.collection, self.requested, self.lease_s = collection, as_of, lease_s
        self.dsn, self.blob = _settings(dsn, blob)
        self.holder = _holder()
        self.parts: PartList | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._lost: Exception | None = None

    @property
    def as_of(self) -> int:
        return self._open().as_of

    def _open(self) -> PartList:
        if self.parts is None:
            raise ReclockError(f"collection {self.collection}: use the read inside its `with` block")
        if self._lost is not None:
            raise ReadLost(self.collection, self.holder) from self._lost
        return self.parts

    def __enter__(self) -> "TableRead":
        with connect(self.dsn) as conn:
            t = _time(conn, self.collection, self.requested)
            acquire_read_hold(conn, self.collection, self.holder, t, lease_s=self.lease_s)
            try:
                self.parts = list_parts(conn, self.blob, self.collection, t)
            except BaseException:
                release_read_hold(conn, self.collection, self.holder)
                raise
        self._renewer = threading.Thread(target=self._renew, name=f"hold-{self.collection}", daemon=True)
        self._renewer.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                with connect(self.dsn) as conn:
                    renew_read_hold(conn, self.collection, self.holder, self.lease_s)
            except UnknownReadHold as e:  # it lapsed (or was released): the read cannot be trusted
                self._lost = e
                return
            except Exception:  # noqa: BLE001 - Postgres away for a moment: try again at the next renewal
                continue

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(30)
        with connect(self.dsn) as conn:
            release_read_hold(conn, self.collection, self.holder)
        lost, self._lost = self._lost, None
        if lost is not None and exc[0] is None:
            raise ReadLost(self.collection, self.holder) from lost

    def spark(self, spark) -> Any:
        """The contents AS OF :attr:`as_of` as a Spark DataFrame over exactly the listed parts."""
        return spark_frame(spark, self._open(), self.blob)

    def duckdb(self, con) -> Any:
        """The contents AS OF :attr:`as_of` as a DuckDB relation over exactly the listed parts."""
        return duckdb_relation(con, self._open(), self.blob)


def read_table(collection: str, as_of: int | None = None, **kw: Any) -> TableRead:
    """A :class:`TableRead` (use it in a ``with`` block)."""
    return TableRead(collection, as_of, **kw)


def _leased(collection: str, as_of: int | None, lower: int | None, dsn: str | None, blob: BlobStore | None,
            lease_s: float) -> tuple[PartList, BlobStore]:
    """Take a leased hold and list the parts: AS OF ``as_of`` (``lower`` None), or the updates at
    ``lower <= ts <= as_of``."""
    dsn, blob = _settings(dsn, blob)
    with connect(dsn) as conn:
        t = _time(conn, collection, as_of)
        if lower is not None and lower > t + 1:
            raise ValueError(f"collection {collection}: lower {lower} is above the read's upper {t + 1}")
        hold = t if lower is None else max(lower, shard_info(conn, collection).since)
        acquire_read_hold(conn, collection, _holder(), min(hold, t), lease_s=lease_s)
        return list_parts(conn, blob, collection, t, lower or 0), blob


def spark_as_of(spark, collection: str, as_of: int | None = None, *, dsn: str | None = None,
                blob: BlobStore | None = None, lease_s: float = READ_LEASE_S) -> Any:
    """``collection``'s contents AS OF ``as_of`` (default: its latest complete time) as a Spark DataFrame over
    exactly the parts the shard lists then, with the user's columns only. The read hold is a lease of
    ``lease_s`` seconds that lapses by itself: run the DataFrame's actions within it, or use
    :func:`read_table` to hold the collection for a block."""
    parts, blob = _leased(collection, as_of, None, dsn, blob, lease_s)
    return spark_frame(spark, parts, blob)


def spark_updates(spark, collection: str, lower: int = 0, upper: int | None = None, *, dsn: str | None = None,
                  blob: BlobStore | None = None, lease_s: float = READ_LEASE_S) -> Any:
    """``collection``'s raw updates ``(data..., ts, diff)`` at ``lower <= ts < upper`` (default: its upper) as a
    Spark DataFrame (``lower`` must be at or above since, as for every read)."""
    parts, blob = _leased(collection, None if upper is None else upper - 1, lower, dsn, blob, lease_s)
    return spark_frame(spark, parts, blob, updates=True)


def duckdb_as_of(con, collection: str, as_of: int | None = None, *, dsn: str | None = None,
                 blob: BlobStore | None = None, lease_s: float = READ_LEASE_S) -> Any:
    """``collection``'s contents AS OF ``as_of`` as a DuckDB relation on ``con`` (a lazy scan of exactly the
    listed parts; DuckDB streams and spills, so memory stays bounded); the hold is leased as for
    :func:`spark_as_of`."""
    parts, blob = _leased(collection, as_of, None, dsn, blob, lease_s)
    return duckdb_relation(con, parts, blob)


# -- the engines ---------------------------------------------------------------------------------------------

def _read_paths(parts: PartList) -> list[str]:
    """The parts to scan: the listed ones, else one to take the columns from (its rows are filtered out)."""
    return list(parts.paths or ((parts.schema_path,) if parts.schema_path else ()))


def spark_frame(spark, parts: PartList, blob: BlobStore, updates: bool = False) -> Any:
    """A DataFrame over ``parts``: the contents AS OF ``parts.as_of`` (or with ``updates``, the raw updates at
    ``parts.lower <= ts <= parts.as_of``). A collection without a single part yet is an empty frame
    without columns."""
    from pyspark.sql import functions as F

    if parts.target is not None:
        df = _spark_projected(spark, parts, blob)
    else:
        paths = _read_paths(parts)
        if not paths:
            return spark.createDataFrame([], "diff BIGINT").drop("diff")
        df = _spark_scan(spark, parts, blob, paths, mergeSchema=not parts.uniform)
        if not parts.paths:
            df = df.limit(0)
    df = df.where((F.col("ts") <= parts.as_of) & (F.col("ts") >= parts.lower))
    if updates:
        return df
    data = [F.col(f"`{c}`") for c in df.columns if c not in ("ts", "diff")]
    if parts.retractions:
        df = _spark_consolidated(df).where(F.col("diff") > 0)
    elif not parts.multiples:
        return df.select(*data)
    return df.select(*data, F.explode(F.sequence(F.lit(1), F.col("diff").cast("int"))).alias("_reclock_n")) \
        .drop("_reclock_n")


def _spark_scan(spark, parts: PartList, blob: BlobStore, paths: list[str], mergeSchema: bool) -> Any:
    """The parts at ``paths`` scanned, their own columns named as the shard names them."""
    from pyspark.sql import functions as F

    # recursiveFileLookup: no partition discovery (upsert parts sit in _output=N/ folders, no column of ours);
    # a listed part that is missing or corrupt fails the read, whatever the session's ignore* settings say
    df = spark.read.options(mergeSchema=str(mergeSchema).lower(), recursiveFileLookup="true",
                            ignoreMissingFiles="false",
                            ignoreCorruptFiles="false").parquet(*[blob.url(p) for p in paths])
    own, renames = own_columns(parts.kind, df.columns)
    return df.select(*[F.col(f"`{c}`").alias(renames.get(c, c)) for c in own])


def _groups(parts: PartList) -> list[list[str]]:
    """The listed parts in groups of one schema each (``parts.part_schemas``), in the order first met."""
    groups: dict = {}
    for path, schema in zip(parts.paths, parts.part_schemas):
        groups.setdefault(schema, []).append(path)
    return list(groups.values())


def _spark_projected(spark, parts: PartList, blob: BlobStore) -> Any:
    """The parts' updates at ``parts.lower <= ts <= parts.as_of`` read as ``parts.target``: each group of one
    schema scanned, filtered to the range first (a part of a newer schema may hold later values the target's
    narrower type cannot), projected (``reclock.schema_projection.spark_sql``), the groups unioned."""
    from pyspark.sql import functions as F

    target = parts.target
    frames = []
    for paths in _groups(parts):
        schema = parts.part_schemas[parts.paths.index(paths[0])]
        df = _spark_scan(spark, parts, blob, paths, mergeSchema=False)
        df = df.where((F.col("ts") <= parts.as_of) & (F.col("ts") >= parts.lower))
        cols = []
        sources = source_names(schema, target)
        for c in target.columns:
            held = sources[c.name]  # the part's column of it (its name, or an earlier one: a rename)
            have = schema.column(held) if held is not None and held in df.columns else None
            expr = spark_sql(_bq(held) if have is not None else _bq(c.name), have.type if have is not None else None,
                             c.type)
            expr = from_ts_sql(expr, c.from_ts)
            cols.append(f"{expr} AS {_bq(c.name)}")
        frames.append(df.selectExpr(*cols, "ts", "diff"))
    if not frames:
        ddl = ", ".join([f"{_bq(c.name)} {c.type}" for c in target.columns] + ["ts BIGINT", "diff BIGINT"])
        return spark.createDataFrame([], ddl)
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _bq(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _spark_consolidated(df) -> Any:
    """``df``'s updates summed by row bit for bit: grouped by each data column where Spark's grouping is bit
    for bit, else by its key (:func:`reclock.bitexact.spark_key`, computed in a projection below the
    aggregation: the reflective call in it is nondeterministic to Spark, which allows it there only), with
    the column's value carried through (``any_value``: every row of a group holds the same bits); the data
    columns, in order, and ``diff``."""
    from pyspark.sql import functions as F

    fields = [f for f in df.schema.fields if f.name not in ("ts", "diff")]
    keys = {}
    for i, f in enumerate(fields):
        key = spark_key(F.col(f"`{f.name}`"), f.dataType)
        if key is not None:
            keys[f.name] = key.alias(f"_reclock_key_{i}")
    if not keys:
        return df.groupBy(*[F.col(f"`{f.name}`") for f in fields]).agg(F.sum("diff").alias("diff"))
    keyed = df.select(*[F.col(f"`{f.name}`") for f in fields], "diff", *keys.values())
    groups = [F.col(f"_reclock_key_{i}" if f.name in keys else f"`{f.name}`") for i, f in enumerate(fields)]
    carried = [F.any_value(F.col(f"`{name}`")).alias(name) for name in keys]
    summed = keyed.groupBy(*groups).agg(F.sum("diff").alias("diff"), *carried)
    return summed.select(*[F.col(f"`{f.name}`") for f in fields], "diff")


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(c: str) -> str:
    return '"' + c.replace('"', '""') + '"'


def duckdb_relation(con, parts: PartList, blob: BlobStore) -> Any:
    """A DuckDB relation over ``parts`` (the contents AS OF ``parts.as_of``). The blob store's files are read
    by DuckDB itself: a local folder directly, an object store through the store's fsspec filesystem. A
    collection without a single part yet is an empty relation of one column, ``_reclock_empty`` (of its
    recorded schema's columns, when it has one)."""
    paths = _read_paths(parts)
    if not paths and parts.target is None:
        return con.sql("SELECT NULL::BOOLEAN AS _reclock_empty WHERE false")
    if parts.wide_decimals:
        raise ValueNotCarried(f"collection {parts.shard}", parts.wide_decimals[0],
                              f"a decimal of more than {MAX_ENGINE_DECIMAL} digits, which DuckDB reads as a "
                              "DOUBLE (rounded)", "read it with `reclock read` or reclock.read.read_as_of")
    if parts.target is not None:
        src = _duckdb_projected(con, parts, blob)
    else:
        src = (f"read_parquet([{', '.join(map(_sql_str, _duckdb_urls(con, blob, paths)))}], union_by_name = true, "
               "hive_partitioning = false)")
    scan = con.sql(f"SELECT * FROM {src}")
    own, renames = own_columns(parts.kind, scan.columns)
    types = dict(zip(scan.columns, scan.types))
    cols = ", ".join(f"{_ident(c)} AS {_ident(renames.get(c, c))}" for c in own)
    data = [(_ident(renames.get(c, c)), types[c]) for c in own if renames.get(c, c) not in ("ts", "diff")]
    where = f"ts <= {int(parts.as_of)} AND ts >= {int(parts.lower)}" + ("" if parts.paths else " AND false")
    base = f"SELECT {cols} FROM {src}"
    sel = ", ".join(c for c, _ in data)
    if parts.retractions:
        # bit for bit: grouped by each column and, where DuckDB's own equality is not, by its key beside it
        # (reclock.bitexact); a group's value is its first row's, bits and all
        by = ", ".join([c for c, _ in data] + [k for k in (duckdb_key(c, t) for c, t in data) if k is not None])
        agg = (f"SELECT {sel}, sum(diff)::BIGINT AS _reclock_n FROM ({base}) WHERE {where} GROUP BY {by} "
               "HAVING sum(diff) > 0")
        return con.sql(f"SELECT {sel} FROM ({agg}) AS a, range(a._reclock_n)")
    if parts.multiples:
        return con.sql(f"SELECT {sel} FROM ({base}) AS a, range(a.diff::BIGINT) WHERE {where}")
    return con.sql(f"SELECT {sel} FROM ({base}) WHERE {where}")


def _duckdb_urls(con, blob: BlobStore, paths: list[str]) -> list[str]:
    """The parts' URLs as DuckDB reads them (an object store through the blob store's fsspec filesystem)."""
    if isinstance(blob, FsspecBlobStore):
        name = blob.fs.protocol if isinstance(blob.fs.protocol, str) else blob.fs.protocol[0]
        if not con.filesystem_is_registered(name):
            con.register_filesystem(blob.fs)
        return [f"{blob.protocol}://{blob._p(p)}" for p in paths]
    return [blob.url(p) for p in paths]


def _duckdb_projected(con, parts: PartList, blob: BlobStore) -> str:
    """SQL of the parts' updates read as ``parts.target``, named as the shard names them: each group of one
    schema scanned and projected, the groups unioned (no parts: no rows, the target's columns)."""
    target = parts.target
    selects = []
    for paths in _groups(parts):
        schema = parts.part_schemas[parts.paths.index(paths[0])]
        src = (f"read_parquet([{', '.join(map(_sql_str, _duckdb_urls(con, blob, paths)))}], "
               "hive_partitioning = false)")
        names = con.sql(f"SELECT * FROM {src}").columns
        own, renames = own_columns(parts.kind, names)
        file_name = {renames.get(c, c): c for c in own}
        cols = []
        sources = source_names(schema, target)
        for c in target.columns:
            held = sources[c.name]  # the part's column of it (its name, or an earlier one: a rename)
            have = schema.column(held) if held is not None else None
            expr = _ident(file_name[held]) if have is not None and held in file_name else "NULL"
            expr = from_ts_sql(duckdb_sql(expr, have.type if expr != 'NULL' else None, c.type), c.from_ts)
            cols.append(f"{expr} AS {_ident(c.name)}")
        # filtered before projected: a part of a newer schema may hold later values the target cannot
        selects.append(f"SELECT {', '.join(cols + ['ts', 'diff'])} FROM {src} "
                       f"WHERE ts <= {int(parts.as_of)} AND ts >= {int(parts.lower)}")
    if not selects:
        cols = [f"NULL::{duckdb_type(c.type)} AS {_ident(c.name)}" for c in target.columns]
        selects.append(f"SELECT {', '.join(cols + ['NULL::BIGINT AS ts', 'NULL::BIGINT AS diff'])} WHERE false")
    return "(" + " UNION ALL ".join(selects) + ")"
