"""Sink throughput: the exactly-once Kafka sink against a plain idempotent, non-transactional producer
writing the same messages, on the same broker, in the same run.

The collection is written straight into a shard (Parquet parts appended with ``compare_and_append``, no
Spark): ``n`` rows of ~200 bytes of JSON over ``timestamps`` times. Contenders:

- ``sink``: a fresh ``KafkaSink``: ``start`` (fence, read the progress topic, check the target topic, take
  the read hold; timed apart as ``sink_start``), then ``step``, the throughput: read the parts,
  consolidate, encode column-at-a-time, produce in transactions (budget ``max_messages``) with the
  progress record, commit;
- ``plain producer``: the same messages (key, value, ``reclock.ts`` header; encoded before the clock
  starts) through an idempotent producer with the same linger, batch and compression settings, then
  ``flush``.

Run alone: ``.venv/bin/python -m benchmarks.sink_bench --messages 1000000 --reps 3``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks import stop


SINK_TARGET = 0.9
"""The sink's throughput over the plain producer's (issue 19; 0.7 before)."""


DATA_SHAPES = ("uniform", "varied")
"""``uniform``: 997 customers and one 120-byte note repeated (what earlier figures used: strings a Parquet
writer keeps as tiny dictionaries); ``varied``: 200,000 customers and notes of 5-25 random words (60-250
bytes, nearly all distinct), as free text is."""


def build_collection(dsn: str, blob_root: Path, shard: str, n: int, timestamps: int, data: str = "uniform") -> None:
    """A shard holding ``n`` insertions spread over ``timestamps`` times, as a handful of Parquet parts, of
    the ``data`` shape (:data:`DATA_SHAPES`)."""
    import numpy as np

    from reclock.batch import BatchDescription, Part
    from reclock.persist import connect
    from reclock.persist.shards import Append, compare_and_append, register_shard

    per_ts = max(1, n // timestamps)
    ids = pa.array(range(n), pa.int64())
    ts = pa.array([1_000 + i // per_ts for i in range(n)], pa.int64())
    if data == "uniform":
        customer = pa.array([f"customer-{i % 997:04d}" for i in range(n)])
        note = pa.array(["x" * 120] * n)
    else:
        rng = np.random.default_rng(7)
        words = np.array([f"w{k:x}" for k in rng.integers(0, 1 << 20, 4096)] + ["order", "late", "gift", "rush"])
        customer = pa.array([f"customer-{k:06d}" for k in rng.integers(0, 200_000, n)])
        counts = rng.integers(5, 26, n)
        picks = words[rng.integers(0, len(words), int(counts.sum()))].tolist()
        ends = np.cumsum(counts).tolist()
        note = pa.array([" ".join(picks[e - c:e]) for e, c in zip(ends, counts.tolist())])
    table = pa.table({"id": ids, "customer": customer,
                      "amount": pa.array([round((i * 7919 % 100_000) / 100, 2) for i in range(n)]),
                      "note": note, "ts": ts, "diff": pa.array([1] * n, pa.int64())})
    lo, hi = 1_000, 1_000 + (n - 1) // per_ts + 1
    rel = f"{shard}/part-0.parquet"
    (blob_root / shard).mkdir(parents=True, exist_ok=True)
    pq.write_table(table, blob_root / rel, row_group_size=256_000)
    with connect(dsn) as conn:
        register_shard(conn, shard)
        compare_and_append(conn, [Append(shard, BatchDescription(0, hi),
                                         (Part(rel, n, (blob_root / rel).stat().st_size, lo, hi - 1),))])


def run_sink_benchmark(dsn: str, bootstrap: str, workdir: Path, n: int, reps: int,
                       echo: Callable[[str], None] = print) -> dict:
    """Figures ``{name: {unit, values}}`` for the sink and the plain producer (messages/s), and the ratio."""
    from confluent_kafka import Producer

    from reclock.config import KafkaSpec, SinkBudget, SinkSpec
    from reclock.persist.blob import LocalBlobStore
    from reclock.sinks.encode import encode_updates
    from reclock.sinks.kafka import KafkaSink, SinkContext, consolidate
    from reclock.read import read_updates
    from reclock.persist import connect

    blob_root = workdir / "sink-blobs"
    shard = f"sinkbench_{uuid.uuid4().hex[:8]}"
    build_collection(dsn, blob_root, shard, n, timestamps=50)
    blob = LocalBlobStore(blob_root)
    sink_rates, plain_rates, starts = [], [], []
    common = {"linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
              "compression.type": "lz4", "enable.idempotence": True, "acks": "all"}
    with connect(dsn) as conn:
        table = consolidate(read_updates(conn, blob, shard))

    def run_sink(rep: int) -> float:
        spec = SinkSpec(name=f"{shard}_{rep}", collection=shard,
                        kafka=KafkaSpec(topic=f"{shard}_sink_{rep}", bootstrap=bootstrap),
                        progress_topic=f"_progress_{shard}", budget=SinkBudget())  # the default budget
        sink = KafkaSink(SinkContext(spec=spec, dsn=dsn, kafka=bootstrap, blob=blob))
        t0 = time.perf_counter()
        sink.start()  # fence, read the progress topic, check the target, take the read hold
        t1 = time.perf_counter()
        result = sink.step()  # read the parts, consolidate, encode, produce in transactions, commit
        sink_s = time.perf_counter() - t1
        assert result.messages == n, result
        sink_rates.append(n / sink_s)
        starts.append(t1 - t0)
        return sink_s

    def run_plain(rep: int) -> float:
        topic = f"{shard}_plain_{rep}"
        _create_topic(bootstrap, topic)
        producer = Producer({"bootstrap.servers": bootstrap, **common})
        t0 = time.perf_counter()
        produce = producer.produce
        headers, last = None, None
        for ts, k, v in msgs:  # the same messages: key, value and the reclock.ts header
            if ts != last:
                headers, last = [("reclock.ts", str(ts).encode())], ts
            try:
                produce(topic, v, k, headers=headers)
            except BufferError:
                producer.poll(0.05)
                produce(topic, v, k, headers=headers)
        producer.flush(120)
        plain_s = time.perf_counter() - t0
        plain_rates.append(n / plain_s)
        return plain_s

    msgs = encode_updates(SinkSpec(name="plain", collection=shard, kafka=KafkaSpec(topic="-", bootstrap=bootstrap),
                                   progress_topic="-"), table)
    for rep in range(reps):  # each repetition starts with the other contender than the last
        order = [run_sink, run_plain] if rep % 2 == 0 else [run_plain, run_sink]
        took = {fn: fn(rep) for fn in order}
        echo(f"  sink rep {rep + 1}: sink {n / took[run_sink]:,.0f} msg/s ({took[run_sink]:.2f}s, "
             f"start {starts[-1]:.2f}s), plain producer {n / took[run_plain]:,.0f} msg/s "
             f"({took[run_plain]:.2f}s){'' if rep % 2 == 0 else ', plain first'}")
    ratio = statistics.median(sink_rates) / statistics.median(plain_rates)
    return {"sink_throughput": {"unit": "messages/s", "values": sink_rates},
            "plain_producer_throughput": {"unit": "messages/s", "values": plain_rates},
            "sink_start": {"unit": "s", "values": starts},
            "sink_vs_plain_producer": {"value": ratio, "target": SINK_TARGET}}


def _create_topic(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, -1)])[topic].result(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    from reclock.dev.kafka import LocalKafka
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.state import StackState
    from reclock.persist.migrate import migrate

    root = Path(tempfile.mkdtemp(prefix="reclock-sinkbench-"))
    os.chmod(root, 0o755)
    state = StackState(root)
    pg, kafka = LocalPostgres(state, fast=True), LocalKafka(state, heap="1g")
    try:
        pg.start()
        kafka.start()
        migrate(pg.dsn())
        figures = run_sink_benchmark(pg.dsn(), kafka.bootstrap, root, args.messages, args.reps)
        for name, f in figures.items():
            if "values" in f:
                print(f"{name}: median {statistics.median(f['values']):,.0f} {f['unit']}")
            else:
                print(f"{name}: {f['value']:.2f} (target >= {f['target']})")
    finally:
        kafka.stop()
        pg.stop()


if __name__ == "__main__":
    main()
