"""``write_batches`` of an S3 source on Spark: read exactly the byte ranges the bindings cover, already
reclocked, decode, write Parquet parts.

::

    bound ranges (id, [start, end), ts)      catalog rows (id -> key, ETag, size)
                     \\                      /
              units_for: one read unit per range, a plain line range cut into splits of
              `split_bytes` (a gzip'd or whole-object format range whole)
                     |
              slices_of: units grouped into Spark jobs of at most the budget's bytes and objects
                     |
    spark.range(tasks).mapInArrow(read_units)   every task reads its units from upstream itself
                     |                          (ranged GETs pinned to the ETag; a folder's files)
              raw rows: key (object key), value (the line), partition (object id), offset (byte
              offset of the line), timestamp (the object's last modification), ts, _problem; JSON lines
              of BIGINT/DOUBLE/STRING/BOOLEAN columns decoded in the task where that gives exactly
              Spark's values (``json_lines``: then ``_typed`` holds the row and ``value`` is null)
                     |
              decoded as a Kafka record's value is (``reclock.spark.decode``): json | csv | text;
              a row with a ``_problem`` (an overwritten object under `on_overwrite: collect`, a damaged
              gzip stream, an overlong line, a whole object that does not read) is an error row
                     |
              Parquet under the slice's folder; the job's Observation metrics count the raw rows read
              and the rows written, so the parts are proved as a Kafka slice's are

Records carry the bindings' ts from the units: no range join is needed. Memory of a task is one chunk
(``READ_CHUNK``), one batch of lines and (JSON decoded in the task) their columns and the lines joined
once for Arrow's reader, whatever the object's size.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa

from reclock.batch import SliceWritten, pack
from reclock.errors import ObjectChanged, ObjectLost
from reclock.persist.objectstore import S3Settings
from reclock.sources.s3.client import READ_CHUNK, ObjectInfo, open_store
from reclock.sources.s3.discovery import Known, OnOverwrite, State
from reclock.sources.s3.log import BoundRange
from reclock.sources.s3.lines import Lines, ReadProblem, read_gzip_lines, read_lines

LINE_FORMATS = ("json", "csv", "text")
WHOLE_FORMATS = ("parquet", "avro")
SPLIT_BYTES = 64 << 20
"""A plain line range longer than this is read by several tasks, each its share (a 5 GB object: 80)."""
TASK_BYTES = 64 << 20
"""A task reads about this many bytes of units (small objects: many per task)."""

RAW_SCHEMA = ("key BINARY, value BINARY, partition INT, offset BIGINT, timestamp TIMESTAMP, ts BIGINT, "
              "_problem STRING")
"""The rows a read task yields: shaped like a Kafka record (``reclock.spark.decode`` decodes ``value``)."""


def is_gzip(key: str, compression: str) -> bool:
    """Whether an object is read through gzip: ``compression: gzip``, or ``auto`` and a ``.gz`` key."""
    return compression == "gzip" or (compression == "auto" and key.endswith(".gz"))


@dataclass(frozen=True)
class ReaderConf:
    """What a read task needs (pickled into the job: the S3 keys travel in the task, never in Spark's
    settings, UI or logs)."""

    source: str
    url: str
    settings: S3Settings | None
    format: str
    compression: str = "auto"
    csv_header: bool = False
    on_overwrite: OnOverwrite = OnOverwrite.STALL
    chunk: int = READ_CHUNK
    max_line: int = 256 << 20
    schema_json: str | None = None  # whole-object formats: the collection's Spark schema (StructType JSON)
    avro_schema: str | None = None  # avro: the reader schema (.avsc JSON)
    json_fields: tuple[tuple[str, str], ...] | None = None
    """JSON decoded in the task (``json_lines``): the declared columns ``(name, Spark type)``, then the
    corrupt-record column Spark's decode adds; None: every line decoded by Spark."""

    @property
    def skip_empty(self) -> bool:
        return self.format in ("json", "csv")

    def whole(self, key: str) -> bool:
        """Whether an object of this source is bound and read whole (no byte ranges)."""
        return self.format in WHOLE_FORMATS or is_gzip(key, self.compression)


@dataclass(frozen=True)
class ReadUnit:
    """Read the lines starting in ``[a, b)`` of object ``id``'s bound range ``[start, end)`` at ``ts`` (a
    whole unit: ``a == start``, ``b == end``, read through its format)."""

    id: int
    key: str
    etag: str
    version: str | None
    size: int
    modified_ms: int
    state: str
    previous_etag: str | None
    start: int
    end: int
    a: int
    b: int
    ts: int

    @property
    def bytes(self) -> int:
        return self.b - self.a

    def info(self) -> ObjectInfo:
        return ObjectInfo(self.key, self.size, self.etag, self.modified_ms, self.version)


def units_for(bound: Sequence[BoundRange], rows: dict[int, Known], conf: ReaderConf,
              split_bytes: int = SPLIT_BYTES) -> list[ReadUnit]:
    """The read units of ``bound`` (a description's ranges with their ts). An id missing from ``rows`` is
    a ``ValueError``: the catalog must know every object a description reads. A plain line range is cut
    into splits of ``split_bytes``; a gzip'd or whole-object format object is one unit, in the range that
    binds its end (an empty file is not a valid Parquet or Avro file: its unit yields an error row); an
    overwrite row's unit yields its error row; an empty range of a line format reads nothing."""
    out = []
    for r in bound:
        row = rows.get(r.id)
        if row is None:
            raise ValueError(f"source {conf.source}: object id {r.id} is bound but not in the catalog")
        base = ReadUnit(r.id, row.key, row.etag, row.version, row.size, row.modified_ms, row.state.value,
                        row.previous_etag, r.start, r.end, r.start, r.end, r.ts)
        if row.state == State.OVERWRITE or conf.whole(row.key):
            if r.ends:
                out.append(replace(base, start=0, a=0))
            elif r.start != r.end:
                raise ValueError(f"source {conf.source}: object {row.key} is read whole, but a binding covers only "
                                 f"its bytes [{r.start}, {r.end})")
            continue
        for a in range(r.start, r.end, split_bytes):
            out.append(replace(base, a=a, b=min(r.end, a + split_bytes)))
    return out


def slices_of(units: Sequence[ReadUnit], max_bytes: int, max_objects: int) -> list[list[ReadUnit]]:
    """Units grouped, in order, into slices (Spark jobs) of at most ``max_bytes`` bytes and ``max_objects``
    units (a unit larger than ``max_bytes`` alone)."""
    return pack(units, lambda u: u.bytes, max_bytes, max_objects)


def assign_tasks(units: Sequence[ReadUnit], task_bytes: int = TASK_BYTES, min_tasks: int = 2) -> list[list[ReadUnit]]:
    """Units spread over tasks of about ``task_bytes`` (greedy, largest first, onto the least loaded task)."""
    total = sum(u.bytes for u in units)
    n = max(1, min(len(units), max(min_tasks, math.ceil(total / task_bytes))))
    tasks: list[list[ReadUnit]] = [[] for _ in range(n)]
    loads = [0] * n
    for u in sorted(units, key=lambda u: (-max(u.bytes, 1), u.id, u.a)):
        k = loads.index(min(loads))
        tasks[k].append(u)
        loads[k] += max(u.bytes, 1)
    return [sorted(t, key=lambda u: (u.id, u.a)) for t in tasks if t]


# -- in the task -----------------------------------------------------------------------------------------


def _raw_schema() -> pa.Schema:
    return pa.schema([("key", pa.binary()), ("value", pa.binary()), ("partition", pa.int32()),
                      ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("ts", pa.int64()),
                      ("_problem", pa.string())])


def _typed_schema(conf: ReaderConf) -> pa.Schema | None:
    from reclock.sources.s3.json_lines import arrow_schema

    return arrow_schema(conf.json_fields) if conf.json_fields else None


def _batch(u: ReadUnit, values: pa.Array, offsets: np.ndarray, problem: str | None = None,
           typed: pa.Schema | None = None) -> pa.RecordBatch:
    """The raw rows of ``values`` (``typed``: JSON lines are decoded here where ``json_lines`` can, into a
    last column ``_typed``; a row decoded there has a null ``value``)."""
    n = len(values)
    extra, schema = [], _raw_schema()
    if typed is not None:
        from reclock.sources.s3.json_lines import decode_lines

        if problem is None:
            rows, values = decode_lines(values, typed, typed.names[-1])
        else:
            rows = pa.nulls(n, pa.struct(list(typed)))
        extra, schema = [rows], schema.append(pa.field("_typed", rows.type))
    key = pa.array([u.key.encode()], pa.binary()).take(pa.array(np.zeros(n, np.int32)))
    if pa.types.is_large_binary(values.type):
        values = values.cast(pa.binary()) if len(values) and values.nbytes < 2**31 else values
    problems = pa.nulls(n, pa.string()) if problem is None else pa.array([problem] * n, pa.string())
    # `partition` stays null: an error row names the object by its key (an object's id is the catalog's, which
    # forgets it; a rebuild must give the same rows)
    return pa.RecordBatch.from_arrays(
        [key, values, pa.nulls(n, pa.int32()), pa.array(np.asarray(offsets, np.int64)),
         pa.array(np.full(n, u.modified_ms * 1000, np.int64)).cast(pa.timestamp("us", tz="UTC")),
         pa.array(np.full(n, u.ts, np.int64)), problems, *extra], schema=schema)


def _problem_batch(u: ReadUnit, offset: int, raw: bytes | None, reason: str,
                   typed: pa.Schema | None = None) -> pa.RecordBatch:
    return _batch(u, pa.array([raw], pa.binary()), np.array([offset]), reason, typed)


def read_unit(conf: ReaderConf, store, u: ReadUnit) -> Iterator[pa.RecordBatch]:
    """The raw rows of one unit of a line format (see the module)."""
    url = store.url(u.key)
    typed = _typed_schema(conf)
    if u.state == State.OVERWRITE.value:
        yield _problem_batch(u, 0, None, f"object {url} was overwritten after it was ingested (ETag {u.previous_etag} "
                                         f"then ETag {u.etag}, {u.size} bytes); on_overwrite: collect, so the new "
                                         "version is not read", typed)
        return
    gz = is_gzip(u.key, conf.compression)
    first = u.a if (u.a == u.start or gz) else u.a - 1
    chunks = store.read(u.info(), first, u.end, conf.chunk)
    if gz:
        items = read_gzip_lines(chunks, url, conf.skip_empty, conf.max_line)
    else:
        items = read_lines(chunks, u.start, u.a, u.b, u.end, conf.skip_empty, conf.max_line)
    header = conf.csv_header and conf.format == "csv"
    try:
        for item in items:
            if isinstance(item, ReadProblem):
                yield _problem_batch(u, item.offset, item.raw, f"object {url}: {item.reason}", typed)
                continue
            if header and len(item) and int(item.offsets[0]) == 0:
                item = Lines(item.values.slice(1), item.offsets[1:])  # the object's header line
            if len(item):
                yield _batch(u, item.values, item.offsets, typed=typed)
    except (ObjectChanged, ObjectLost) as e:
        if conf.on_overwrite == OnOverwrite.STALL or isinstance(e, ObjectLost):
            raise
        # collect / reingest: the version bound is gone (overwritten before it was read): an error row
        yield _problem_batch(u, u.a, None, f"{e} (on_overwrite: {conf.on_overwrite.value}: its bytes from "
                                           f"{u.a} on are not read)", typed)


def _data_schema(conf: ReaderConf) -> pa.Schema:
    import json

    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    declared = T.StructType([T.StructField(f.name, f.dataType, True)
                             for f in T.StructType.fromJson(json.loads(conf.schema_json)).fields])
    return to_arrow_schema(declared, timezone="UTC", prefers_large_types=False)


def read_whole_unit(conf: ReaderConf, store, u: ReadUnit, want: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of one whole object (Parquet, Avro): the declared columns, then the raw columns."""
    import json

    from reclock.sources.s3 import whole

    url = store.url(u.key)
    meta = _raw_schema()
    out = pa.schema(list(want) + list(meta))

    def rows(table: pa.Table, first: int) -> pa.RecordBatch:
        n = table.num_rows
        raw = _batch(u, pa.nulls(n, pa.binary()), np.arange(first, first + n))
        return pa.RecordBatch.from_arrays([table.column(i).combine_chunks() for i in range(table.num_columns)]
                                          + raw.columns, schema=out)

    def problem(at: int, reason: str) -> pa.RecordBatch:
        raw = _problem_batch(u, at, None, f"object {url}: {reason}")
        return pa.RecordBatch.from_arrays([pa.nulls(1, f.type) for f in want] + raw.columns, schema=out)

    if u.state == State.OVERWRITE.value:
        raw = next(read_unit(conf, store, u))
        yield pa.RecordBatch.from_arrays([pa.nulls(1, f.type) for f in want] + raw.columns, schema=out)
        return
    if u.size == 0:
        yield problem(0, f"a zero-byte object is not a {conf.format.capitalize()} file")
        return
    done = 0
    try:
        with whole.open_object(store, u.info()) as f:
            items = (whole.read_parquet(f, want) if conf.format == "parquet"
                     else whole.read_avro(f, json.loads(conf.avro_schema), want))
            for item in items:
                if isinstance(item, str):
                    yield problem(done, item)
                    return
                for batch in item.to_batches(max_chunksize=whole.BATCH_ROWS):
                    yield rows(pa.Table.from_batches([batch], schema=want), done)
                    done += batch.num_rows
    except (ObjectChanged, ObjectLost) as e:
        if conf.on_overwrite == OnOverwrite.STALL or isinstance(e, ObjectLost) or done:
            raise
        yield problem(0, f"{e} (on_overwrite: {conf.on_overwrite.value}: not read)")


def read_units(conf: ReaderConf, tasks: Sequence[Sequence[ReadUnit]],
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow``'s function: for each task number in ``batches`` (a ``spark.range``), its units' rows."""
    store = open_store(conf.source, conf.url, conf.settings)
    want = _data_schema(conf) if conf.format in WHOLE_FORMATS else None
    for b in batches:
        for k in b.column(0).to_pylist():
            for u in tasks[k]:
                if want is not None:
                    yield from read_whole_unit(conf, store, u, want)
                else:
                    yield from read_unit(conf, store, u)


# -- on the driver ---------------------------------------------------------------------------------------


def raw_rows(spark, conf: ReaderConf, units: Sequence[ReadUnit], task_bytes: int = TASK_BYTES):
    """The DataFrame of the units' raw rows (:data:`RAW_SCHEMA`; a whole-object format's declared columns
    first), one Spark task per group of units."""
    from reclock.spark.jobs import sql_ident

    tasks = assign_tasks(units, task_bytes)
    fn = functools.partial(read_units, conf, tasks)
    schema: object = RAW_SCHEMA
    if conf.format in WHOLE_FORMATS:
        import json

        from pyspark.sql import types as T

        raw = [T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()),
               T.StructField("partition", T.IntegerType()), T.StructField("offset", T.LongType()),
               T.StructField("timestamp", T.TimestampType()), T.StructField("ts", T.LongType()),
               T.StructField("_problem", T.StringType())]
        # nullable: an error row has no values (Avro's mapping marks required fields not null)
        declared = [T.StructField(f.name, f.dataType, True) for f in
                    T.StructType.fromJson(json.loads(conf.schema_json)).fields]
        schema = T.StructType(declared + raw)
    elif conf.json_fields:
        typed = ", ".join(f"{sql_ident(n)}: {t.upper()}" for n, t in conf.json_fields)
        schema = f"{RAW_SCHEMA}, _typed STRUCT<{typed}>"
    return spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(fn, schema)


def whole_schema(spark, spec) -> str:
    """The collection's Spark schema (StructType JSON) of a whole-object format: the DDL of a Parquet
    source; the Spark schema Avro's reader schema maps to (Spark's own mapping, ``from_avro``)."""
    if spec.format.type == "avro":
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        return spark.range(0).select(from_avro(F.lit(b"").cast("binary"), spec.format.schema).alias("r")) \
            .schema["r"].dataType.json()
    from reclock.spark.decode import data_schema

    return data_schema(spec).json()


def s3_output_meta(include: Sequence[str]) -> list[str]:
    """The metadata columns an S3 source's collection carries (``include:``), as SQL over the decoded rows:
    ``key`` (the object key), ``offset`` (the line's byte offset; in a gzip'd object, in its decompressed
    bytes), ``last_modified`` (the object's)."""
    exprs = {"key": "CAST(_k AS STRING) AS _key", "offset": "_o AS _offset", "last_modified": "_t AS _last_modified"}
    return [exprs[m] for m in include]



def json_fields(spec) -> tuple[tuple[str, str], ...] | None:
    """:attr:`ReaderConf.json_fields` of a source: its declared columns and the corrupt-record column, when
    its format is JSON and every column's type is one ``json_lines`` decodes; else None."""
    from reclock.sources.s3.json_lines import arrow_schema
    from reclock.spark.decode import CORRUPT, data_schema

    if spec.format.type != "json":
        return None
    fields = tuple((f.name, f.dataType.simpleString()) for f in data_schema(spec).fields)
    if arrow_schema(fields) is None or CORRUPT in dict(fields):
        return None
    return fields + ((CORRUPT, "string"),)


def output_names(spec, include: Sequence[str]) -> list[str]:
    from reclock.spark.decode import field_names

    return field_names(spec) + [f"_{m}" for m in include] + ["ts", "diff"]


def decoded(spark, spec, conf: ReaderConf, units: Sequence[ReadUnit], include: Sequence[str], read_metrics=None):
    """The slice's rows decoded: the collection's columns, ``ts``, ``diff`` and the packed error column
    (``reclock.part_layout.REJECTED_COLUMN``) as an append-only Kafka slice has them."""
    from pyspark.sql import functions as F

    from reclock.part_layout import REJECTED_COLUMN
    from reclock.spark.decode import decoded as decode, field_names, packed_error_sql
    from reclock.spark.jobs import sql_ident

    raw = raw_rows(spark, conf, units)
    if read_metrics is not None:
        raw = raw.observe(read_metrics, F.count(F.lit(1)).alias("records"))
    if conf.format in WHOLE_FORMATS:  # decoded in the task already: the raw columns under decode's names
        dec = raw.selectExpr("*", "key AS _k", "value AS _v", "partition AS _p", "offset AS _o", "timestamp AS _t",
                             "_problem AS _reason")
    else:
        dec = decode(spec, raw, problem="_problem", predecoded="_typed" if conf.json_fields else None)
    return dec.selectExpr(*map(sql_ident, field_names(spec)), *s3_output_meta(include), "ts",
                          "CAST(1 AS BIGINT) AS diff",
                          f"CASE WHEN _reason IS NOT NULL THEN {packed_error_sql()} END AS {REJECTED_COLUMN}")


def write_slice(spark, spec, conf: ReaderConf, units: Sequence[ReadUnit], include: Sequence[str], url: str,
                index: int = 0) -> SliceWritten:
    """One Spark job writing the slice's rows as Parquet under ``url``; what it read and wrote, counted by
    the job's own metrics (as a Kafka slice's job is). A task that finds an object gone or
    changed fails the job; :func:`explain_failure` then names the object on the driver."""
    from pyspark.sql import functions as F

    from reclock.part_layout import DATA_OUTPUT, ERRORS_OUTPUT, REJECTED_COLUMN
    from reclock.spark.jobs import observation as _observation
    from reclock.spark.jobs import observed as _observed
    from reclock.spark.jobs import parts_writer

    read, written = _observation(spark), _observation(spark)
    df = decoded(spark, spec, conf, units, include, read_metrics=read)
    df = df.observe(written, F.count(F.lit(1)).alias("rows"), F.count(REJECTED_COLUMN).alias("rejected"))
    try:
        parts_writer(df, url).parquet(url)
    except Exception as e:
        explain_failure(conf, units, e)
        raise
    w = _observed(written, spec.name, url, ("rows", "rejected"))
    records = _observed(read, spec.name, url, ("records",))["records"]
    rows = {DATA_OUTPUT: w["rows"] - w["rejected"], ERRORS_OUTPUT: w["rejected"]}
    return SliceWritten(index, url, record_bound(conf, units, records), records, rows)


def record_bound(conf: ReaderConf, units: Sequence[ReadUnit], records: int) -> int:
    """An upper bound on the records the units can yield (``SliceWritten.offsets``): a line takes at least
    one byte, plus one row per unit (its last line, or its problem); a gzip'd byte decompresses to at most
    1032 bytes (deflate's limit). A whole-object format's rows are not bounded by its bytes: the count read."""
    if conf.format in WHOLE_FORMATS:
        return records
    return sum(u.bytes * (1033 if is_gzip(u.key, conf.compression) else 1) + 1 for u in units)


def explain_failure(conf: ReaderConf, units: Sequence[ReadUnit], error: Exception) -> None:
    """After a read job failed: if an object of ``units`` is gone or changed, raise the error naming it
    (``ObjectLost`` / ``ObjectChanged``), chained to the job's; else return (the job's error stands)."""
    store = open_store(conf.source, conf.url, conf.settings)
    seen: set[int] = set()
    for u in units:
        if u.id in seen or u.state == State.OVERWRITE.value:
            continue
        seen.add(u.id)
        now = store.head(u.key)
        if now is None:
            raise ObjectLost(conf.source, store.url(u.key), u.a, u.end) from error
        if now.etag != u.etag or now.size < u.end:
            raise ObjectChanged(conf.source, store.url(u.key), f"ETag {u.etag}, {u.size} bytes",
                                f"ETag {now.etag}, {now.size} bytes",
                                "the version that was bound is no longer there to read; set `on_overwrite:` to "
                                "`collect` or `reingest` to go on without it (see docs/s3.md, 'Overwritten "
                                "objects')") from error
