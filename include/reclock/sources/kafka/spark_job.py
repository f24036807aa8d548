"""``write_batches`` on Spark: read exactly the offset ranges the bindings cover, reclock, decode, route.

One Spark job per slice of a description (a slice is at most the source's record budget): every
executor reads its Kafka partitions' ranges with Spark's Kafka batch source (``read_committed``; gaps
from compaction or transaction markers are normal), reclocks each record by the bindings (a ``CASE``
expression over partition and offset, or a broadcast range join when a slice spans very many bindings;
never a per-record Python function), decodes it, and writes Parquet under one fresh
folder, the outputs told apart by a column (append-only) or by folders (upsert) (output 0 the collection,
1 the error collection, 2 the upsert state's changes). Nothing is visible until ``append`` puts the parts
into the shards.

Upsert (``envelope: upsert``, keyed by the Kafka key): per key, the records of the description are ordered
by ``(ts, partition, offset)``; the last one at each ts wins; the output carries ``+1`` for the new value
and ``-1`` for the value it replaces (the previous record in the description, or the key's entry in the
upsert state before the description); a null value deletes the key. The state rows of only the keys the
description touches are read (``prior``), so a cycle costs what its data costs, not the collection's size.
"""

from __future__ import annotations

import contextlib
import functools
import json
from typing import Iterator, Sequence

from reclock.batch import OffsetRange, SliceWritten
from reclock.config import SourceSpec
from reclock.kafka_client import KafkaClientConfig, client_config
from reclock.kafka_client import check as kafka_check
from reclock.part_layout import (DATA_OUTPUT, ERR_PREFIX, ERROR_COLUMNS, ERRORS_OUTPUT, MEMBER_COLUMN, PACKED_BASE64,
                                 REJECTED_COLUMN, STATE_COLUMNS, STATE_OUTPUT, STATE_PREFIX)
from reclock.sources.base import JointSlice
from reclock.spark.decode import AVRO_OK, CORRUPT, ERROR_SOURCES, PACKED, data_schema, decoded, field_names
from reclock.spark.jobs import observation, observed, sql_ident, sql_string
from reclock.spark.reclocking import BindingRange, reclocked

_STATE_SOURCES = tuple(zip(STATE_COLUMNS, ("_k", "_v", "_p", "_o", "_t_us")))
PRIOR_SCHEMA = "key BINARY, value BINARY, partition INT, offset BIGINT, timestamp_us BIGINT"

def kafka_read_options(spec: SourceSpec, kafka: KafkaClientConfig | str,
                       ranges: Sequence[OffsetRange]) -> dict[str, str]:
    """Spark Kafka batch-source options that read exactly ``ranges`` (and nothing else), on the cluster
    ``kafka`` (its connection's ``kafka.*`` options: brokers and security settings).

    The consumers get a stable group id per source (:func:`read_group`). Spark's default, a new one per
    query, never finds the consumers its executors pool by group and partition, so every cycle would open
    and connect a consumer per partition again (0.1-0.2 s of a small cycle, measured). The group is not
    the one whose committed offsets show the source's progress: these consumers are assigned their
    partitions and never commit."""
    parts = sorted({r.partition for r in ranges})
    opts = {
        **client_config(kafka).spark_options(),
        "kafka.group.id": read_group(spec),
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


def read_group(spec: SourceSpec) -> str:
    """The Kafka group id of the consumers Spark reads ``spec``'s topic with."""
    return f"{spec.consumer_group}-read"


def _is_librdkafka(key: str) -> bool:
    return "." in key and not key.startswith(("spark.", "kafka."))


def kafka_meta(spec: SourceSpec) -> list[str]:
    """The metadata columns a Kafka source's collection carries (``include:``), as SQL over its records."""
    names = {"key": "_key", "timestamp": "_kafka_timestamp"}
    return [f"{sql_ident(m)} AS {sql_ident(names.get(m, f'_{m}'))}" for m in spec.include]


def _read_kafka(spark, spec: SourceSpec, bootstrap: KafkaClientConfig | str, ranges: Sequence[OffsetRange]):
    return spark.read.format("kafka").options(**kafka_read_options(spec, bootstrap, ranges)).load()


def _reclocked(spark, spec: SourceSpec, bootstrap: KafkaClientConfig | str, ranges: Sequence[OffsetRange],
               bindings: Sequence[BindingRange], read_metrics=None):
    """The records of ``ranges`` read from Kafka, each with the ``ts`` of the binding that covers its offset
    (``reclock.spark.reclocking.reclocked``). ``read_metrics`` (an ``Observation``) counts the records read,
    as ``records``, right above the scan."""
    from pyspark.sql import functions as F

    raw = _read_kafka(spark, spec, bootstrap, ranges)
    if read_metrics is not None:
        raw = raw.observe(read_metrics, F.count(F.lit(1)).alias("records"))
    return reclocked(spark, raw, ranges, bindings)


def _typed_null(col: str):
    """A null of ``col``'s type."""
    from pyspark.sql import functions as F

    return F.when(F.lit(False), F.col(col))


def reclock_and_decode(spark, spec: SourceSpec, bootstrap: KafkaClientConfig | str, ranges: Sequence[OffsetRange],
                       bindings: Sequence[BindingRange], prior: Sequence[tuple] = (), read_metrics=None):
    """The DataFrame of one slice: every record reclocked and decoded.

    Append-only: the collection's columns, ``ts``, ``diff`` and :data:`REJECTED_COLUMN` (null, or for a
    record that does not decode, its error row packed as JSON: the only column the collection's rows pay
    for the error collection). Upsert: the collection's columns, ``ts``, ``diff``, the error columns and
    the state columns, each null where it does not apply, and ``_output``. ``prior`` (upsert only): the
    state rows ``(key, value, partition, offset, timestamp_us)`` of the keys the slice touches, as of its
    lower. One pass over the records either way: no branch of the plan reads Kafka again. ``read_metrics``:
    see :func:`_reclocked`.
    """
    from pyspark.sql import functions as F

    dec = decoded(spec, _reclocked(spark, spec, bootstrap, ranges, bindings, read_metrics), kafka_meta(spec))
    data_cols = output_columns(spec)[0][:-2]
    if spec.envelope != "upsert":
        packed = ", ".join(f"{sql_string(c)}, {PACKED.get(c, raw)}" for c, raw in ERROR_SOURCES)
        return dec.selectExpr(
            *map(sql_ident, data_cols), "ts", "CAST(1 AS BIGINT) AS diff",
            f"CASE WHEN _reason IS NOT NULL THEN to_json(named_struct({packed})) END AS {REJECTED_COLUMN}")

    from pyspark.sql import Window

    reason = F.coalesce(F.col("_reason"), F.when(F.col("_k").isNull(), F.lit("an upsert record needs a key")))
    before = spark.createDataFrame(list(prior), PRIOR_SCHEMA).select(
        "key", "value", "partition", "offset", F.timestamp_micros("timestamp_us").alias("timestamp"),
        F.lit(-1).cast("long").alias("ts"))
    records = (dec.withColumn("_reason", reason).withColumn("_prior", F.lit(False))
               .unionByName(decoded(spec, before, kafka_meta(spec)).withColumn("_prior", F.lit(True))))
    bad = F.col("_reason").isNotNull()
    # per key (good records only: bad ones sit in their own window partitions and pass through), the last
    # record at each ts wins; then each row's predecessor is the value it replaces
    last_at_ts = Window.partitionBy("_k", bad, "ts").orderBy(F.col("_p").desc(), F.col("_o").desc())
    by_ts = Window.partitionBy("_k", bad).orderBy("ts")
    records = (records.withColumn("_rn", F.row_number().over(last_at_ts)).filter(bad | (F.col("_rn") == 1))
               .withColumn("_row", F.struct(*data_cols, "_v"))
               .withColumn("_prev", F.lag("_row").over(by_ts))
               .withColumn("_next_ts", F.lead("ts").over(by_ts))
               .filter(~F.col("_prior")))

    no_data = {c: _typed_null(c) for c in data_cols}
    no_error = {ERR_PREFIX + c: _typed_null(raw) for c, raw in ERROR_SOURCES}
    no_state = {STATE_PREFIX + c: _typed_null(raw) for c, raw in _STATE_SOURCES}

    def emit(when, output: int, diff: int, data: dict, error: dict, state: dict):
        cols = {**data, "ts": F.col("ts"), "diff": F.lit(diff).cast("long"), **error, **state,
                "_output": F.lit(output)}
        return F.when(when, F.struct(*[v.alias(k) for k, v in cols.items()]))

    kinds = [
        emit(~bad & F.col("_v").isNotNull(), DATA_OUTPUT, 1, {c: F.col(c) for c in data_cols}, no_error, no_state),
        emit(~bad & F.col("_prev").getField("_v").isNotNull(), DATA_OUTPUT, -1,
             {c: F.col("_prev").getField(c) for c in data_cols}, no_error, no_state),
        emit(bad, ERRORS_OUTPUT, 1, no_data, {ERR_PREFIX + c: F.col(raw) for c, raw in ERROR_SOURCES}, no_state),
        emit(~bad & F.col("_next_ts").isNull(), STATE_OUTPUT, 0, no_data, no_error,
             {STATE_PREFIX + c: F.col(raw) for c, raw in _STATE_SOURCES}),
    ]
    return (records.withColumn("_t_us", F.unix_micros("_t"))
            .select(F.explode(F.filter(F.array(*kinds), lambda x: x.isNotNull())).alias("_e")).select("_e.*"))


@contextlib.contextmanager
def kafka_job(what: str, kafka: KafkaClientConfig | str, topics: Sequence[str], groups: Sequence[str]) -> Iterator[None]:
    """Around a Spark job that reads Kafka: a job failed because the brokers refused the principal an ACL
    (or its login) raises :class:`~reclock.errors.KafkaAccessDenied` (or
    :class:`~reclock.errors.KafkaAuthenticationFailed`) naming it, instead of the JVM's stack trace."""
    try:
        yield
    except Exception as e:
        refused = kafka_check(e, client_config(kafka), f"{what}: Spark reading Kafka",
                              {"topic": ("READ", ", ".join(topics)), "group": ("READ", ", ".join(groups))})
        if refused is None:
            raise
        raise refused from e


def upsert_keys(spark, spec: SourceSpec, bootstrap: KafkaClientConfig | str, ranges: Sequence[OffsetRange]) -> list[bytes]:
    """The distinct non-null Kafka keys in ``ranges`` (whose upsert state a description needs)."""
    from pyspark.sql import functions as F

    df = _read_kafka(spark, spec, bootstrap, ranges)
    with kafka_job(f"source {spec.name}", bootstrap, [spec.kafka.topic], [read_group(spec)]):
        return [bytes(r[0]) for r in df.filter(F.col("key").isNotNull()).select("key").distinct().collect()]


def output_columns(spec: SourceSpec) -> tuple[list[str], list[str]]:
    """Columns each shard's parts carry: ``(data shard, errors shard)``; both end with ts, diff."""
    meta = [{"key": "_key", "timestamp": "_kafka_timestamp"}.get(m, f"_{m}") for m in spec.include]
    return field_names(spec) + meta + ["ts", "diff"], [ERR_PREFIX + c for c in ERROR_COLUMNS] + ["ts", "diff"]


def write_slice(spark, spec: SourceSpec, bootstrap: KafkaClientConfig | str, ranges: Sequence[OffsetRange],
                bindings: Sequence[BindingRange], url: str, prior: Sequence[tuple] = (),
                index: int = 0) -> SliceWritten:
    """Run one Spark job writing the slice's updates as Parquet under ``url``; what it read and wrote.

    Append-only (``envelope: none``): plain files of the collection's columns and :data:`REJECTED_COLUMN`;
    nearly always every row is the collection's, and the rare file that holds rejected records is split
    into the two collections' parts when its parts are collected (``reclock.persist.staged``). Not
    partitioning by output spares Spark a sort of each task's rows before writing (a fifth of the job's
    time at a million records), and one packed column instead of five error columns spares it a seventh
    of what is left. Upsert: partitioned by output (``_output=N/`` folders), since every file holds state
    changes too.

    The job counts, as it runs, the records it read (right above the Kafka scan) and the rows it hands
    to the writer per output (right below it): two ``Observation`` metrics, which Spark reports with the
    job's end, in a local session and over Spark Connect alike. Neither splits the generated code of the
    plan in between."""
    from pyspark.sql import functions as F

    read, written = observation(spark), observation(spark)
    df = reclock_and_decode(spark, spec, bootstrap, ranges, bindings, prior, read_metrics=read)
    if spec.envelope != "upsert":
        df = df.observe(written, F.count(F.lit(1)).alias("rows"), F.count(REJECTED_COLUMN).alias("rejected"))
        with kafka_job(f"source {spec.name}", bootstrap, [spec.kafka.topic], [read_group(spec)]):
            df.write.mode("error").parquet(url)
        w = observed(written, spec.name, url, ("rows", "rejected"))
        rows = {DATA_OUTPUT: w["rows"] - w["rejected"], ERRORS_OUTPUT: w["rejected"]}
    else:
        data_cols, err_cols = output_columns(spec)
        state_cols = [STATE_PREFIX + c for c in STATE_COLUMNS]
        # one job, several outputs: a row's columns of the other outputs are null and each shard reads only
        # its own columns (all-null columns cost next to nothing in Parquet)
        keep = list(dict.fromkeys(data_cols + err_cols + state_cols))
        outputs = (DATA_OUTPUT, ERRORS_OUTPUT, STATE_OUTPUT)
        counts = [F.count(F.when(F.col("_output") == o, F.lit(1))).alias(f"output{o}") for o in outputs]
        df = df.selectExpr(*map(sql_ident, keep), "_output").observe(written, *counts)
        with kafka_job(f"source {spec.name}", bootstrap, [spec.kafka.topic], [read_group(spec)]):
            df.write.mode("error").partitionBy("_output").parquet(url)
        w = observed(written, spec.name, url, [f"output{o}" for o in outputs])
        rows = {o: w[f"output{o}"] for o in outputs}
    records = observed(read, spec.name, url, ("records",))["records"]
    return SliceWritten(index, url, sum(r.end - r.start for r in ranges), records, rows)


JOINT_RECORDS_PER_TASK = 200_000
"""A joint job reads its slices' Kafka partitions in tasks of about this many records (at least two tasks):
a task per Kafka partition, as a job of one source has, would make a round of many small sources pay a
task's fixed cost (its start, a Parquet writer, its commit) per partition of every source."""


def joint_key(spec: SourceSpec) -> tuple | None:
    """Sources with the same key can have their slices written by one Spark job (:func:`write_joint`): their
    parts have the same columns of the same types. None: the source's slices need a job of their own (an
    upsert source's)."""
    if spec.envelope == "upsert":
        return None
    return (spec.format.type, spec.format.schema, tuple(spec.include))


def write_joint(spark, slices: Sequence[JointSlice], url: str) -> list[SliceWritten]:
    """Run one Spark job writing the append-only slices of several sources (of one :func:`joint_key`) under
    ``url``, slice ``i``'s files in ``url/_reclock_member=i/``; what it read and wrote, per slice (each
    ``SliceWritten``'s ``url`` is that folder, its ``index`` 0).

    The same plan per slice as :func:`write_slice` (each source's own Kafka options, bindings and decode),
    the slices' DataFrames unioned by name, read in as few tasks as :data:`JOINT_RECORDS_PER_TASK` allows,
    and written partitioned by :data:`MEMBER_COLUMN`. Each slice's records
    read are counted right above its own Kafka scan and its rows written per slice right below the union,
    so every source's write is accounted for on its own, as a job of its own would be. One job instead of
    one per source: one plan submission, one set of task launches and one commit a round, which is what a
    group of many small sources spends most of its Spark time on."""
    from pyspark.sql import functions as F

    if not slices:
        raise ValueError("write_joint needs at least one slice")
    reads = [observation(spark) for _ in slices]
    written = observation(spark)
    df = None
    for i, (s, read) in enumerate(zip(slices, reads)):
        one = reclock_and_decode(spark, s.spec, s.upstream, s.ranges, s.bindings, read_metrics=read)
        one = one.withColumn(MEMBER_COLUMN, F.lit(i))
        df = one if df is None else df.unionByName(one)
    offsets = sum(r.end - r.start for s in slices for r in s.ranges)
    partitions = sum(len(s.ranges) for s in slices)
    tasks = max(1, min(partitions, max(2, -(-offsets // JOINT_RECORDS_PER_TASK))))
    df = df.coalesce(tasks)  # no shuffle: each task reads several Kafka partitions one after the other
    member = F.col(MEMBER_COLUMN)
    counts = [c for i in range(len(slices))
              for c in (F.count(F.when(member == i, F.lit(1))).alias(f"rows{i}"),
                        F.count(F.when(member == i, F.col(REJECTED_COLUMN))).alias(f"rejected{i}"))]
    with kafka_job("sources " + ", ".join(s.spec.name for s in slices), slices[0].upstream,
                   [s.spec.kafka.topic for s in slices], [read_group(s.spec) for s in slices]):
        df.observe(written, *counts).write.mode("error").partitionBy(MEMBER_COLUMN).parquet(url)
    w = observed(written, slices[0].spec.name, url,
                 [f"{k}{i}" for i in range(len(slices)) for k in ("rows", "rejected")])
    out = []
    for i, (s, read) in enumerate(zip(slices, reads)):
        records = observed(read, s.spec.name, url, ("records",))["records"]
        rows = {DATA_OUTPUT: w[f"rows{i}"] - w[f"rejected{i}"], ERRORS_OUTPUT: w[f"rejected{i}"]}
        out.append(SliceWritten(0, f"{url}/{MEMBER_COLUMN}={i}", sum(r.end - r.start for r in s.ranges), records,
                                rows))
    return out
