"""Ingest throughput beyond one machine: a Reclock cycle on a two-worker Spark standalone cluster with its
parts on an S3 endpoint, beside ``local[2]`` with local parts, in one run; and what the difference is made of.

::

    .venv/bin/python -m benchmarks.cluster                       # 500k records, median of 3 (~15 min here)
    .venv/bin/python -m benchmarks.cluster --records 50000 --reps 1

    services up (a temporary folder): Postgres, Kafka, moto's S3 server (one bucket), two Spark Connect
    servers: `local[2]`, and a standalone cluster (a master, 2 workers of 1 core and 1g, an executor each);
    both servers carry the same settings, the Kafka and S3A jars and the S3 keys
      |
      +-- data        one topic, the backlog (``--records`` ~200-byte JSON records, 8 partitions)
      +-- warm-up     two untimed rounds of every configuration (JIT, S3A's first use, the executors' jars)
      +-- throughput  per repetition, every configuration (each round starts at the next one):
      |               run_cycle on a new source over the whole backlog (one description, one Spark job of
      |               8 tasks), timed from the cycle's start to the append's commit -> records/s, and the
      |               CPU seconds moto's server used meanwhile
      |                 local[2] + local parts     the baseline
      |                 local[2] + S3 parts        what S3A (and s3fs collecting the parts) costs alone
      |                 cluster  + local parts     what the cluster (executors in other JVMs) costs alone
      |                 cluster  + S3 parts        the figure
    services down (always, also on Ctrl-C)

Both sides go through Spark Connect (the way cycles reach Spark in production), so the ratio holds the
cluster and S3 and nothing else. It is not part of ``benchmarks.run`` (whose contenders share one
in-process ``local[2]`` session); run it beside it. The S3 endpoint is moto's, a Python server on the
same two cores: its cost is CPU taken from Spark here, where a real store's would be network time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from benchmarks import stop
from benchmarks.contenders import committed_records, source_spec, step_seconds
from benchmarks.env import stop_services
from benchmarks.run import echo, settle
from benchmarks.workload import Backlog, produce_backlog

CONFIGS = (("local[2]", "local"), ("local[2]", "s3"), ("cluster", "local"), ("cluster", "s3"))


@dataclass
class BenchEnv:
    """What :func:`settle` and the runs need: the services and one Spark Connect session per server."""

    root: Path
    postgres: object
    kafka: object
    s3: object
    sessions: dict[str, object]  # "local[2]" | "cluster" -> a Spark Connect session


@contextlib.contextmanager
def cluster_services(workers: int = 2) -> Iterator[BenchEnv]:
    """Postgres, Kafka, moto, a ``local[2]`` Connect server and a standalone cluster with its Connect
    server, under a new temporary folder; all stopped and the folder removed when the block ends."""
    from pyspark.sql import SparkSession

    from reclock.dev.cluster import LocalSparkCluster
    from reclock.dev.kafka import LocalKafka
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.s3 import LocalS3
    from reclock.dev.spark import LocalSparkConnect
    from reclock.dev.state import StackState
    from reclock.persist.migrate import migrate

    saved = dict(os.environ)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    root = Path(tempfile.mkdtemp(prefix="reclock-bench-cluster-"))
    root.chmod(0o755)  # the postgres user must reach the cluster's files
    os.environ["RECLOCK_HOME"] = str(root / "stack")
    state = StackState(root / "stack")
    pg, kafka, s3 = LocalPostgres(state, fast=True), LocalKafka(state, heap="1g"), LocalS3(state)
    local = LocalSparkConnect(state, master="local[2]", driver_memory="2g", name="bench_local", s3=s3.settings())
    cluster = LocalSparkCluster(state, workers=workers, s3=s3.settings())
    stops: list[tuple[str, Callable[[], object]]] = []
    sessions: dict[str, object] = {}
    try:
        for name, service, stop in (("postgres", pg, pg.stop), ("kafka", kafka, kafka.stop), ("s3", s3, s3.stop),
                                    ("local[2] connect", local, local.stop), ("cluster", cluster, cluster.stop)):
            stops.insert(0, (name, stop))
            echo(f"services: {name} up ({service.start():.1f}s)")
        migrate(pg.dsn())
        for key, url in (("local[2]", local.url), ("cluster", cluster.url)):
            sessions[key] = SparkSession.builder.remote(url).create()  # one per server (getOrCreate shares one)
        yield BenchEnv(root, pg, kafka, s3, sessions)
    finally:
        for session in sessions.values():
            session.stop()
        stop_services(stops, echo)
        shutil.rmtree(root, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


def run_config(env: BenchEnv, backlog: Backlog, spark: str, parts: str, tag: str) -> tuple[float, dict[str, float]]:
    """``run_cycle`` on a new source over ``backlog`` with ``spark``'s session and parts on ``parts``; the
    seconds from the cycle's start to the append's commit, and the steps' seconds plus ``s3_cpu``: the CPU
    seconds moto's server spent meanwhile (CPU this machine's Spark did not get). Its parts are removed."""
    import psutil

    moto = psutil.Process(int(env.s3.pidfile.read_text()))
    cpu0 = sum(moto.cpu_times()[:2])
    from reclock.cycle import CycleContext, run_cycle
    from reclock.persist.blob import LocalBlobStore, blob_store_from_url

    name = f"b_{'cl' if spark == 'cluster' else 'lo'}_{parts}_{tag}"
    if parts == "s3":
        blob = blob_store_from_url(env.s3.url("bench"), env.s3.settings())
    else:
        blob = LocalBlobStore(env.root / "blobs")
    session = env.sessions[spark]
    dsn, bootstrap = env.postgres.dsn(), env.kafka.bootstrap
    ctx = CycleContext(spec=source_spec(name, backlog, bootstrap), dsn=dsn, upstream=bootstrap, blob=blob,
                       spark_factory=lambda: session)
    t0 = time.perf_counter()
    out = run_cycle(ctx)
    total = time.perf_counter() - t0
    steps, _ = step_seconds(dsn, name)
    steps["s3_cpu"] = sum(moto.cpu_times()[:2]) - cpu0
    if out["descriptions"] != 1 or committed_records(dsn, name) != backlog.records:
        raise RuntimeError(f"{name}: expected one description of {backlog.records} records, got {out}")
    for b in blob.list(name):
        blob.delete(b.path)
    return total - steps.get("resume", 0.0), steps


def label(spark: str, parts: str) -> str:
    return f"{spark} + {'S3' if parts == 's3' else 'local'} parts"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000, help="records in the backlog (default 500,000)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every configuration (default 3)")
    ap.add_argument("--warm-ups", type=int, default=2,
                    help="untimed rounds of every configuration first (default 2: after one, every configuration's "
                         "first timed run was still 1.5-2x slower than its later ones)")
    args = ap.parse_args(argv)
    stop.install()
    started = time.perf_counter()
    runs: dict[tuple[str, str], list[tuple[float, dict[str, float]]]] = {c: [] for c in CONFIGS}
    with cluster_services() as env:
        t0 = time.perf_counter()
        backlog = produce_backlog(env.kafka.bootstrap, "base", "bench_cluster", args.records)
        echo(f"data: {backlog.records:,} records, {backlog.megabytes:.0f} MB over {len(backlog.ends)} partitions "
             f"in {time.perf_counter() - t0:.1f}s")
        for warm in range(args.warm_ups):
            for spark, parts in CONFIGS:
                seconds, _ = run_config(env, backlog, spark, parts, f"warm{warm}")
                echo(f"warm-up: {label(spark, parts):25s} {seconds:.2f}s (untimed)")
        for rep in range(args.reps):
            for spark, parts in CONFIGS[rep % len(CONFIGS):] + CONFIGS[:rep % len(CONFIGS)]:
                settle(env, backlog)
                seconds, steps = run_config(env, backlog, spark, parts, str(rep))
                runs[(spark, parts)].append((seconds, steps))
                echo(f"rep {rep + 1}/{args.reps} {label(spark, parts):25s} {backlog.records / seconds:>10,.0f} rec/s "
                     f"({seconds:.2f}s: " + ", ".join(f"{k} {v:.2f}s" for k, v in steps.items() if k != "resume")
                     + ")")
    median = {c: statistics.median(s for s, _ in r) for c, r in runs.items()}
    rate = {c: args.records / s for c, s in median.items()}
    write = {c: statistics.median(st.get("write_batches", 0.0) for _, st in r) for c, r in runs.items()}
    moto = {c: statistics.median(st["s3_cpu"] for _, st in r) for c, r in runs.items()}
    print(f"\ningest throughput, {args.records:,} JSON records, median of {args.reps} "
          f"(load average {os.getloadavg()[0]:.1f}, run {time.perf_counter() - started:.0f}s)")
    print(f"{'configuration':27s} {'records/s':>11s} {'seconds':>8s} {'write_batches':>14s} {'moto CPU':>9s} "
          f"{'vs baseline':>12s}")
    base = ("local[2]", "local")
    for c in CONFIGS:
        print(f"{label(*c):27s} {rate[c]:>11,.0f} {median[c]:>8.2f} {write[c]:>13.2f}s {moto[c]:>8.2f}s "
              f"{rate[c] / rate[base]:>11.2f}x")
    target = ("cluster", "s3")
    print(f"\ncluster + S3 parts / local[2] + local parts = {rate[target] / rate[base]:.2f}")
    print(f"  S3 alone (local[2]):     {rate[('local[2]', 's3')] / rate[base]:.2f}   "
          f"cluster alone (local parts): {rate[('cluster', 'local')] / rate[base]:.2f}   "
          f"S3 on the cluster: {rate[target] / rate[('cluster', 'local')]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
