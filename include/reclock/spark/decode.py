"""Decoding a record's value (JSON, CSV, text, bytes, Avro) on Spark, for every kind whose records have a
value: one SQL projection over rows shaped as Kafka shapes a record (``key``, ``value``, ``partition``,
``offset``, ``timestamp``) plus their ``ts``. Kafka's records are such rows; an S3 source's lines are made
so (``reclock.sources.s3.read``). What a record that does not decode becomes (an error row's columns) is
here too: :data:`ERROR_SOURCES`, :func:`packed_error_sql`."""

from __future__ import annotations

import functools
import json
from typing import Sequence

from reclock.config import SourceSpec
from reclock.part_layout import ERROR_COLUMNS, PACKED_BASE64
from reclock.spark.jobs import sql_ident, sql_string

CORRUPT = "_reclock_corrupt"
AVRO_OK = "_reclock_ok"

# where each error / state column comes from among the decoded rows' raw columns (see ``_decoded``)
ERROR_SOURCES = tuple(zip(ERROR_COLUMNS, ("_p", "_o", "_k", "_v", "_reason")))

PACKED = {c: f"base64({raw})" for c, raw in ERROR_SOURCES if c in PACKED_BASE64}



def packed_error_sql() -> str:
    """The SQL of an error row packed as one JSON text (``reclock.part_layout.REJECTED_COLUMN``), over decoded
    rows (:func:`decoded`'s ``_p, _o, _k, _v, _reason``)."""
    packed = ", ".join(f"{sql_string(c)}, {PACKED.get(c, raw)}" for c, raw in ERROR_SOURCES)
    return f"to_json(named_struct({packed}))"


def field_names(spec: SourceSpec) -> list[str]:
    """The names of the decoded value's columns (before metadata columns)."""
    if spec.format.type == "avro":
        return spec.format.avro_fields
    return [f.name for f in data_schema(spec).fields]


def data_schema(spec: SourceSpec):
    """The Spark schema of the decoded value for json, csv, text and bytes."""
    from pyspark.sql import types as T

    if spec.format.type == "text":
        return T.StructType([T.StructField("text", T.StringType())])
    if spec.format.type == "bytes":
        return T.StructType([T.StructField("data", T.BinaryType())])
    if spec.format.type == "avro":
        raise ValueError("an Avro source's schema is its .avsc; see field_names")
    return _parsed_schema(spec.format.schema)


@functools.lru_cache(maxsize=64)
def _parsed_schema(ddl: str):
    """The DDL parsed (by the JVM: a few dozen calls, so once per schema text)."""
    from pyspark.sql import types as T

    return T._parse_datatype_string(ddl)


def decoded(spec: SourceSpec, df, meta: Sequence[str] = (), problem: str | None = None):
    """``df`` (records shaped as the module says, plus ``ts``) decoded: the collection's columns (fields, then metadata), ``ts``,
    the raw record as ``_k, _v, _p, _o, _t``, ``_reason`` (why the value does not decode, else null) and
    ``_raw``: the value of a record that does not decode. For JSON and CSV that is the parser's
    corrupt-record column (the same bytes) rather than ``value``: ``from_json`` and ``from_csv`` run
    outside Spark's generated code, in a projection that copies every column it passes on, so an
    append-only slice, which needs the value only for its rejected records, does not pass the value
    (~200 bytes a record) through it.

    ``meta``: the metadata columns the collection carries, as SQL over ``df`` (a kind's own: Kafka's
    partition, offset, key, timestamp, headers). ``problem``: the name of a column saying why a record is
    an error before any decoding (a reader's finding: a damaged object, an overlong line); where it is set,
    it is the ``_reason``.

    Built as SQL expression text, one ``selectExpr`` (a plan of a few JVM calls, not hundreds)."""
    ftype = spec.format.type
    d = sql_ident("_d")
    raw = "value"
    if ftype in ("json", "csv"):
        from pyspark.sql import types as T

        # PERMISSIVE parsing with a corrupt-record column: a value that does not parse (or does not fit
        # the declared types) keeps its text there, and becomes an error row
        schema = data_schema(spec)
        with_corrupt = T.StructType(schema.fields + [T.StructField(CORRUPT, T.StringType())])
        opts = f"map('mode', 'PERMISSIVE', 'columnNameOfCorruptRecord', {sql_string(CORRUPT)})"
        if ftype == "json":
            decode = f"from_json(CAST(value AS STRING), {sql_string(with_corrupt.json())}, {opts})"
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
    return df.selectExpr(*cols, *meta, "ts", "key AS _k", "value AS _v", "partition AS _p", "offset AS _o",
                         "timestamp AS _t", f"CAST({reason} AS STRING) AS _reason", f"{raw} AS _raw")
