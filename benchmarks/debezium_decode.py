"""The ``debezium`` envelope beside Structured Streaming doing the same parse into a file sink, in one run.

A topic of ``n`` Debezium change events (JSON without Connect's schemas, as Debezium 3.6.1.Final's Postgres
connector writes them with ``value.converter.schemas.enable=false``: ``before``, ``after``, ``op``, ``source``
with ``lsn``, ``txId`` and ``sequence``) of a table ``orders(id, customer, amount, country, note)`` keyed by
``id``, over ``keys`` keys in 4 partitions (a key's events in one partition, as Connect's default partitioner
puts them): every key inserted, then updates (``before`` null, as under ``REPLICA IDENTITY DEFAULT``), every
tenth event a delete (``before`` the key only) followed by its tombstone, and a deleted key inserted again.
Each event is its own upstream transaction. Contenders, alternating which goes first, on one ``local[2]``
session with the same Kafka options (Reclock's: ``read_committed``, ``fetch.max.wait.ms=10``, the same offset
ranges):

- ``reclock``: one cycle of a new source with ``envelope: debezium`` (mint, write_batches, append; the resume
  step left out): each key's events folded against its upsert state, exact retractions, redeliveries
  recognised, the state written in the append. Checked: the collection AS OF its binding is the table the
  events describe, every row once.
- ``structured_streaming``: the Kafka source, ``from_json`` of the same envelope (PERMISSIVE, with the same
  corrupt-record column), ``op``, ``after``'s columns, ``before``'s key and the source position selected,
  into a Parquet file sink, ``trigger(availableNow=True)``, a fresh checkpoint: the parse a Spark user writes
  before a ``MERGE`` (which it does not do: the figure is the parse into files only). Checked: one row per
  record.

The figure is the ratio of their median times (``structured_streaming`` / ``reclock``: above 1.0x Reclock is
faster).

Run: ``.venv/bin/python -m benchmarks.debezium_decode --events 1000000 --keys 100000 --reps 3``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time

from benchmarks import stop
from benchmarks.env import Env, alternating, services

SCHEMA = "id INT, customer BIGINT, amount DOUBLE, country STRING, note STRING"
COLUMNS = [c.split()[0] for c in SCHEMA.split(", ")]
PARTITIONS = 4
COUNTRIES = ("DE", "FR", "NL", "PL", "SE", "US")
TOPIC = "dbz.public.orders"


def events(n: int, keys: int, table: dict[int, dict]):
    """``(partition, key, value)`` of ``n`` change events (and the tombstones after their deletes); ``table``
    (``{id: row}``) is left as the events leave the table."""
    lsn = commit = 22_000_000
    for i in range(n):
        k = i % keys
        lsn += 96
        row = {"id": k, "customer": (i * 31) % 50_000, "amount": (i * 7919) % 100_000 / 100,
               "country": COUNTRIES[i % len(COUNTRIES)], "note": None if i % 3 else "a note of some forty bytes"}
        if k in table and i % 10 == 0:
            op, before, after = "d", {"id": k}, None
            del table[k]
        else:
            op, before, after = ("u" if k in table else "c"), None, row
            table[k] = row
        source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "dbz", "ts_ms": 1795671145479 + i,
                  "snapshot": "false", "db": "postgres",
                  "sequence": json.dumps([str(commit), str(lsn)], separators=(",", ":")),
                  "schema": "public", "table": "orders", "txId": 1000 + i, "lsn": lsn, "xmin": None}
        value = {"before": before, "after": after, "source": source, "transaction": None, "op": op,
                 "ts_ms": 1795671145480 + i}
        key = json.dumps({"id": k}, separators=(",", ":")).encode()  # compact, as Connect's JsonConverter writes
        yield k % PARTITIONS, key, json.dumps(value, separators=(",", ":")).encode()
        if op == "d":
            yield k % PARTITIONS, key, None
        commit = lsn + 8


def fill(bootstrap: str, n: int, keys: int) -> tuple[int, dict[int, dict]]:
    """Write the events; the number of records (tombstones included) and the table they leave."""
    from benchmarks.workload import create_topic, end_offsets, fast_producer

    create_topic(bootstrap, TOPIC, PARTITIONS)
    producer = fast_producer(bootstrap)
    table: dict[int, dict] = {}
    records = 0
    for part, key, value in events(n, keys, table):
        try:
            producer.produce(TOPIC, value, key, partition=part)
        except BufferError:
            producer.poll(0.1)
            producer.produce(TOPIC, value, key, partition=part)
        records += 1
        if records % 50_000 == 0:
            producer.poll(0)
    if producer.flush(600) != 0:
        raise RuntimeError("records still queued after 10 minutes")
    if sum(end_offsets(bootstrap, TOPIC).values()) != records:
        raise RuntimeError(f"topic {TOPIC}: the end offsets do not add up to {records}")
    return records, table


def debezium_spec(name: str, bootstrap: str, records: int | None = None):
    """The source over the events' topic: the debezium envelope, JSON rows of ``SCHEMA``, a cycle's budget of
    ``records`` (the default budget without)."""
    from reclock.config import parse_source

    budget = {} if records is None else {"budget": {"max_records": records}}
    return parse_source(name, {"kafka": {"topic": TOPIC, "bootstrap": bootstrap}, "envelope": "debezium",
                               "format": {"type": "json", "schema": SCHEMA}, **budget})


def run_reclock(env: Env, records: int, table: dict[int, dict], rep: int) -> float:
    """One cycle of a new source over the topic: seconds from its start to the append's commit."""
    from benchmarks.contenders import step_seconds
    from reclock.cycle import CycleContext, run_cycle
    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore
    from reclock.read import read_as_of

    name = f"dbz_{rep}"
    blob = LocalBlobStore(env.work / "blobs")
    ctx = CycleContext(spec=debezium_spec(name, env.bootstrap, records), dsn=env.dsn, upstream=env.bootstrap, blob=blob,
                       spark_factory=lambda: env.spark)
    t0 = time.perf_counter()
    out = run_cycle(ctx)
    total = time.perf_counter() - t0
    steps, _ = step_seconds(env.dsn, name)
    if out["descriptions"] != 1:
        raise RuntimeError(f"reclock {name}: expected one description, got {out['descriptions']}")
    with connect(env.dsn) as conn:
        got = read_as_of(conn, blob, name).to_pylist()
    if any(r["diff"] != 1 for r in got):
        raise RuntimeError(f"reclock {name}: a row more than once")
    rows = {r["id"]: {c: r[c] for c in COLUMNS} for r in got}
    if len(got) != len(table) or rows != table:
        raise RuntimeError(f"reclock {name}: the collection ({len(got)} rows) is not the table ({len(table)} rows)")
    shutil.rmtree(blob.root / name, ignore_errors=True)
    env.echo(f"  reclock {name}: " + ", ".join(f"{k} {v:.2f}s" for k, v in steps.items()))
    return total - steps.get("resume", 0.0)


def run_structured_streaming(env: Env, records: int, rep: int) -> float:
    """The Kafka source, the envelope parsed, into a Parquet file sink (``availableNow``)."""
    from pyspark.sql import functions as F

    from benchmarks.contenders import stream_to_parquet
    from reclock.batch import OffsetRange
    from reclock.sources.kafka.spark_job import CORRUPT, kafka_read_options
    from benchmarks.workload import end_offsets

    out = env.work / f"ss_{rep}"
    checkpoint = env.work / f"ss_{rep}_checkpoint"
    ranges = [OffsetRange(p, 0, end) for p, end in sorted(end_offsets(env.bootstrap, TOPIC).items()) if end > 0]
    opts = kafka_read_options(debezium_spec(out.name, env.bootstrap, records), env.bootstrap, ranges)
    opts.pop("endingOffsets")  # a stream reads to what is available when it starts
    after = ", ".join(f"{c.split()[0]}: {c.split()[1]}" for c in SCHEMA.split(", "))
    envelope = (f"before STRUCT<id: INT>, after STRUCT<{after}>, op STRING, "
                f"source STRUCT<lsn: BIGINT, txId: BIGINT, sequence: STRING>, ts_ms BIGINT, {CORRUPT} STRING")
    d = F.from_json(F.col("value").cast("string"), envelope,
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}).alias("_d")
    cols = [F.col("_d.op").alias("op"), *[F.col(f"_d.after.{c}").alias(c) for c in COLUMNS],
            F.col("_d.before.id").alias("before_id"), F.col("_d.source.lsn").alias("lsn"),
            F.col("_d.source.txId").alias("tx_id"), F.col(f"_d.{CORRUPT}").alias(CORRUPT)]
    stream = env.spark.readStream.format("kafka").options(**opts).load().select("key", d).select("key", *cols)
    seconds, rows = stream_to_parquet(stream, out, checkpoint, "structured streaming")
    if rows != records:
        raise RuntimeError(f"structured streaming wrote {rows} rows of {records} records")
    return seconds


def run(n: int, keys: int, reps: int, echo=print) -> dict:
    with services(echo) as env:
        records, table = fill(env.bootstrap, n, keys)
        echo(f"topic filled: {n} change events, {records} records (tombstones included), {len(table)} rows left")
        times = alternating({"reclock": lambda rep: run_reclock(env, records, table, rep),
                             "structured_streaming": lambda rep: run_structured_streaming(env, records, rep)},
                            reps, echo)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"events": n, "records": records, "keys": keys, "reps": reps, "seconds": times, "median_s": med,
              "records_per_s": {k: records / v for k, v in med.items()},
              "ratio": med["structured_streaming"] / med["reclock"]}
    echo(f"debezium envelope {records / med['reclock']:,.0f} records/s, structured streaming parse "
         f"{records / med['structured_streaming']:,.0f} records/s: {result['ratio']:.2f}x")
    return result


def cli(run, doc: str) -> None:
    """The command line of a benchmark over these events: ``run(events, keys, reps)``'s result printed as
    JSON; ``doc``'s first line describes it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what the run started
    print(json.dumps(run(args.events, args.keys, args.reps), indent=2))


def main() -> None:
    cli(run, __doc__)


if __name__ == "__main__":
    main()
