"""Avro through the Schema Registry: Reclock's decode of Confluent wire-format records beside Spark's own
``from_avro`` over the same records with the header stripped, in the same run.

A topic of ``n`` Avro records (~90 bytes of payload: an order with ids, an amount, a country, a note) in
the wire format, written by the subject's current writer (version 2 of 2: version 1 lacks ``note``),
registered in a real registry (``reclock.dev.registry``). Contenders, alternating which goes first, each a
Spark job over the whole topic on ``local[2]`` with the same Kafka options, into Spark's ``noop`` sink:

- ``registry``: ``reclock.registry_plan.avro_plan`` (the subject's versions asked of the registry, each
  writer checked against the reader) and ``reclock.spark.registry_decode.avro_decoded``: a branch per writer
  on the header's bytes, ``from_avro`` of the payload with the reader schema, a reason per bad record; the
  decoded columns and the reason are written;
- ``from_avro``: ``from_avro(substring(value, 6), <the writer schema>)``: the header stripped by hand and the
  one schema known beforehand (what a Spark user writes when every record is known to have one writer);
  the decoded columns are written.

The figure is the ratio of their median times (``from_avro`` / ``registry``: above 1.0x Reclock is faster).

Run: ``.venv/bin/python -m benchmarks.registry_decode --records 2000000 --reps 5`` (under the bench lock).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time

import fastavro

from benchmarks import stop
from benchmarks.env import alternating, services

V1 = {"type": "record", "name": "order", "namespace": "bench",
      "fields": [{"name": "id", "type": "long"}, {"name": "customer", "type": "long"},
                 {"name": "amount", "type": "double"}, {"name": "country", "type": "string"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}
PARTITIONS = 4
COUNTRIES = ("DE", "FR", "NL", "PL", "SE", "US")


def fill(bootstrap: str, topic: str, schema_id: int, n: int) -> None:
    from benchmarks.workload import create_topic, end_offsets, fast_producer
    from reclock.wire import encode

    create_topic(bootstrap, topic, PARTITIONS)
    parsed = fastavro.parse_schema(V2)
    producer = fast_producer(bootstrap)
    buf = io.BytesIO()
    for i in range(n):
        buf.seek(0)
        buf.truncate()
        fastavro.schemaless_writer(buf, parsed, {"id": i, "customer": i % 50_000, "amount": (i * 7919) % 100_000 / 100,
                                                 "country": COUNTRIES[i % len(COUNTRIES)],
                                                 "note": None if i % 3 else "a note of some forty bytes, give or take"})
        value = encode(schema_id, buf.getvalue())
        try:
            producer.produce(topic, value, partition=i % PARTITIONS)
        except BufferError:
            producer.poll(0.1)
            producer.produce(topic, value, partition=i % PARTITIONS)
        if i % 50_000 == 0:
            producer.poll(0)
    if producer.flush(600) != 0:
        raise RuntimeError("records still queued after 10 minutes")
    if sum(end_offsets(bootstrap, topic).values()) != n:
        raise RuntimeError(f"topic {topic}: the end offsets do not add up to {n}")


def run(n: int, reps: int, echo=print) -> dict:
    from pyspark.sql.avro.functions import from_avro

    from reclock.dev.registry import LocalRegistry
    from reclock.registry_plan import avro_plan
    from reclock.schema_registry import RegistryClient
    from reclock.spark.registry_decode import avro_decoded

    with services(echo) as env:
        registry = LocalRegistry(env.state)
        echo(f"registry up ({registry.start():.1f}s)")
        try:
            client = RegistryClient(registry.settings())
            client.register("bench-value", json.dumps(V1))
            v2 = client.register("bench-value", json.dumps(V2))
            fill(env.bootstrap, "bench", v2, n)
            echo(f"topic filled: {n} records")
            spark = env.spark
            opts = {"kafka.bootstrap.servers": env.bootstrap, "subscribe": "bench", "startingOffsets": "earliest",
                    "endingOffsets": "latest", "kafka.fetch.max.wait.ms": "10"}

            def registry_job() -> None:
                plan = avro_plan(client, json.dumps(V2), "bench-value")
                df = avro_decoded(spark.read.format("kafka").options(**opts).load(), plan)
                df.select("_d.id", "_d.customer", "_d.amount", "_d.country", "_d.note", "_reason") \
                    .write.format("noop").mode("overwrite").save()

            def from_avro_job() -> None:
                df = spark.read.format("kafka").options(**opts).load()
                df = df.select(from_avro(df["value"].substr(6, 1 << 30), json.dumps(V2)).alias("_d"))
                df.select("_d.id", "_d.customer", "_d.amount", "_d.country", "_d.note") \
                    .write.format("noop").mode("overwrite").save()

            # correctness first: the same rows, and no reason on any record
            ours = avro_decoded(spark.read.format("kafka").options(**opts).load(),
                                avro_plan(client, json.dumps(V2), "bench-value"))
            bad = ours.filter("_reason IS NOT NULL").count()
            if bad:
                raise RuntimeError(f"{bad} records did not decode")
            def timed(job):
                def run(_rep: int) -> float:
                    t0 = time.perf_counter()
                    job()
                    return time.perf_counter() - t0
                return run

            times = alternating({"registry": timed(registry_job), "from_avro": timed(from_avro_job)}, reps, echo)
        finally:
            registry.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"records": n, "reps": reps, "median_s": med,
              "records_per_s": {k: n / v for k, v in med.items()},
              "ratio": med["from_avro"] / med["registry"]}
    echo(f"registry decode {n / med['registry']:,.0f} records/s, from_avro {n / med['from_avro']:,.0f} records/s: "
         f"{result['ratio']:.2f}x")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    print(json.dumps(run(args.records, args.reps), indent=2))


if __name__ == "__main__":
    main()
