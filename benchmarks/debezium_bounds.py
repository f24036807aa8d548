"""What folding Debezium change events costs in Spark here, beside the parse alone: the bounds behind the
``debezium`` envelope's figure (``benchmarks.debezium_decode``, issue 32).

That benchmark sets a whole Reclock cycle beside Structured Streaming parsing the same topic into files. This
one leaves Kafka and the cycle out, to see what any fold of a key's events can reach beside the parse: the
events of ``benchmarks.debezium_decode.events`` are written once as Parquet, one file per Kafka partition in
offset order, each file read as one Spark task (as the Kafka source reads a partition), and on one
``local[2]`` session, alternating which goes first:

- ``parse``: the peer's work: ``from_json`` of the envelope (PERMISSIVE, a corrupt-record column), ``op``,
  ``after``'s columns, ``before``'s key and the source position selected, into Parquet; one row per record.
- ``last_per_key``: the least any fold does: the envelope parsed and each key's last record kept (``groupBy``
  and ``max_by``, aggregated in each task before the shuffle). No rule of the envelope is applied: this is a
  lower bound of any design that gathers a key's events, not a fold.
- ``window_fold``: the envelope's rules in Spark SQL, a window over each key in offset order: a streamed event
  applied only above the highest sequence before it since the last snapshot read, a tombstone skipped after a
  skipped event, the row the key holds after each event, the last one per ``(key, ts)``. It is not
  Reclock's code: it measures a fold in the JVM, and leaves out what such a fold still needs (the error rows,
  ``after``'s raw text, the key without Connect's wrapper, the prior state).
- ``array_fold``: the same rules as a fold over an array in the JVM: each key's events gathered
  (``collect_list`` of their positions and kinds, aggregated in each task before the shuffle, and ``max_by``
  of the last record's row), then folded in order by ``aggregate``. Only the index of the last event applied
  is kept, so its result stands only for a key whose last event is applied (all of them here); it measures
  the shape, not a complete fold.
- ``python_fold``: Reclock's fold as the envelope runs it for a slice over several partitions
  (``reclock.spark.debezium_decode.changes`` with ``local``: ``sortWithinPartitions`` by key,
  ``mapInArrow(fold_local)``, the rows decoded by the declared schema).

Every contender is checked: ``parse`` wrote one row per record; the others leave exactly the table the
events leave. Printed: seconds per repetition and the ratio ``parse`` / contender (1.0x: as fast as the
parse alone).

Run: ``.venv/bin/python -m benchmarks.debezium_bounds --events 1000000 --keys 100000 --reps 3``.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import stop
from benchmarks.debezium_decode import COLUMNS, PARTITIONS, SCHEMA, cli, debezium_spec, events
from benchmarks.env import SPARK_MASTER, alternating

CORRUPT = "_corrupt"
AFTER = ", ".join(f"{c.split()[0]}: {c.split()[1]}" for c in SCHEMA.split(", "))
TS = 7  # every record of the slice at one timestamp, as one binding gives them


def write_input(root: Path, n: int, keys: int) -> tuple[int, dict[int, dict]]:
    """The events as Parquet, a file per partition (key, value, partition, offset, ts); the number of records
    and the table they leave."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table: dict[int, dict] = {}
    parts: dict[int, list[tuple[bytes, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
    for p, key, value in events(n, keys, table):
        parts[p].append((key, value))
    (root / "in").mkdir(parents=True)
    for p, recs in parts.items():
        pq.write_table(pa.table({"key": pa.array([k for k, _ in recs], pa.binary()),
                                 "value": pa.array([v for _, v in recs], pa.binary()),
                                 "p": pa.array([p] * len(recs), pa.int32()),
                                 "o": pa.array(range(len(recs)), pa.int64()),
                                 "ts": pa.array([TS] * len(recs), pa.int64())}), root / "in" / f"p{p}.parquet")
    return sum(map(len, parts.values())), table


def session(root: Path):
    """A ``local[2]`` session as the benchmarks' (``benchmarks.env``: Reclock's settings, the Kafka connector's
    jars), its state under ``root``; a Parquet file is one task, a shuffle has a partition per Kafka
    partition."""
    from reclock.dev.spark import local_session
    from reclock.dev.state import StackState

    spark = local_session(StackState(root / "stack"), app="reclock-debezium-bounds", master=SPARK_MASTER)
    for k, v in {"spark.sql.files.maxPartitionBytes": "1g", "spark.sql.files.openCostInBytes": "1g",
                 "spark.sql.shuffle.partitions": str(PARTITIONS)}.items():
        spark.conf.set(k, v)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _parsed(spark, root: Path, envelope: str):
    from pyspark.sql import functions as F

    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
    d = F.from_json(F.col("value").cast("string"), envelope, opts)
    return spark.read.parquet(str(root / "in")).select("key", "p", "o", "ts", F.col("value").isNull().alias("tomb"),
                                                       d.alias("d"))


def parse(spark, root: Path, out: Path) -> None:
    from pyspark.sql import functions as F

    env = (f"before STRUCT<id: INT>, after STRUCT<{AFTER}>, op STRING, "
           f"source STRUCT<lsn: BIGINT, txId: BIGINT, sequence: STRING>, ts_ms BIGINT, {CORRUPT} STRING")
    _parsed(spark, root, env).select(
        "key", F.col("d.op").alias("op"), *[F.col(f"d.after.{c}").alias(c) for c in COLUMNS],
        F.col("d.before.id").alias("before_id"), F.col("d.source.lsn").alias("lsn"),
        F.col("d.source.txId").alias("tx_id"), F.col(f"d.{CORRUPT}").alias(CORRUPT)).write.parquet(str(out))


_FOLD_ENVELOPE = (f"after STRUCT<{AFTER}>, op STRING, "
                  f"source STRUCT<lsn: BIGINT, txId: BIGINT, snapshot: STRING, sequence: STRING>, {CORRUPT} STRING")


def _last_commit():
    """The first element of ``source.sequence`` (``'["<last commit LSN>","<lsn>"]'``) as a number."""
    from pyspark.sql import functions as F

    return F.split(F.regexp_replace("d.source.sequence", r'[\[\]"]', ""), ",").getItem(0).cast("long")


def last_per_key(spark, root: Path, out: Path) -> None:
    from pyspark.sql import functions as F

    last = F.max_by(F.struct(F.when(F.col("d.op") != "d", F.col("d.after")).alias("row"),
                             F.col("d.source.lsn").alias("lsn"), F.col("tomb")), F.struct("p", "o"))
    (_parsed(spark, root, _FOLD_ENVELOPE).groupBy("key", "ts").agg(last.alias("last"))
     .select("key", "ts", F.when(~F.col("last.tomb"), F.col("last.row")).alias("row"), F.col("last.lsn").alias("lsn"))
     .write.parquet(str(out)))


def window_fold(spark, root: Path, out: Path) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    e = _parsed(spark, root, _FOLD_ENVELOPE).select(
        "key", "p", "o", "ts", "tomb", F.col("d.op").alias("op"), F.col("d.after").alias("after"),
        F.col("d.source.lsn").alias("lsn"), (F.col("d.op") == "r").alias("snap"),
        _last_commit().alias("commit"), F.col(f"d.{CORRUPT}").isNotNull().alias("bad"))
    w = Window.partitionBy("key").orderBy("p", "o")
    upto, before = w.rowsBetween(Window.unboundedPreceding, 0), w.rowsBetween(Window.unboundedPreceding, -1)
    e = e.withColumn("seg", F.sum(F.col("snap").cast("int")).over(upto))  # snapshot reads so far
    e = e.withColumn("pos", F.when(~F.col("tomb") & ~F.col("bad"), F.struct(
        "seg", F.when(F.col("snap"), F.lit(-1)).otherwise(F.col("commit")).alias("c"), "lsn")))
    e = e.withColumn("pmax", F.max("pos").over(before))  # the highest sequence before, in the last segment
    newer = (F.col("snap") | F.col("pmax").isNull() | (F.col("pmax.seg") < F.col("seg"))
             | (F.struct("commit", "lsn") > F.struct(F.col("pmax.c"), F.col("pmax.lsn"))))
    e = e.withColumn("applied", F.when(F.col("bad") | F.col("tomb"), None).otherwise(newer))
    e = e.withColumn("last_applied", F.last("applied", ignorenulls=True).over(before))
    e = e.withColumn("eff", F.when(F.col("bad"), False)
                     .when(F.col("tomb"), F.coalesce(F.col("last_applied"), F.lit(True))).otherwise(F.col("applied")))
    e = e.withColumn("held", F.when(F.col("eff"), F.struct(F.when(F.col("op") != "d", F.col("after")).alias("r"))))
    e = e.withColumn("cur", F.last("held", ignorenulls=True).over(upto))
    (e.groupBy("key", "ts").agg(F.max_by("cur", F.struct("p", "o")).alias("last"),
                                 F.max_by(F.struct("p", "o", "lsn", "commit"), F.struct("p", "o")).alias("pos"))
     .select("key", "ts", F.col("last.r").alias("row"),
             F.to_json(F.struct(F.col("last.r").alias("row"), "pos")).alias("state"))
     .write.parquet(str(out)))


def array_fold(spark, root: Path, out: Path) -> None:
    from pyspark.sql import functions as F

    kind = F.when(F.col("tomb"), 0).when(F.col("d.op") == "d", 1).when(F.col("d.op") == "r", 2).otherwise(3)
    ev = F.struct("p", "o", _last_commit().alias("c"), F.col("d.source.lsn").alias("l"),
                  kind.alias("k"), F.col(f"d.{CORRUPT}").isNotNull().alias("b"))
    g = _parsed(spark, root, _FOLD_ENVELOPE).groupBy("key", "ts").agg(
        F.collect_list(ev).alias("evs"),
        F.max_by(F.struct(F.when(F.col("d.op") != "d", F.col("d.after")).alias("r"), "o", "tomb"),
                 F.struct("p", "o")).alias("last"))
    start = F.struct(F.lit(-1).cast("long").alias("c"), F.lit(-1).cast("long").alias("l"),
                     F.lit(-1).cast("long").alias("at"), F.lit(False).alias("sk"))

    def step(acc, x):  # (highest sequence applied, offset of the last event applied, last event skipped)
        streamed = (x["k"] == 1) | (x["k"] == 3)
        applied = (F.when(x["b"], F.lit(False)).when(x["k"] == 0, ~acc["sk"]).when(x["k"] == 2, F.lit(True))
                   .otherwise(F.struct(x["c"], x["l"]) > F.struct(acc["c"], acc["l"])))
        return F.struct(F.when(streamed & applied, x["c"]).otherwise(acc["c"]).alias("c"),
                        F.when(streamed & applied, x["l"]).otherwise(acc["l"]).alias("l"),
                        F.when(applied, x["o"]).otherwise(acc["at"]).alias("at"),
                        F.when(x["k"] == 0, acc["sk"]).otherwise(~applied & ~x["b"]).alias("sk"))

    (g.select("key", "ts", "last", F.aggregate(F.array_sort("evs"), start, step).alias("f"))
     .select("key", "ts",
             F.when((F.col("f.at") == F.col("last.o")) & ~F.col("last.tomb"), F.col("last.r")).alias("row"),
             (F.col("f.at") != F.col("last.o")).alias("undecided"))
     .write.parquet(str(out)))


def python_fold(spark, root: Path, out: Path) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from reclock.part_layout import KAFKA_SHAPE
    from reclock.spark.debezium_decode import changes

    (p, _), (o, _) = KAFKA_SHAPE.positions
    records = spark.read.parquet(str(root / "in")).select(  # named as a Kafka slice's records are
        "key", "value", F.col("p").alias(p), F.col("o").alias(o), F.timestamp_micros(F.lit(0)).alias("timestamp"),
        "ts")
    spec = debezium_spec("bounds", "127.0.0.1:9")  # no broker is asked
    folded = changes(spark, spec, KAFKA_SHAPE, records, (), "", COLUMNS, T.StructType.fromDDL(SCHEMA), local=True)
    folded.write.parquet(str(out))


def check(name: str, spark, out: Path, records: int, table: dict[int, dict]) -> None:
    """Raises unless ``out`` holds what ``name`` must leave."""
    from reclock.part_layout import DATA_OUTPUT

    got = spark.read.parquet(str(out))
    if name == "parse":
        if got.count() != records:
            raise RuntimeError(f"parse: {got.count()} rows of {records} records")
        return
    if name == "array_fold" and got.where("undecided").count():
        raise RuntimeError("array_fold: a key whose last event was not applied (its result is not kept)")
    if name == "python_fold":
        live = got.where(f"_output = {DATA_OUTPUT}")
        if live.where("diff != 1").count():
            raise RuntimeError("python_fold: a row with a diff other than 1 (a new source has nothing to retract)")
        rows = [r.asDict() for r in live.select(*COLUMNS).collect()]
    else:
        rows = [r["row"].asDict() for r in got.where("row IS NOT NULL").select("row").collect()]
    held = {r["id"]: r for r in rows}
    if len(rows) != len(table) or held != table:
        raise RuntimeError(f"{name}: {len(rows)} rows, not the table's {len(table)}")


CONTENDERS = {"parse": parse, "last_per_key": last_per_key, "window_fold": window_fold, "array_fold": array_fold,
               "python_fold": python_fold}


def run(n: int, keys: int, reps: int, echo=print) -> dict:
    root = Path(tempfile.mkdtemp(prefix="reclock-dbz-bounds-"))
    spark = None
    try:
        records, table = write_input(root, n, keys)
        echo(f"{n} change events, {records} records in {PARTITIONS} files, {len(table)} rows left; work folder {root}")
        spark = session(root)

        def job(name):
            def once(rep: int) -> float:
                out = root / f"{name}_{rep}"
                t0 = time.perf_counter()
                CONTENDERS[name](spark, root, out)
                seconds = time.perf_counter() - t0
                check(name, spark, out, records, table)
                shutil.rmtree(out)
                return seconds
            return once

        times = alternating({name: job(name) for name in CONTENDERS}, reps, echo)
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {k: med["parse"] / v for k, v in med.items() if k != "parse"}
    echo("beside the parse alone (parse / contender): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    return {"events": n, "records": records, "keys": keys, "reps": reps, "seconds": times, "median_s": med,
            "ratio_to_parse": ratios}


def main() -> None:
    cli(run, __doc__)


if __name__ == "__main__":
    main()
