"""The decode path every kind's Spark job shares: a slice's records, each with its binding's ``ts``, decoded
with the source's format (JSON, Avro, CSV, text, bytes), put through its envelope (append-only, or upsert by
key), routed to outputs (output 0 the collection, 1 the error collection, 2 the upsert state's changes),
written as Parquet under one fresh folder, and counted (what was read and what was written: the two sides
of an accounted write, ``reclock.persist.staged``). Nothing is visible until ``append`` puts the parts into
the shards.

A kind reads its records its own way (Kafka: Spark's Kafka source, reclocked by
``reclock.spark.reclocking``; Kinesis: its reader in the tasks; S3: its lines, shaped as Kafka shapes a
record, decoded by :func:`decoded` and written by its own job) and hands over a DataFrame with the columns
of its :class:`~reclock.part_layout.RecordShape`: ``key`` and ``value`` (binary), ``timestamp``, ``ts``,
its two position columns, and each metadata column the source includes, by its include name.

Debezium (``envelope: debezium``): ``reclock.spark.debezium_decode``, into the same outputs as upsert.

Upsert (``envelope: upsert``, keyed by ``key``): per key, the records of the description are ordered by
``(ts, positions)``; the last one at each ts wins; the output carries ``+1`` for the new value and ``-1`` for
the value it replaces (the previous record in the description, or the key's entry in the upsert state
before the description); a null value deletes the key. The state rows of only the keys the description
touches are read (``prior``), so a cycle costs what its data costs, not the collection's size.
"""

from __future__ import annotations

import functools
import json
from typing import Callable, Sequence

from reclock.batch import SliceWritten
from reclock.specs import SourceSpec
from reclock.part_layout import (DATA_OUTPUT, ERR_PREFIX, ERRORS_OUTPUT, KAFKA_SHAPE, PACKED_BASE64,
                                 REJECTED_COLUMN, STATE_OUTPUT, STATE_PREFIX, RecordShape)
from reclock.registry_plan import AvroPlan
from reclock.spark.jobs import observation, observed, parts_writer, sql_ident, sql_string

CORRUPT = "_reclock_corrupt"
AVRO_OK = "_reclock_ok"
_RAW = ("_p", "_o", "_k", "_v", "_reason")  # where each error column comes from among the decoded rows

# Kafka-shaped records (Kafka, S3 lines): where each error column comes from among the decoded rows
ERROR_SOURCES = tuple(zip(KAFKA_SHAPE.error_columns, _RAW))
PACKED = {c: f"base64({raw})" for c, raw in ERROR_SOURCES if c in PACKED_BASE64}


def packed_error_sql(shape: RecordShape = KAFKA_SHAPE) -> str:
    """The SQL of an error row packed as one JSON text (``reclock.part_layout.REJECTED_COLUMN``), over decoded
    rows (:func:`decoded`'s ``_p, _o, _k, _v, _reason``)."""
    packed = {c: f"base64({raw})" for c, raw in _error_sources(shape) if c in PACKED_BASE64}
    return "to_json(named_struct(" + ", ".join(f"{sql_string(c)}, {packed.get(c, raw)}"
                                                for c, raw in _error_sources(shape)) + "))"


def _error_sources(shape: RecordShape) -> tuple[tuple[str, str], ...]:
    return tuple(zip(shape.error_columns, _RAW))


def _state_sources(shape: RecordShape) -> tuple[tuple[str, str], ...]:
    return tuple(zip(shape.state_columns, ("_k", "_v", "_p", "_o", "_t_us")))


def prior_schema(shape: RecordShape) -> str:
    """The Spark schema of the upsert state's rows (``prior``) of ``shape``."""
    spark_types = {"int32": "INT", "int64": "BIGINT", "string": "STRING"}
    (a, at), (b, bt) = shape.positions
    return f"key BINARY, value BINARY, {a} {spark_types[at]}, {b} {spark_types[bt]}, timestamp_us BIGINT"


def field_names(spec: SourceSpec, plan: AvroPlan | None = None) -> list[str]:
    """The names of the decoded value's columns (before metadata columns); ``plan``: a registry source's
    (its reader's columns)."""
    if plan is not None and (plan.format != "debezium" or plan.columns is not None):
        return list(plan.decoded_columns.names)
    if spec.format.type == "avro" and spec.envelope != "debezium":  # debezium: `schema` is the row's DDL
        return spec.format.avro_fields
    return [f.name for f in data_schema(spec).fields]


def data_schema(spec: SourceSpec):
    """The Spark schema of the decoded value for json, csv, text and bytes."""
    from pyspark.sql import types as T

    if spec.format.type == "text":
        return T.StructType([T.StructField("text", T.StringType())])
    if spec.format.type == "bytes":
        return T.StructType([T.StructField("data", T.BinaryType())])
    if spec.format.type == "avro" and spec.envelope != "debezium":
        raise ValueError("an Avro source's schema is its .avsc; see field_names")
    return _parsed_schema(spec.format.schema)


@functools.lru_cache(maxsize=64)
def _parsed_schema(ddl: str):
    """The DDL parsed (by the JVM: a few dozen calls, so once per schema text)."""
    from pyspark.sql import types as T

    return T._parse_datatype_string(ddl)


def decoded(spec: SourceSpec, df, meta: Sequence[str] = (), problem: str | None = None,
            positions: tuple[str, str] = ("partition", "offset"), plan: AvroPlan | None = None,
            predecoded: str | None = None):
    """``df`` (a kind's records: ``key``, ``value``, ``timestamp``, ``ts`` and the two ``positions``) decoded: the collection's columns (fields, then metadata), ``ts``,
    the raw record as ``_k, _v, _p, _o, _t``, ``_reason`` (why the value does not decode, else null) and
    ``_raw``: the value of a record that does not decode. For JSON and CSV that is the parser's
    corrupt-record column (the same bytes) rather than ``value``: ``from_json`` and ``from_csv`` run
    outside Spark's generated code, in a projection that copies every column it passes on, so an
    append-only slice, which needs the value only for its rejected records, does not pass the value
    (~200 bytes a record) through it.

    ``meta``: the metadata columns the collection carries, as SQL over ``df`` (:func:`shape_meta`).
    ``problem``: the name of a column saying why a record is an error before any decoding (a reader's
    finding: a damaged object, an overlong line); where it is set, it is the ``_reason``. ``plan``: a
    registry source's (``format.registry``): each record's writer schema by its header
    (``reclock.spark.registry_decode``). ``predecoded`` (JSON only): a struct column with the declared
    fields and the corrupt-record column, holding the value as ``from_json`` decodes it on the rows whose
    ``value`` is null (a reader decoded them already: ``reclock.sources.s3.json_lines``).

    Built as SQL expression text, one ``selectExpr`` (a plan of a few JVM calls, not hundreds)."""
    ftype = spec.format.type
    d = sql_ident("_d")
    raw = "value"
    if plan is not None:
        from reclock.spark.registry_decode import avro_decoded, json_decoded, protobuf_decoded

        ddl = ", ".join(f"{sql_ident(c.name)} {c.type}" for c in plan.decoded_columns.columns)
        if plan.format == "avro":
            df = avro_decoded(df, plan, out="_d", reason="_reclock_reason")
        elif plan.format == "protobuf":
            df = protobuf_decoded(df, plan, _parsed_schema(ddl), out="_d", reason="_reclock_reason")
        else:
            df = json_decoded(df, _parsed_schema(ddl), [w.schema_id for w in plan.writers],
                              out="_d", reason="_reclock_reason")
        reason = "_reclock_reason"
        cols = [f"{d}.{sql_ident(f)} AS {sql_ident(f)}" for f in field_names(spec, plan)]
    elif ftype in ("json", "csv"):
        from pyspark.sql import types as T

        # PERMISSIVE parsing with a corrupt-record column: a value that does not parse (or does not fit
        # the declared types) keeps its text there, and becomes an error row
        schema = data_schema(spec)
        with_corrupt = T.StructType(schema.fields + [T.StructField(CORRUPT, T.StringType())])
        opts = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', {sql_string(CORRUPT)})"
        if ftype == "json":
            decode = f"from_json(CAST(value AS STRING), {sql_string(with_corrupt.json())}, {opts})"
            if predecoded is not None:
                decode = f"CASE WHEN value IS NULL THEN {sql_ident(predecoded)} ELSE {decode} END"
        else:
            ddl = ", ".join(f"{sql_ident(f.name)} {f.dataType.simpleString()}" for f in with_corrupt.fields)
            decode = f"from_csv(CAST(value AS STRING), {sql_string(ddl)}, {opts})"
        df = df.selectExpr("*", f"{decode} AS {d}")
        # the corrupt-record column is null on a null value, and holds the value's bytes on a bad one
        reason = (f"CASE WHEN {d}.{sql_ident(CORRUPT)} IS NOT NULL "
                  f"THEN {sql_string(f'value does not parse as {ftype.upper()} of the declared schema')} END")
        raw = f"CAST({d}.{sql_ident(CORRUPT)} AS BINARY)"
        cols = [f"{d}.{sql_ident(f)} AS {sql_ident(f)}" for f in field_names(spec)]
    elif ftype == "avro":
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import from_avro

        # the reader schema adds a field with a default: it is true on every record that decodes and null
        # when PERMISSIVE mode gives up on a malformed one (an all-null record stays distinguishable)
        writer = json.loads(spec.format.schema)
        reader = dict(writer, fields=writer["fields"] + [{"name": AVRO_OK, "type": "boolean", "default": True}])
        payload = F.col("value") if spec.format.wire == "plain" else F.expr("substring(value, 6)")
        df = df.withColumn("_d", from_avro(payload, json.dumps(writer),
                                           {"mode": "PERMISSIVE", "avroSchema": json.dumps(reader)}))
        arms = ["WHEN value IS NULL THEN NULL"]
        if spec.format.wire == "confluent":
            arms.append("WHEN length(value) < 5 OR substring(value, 1, 1) != X'00' THEN "
                        + sql_string("value has no Confluent wire header (magic byte 0 and a schema id)"))
        arms.append(f"WHEN {d}.{sql_ident(AVRO_OK)} IS NULL THEN "
                    + sql_string("value does not decode as Avro of the declared schema"))
        reason = f"CASE {' '.join(arms)} END"
        cols = [f"{d}.{sql_ident(f)} AS {sql_ident(f)}" for f in field_names(spec)]
    elif ftype == "text":
        # invalid UTF-8 cannot round trip through a string: such a record is an error
        reason = ("CASE WHEN value IS NOT NULL AND encode(CAST(value AS STRING), 'UTF-8') != value "
                  f"THEN {sql_string('value is not valid UTF-8')} END")
        cols = ["CAST(value AS STRING) AS text"]
    else:
        reason = "NULL"
        cols = ["value AS data"]

    if problem is not None:
        reason = f"coalesce({sql_ident(problem)}, {reason})"
    p, o = positions
    return df.selectExpr(*cols, *meta, "ts", "key AS _k", "value AS _v", f"{sql_ident(p)} AS _p",
                         f"{sql_ident(o)} AS _o", "timestamp AS _t", f"CAST({reason} AS STRING) AS _reason",
                         f"{raw} AS _raw")


def shape_meta(spec: SourceSpec, shape: RecordShape) -> list[str]:
    """The metadata columns a source's collection carries (``include:``), as SQL over records of ``shape``."""
    return [f"{sql_ident(m)} AS {sql_ident(shape.meta_column(m))}" for m in spec.include]


def _shape_decoded(spec: SourceSpec, shape: RecordShape, df, plan: AvroPlan | None = None):
    (p, _), (o, _) = shape.positions
    return decoded(spec, df, shape_meta(spec, shape), positions=(p, o), plan=plan)


def typed_null(col: str):
    """A null of ``col``'s type."""
    from pyspark.sql import functions as F

    return F.when(F.lit(False), F.col(col))


def envelope(spark, spec: SourceSpec, shape: RecordShape, records, prior: Sequence[tuple] = (),
             plan: AvroPlan | None = None, local: bool = False):
    """One slice's ``records`` (the shape's columns, each with its ``ts``) decoded and put through the
    source's envelope.

    Append-only: the collection's columns, ``ts``, ``diff`` and :data:`REJECTED_COLUMN` (null, or for a
    record that does not decode, its error row packed as JSON: the only column the collection's rows pay
    for the error collection). Upsert: the collection's columns, ``ts``, ``diff``, the error columns and
    the state columns, each null where it does not apply, and ``_output``. ``prior`` (upsert only): the
    state rows ``(key, value, position, position, timestamp_us)`` of the keys the slice touches, as of its
    lower. One pass over the records either way: no branch of the plan reads upstream again. ``plan``: a
    registry source's writers and reader. ``local`` (debezium): each task folds the keys it read
    (``reclock.spark.debezium_decode.fold_local``; the caller checks each key was folded in one place).
    """
    from pyspark.sql import functions as F

    data_cols = output_columns(spec, shape, plan)[0][:-2]
    if spec.envelope == "debezium":
        from reclock.spark import debezium_decode

        rows = data_schema(spec) if plan is None or plan.columns is None else _parsed_schema(", ".join(
            f"{sql_ident(c.name)} {c.type}" for c in plan.decoded_columns.columns))
        return debezium_decode.changes(spark, spec, shape, records, prior, prior_schema(shape), data_cols, rows,
                                       plan, local)
    dec = _shape_decoded(spec, shape, records, plan)
    errors, states = _error_sources(shape), _state_sources(shape)
    if spec.envelope != "upsert":
        return dec.selectExpr(
            *map(sql_ident, data_cols), "ts", "CAST(1 AS BIGINT) AS diff",
            f"CASE WHEN _reason IS NOT NULL THEN {packed_error_sql(shape)} END AS {REJECTED_COLUMN}")

    from pyspark.sql import Window

    reason = F.coalesce(F.col("_reason"), F.when(F.col("_k").isNull(), F.lit("an upsert record needs a key")))
    (p, _), (o, _) = shape.positions
    before = spark.createDataFrame(list(prior), prior_schema(shape)).select(
        "key", "value", p, o, F.timestamp_micros("timestamp_us").alias("timestamp"),
        F.lit(-1).cast("long").alias("ts"))
    before = before.select("*", *[F.expr(sql).alias(m) for m, sql in shape.derived if m in spec.include])
    records = (dec.withColumn("_reason", reason).withColumn("_prior", F.lit(False))
               .unionByName(_shape_decoded(spec, shape, before, plan).withColumn("_prior", F.lit(True))))
    bad = F.col("_reason").isNotNull()
    # per key (good records only: bad ones sit in their own window partitions and pass through), the last
    # record at each ts wins; then each row's predecessor is the value it replaces
    last_at_ts = Window.partitionBy("_k", bad, "ts").orderBy(F.col("_p").desc(), F.expr(shape.order_sql).desc())
    by_ts = Window.partitionBy("_k", bad).orderBy("ts")
    records = (records.withColumn("_rn", F.row_number().over(last_at_ts)).filter(bad | (F.col("_rn") == 1))
               .withColumn("_row", F.struct(*data_cols, "_v"))
               .withColumn("_prev", F.lag("_row").over(by_ts))
               .withColumn("_next_ts", F.lead("ts").over(by_ts))
               .filter(~F.col("_prior")))

    no_data = {c: typed_null(c) for c in data_cols}
    no_error = {ERR_PREFIX + c: typed_null(raw) for c, raw in errors}
    no_state = {STATE_PREFIX + c: typed_null(raw) for c, raw in states}

    def emit(when, output: int, diff: int, data: dict, error: dict, state: dict):
        cols = {**data, "ts": F.col("ts"), "diff": F.lit(diff).cast("long"), **error, **state,
                "_output": F.lit(output)}
        return F.when(when, F.struct(*[v.alias(k) for k, v in cols.items()]))

    kinds = [
        emit(~bad & F.col("_v").isNotNull(), DATA_OUTPUT, 1, {c: F.col(c) for c in data_cols}, no_error, no_state),
        emit(~bad & F.col("_prev").getField("_v").isNotNull(), DATA_OUTPUT, -1,
             {c: F.col("_prev").getField(c) for c in data_cols}, no_error, no_state),
        emit(bad, ERRORS_OUTPUT, 1, no_data, {ERR_PREFIX + c: F.col(raw) for c, raw in errors}, no_state),
        emit(~bad & F.col("_next_ts").isNull(), STATE_OUTPUT, 0, no_data, no_error,
             {STATE_PREFIX + c: F.col(raw) for c, raw in states}),
    ]
    return (records.withColumn("_t_us", F.unix_micros("_t"))
            .select(F.explode(F.filter(F.array(*kinds), lambda x: x.isNotNull())).alias("_e")).select("_e.*"))


def output_columns(spec: SourceSpec, shape: RecordShape, plan: AvroPlan | None = None) -> tuple[list[str], list[str]]:
    """Columns each shard's parts carry: ``(data shard, errors shard)``; both end with ts, diff."""
    meta = [shape.meta_column(m) for m in spec.include]
    return (field_names(spec, plan) + meta + ["ts", "diff"],
            [ERR_PREFIX + c for c in shape.error_columns] + ["ts", "diff"])



def write_slice(spark, spec: SourceSpec, shape: RecordShape, records: Callable[[object], object], url: str,
                prior: Sequence[tuple] = (), index: int = 0, offsets: int = 0,
                plan: AvroPlan | None = None, local: bool = False) -> SliceWritten:
    """Run one Spark job writing the slice's updates as Parquet under ``url``; what it read and wrote.
    ``records(read_metrics)`` gives the slice's records (the shape's columns, reclocked), counted by the
    ``Observation`` it is handed right above the upstream scan; ``offsets``: how many records the slice's
    ranges can hold at most (``SliceWritten.offsets``); ``local``: as :func:`envelope`.

    Append-only (``envelope: none``): plain files of the collection's columns and :data:`REJECTED_COLUMN`;
    nearly always every row is the collection's, and the rare file that holds rejected records is split
    into the two collections' parts when its parts are collected (``reclock.persist.staged``). Not
    partitioning by output spares Spark a sort of each task's rows before writing (a fifth of the job's
    time at a million records), and one packed column instead of five error columns spares it a seventh
    of what is left. Upsert: partitioned by output (``_output=N/`` folders), since every file holds state
    changes too.

    The job counts, as it runs, the records it read (right above the upstream scan) and the rows it hands
    to the writer per output (right below it): two ``Observation`` metrics, which Spark reports with the
    job's end, in a local session and over Spark Connect alike. Neither splits the generated code of the
    plan in between."""
    from pyspark.sql import functions as F

    read, written = observation(spark), observation(spark)
    df = envelope(spark, spec, shape, records(read), prior, plan, local)
    if not spec.keyed:
        df = df.observe(written, F.count(F.lit(1)).alias("rows"), F.count(REJECTED_COLUMN).alias("rejected"))
        parts_writer(df, url).parquet(url)
        w = observed(written, spec.name, url, ("rows", "rejected"))
        rows = {DATA_OUTPUT: w["rows"] - w["rejected"], ERRORS_OUTPUT: w["rejected"]}
    else:
        data_cols, err_cols = output_columns(spec, shape, plan)
        state_cols = [STATE_PREFIX + c for c in shape.state_columns]
        # one job, several outputs: a row's columns of the other outputs are null and each shard reads only
        # its own columns (all-null columns cost next to nothing in Parquet)
        keep = list(dict.fromkeys(data_cols + err_cols + state_cols))
        outputs = (DATA_OUTPUT, ERRORS_OUTPUT, STATE_OUTPUT)
        counts = [F.count(F.when(F.col("_output") == o, F.lit(1))).alias(f"output{o}") for o in outputs]
        df = df.selectExpr(*map(sql_ident, keep), "_output").observe(written, *counts)
        parts_writer(df, url).partitionBy("_output").parquet(url)
        w = observed(written, spec.name, url, [f"output{o}" for o in outputs])
        rows = {o: w[f"output{o}"] for o in outputs}
    read_count = observed(read, spec.name, url, ("records",))["records"]
    return SliceWritten(index, url, offsets, read_count, rows)
