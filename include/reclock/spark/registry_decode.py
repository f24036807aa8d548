"""Decoding records in the Confluent wire format on Spark, vectorised: no per-record Python.

Spark's ``from_avro`` takes one writer schema and bare Avro bytes, so it cannot read a topic whose records
carry a 5-byte header naming their writer schema (apache/spark#48645). Here the writer schemas that can
appear are known before the job runs (a subject's versions, and any id the registry was asked for), and the
plan branches on the header's bytes::

    CASE substring(value, 1, 5)
      WHEN X'0000000001' THEN from_avro(substring(value, 6), <writer 1>, {avroSchema: <reader>, PERMISSIVE})
      WHEN X'0000000003' THEN from_avro(substring(value, 6), <writer 3>, {avroSchema: <reader>, PERMISSIVE})
    END

Each branch resolves its writer's records to the one reader schema by Avro's own rules (Spark's
``avroSchema`` option is the reader schema of Avro's ``GenericDatumReader(writer, reader)``), so the records of
old and new writers land in one collection with one set of columns. The header is compared as bytes (no
conversion of the id to a number per record), and only a record that fails gets a reason:

- no magic byte or fewer than 5 bytes: ``value has no Confluent wire header ...``;
- an id the plan does not know: ``schema id N is not known ...``: the job's :func:`unknown_ids_metric`
  collects those ids, so the caller can ask the registry for them and write the slice again, or, when the
  registry says they do not exist, keep the rows as errors (or stall, per ``on_decode_error``);
- a writer the reader cannot read (:mod:`reclock.avro_schema`'s resolution check, done once per writer in
  the driver): that check's reason;
- bytes that do not decode: ``value does not decode as Avro of writer schema N``.

JSON Schema records decode with ``from_json`` over the payload after the header, into the reader schema's
Spark type (``reclock.json_schema``); JSON's fields are matched by name, so every writer needs no branch of
its own and only the header is checked.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Sequence

from reclock.registry_plan import OK_FIELD, AvroPlan

NO_HEADER = "value has no Confluent wire header (magic byte 0 and a 4-byte schema id)"


def header_literal(schema_id: int) -> bytes:
    """The 5 bytes a record of ``schema_id`` starts with."""
    return struct.pack(">bi", 0, schema_id)


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _id_text(column: str = "value") -> str:
    """SQL: the record's schema id as decimal text (only evaluated for records that fail)."""
    return f"CAST(CAST(conv(hex(substring({column}, 2, 4)), 16, 10) AS BIGINT) AS STRING)"


def has_header_sql(column: str = "value") -> str:
    return f"(length({column}) >= 5 AND substring({column}, 1, 1) = X'00')"


def known_sql(ids: Sequence[int], column: str = "value") -> str:
    """SQL: whether the record's header (in ``column``) names one of ``ids``."""
    if not ids:
        return "false"
    return f"substring({column}, 1, 5) IN ({', '.join(_hex(header_literal(i)) for i in ids)})"


def _hex(b: bytes) -> str:
    return f"X'{b.hex().upper()}'"


def avro_decoded(df, plan: AvroPlan, out: str = "_d", reason: str = "_reason"):
    """``df`` (with a binary ``value``) plus ``out``: the value decoded to the reader schema's struct (with
    :data:`OK_FIELD`), and ``reason``: why it does not decode (null when it does, and on a null value)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    reader = plan.reader_with_ok
    payload = F.expr("substring(value, 6)")
    head = F.substring(F.col("value"), 1, 5)
    decoded = None
    for w in plan.writers:
        if w.unreadable is not None:
            continue
        branch = from_avro(payload, w.schema, {"mode": "PERMISSIVE", "avroSchema": reader})
        cond = head == F.lit(header_literal(w.schema_id))
        decoded = F.when(cond, branch) if decoded is None else decoded.when(cond, branch)
    if decoded is None:  # no writer the reader can read: a typed null of the reader's struct
        decoded = F.when(F.lit(False), from_avro(payload, reader, {"mode": "PERMISSIVE"}))
    df = df.withColumn(out, decoded)
    # the first arm settles every record that decodes with one null check; the header is looked at again
    # only for the records that do not
    arms = [f"WHEN {out}.`{OK_FIELD}` IS NOT NULL OR value IS NULL THEN NULL",
            f"WHEN NOT {has_header_sql()} THEN {_sql_string(NO_HEADER)}",
            f"WHEN NOT {known_sql([w.schema_id for w in plan.writers])} THEN concat('schema id ', {_id_text()}, "
            f"{_sql_string(' is not known to the schema registry')})"]
    for w in plan.writers:
        if w.unreadable is not None:
            arms.append(f"WHEN substring(value, 1, 5) = {_hex(header_literal(w.schema_id))} THEN "
                        + _sql_string(f"writer schema {w.schema_id} cannot be read as the collection's schema: "
                                      f"{w.unreadable}"))
    arms.append(f"ELSE concat('value does not decode as Avro of writer schema ', {_id_text()})")
    return df.withColumn(reason, F.expr(f"CAST(CASE {' '.join(arms)} END AS STRING)"))


def json_decoded(df, spark_schema, known_ids: Sequence[int] | None, out: str = "_d", reason: str = "_reason"):
    """``df`` plus ``out``, the JSON payload after the header parsed into ``spark_schema`` (a StructType;
    PERMISSIVE, a corrupt-record column added), and ``reason``. ``known_ids``: the ids the registry knows
    (None: any id is taken; JSON is matched by field name, so the writer's own schema is not needed)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    corrupt = "_reclock_corrupt"
    with_corrupt = T.StructType(list(spark_schema.fields) + [T.StructField(corrupt, T.StringType())])
    df = df.withColumn(out, F.from_json(F.expr("CAST(substring(value, 6) AS STRING)"), with_corrupt,
                                        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}))
    arms = ["WHEN value IS NULL THEN NULL", f"WHEN NOT {has_header_sql()} THEN {_sql_string(NO_HEADER)}"]
    if known_ids is not None:
        arms.append(f"WHEN NOT {known_sql(known_ids)} THEN concat('schema id ', {_id_text()}, "
                    f"{_sql_string(' is not known to the schema registry')})")
    arms.append(f"WHEN {out}.`{corrupt}` IS NOT NULL THEN "
                + _sql_string("value does not parse as JSON of the collection's schema"))
    return df.withColumn(reason, F.expr(f"CAST(CASE {' '.join(arms)} END AS STRING)"))


def unknown_ids_metric(known_ids: Sequence[int], column: str = "value"):
    """An aggregate for an ``Observation``: the distinct schema ids (as text) of records with a header whose id
    is not among ``known_ids`` (in ``column``: the value, or the key where keys are wire-format too)."""
    from pyspark.sql import functions as F

    c = column
    return F.expr(f"collect_set(CASE WHEN {c} IS NOT NULL AND {has_header_sql(c)} AND NOT {known_sql(known_ids, c)} "
                  f"THEN {_id_text(c)} END)")


_DECODERS: dict[str, object] = {}


def _decoder(args: str):
    """The worker's :class:`reclock.protobuf_schema.Decoder` of a plan (built once per Python worker)."""
    dec = _DECODERS.get(args)
    if dec is None:
        from reclock.protobuf_schema import Decoder

        d = json.loads(args)
        writers = {int(i): {tuple(p): n for p, n in paths} for i, paths in d["writers"].items()}
        dec = _DECODERS[args] = Decoder(base64.b64decode(d["reader"]), writers, {int(i): r for i, r in d["unreadable"].items()})
    return dec


def protobuf_decoded(df, plan: AvroPlan, spark_type, out: str = "_d", reason: str = "_reason"):
    """``df`` plus ``out``, the Protobuf payload after the header and message indexes parsed with the reader's
    message (``spark_type``: its columns' struct), and ``reason``. Spark has no Protobuf reader here
    (spark-protobuf is not on Maven Central's mirror), so the records are parsed by the Python protobuf
    runtime (upb, in C) in an Arrow UDF: one call per batch of records, not per record."""
    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type

    ret = T.StructType([T.StructField("d", spark_type), T.StructField("r", T.StringType())])
    arrow_type = to_arrow_type(ret)
    args = json.dumps(plan.protobuf_decoder_args(), sort_keys=True)

    def decode(values):
        dec = _decoder(args)
        return pa.array([dict(zip(("d", "r"), dec.decode(v))) for v in values.to_pylist()], type=arrow_type)

    # the hints as objects: this module's annotations are strings (``from __future__``), which Spark cannot read
    decode.__annotations__ = {"values": pa.Array, "return": pa.Array}
    udf = F.arrow_udf(decode, ret)
    tmp = "_reclock_pb"
    return (df.withColumn(tmp, udf(F.col("value")))
            .withColumn(out, F.col(f"{tmp}.d")).withColumn(reason, F.col(f"{tmp}.r")).drop(tmp))
