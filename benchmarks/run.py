"""The benchmark harness: every contender in one run, on the same topics, Spark settings and decode.

It ends with a table of figures and target checks.

::

    .venv/bin/python -m benchmarks.run --size quick --reps 1          # a few minutes
    .venv/bin/python -m benchmarks.run --size standard --reps 3 --freshness

    services up (Postgres, Kafka, one local[2] Spark session; a temporary folder)
      |
      +-- data       one topic per backlog (small, base = 1x, large), 8 partitions, ~200-byte JSON records
      +-- warm-up    one untimed run of every contender on the base backlog
      +-- throughput for each backlog, each repetition: reclock (run_cycle), reclock_dag_test (dag.test()),
      |              structured_streaming (availableNow), spark_batch, kafka_consumer  -> records/s, MB/s,
      |              peak RSS (this process + the Spark JVM) -> Reclock / SS >= 1.0, Reclock / bare >= 0.9,
      |              Reclock's peak memory at the large backlog / at 1x <= 1.2
      +-- overhead   cycles over 100 records: total and per step (target <= 3 s)
      +-- state      N cycles with compaction on: remap and batch rows at N/2 and N (must not grow)
      +-- sink       the exactly-once sink vs a plain idempotent producer writing the same messages
    services down (always, also on Ctrl-C)
    --freshness: the full local stack (Airflow scheduler, Spark Connect) in its own temporary folder:
                 produce -> visible p50/p95 for the ingest DAG and for Structured Streaming beside it

Outputs: the table on stdout, ``results.md``, ``results.json`` (figures ``{name, unit, median, min, max}``,
ratios ``{name, value, target, op, met}``) and ``results.png`` in ``--out`` (default: this folder).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from benchmarks import report, stop
from benchmarks.contenders import Contender, DagTest, contenders
from benchmarks.cycle_costs import cycle_overhead, state_size
from benchmarks.env import Env, services
from benchmarks.memory import PeakRss
from benchmarks.report import Results
from benchmarks.workload import SIZES, Backlog, Size, produce_backlog

HERE = Path(__file__).resolve().parent
LABELS = ("small", "base", "large")
TARGET_VS_STREAMING = 1.0
TARGET_VS_BATCH = 0.9
TARGET_OVERHEAD_S = 3.0
TARGET_MEMORY_GROWTH = 1.2


def echo(line: str) -> None:
    """A progress line, timestamped."""
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="quick",
                    help="backlogs: " + "; ".join(f"{s.name} = {s.small:,}/{s.base:,}/{s.large:,} records, "
                                                  f"{s.state_cycles} state cycles" for s in SIZES.values()))
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every throughput figure (default 3)")
    ap.add_argument("--large-reps", type=int,
                    help="repetitions at the large backlog only (default: --reps; at --size full one repetition "
                         "of every contender at 50M records takes ~20 min)")
    ap.add_argument("--state-cycles", type=int, help="cycles of the state-size run (default: by --size)")
    ap.add_argument("--overhead-cycles", type=int,
                    help="cycles of 100 records timed for the cycle overhead (default: 5, or --reps if more)")
    ap.add_argument("--no-dag-test", action="store_true", help="skip the dag.test() contender")
    ap.add_argument("--freshness", action="store_true",
                    help="also measure freshness under the real Airflow scheduler (brings up the full stack)")
    ap.add_argument("--freshness-seconds", type=float, default=60.0, help="how long to produce (default 60)")
    ap.add_argument("--rate", type=int, default=2000, help="records/s produced for freshness (default 2000)")
    ap.add_argument("--out", type=Path, default=HERE, help="folder for results.{md,json,png} (default: benchmarks/)")
    args = ap.parse_args(argv)
    if args.reps < 1 or (args.large_reps is not None and args.large_reps < 1):
        ap.error("--reps and --large-reps must be at least 1")
    if args.overhead_cycles is not None and args.overhead_cycles < 1:
        ap.error("--overhead-cycles must be at least 1")
    return args


def produce_data(env: Env, size: Size) -> dict[str, Backlog]:
    backlogs = {}
    for label, records in size.backlogs().items():
        t0 = time.perf_counter()
        backlogs[label] = produce_backlog(env.bootstrap, label, f"bench_{label}", records)
        b = backlogs[label]
        echo(f"data: {label} backlog {b.records:,} records, {b.megabytes:.0f} MB over {len(b.ends)} partitions "
             f"in {time.perf_counter() - t0:.1f}s")
    return backlogs


def throughput(env: Env, backlogs: dict[str, Backlog], runners: dict[str, Contender], reps: int,
               results: Results, large_reps: int | None = None) -> None:
    """Every contender at every backlog, ``reps`` times (``large_reps`` at the large one), after one untimed
    warm-up run of each on the base backlog (class loading and JIT in the shared JVM: in a probe at 5M
    records, the bare job and Reclock alternating, executor CPU time fell from 34 s to 24-25 s over eight
    runs, whoever ran; a warm-up on the small backlog left much of that to the timed runs).

    Each repetition starts the round at the next contender (so no contender is always the first to read a
    topic), and before every timed run the disk has no pending writes and the topic's log is in the page
    cache (:func:`settle`): a first reader of a topic written minutes earlier was measured 20% slower than
    the same job run right after it (20M records: 84.8 s vs 70.3 s), whoever it was."""
    for name, run in runners.items():
        t0 = time.perf_counter()
        run(env, backlogs["base"], reps)  # repetition number `reps`: a name no timed repetition uses
        echo(f"throughput: warm-up {name} ({time.perf_counter() - t0:.1f}s, untimed)")
    names = list(runners)
    for label in LABELS:
        backlog = backlogs[label]
        n = large_reps if label == "large" and large_reps is not None else reps
        for rep in range(n):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                settle(env, backlog)
                with PeakRss(env.memory_groups()) as peak:
                    r = runners[name](env, backlog, rep)
                mem = peak.mb()
                results.add(f"throughput_records_{name}_{label}", "records/s", r.records / r.seconds)
                results.add(f"throughput_mb_{name}_{label}", "MB/s", backlog.megabytes / r.seconds)
                results.add(f"memory_peak_total_{name}_{label}", "MB", mem["total"])
                if name == "reclock":
                    results.add(f"memory_peak_python_{name}_{label}", "MB", mem["python"])
                    results.add(f"memory_peak_jvm_{name}_{label}", "MB", mem["jvm"])
                extra = "".join(f", {k} {v:.2f}s" for k, v in r.extra.items())
                echo(f"throughput: {label} rep {rep + 1}/{n} {name:21s} {r.records / r.seconds:>12,.0f} rec/s "
                     f"{backlog.megabytes / r.seconds:7.1f} MB/s ({r.seconds:.2f}s{extra}; "
                     f"peak {mem['total']:,.0f} MB)")


def settle(env: Env, backlog: Backlog) -> None:
    """Untimed, before a contender runs: flush every pending write to disk (the last contender's output),
    then read the topic's log segments once, so every contender finds them in the page cache."""
    os.sync()
    for segment in sorted((env.kafka.home / "data").glob(f"{backlog.topic}-*/*.log")):
        with open(segment, "rb") as f:
            while f.read(8 << 20):
                pass


def throughput_checks(results: Results, runners: dict[str, Contender]) -> None:
    """Reclock (direct and under dag.test()) against the baselines at every backlog; memory growth."""
    for reclock in (n for n in ("reclock", "reclock_dag_test") if n in runners):
        for label in LABELS:
            ours = results.median(f"throughput_records_{reclock}_{label}")
            for other, target in (("structured_streaming", TARGET_VS_STREAMING), ("spark_batch", TARGET_VS_BATCH)):
                theirs = results.median(f"throughput_records_{other}_{label}")
                if ours is not None and theirs:
                    results.check(f"{reclock}_vs_{other}_{label}", ours / theirs, target, ">=")
    for group in ("total", "python", "jvm"):
        base = results.median(f"memory_peak_{group}_reclock_base")
        large = results.median(f"memory_peak_{group}_reclock_large")
        if base and large is not None:
            results.check(f"memory_{group}_reclock_large_vs_base", large / base, TARGET_MEMORY_GROWTH, "<=")


def machine() -> str:
    import psutil

    return (f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    size = SIZES[args.size]
    state_cycles = args.state_cycles if args.state_cycles is not None else size.state_cycles
    stop.install()  # a kill runs the same clean-up as Ctrl-C, also after dag.test() (benchmarks/stop.py)
    started = time.perf_counter()
    failed = ""
    results = Results(meta={
        "size": size.name, "reps": args.reps, "large_reps": args.large_reps or args.reps, "machine": machine(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "state_cycles": state_cycles, "notes": [
            "reclock: run_cycle on a new source per repetition (one description); timed from the cycle's "
            "start to the append's commit (the cycle minus its resume step)",
            "reclock_dag_test: ingest__<source> under dag.test() in the benchmark process (its tasks use the "
            "shared Spark session); timed from the mint_write task's start to the append task's end",
            "every Spark contender: one local[2] session with Reclock's settings (batch reads of Kafka by the "
            "V2 reader, as Structured Streaming's), Reclock's Kafka options, from_json PERMISSIVE with the "
            "same schema, Parquet (snappy)",
            "memory: resident set of this process and of the Spark JVM's process tree, sampled every 50 ms; "
            "one JVM serves every contender, so its heap only grows during the run",
            "MB are 10^6 bytes; MB/s counts the records' value bytes (what Kafka holds, ~200 bytes a record)",
            "Postgres runs with fsync off (a throwaway cluster)",
        ]})
    try:
        with services(echo) as env:
            import pyspark

            results.meta["spark"] = pyspark.__version__
            with ThreadPoolExecutor(1, thread_name_prefix="airflow-db-migrate") as pool:
                dag_test = None
                if not args.no_dag_test:  # Airflow's migration (a subprocess) runs beside the data and the
                    dag_test = DagTest(env)  # other contenders' warm-ups; dag.test's first run waits for it
                    echo("dag.test: migrating Airflow's metadata DB beside the next steps ...")
                    dag_test.prepare(pool)
                backlogs = produce_data(env, size)
                results.meta["backlogs"] = {k: {"records": b.records, "megabytes": round(b.megabytes, 1),
                                                "partitions": len(b.ends)} for k, b in backlogs.items()}
                runners = contenders(env, dag_test)
                throughput(env, backlogs, runners, args.reps, results, args.large_reps)
                if dag_test is not None:
                    results.meta["airflow_db_migrate_s"] = round(dag_test.migrate_s, 1)
            throughput_checks(results, runners)

            cycles = args.overhead_cycles or max(5, args.reps)
            echo(f"overhead: {cycles} cycles of 100 records")
            cycle_overhead(env, cycles, results, echo)
            results.check("cycle_overhead_total_s", results.median("cycle_overhead_total"), TARGET_OVERHEAD_S,
                          "<=", "direct, not under the scheduler")

            echo(f"state: {state_cycles} cycles with compaction on")
            state_size(env, state_cycles, results, echo)

            sink_messages = size.base
            echo(f"sink: {sink_messages:,} messages, exactly-once sink vs a plain idempotent producer")
            from benchmarks.sink_bench import SINK_TARGET, run_sink_benchmark

            figures = run_sink_benchmark(env.dsn, env.bootstrap, Path(env.work), sink_messages, args.reps,
                                         echo=lambda line: echo(line.strip()))
            for name in ("sink_throughput", "plain_producer_throughput", "sink_start"):
                for v in figures[name]["values"]:
                    results.add(name, figures[name]["unit"], v)
            results.check("sink_vs_plain_producer", results.median("sink_throughput")
                          / results.median("plain_producer_throughput"), SINK_TARGET, ">=",
                          "the same messages (key, value, reclock.ts header); the plain producer gets them encoded")
        if args.freshness:
            from benchmarks.freshness import freshness

            try:
                freshness(results, seconds=args.freshness_seconds, rate=args.rate, echo=echo)
            except Exception as e:  # noqa: BLE001 - the other figures are still worth writing
                failed = f"freshness failed: {type(e).__name__}: {e}"
                results.meta["notes"].append(failed)
                echo(failed)
    except KeyboardInterrupt:
        echo("interrupted: every service this run started has been stopped; no results written")
        return 130
    results.meta["seconds"] = round(time.perf_counter() - started, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, args.out / "results.json")
    report.write_markdown(results, args.out / "results.md")
    names = [n for n in ("reclock", "reclock_dag_test", "structured_streaming", "spark_batch", "kafka_consumer")
             if f"throughput_records_{n}_base" in results.figures]
    png = report.write_png(results, args.out / "results.png", names, list(LABELS))
    print()
    print(report.table(results))
    print()
    echo(f"done in {results.meta['seconds']:.0f}s; wrote {args.out / 'results.md'}, {args.out / 'results.json'}"
         + (f", {args.out / 'results.png'}" if png else " (no PNG: matplotlib is not installed)"))
    if failed:
        echo(failed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
