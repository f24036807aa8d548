"""Parts on S3 beside local parts: one Reclock cycle over the same backlog with its parts in a local folder,
on S3 through Reclock's direct committer (what the dev servers with S3 use), and on S3 through Hadoop's
FileOutputCommitter (what Spark does unless told otherwise), in one run, on one ``local[2]`` Spark Connect
server (issue 31 part 3: parts on S3 >= 0.8x local parts).

::

    .venv/bin/python -m benchmarks.s3_parts                       # 500k records, median of 5 (~6 min here)
    .venv/bin/python -m benchmarks.s3_parts --records 50000 --reps 1

    services up (a temporary folder): Postgres, Kafka, moto's S3 server (a separate process), a Spark Connect
    server on local[2] with the S3A jars (and Reclock's committer among them)
      |
      +-- data        one topic, the backlog (``--records`` ~200-byte JSON records, 8 partitions)
      +-- warm-up     ``--warm-ups`` untimed rounds of every configuration
      +-- throughput  per repetition, every configuration, in a rotating order: run_cycle on a new source over
      |               the whole backlog (one description, one Spark job of 8 tasks, 8 parts), timed from the
      |               cycle's start to the append's commit; moto's CPU seconds and requests meanwhile
      |                 local parts                  the baseline
      |                 S3 parts, direct committer   the figure
      |                 S3 parts, FileOutputCommitter what it was
    services down (always, also on Ctrl-C)

The S3 endpoint is moto's, a Python server on the same two cores: its CPU is taken from Spark here, where a
real store's cost would be network time; each request to it costs ~5-10 ms, so what matters is how many a
write makes (printed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from benchmarks import stop
from benchmarks.cluster import BenchEnv, run_config
from benchmarks.env import stop_services
from benchmarks.run import echo, settle
from benchmarks.workload import produce_backlog

CONFIGS = (("local", "local parts"), ("direct", "S3 parts, direct committer"),
           ("hadoop", "S3 parts, FileOutputCommitter"))


@contextlib.contextmanager
def services() -> Iterator[BenchEnv]:
    """Postgres, Kafka, moto and a ``local[2]`` Spark Connect server with S3, under a new temporary folder;
    all stopped and the folder removed when the block ends."""
    from pyspark.sql import SparkSession

    from reclock.dev.kafka import LocalKafka
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.s3 import LocalS3
    from reclock.dev.spark import LocalSparkConnect
    from reclock.dev.state import StackState
    from reclock.persist.migrate import migrate

    saved = dict(os.environ)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    root = Path(tempfile.mkdtemp(prefix="reclock-bench-s3parts-"))
    root.chmod(0o755)
    os.environ["RECLOCK_HOME"] = str(root / "stack")
    state = StackState(root / "stack")
    pg, kafka, s3 = LocalPostgres(state, fast=True), LocalKafka(state, heap="1g"), LocalS3(state)
    local = LocalSparkConnect(state, master="local[2]", driver_memory="2g", name="bench_local", s3=s3.settings())
    stops: list[tuple[str, Callable[[], object]]] = []
    session = None
    try:
        for name, service, stop in (("postgres", pg, pg.stop), ("kafka", kafka, kafka.stop), ("s3", s3, s3.stop),
                                    ("local[2] connect", local, local.stop)):
            stops.insert(0, (name, stop))
            echo(f"services: {name} up ({service.start():.1f}s)")
        migrate(pg.dsn())
        session = SparkSession.builder.remote(local.url).create()
        yield BenchEnv(root, pg, kafka, s3, {"local[2]": session})
    finally:
        if session is not None:
            session.stop()
        stop_services(stops, echo)
        shutil.rmtree(root, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


def run(env: BenchEnv, backlog, config: str, tag: str) -> tuple[float, dict[str, float], int]:
    """One cycle of ``config``: its seconds, its steps' seconds (and moto's CPU), and moto's requests."""
    from reclock.spark.jobs import PARTS_COMMITTER_CONF

    env.sessions["local[2]"].conf.set(PARTS_COMMITTER_CONF, "hadoop" if config == "hadoop" else "direct")
    lines = env.s3.log.read_text(errors="replace").count("\n")
    seconds, steps = run_config(env, backlog, "local[2]", "local" if config == "local" else "s3", f"{config}{tag}")
    requests = env.s3.log.read_text(errors="replace").count("\n") - lines
    return seconds, steps, requests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.s3_parts", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000, help="records in the backlog (default 500,000)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions of every configuration (default 5)")
    ap.add_argument("--warm-ups", type=int, default=2, help="untimed rounds of every configuration first")
    args = ap.parse_args(argv)
    stop.install()
    started = time.perf_counter()
    runs: dict[str, list[tuple[float, dict[str, float], int]]] = {c: [] for c, _ in CONFIGS}
    loads = []
    with services() as env:
        backlog = produce_backlog(env.kafka.bootstrap, "base", "bench_s3_parts", args.records)
        echo(f"data: {backlog.records:,} records, {backlog.megabytes:.0f} MB over {len(backlog.ends)} partitions")
        for warm in range(args.warm_ups):
            for config, label in CONFIGS:
                seconds, _, _ = run(env, backlog, config, f"w{warm}")
                echo(f"warm-up: {label:31s} {seconds:.2f}s (untimed)")
        order = list(CONFIGS)
        for rep in range(args.reps):
            for config, label in order[rep % len(order):] + order[:rep % len(order)]:
                settle(env, backlog)
                loads.append(os.getloadavg()[0])
                seconds, steps, requests = run(env, backlog, config, f"r{rep}")
                runs[config].append((seconds, steps, requests))
                echo(f"rep {rep + 1}/{args.reps} {label:31s} {backlog.records / seconds:>10,.0f} rec/s ({seconds:.2f}s: "
                     + ", ".join(f"{k} {v:.2f}s" for k, v in steps.items() if k != "resume") + f", {requests} requests)")
    median = {c: statistics.median(s for s, _, _ in r) for c, r in runs.items()}
    write = {c: statistics.median(st.get("write_batches", 0.0) for _, st, _ in r) for c, r in runs.items()}
    moto = {c: statistics.median(st["s3_cpu"] for _, st, _ in r) for c, r in runs.items()}
    reqs = {c: statistics.median(n for _, _, n in r) for c, r in runs.items()}
    print(f"\none cycle, {args.records:,} JSON records, 8 parts, local[2] over Spark Connect, median of {args.reps} "
          f"(load average during the runs {min(loads):.1f}-{max(loads):.1f}, run {time.perf_counter() - started:.0f}s)")
    print(f"{'parts':31s} {'records/s':>11s} {'seconds':>8s} {'write_batches':>14s} {'S3 requests':>12s} "
          f"{'moto CPU':>9s} {'vs local':>9s}")
    for config, label in CONFIGS:
        print(f"{label:31s} {args.records / median[config]:>11,.0f} {median[config]:>8.2f} {write[config]:>13.2f}s "
              f"{reqs[config]:>12.0f} {moto[config]:>8.2f}s {median['local'] / median[config]:>8.2f}x")
    print(f"\nS3 parts (direct committer) / local parts = {median['local'] / median['direct']:.2f}  (target >= 0.8)")
    print(f"S3 parts (FileOutputCommitter) / local parts = {median['local'] / median['hadoop']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
