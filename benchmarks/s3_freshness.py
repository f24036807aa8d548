"""Freshness of an S3 source under the real Airflow scheduler with S3 event notifications through SQS, and
Spark's file stream source beside it.

    python -m benchmarks.s3_freshness [--seconds 120] [--rate 2] [--records 50]

The full local stack (``benchmarks.freshness.bench_stack``: Postgres, moto's S3 + SQS server, a warm Spark
Connect server, Airflow's scheduler, API server, DAG processor and triggerer) in a temporary folder, with
one source ``fresh_s3``: ``discovery: notifications`` (the bucket's ``ObjectCreated`` events for ``fresh/``
go to the SQS queue ``fresh-events``) and ``schedule: upstream`` (the triggerer's ``ObjectsArrived`` watcher
long-polls the queue and fires the moment a message arrives). Then:

1. **Reclock**: ``ingest__fresh_s3`` unpaused; after its first cycle and a warm-up of :data:`WARM_S`
   seconds (untimed), ``rate`` objects a second of ``records`` JSON lines each (every record carries its
   upload time in ``created_ms``) are uploaded for ``seconds``; a watcher polls the shard's upper every
   0.1 s and takes each new record's upload -> visible latency (what a read AS OF the new upper - 1 adds).
   p50 and p95; target p50 <= 2 s. The cycle's time split (scheduler gaps, task overhead, Spark,
   Postgres and S3) from the runs' task instances and the steps' statistics.
2. **Spark's file stream source**, the same workload, in a local[2] session of this process reading the
   same bucket through S3A with ``trigger(processingTime="1 second")``, writing Parquet; a record is visible
   when the sink's ``_spark_metadata`` log lists its file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from benchmarks import stop
from benchmarks.freshness import (ShardWatcher, SinkLogWatcher, _pause, _percentile, _wait_first_cycle, bench_stack,
                                  cycle_split)
from benchmarks.workload import SCHEMA, record

SOURCE = "fresh_s3"
BUCKET = "landing"
PREFIX = "fresh/"
QUEUE = "fresh-events"
WARM_S = 20.0
TARGET_P50_S = 2.0


def echo(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def _now_ms() -> int:
    return int(time.time() * 1000)


class Uploader(threading.Thread):
    """``rate`` objects a second, ``records`` lines each, under a time-ordered key, for ``seconds``."""

    def __init__(self, client, seconds: float, rate: float, records: int, start: int = 0) -> None:
        super().__init__(name="uploader", daemon=True)
        self.client, self.seconds, self.rate, self.records = client, seconds, rate, records
        self.n, self.objects, self.produced = start, 0, 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < self.seconds:
                now = _now_ms()
                body = b"".join(record(self.n + i, now) + b"\n" for i in range(self.records))
                self.client.put_object(Bucket=BUCKET, Key=f"{PREFIX}{time.strftime('%Y/%m/%d/%H%M%S')}-{self.n}.json",
                                       Body=body)
                self.n += self.records
                self.objects += 1
                self.produced += self.records
                time.sleep(max(0.0, t0 + self.objects / self.rate - time.monotonic()))
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self.failure = e


def measure(client, watcher, seconds: float, rate: float, records: int, start: int, drain_s: float = 90.0
            ) -> tuple[list[float], int, int]:
    """Upload for ``seconds`` while polling ``watcher``; the latencies of the records uploaded in the window."""
    t0 = _now_ms()
    up = Uploader(client, seconds, rate, records, start)
    up.start()
    latencies: list[float] = []
    deadline = None
    last = time.monotonic()
    while True:
        seen, created = watcher()
        latencies += [(seen - c) / 1000 for c in created if c >= t0]
        if not up.is_alive():
            if up.failure is not None:
                raise RuntimeError(f"uploader failed: {up.failure}") from up.failure
            deadline = deadline or time.monotonic() + drain_s
            if len(latencies) >= up.produced or time.monotonic() > deadline:
                break
        if time.monotonic() - last > 10:
            last = time.monotonic()
            p50 = statistics.median(latencies) if latencies else float("nan")
            echo(f"  {up.produced:,} uploaded, {len(latencies):,} visible, p50 so far {p50:.2f}s")
        time.sleep(0.1)
    return latencies, up.produced, up.n


def file_stream(root: Path, settings, client, seconds: float, rate: float, records: int, start: int) -> tuple:
    """Spark's file stream source over the same prefix (S3A), processingTime 1 s, the same workload."""
    from reclock.dev.jars import spark_kafka_jars, spark_s3a_jars
    from reclock.dev.spark import LOOPBACK_CONF
    from reclock.dev.state import StackState
    from reclock.persist.objectstore import jvm_env, spark_s3a_conf
    from reclock.spark.session import driver_session

    state = StackState(root / "peer")
    os.environ.update(jvm_env(settings))
    conf = {**LOOPBACK_CONF, "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
            **spark_s3a_conf(settings), "spark.jars": ",".join(spark_kafka_jars(state) + spark_s3a_jars(state))}
    spark = driver_session("local[2]", "reclock-s3-freshness-peer", conf)
    out, chk = root / "ss-out", root / "ss-chk"
    try:
        q = (spark.readStream.schema(SCHEMA).json(f"s3a://{BUCKET}/{PREFIX}*/*/*/")
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(chk))
             .trigger(processingTime="1 second").start())
        watcher = SinkLogWatcher(out)
        measure(client, watcher, WARM_S, rate, records, start)
        echo(f"file stream source: uploading {rate:g} objects/s for {seconds:.0f}s")
        latencies, produced, _ = measure(client, watcher, seconds, rate, records, start + 10_000_000)
        q.stop()
        return latencies, produced
    finally:
        spark.stop()


def run(seconds: float, rate: float, records: int) -> dict:
    sources = {SOURCE: {"s3": {"connection": "reclock_s3", "url": f"s3://{BUCKET}/{PREFIX}",
                               "discovery": "notifications", "queue": QUEUE},
                        "format": {"type": "json", "schema": SCHEMA}, "schedule": "upstream", "poll": "200ms"}}
    dag_id = f"ingest__{SOURCE}"
    out: dict = {}
    with bench_stack("reclock-bench-s3fresh-", "s3 freshness", sources, echo) as (root, stack):
        echo("s3 freshness: bringing the stack up (Postgres, S3 + SQS, Spark Connect, Airflow) ...")
        stack.up(services=("postgres", "s3", "spark", "airflow"), echo=lambda line: echo(f"  {line}"))
        stack.s3.create_bucket(BUCKET)
        _, arn = stack.s3.queue(QUEUE)
        stack.s3.notify(BUCKET, PREFIX, arn)
        client = stack.s3.client()
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}0000/seed.json", Body=record(0, _now_ms()) + b"\n")
        stack.airflow.wait_for_dag(dag_id, timeout=180)
        stack.airflow.unpause(dag_id)
        _wait_first_cycle(stack.postgres.dsn(), source=SOURCE)
        watcher = ShardWatcher(stack.postgres.dsn(), stack.state.root / "blobs", SOURCE)
        echo(f"s3 freshness: {dag_id} runs on the queue's messages; warming up for {WARM_S:.0f}s")
        _, _, n = measure(client, watcher, WARM_S, rate, records, 1)
        echo(f"s3 freshness: uploading {rate:g} objects/s of {records} records for {seconds:.0f}s")
        from datetime import datetime

        since = datetime.now().astimezone()
        latencies, produced, n = measure(client, watcher, seconds, rate, records, n)
        watcher.conn.close()
        _pause(stack.airflow, dag_id)
        if not latencies:
            raise RuntimeError("no uploaded record became visible")
        out["reclock"] = {"p50": _percentile(latencies, 0.5), "p95": _percentile(latencies, 0.95),
                          "visible": len(latencies), "produced": produced}
        cycles = cycle_split(stack.airflow, stack.postgres.dsn(), dag_id, since, source=SOURCE)
        if cycles:
            out["cycle_split_median"] = {k: statistics.median(c[k] for c in cycles) for k in cycles[0]}
            out["cycles"] = len(cycles)
        echo(f"s3 freshness: reclock p50 {out['reclock']['p50']:.2f}s, p95 {out['reclock']['p95']:.2f}s over "
             f"{len(latencies):,} records; cycle split (median) {out.get('cycle_split_median')}")
        latencies, produced = file_stream(root, stack.s3.settings(), client, seconds, rate, records, n)
        out["file_stream"] = {"p50": _percentile(latencies, 0.5) if latencies else None,
                              "p95": _percentile(latencies, 0.95) if latencies else None,
                              "visible": len(latencies), "produced": produced}
        echo(f"s3 freshness: file stream source p50 {out['file_stream']['p50']}s, p95 {out['file_stream']['p95']}s")
        met = out["reclock"]["p50"] <= TARGET_P50_S
        echo(f"s3 freshness: reclock p50 {out['reclock']['p50']:.2f}s (target <= {TARGET_P50_S:g}s: "
             f"{'met' if met else 'NOT met'})")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.s3_freshness", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--rate", type=float, default=2.0, help="objects a second")
    p.add_argument("--records", type=int, default=50, help="records an object")
    a = p.parse_args(argv)
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    print(json.dumps(run(a.seconds, a.rate, a.records), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
