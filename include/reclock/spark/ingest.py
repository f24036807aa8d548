"""``write_batches`` on Spark: read exactly the offset ranges the bindings cover, reclock, decode, route.

One Spark job per slice of a description (a slice is at most the source's record budget): every
executor reads its Kafka partitions' ranges with Spark's Kafka batch source (``read_committed``; gaps
from compaction or transaction markers are normal), reclocks each record with a broadcast range join
against the bindings (never a per-record Python function), decodes it, and writes Parquet under one fresh
folder, partitioned by output (``_output=0`` the collection, ``_output=1`` the error collection).
Nothing is visible until ``append`` puts the parts into the shards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from reclock.batch import OffsetRange
from reclock.config import SourceSpec

DATA_OUTPUT = 0
ERRORS_OUTPUT = 1
CORRUPT = "_reclock_corrupt"

ERROR_COLUMNS = ("partition", "offset", "key", "raw", "reason")
ERR_PREFIX = "_reclock_err_"
"""Parts of both outputs come from one Spark job and carry the union of columns; the error collection's
columns carry this prefix in the files (readers of each shard keep only their own columns)."""


@dataclass(frozen=True)
class BindingRange:
    """Offsets ``[start, end)`` of ``partition`` are bound at ``ts``."""

    partition: int
    start: int
    end: int
    ts: int


def kafka_read_options(spec: SourceSpec, bootstrap: str, ranges: Sequence[OffsetRange]) -> dict[str, str]:
    """Spark Kafka batch-source options that read exactly ``ranges`` (and nothing else)."""
    parts = sorted({r.partition for r in ranges})
    opts = {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.isolation.level": "read_committed",
        "kafka.fetch.max.wait.ms": "10",
        "assign": json.dumps({spec.kafka.topic: parts}),
        "startingOffsets": json.dumps({spec.kafka.topic: {str(r.partition): r.start for r in ranges}}),
        "endingOffsets": json.dumps({spec.kafka.topic: {str(r.partition): r.end for r in ranges}}),
        "failOnDataLoss": "true",
        "includeHeaders": "true" if "headers" in spec.include else "false",
    }
    for k, v in spec.kafka.options:
        opts[k if k.startswith("kafka.") or not _is_librdkafka(k) else f"kafka.{k}"] = v
    return opts


def _is_librdkafka(key: str) -> bool:
    return "." in key and not key.startswith(("spark.", "kafka."))


def data_schema(spec: SourceSpec):
    """The Spark schema of the decoded value (before metadata columns)."""
    from pyspark.sql import types as T

    if spec.format.type == "text":
        return T.StructType([T.StructField("text", T.StringType())])
    if spec.format.type == "bytes":
        return T.StructType([T.StructField("data", T.BinaryType())])
    return T._parse_datatype_string(spec.format.schema)


def reclock_and_decode(spark, spec: SourceSpec, bootstrap: str, ranges: Sequence[OffsetRange],
                       bindings: Sequence[BindingRange]):
    """The DataFrame of one slice: every record reclocked and decoded, with an ``_output`` column.

    Columns: the decoded fields, the included metadata columns, ``ts``, ``diff``, and the error
    columns (null on good rows), ``_output`` (0 data, 1 error).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    raw = spark.read.format("kafka").options(**kafka_read_options(spec, bootstrap, ranges)).load()
    bdf = spark.createDataFrame([(b.partition, b.start, b.end, b.ts) for b in bindings],
                                "b_partition INT, b_start BIGINT, b_end BIGINT, ts BIGINT")
    # the vectorised range join: each record gets the ts of the binding whose range holds its offset
    df = raw.join(F.broadcast(bdf), (raw["partition"] == bdf["b_partition"]) & (raw["offset"] >= bdf["b_start"])
                  & (raw["offset"] < bdf["b_end"]), "inner").drop("b_partition", "b_start", "b_end")

    schema = data_schema(spec)
    fields = [f.name for f in schema.fields]
    value_str = F.col("value").cast("string")
    if spec.format.type in ("json", "csv"):
        # PERMISSIVE parsing with a corrupt-record column: a value that does not parse (or does not fit
        # the declared types) keeps its text there, and becomes an error row
        with_corrupt = T.StructType(schema.fields + [T.StructField(CORRUPT, T.StringType())])
        opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        if spec.format.type == "json":
            decoded = F.from_json(value_str, with_corrupt, opts)
        else:
            ddl = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in with_corrupt.fields)
            decoded = F.from_csv(value_str, ddl, opts)
        df = df.withColumn("_d", decoded)
        reason = F.when(F.col("value").isNotNull() & F.col(f"_d.{CORRUPT}").isNotNull(),
                        F.lit(f"value does not parse as {spec.format.type.upper()} of the declared schema"))
        cols = [F.col(f"_d.{f}").alias(f) for f in fields]
    elif spec.format.type == "text":
        # invalid UTF-8 cannot round trip through a string: such a record is an error
        reason = F.when(F.col("value").isNotNull()
                        & (F.encode(value_str, "UTF-8") != F.col("value")),
                        F.lit("value is not valid UTF-8"))
        cols = [value_str.alias("text")]
    else:
        reason = F.lit(None).cast("string")
        cols = [F.col("value").alias("data")]

    meta = []
    for m in spec.include:
        if m == "key":
            meta.append(F.col("key").alias("_key"))
        elif m == "timestamp":
            meta.append(F.col("timestamp").alias("_kafka_timestamp"))
        else:
            meta.append(F.col(m).alias(f"_{m}"))
    is_error = reason.isNotNull()
    out = df.select(
        *cols, *meta,
        F.col("ts"), F.lit(1).cast("long").alias("diff"),
        F.when(is_error, F.col("partition")).alias(ERR_PREFIX + "partition"),
        F.when(is_error, F.col("offset")).alias(ERR_PREFIX + "offset"),
        F.when(is_error, F.col("key")).alias(ERR_PREFIX + "key"),
        F.when(is_error, F.col("value")).alias(ERR_PREFIX + "raw"),
        reason.alias(ERR_PREFIX + "reason"),
        F.when(is_error, F.lit(ERRORS_OUTPUT)).otherwise(F.lit(DATA_OUTPUT)).alias("_output"),
    )
    return out


def output_columns(spec: SourceSpec) -> tuple[list[str], list[str]]:
    """Columns each shard's parts carry: ``(data shard, errors shard)``; both end with ts, diff."""
    fields = [f.name for f in data_schema(spec).fields]
    meta = [{"key": "_key", "timestamp": "_kafka_timestamp"}.get(m, f"_{m}") for m in spec.include]
    return fields + meta + ["ts", "diff"], [ERR_PREFIX + c for c in ERROR_COLUMNS] + ["ts", "diff"]


def write_slice(spark, spec: SourceSpec, bootstrap: str, ranges: Sequence[OffsetRange],
                bindings: Sequence[BindingRange], url: str) -> None:
    """Run one Spark job writing the slice's updates as Parquet under ``url`` (``_output=N/`` folders)."""
    df = reclock_and_decode(spark, spec, bootstrap, ranges, bindings)
    data_cols, err_cols = output_columns(spec)
    from pyspark.sql import functions as F

    # one job, two outputs: the data columns are null in error rows and vice versa, and each shard
    # reads only its own columns (all-null columns cost next to nothing in Parquet)
    keep = list(dict.fromkeys(data_cols + err_cols))
    (df.select(*[F.col(c) for c in keep], "_output")
       .write.mode("error").partitionBy("_output").parquet(url))
