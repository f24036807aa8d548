"""``write_batches`` of a Kafka source on Spark: read exactly the offset ranges the bindings cover with
Spark's Kafka batch source (``read_committed``; gaps from compaction or transaction markers are normal),
reclock each record by the bindings (``reclock.spark.reclocking``: a ``CASE`` expression over partition and
offset, or a broadcast range join when a slice spans very many bindings; never a per-record Python
function), and hand the records to the decode path every kind shares (``reclock.spark.decode``: decode,
envelope, route, write, count). One Spark job per slice of a description (a slice is at most the source's
record budget); a continuous group's append-only slices of several sources may share one job
(:func:`write_joint`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Iterator, Sequence

from reclock.batch import OffsetRange, SliceWritten
from reclock.specs import SourceSpec
from reclock.kafka_client import KafkaClientConfig, client_config
from reclock.kafka_client import check as kafka_check
from reclock.part_layout import DATA_OUTPUT, ERRORS_OUTPUT, KAFKA_SHAPE, MEMBER_COLUMN, REJECTED_COLUMN
from reclock.registry_plan import AvroPlan, WriterTally
from reclock.schema_evolution import Column
from reclock.sources.base import JointSlice
from reclock.spark import decode
from reclock.spark.decode import CORRUPT  # noqa: F401 - the benchmarks' bare jobs decode as the cycle does
from reclock.spark.jobs import observation, observed, parts_writer
from reclock.spark.reclocking import BindingRange, reclocked


def kafka_read_options(spec: SourceSpec, kafka: KafkaClientConfig | str,
                       ranges: Sequence[OffsetRange]) -> dict[str, str]:
    """Spark Kafka batch-source options that read exactly ``ranges`` (and nothing else), on the cluster
    ``kafka`` (its connection's ``kafka.*`` options: brokers and security settings).

    The consumers get a stable group id per source and consumer settings (:func:`read_group`). Spark's
    default, a new one per query, never finds the consumers its executors pool by group and partition, so
    every cycle would open and connect a consumer per partition again (0.1-0.2 s of a small cycle,
    measured). The group is not the one whose committed offsets show the source's progress: these consumers
    are assigned their partitions and never commit."""
    parts = sorted({r.partition for r in ranges})
    settings = _consumer_settings(spec, kafka)
    opts = {
        **settings,
        "kafka.group.id": _group_of(spec, settings),
        "assign": json.dumps({spec.upstream.topic: parts}),
        "startingOffsets": json.dumps({spec.upstream.topic: {str(r.partition): r.start for r in ranges}}),
        "endingOffsets": json.dumps({spec.upstream.topic: {str(r.partition): r.end for r in ranges}}),
        "failOnDataLoss": "true",
        "includeHeaders": "true" if "headers" in spec.include else "false",
    }
    for k, v in spec.upstream.options:
        if not (k.startswith("kafka.") or _is_librdkafka(k)):
            opts[k] = v
    return opts


def _consumer_settings(spec: SourceSpec, kafka: KafkaClientConfig | str) -> dict[str, str]:
    """The ``kafka.*`` options Spark's consumers are made with (the cluster's, Reclock's, the source's)."""
    opts = {**client_config(kafka).spark_options(), "kafka.isolation.level": "read_committed",
            "kafka.fetch.max.wait.ms": "10"}
    for k, v in spec.upstream.options:
        if k.startswith("kafka.") or _is_librdkafka(k):
            opts[k if k.startswith("kafka.") else f"kafka.{k}"] = v
    return opts


def _group_of(spec: SourceSpec, settings: dict[str, str]) -> str:
    digest = hashlib.sha256(json.dumps(sorted(settings.items())).encode()).hexdigest()[:8]
    return f"{spec.consumer_group}-read-{digest}"


def read_group(spec: SourceSpec, kafka: KafkaClientConfig | str) -> str:
    """The Kafka group id of the consumers Spark reads ``spec``'s topic with on the cluster ``kafka``.

    It carries a digest of the consumers' settings: Spark pools its executors' consumers by group and
    partition and refuses a pooled consumer made with other settings ("Kafka parameters for same cache key
    should be equal"), so consumers of changed settings (a release that sets another option, a source's
    edited ``options``, rotated credentials) must not share a group with the old ones on a Spark cluster
    that stayed up."""
    return _group_of(spec, _consumer_settings(spec, kafka))


def _is_librdkafka(key: str) -> bool:
    return "." in key and not key.startswith(("spark.", "kafka."))


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


def reclock_and_decode(spark, spec: SourceSpec, bootstrap: KafkaClientConfig | str, ranges: Sequence[OffsetRange],
                       bindings: Sequence[BindingRange], prior: Sequence[tuple] = (), read_metrics=None):
    """The DataFrame of one slice: every record of ``ranges`` read from Kafka, reclocked and put through the
    shared decode path (``reclock.spark.decode.envelope``)."""
    return decode.envelope(spark, spec, KAFKA_SHAPE, _reclocked(spark, spec, bootstrap, ranges, bindings,
                                                                  read_metrics), prior)


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
    with kafka_job(f"source {spec.name}", bootstrap, [spec.upstream.topic], [read_group(spec, bootstrap)]):
        return [bytes(r[0]) for r in df.filter(F.col("key").isNotNull()).select("key").distinct().collect()]


def write_slice(spark, spec: SourceSpec, bootstrap: KafkaClientConfig | str, ranges: Sequence[OffsetRange],
                bindings: Sequence[BindingRange], url: str, prior: Sequence[tuple] = (),
                index: int = 0, plan: AvroPlan | None = None, writers: WriterTally | None = None,
                local: bool = False) -> SliceWritten:
    """One Spark job writing the slice's updates under ``url`` (``reclock.spark.decode.write_slice``): the
    Kafka records of ``ranges``, counted right above the Kafka scan, reclocked by ``bindings``; a refused ACL
    or login is named (:func:`kafka_job`). ``plan`` (a registry source): records decode by their writer
    schemas; ``writers`` gets what the job met of them (:func:`writer_aggregates` of the reclocked records,
    :func:`tally`). ``local`` (debezium): each task folds the keys it read (``reclock.spark.decode.envelope``)."""
    met = observation(spark) if plan is not None else None

    def records(read):
        df = _reclocked(spark, spec, bootstrap, ranges, bindings, read)
        return df.observe(met, *writer_aggregates(plan, keys=spec.envelope == "debezium")) if met is not None \
            else df

    with kafka_job(f"source {spec.name}", bootstrap, [spec.upstream.topic], [read_group(spec, bootstrap)]):
        out = decode.write_slice(spark, spec, KAFKA_SHAPE, records, url, prior, index,
                                 offsets=sum(r.end - r.start for r in ranges), plan=plan, local=local)
    if met is not None and writers is not None:
        tally(met, plan, spec.name, url, writers)
    return out


KAFKA_META_TYPES = {"partition": "int", "offset": "bigint", "key": "binary", "timestamp": "timestamp",
                    "headers": "array<struct<key:string,value:binary>>"}
"""The Spark types of the metadata columns Spark's Kafka source gives."""


def meta_columns(spec: SourceSpec) -> tuple[Column, ...]:
    """The metadata columns a Kafka source's collection carries after its value's (``include:``), as schema
    columns (a registry source's schema versions hold them too)."""
    return tuple(Column(KAFKA_SHAPE.meta_column(m), KAFKA_META_TYPES[m], True) for m in spec.include)


def writer_aggregates(plan: AvroPlan, keys: bool = False) -> list:
    """Aggregates over reclocked wire-format records (``value``, ``ts``): ``n`` (records), ``w<id>`` (the
    first ts of each writer id the plan knows; null: none met) and ``unknown`` (the ids met that it does
    not know, as text); ``keys`` (Debezium's Avro: keys are wire-format too): ``unknown_keys``, the same of
    the keys. Compared as header bytes, as the decode does: no per-record conversion."""
    from pyspark.sql import functions as F

    from reclock.spark.registry_decode import header_literal, unknown_ids_metric

    aggs = [F.count(F.lit(1)).alias("n")]
    for i in plan.ids:
        aggs.append(F.min(F.when(F.substring(F.col("value"), 1, 5) == F.lit(header_literal(i)), F.col("ts")))
                    .alias(f"w{i}"))
    return aggs + [unknown_ids_metric(plan.ids).alias("unknown")] + \
        ([unknown_ids_metric(plan.ids, "key").alias("unknown_keys")] if keys else [])


def tally(obs, plan: AvroPlan, source: str, url: str, into: WriterTally) -> None:
    """Add a finished job's :func:`writer_aggregates` to ``into`` (no report: the write is not accounted for)."""
    from reclock.errors import UnaccountedWrite

    got = obs.get or {}
    if got.get("n") is None:
        raise UnaccountedWrite(source, url, url, f"Spark reported no writer metrics for its job (metrics: {got})")
    into.add({i: got.get(f"w{i}") for i in plan.ids},
             [int(x) for x in [*(got.get("unknown") or ()), *(got.get("unknown_keys") or ())]])


JOINT_RECORDS_PER_TASK = 200_000
"""A joint job reads its slices' Kafka partitions in tasks of about this many records (at least two tasks):
a task per Kafka partition, as a job of one source has, would make a round of many small sources pay a
task's fixed cost (its start, a Parquet writer, its commit) per partition of every source."""


def joint_key(spec: SourceSpec) -> tuple | None:
    """Sources with the same key can have their slices written by one Spark job (:func:`write_joint`): their
    parts have the same columns of the same types. None: the source's slices need a job of their own (an
    upsert source's)."""
    if spec.keyed or spec.format.registry is not None:
        return None  # a registry source's columns are its reader's, known only when its slice is planned
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
                   [s.spec.upstream.topic for s in slices], [read_group(s.spec, s.upstream) for s in slices]):
        parts_writer(df.observe(written, *counts), url).partitionBy(MEMBER_COLUMN).parquet(url)
    w = observed(written, slices[0].spec.name, url,
                 [f"{k}{i}" for i in range(len(slices)) for k in ("rows", "rejected")])
    out = []
    for i, (s, read) in enumerate(zip(slices, reads)):
        records = observed(read, s.spec.name, url, ("records",))["records"]
        rows = {DATA_OUTPUT: w[f"rows{i}"] - w[f"rejected{i}"], ERRORS_OUTPUT: w[f"rejected{i}"]}
        out.append(SliceWritten(0, f"{url}/{MEMBER_COLUMN}={i}", sum(r.end - r.start for r in s.ranges), records,
                                rows))
    return out
