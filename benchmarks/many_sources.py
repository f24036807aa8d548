"""Many sources on one machine (issue 19): ``--sources`` Kafka sources at ``--rate`` records/s each under
the real Airflow scheduler, beside as many Structured Streaming queries in one Spark application.

The full local stack (:class:`reclock.dev.stack.Stack`) comes up in a temporary folder with a config of
``--sources`` sources ``many_00 ..``, each on its own topic, all with the same ``--schedule``
(``continuous``: one task a source cycling back to back, a lease of :data:`LEASE`; ``group``: the same,
but every source in one continuous group, so one task of ``ingest_group__many`` cycles them all, a thread
each; ``upstream``: a run when its topic moves; ``interval``: every second). Airflow's parallelism is raised to the number of
sources (plus a few), so every source can have its task running at once. Then:

1. **Reclock**: every source's DAG unpaused; once every source's first cycle is in and :data:`WARM_S`
   seconds of the workload have gone through (untimed), one producer writes ``--rate`` records/s to every
   topic for ``--seconds`` (each record carries its produce time). One watcher per shard (as in
   ``benchmarks.freshness``) polls the shards' uppers every :data:`POLL_S` seconds and takes each record's
   produce -> visible latency. The DAGs are paused afterwards (their tasks under way finish first).
2. **Structured Streaming**: one query per topic in one session of the stack's Spark Connect server (one
   Spark application), each a Parquet file sink with a 1 s processing-time trigger; a record is visible
   when its sink's log lists its file. Same warm-up, rate and duration.

CPU: the machine's busy CPU seconds over the timed window (``/proc/stat``) minus this process's own (the
producer and the watchers), divided by source-minutes. Both contenders are charged the same Kafka broker
and Postgres; Reclock's consensus and statistics in Postgres are its own cost. Each contender runs alone
(the other's DAGs paused or queries stopped). Everything the stack started is stopped at the end, also on
failure; after a failure the stack's folder (logs included) is kept and named.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Callable

from benchmarks import stop
from benchmarks.contenders import decode
from benchmarks.freshness import SinkLogWatcher, ShardWatcher, Watcher, _now_ms, bench_stack, _percentile, _wait_first_cycle
from benchmarks.freshness import _measure as _measure_latency
from benchmarks.report import Results
from benchmarks.workload import SCHEMA, create_topic, record

SCHEDULES = ("continuous", "group", "upstream", "interval")
LEASE = "3m"
"""``schedule: continuous``: one run's lease (the measurement fits in about one)."""
WARM_S = 20.0
POLL_S = 0.25
DRAIN_S = 120.0
TARGET_P50_S = 5.0
TOPIC_PARTITIONS = 2
"""Partitions per topic: a source of 200 records/s is small."""


def _busy_cpu_s() -> float:
    """The machine's busy CPU seconds so far (every mode of ``/proc/stat``'s cpu line but idle and iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


_GROUPS = (("airflow task runner", "airflow tasks"), ("airflow supervisor", "airflow tasks"),
           ("airflow worker", "airflow tasks"), ("airflow scheduler", "airflow scheduler"),
           ("airflow triggerer", "airflow others"), ("dag-processor", "airflow others"),
           ("api-server", "airflow others"), ("api_server", "airflow others"),
           ("org.apache.spark", "spark"), ("kafka.Kafka", "kafka"), ("postgres", "postgres"))
"""A process's group by its command line (first match; Airflow names its task processes with setproctitle;
Spark's JVM before Kafka's, as its class path names the Kafka connector)."""


def _group(cmdline: str) -> str:
    for needle, group in _GROUPS:
        if needle in cmdline:
            return group
    return "other"


def _cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's group and CPU seconds so far (user + system, ``/proc/<pid>/stat``); the harness's
    own process is left out."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            stat = (d / "stat").read_text()
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(d.name)] = (_group(cmdline or stat[stat.index("(") + 1:stat.rindex(")")]),
                            (int(fields[11]) + int(fields[12])) / tick)
    return out


def _cpu_breakdown(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                   busy_s: float) -> dict[str, float]:
    """CPU seconds per group between two :func:`_cpu_by_process` snapshots; what processes that exited in
    between spent (and the kernel's own work) is ``exited or kernel``: the machine's busy seconds minus the
    rest."""
    out: dict[str, float] = {}
    for pid, (group, cpu) in after.items():
        prior = before.get(pid)
        out[group] = out.get(group, 0.0) + cpu - (prior[1] if prior and prior[0] == group else 0.0)
    out["exited or kernel"] = max(0.0, busy_s - sum(out.values()))
    return out


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _measure(bootstrap: str, topics: list[str], seconds: float, rate: int, watchers: list[Watcher],
             echo: Callable[[str], None]) -> tuple[list[float], int, float, dict[str, float]]:
    """:func:`benchmarks.freshness._measure` over every topic (:data:`TOPIC_PARTITIONS` each); also the CPU
    seconds the rest of the machine spent over the window (up to when the last record became visible, or
    the drain's end), and those seconds by group of processes (:func:`_cpu_breakdown`)."""
    busy0, own0, procs0 = _busy_cpu_s(), _own_cpu_s(), _cpu_by_process()
    latencies, produced = _measure_latency(bootstrap, topics, seconds, rate, watchers, echo,
                                           partitions=TOPIC_PARTITIONS, tick=0.02, poll_s=POLL_S, drain_s=DRAIN_S)
    cpu = (_busy_cpu_s() - busy0) - (_own_cpu_s() - own0)
    return latencies, produced, cpu, _cpu_breakdown(procs0, _cpu_by_process(), cpu)


def _report(results: Results, who: str, latencies: list[float], produced: int, cpu_s: float,
            breakdown: dict[str, float], source_minutes: float, echo: Callable[[str], None]) -> None:
    if not latencies:
        raise RuntimeError(f"many sources: no record produced for {who} became visible")
    for group, seconds in sorted(breakdown.items(), key=lambda kv: -kv[1]):
        results.add(f"many_{who}_cpu_{group.replace(' ', '_')}_per_source_minute", "s", seconds / source_minutes)
    echo(f"many sources: {who} CPU s per source-minute by process group: " + ", ".join(
        f"{g} {v / source_minutes:.2f}" for g, v in sorted(breakdown.items(), key=lambda kv: -kv[1])))
    results.add(f"many_{who}_p50", "s", _percentile(latencies, 0.5))
    results.add(f"many_{who}_p95", "s", _percentile(latencies, 0.95))
    results.add(f"many_{who}_visible_share", "fraction", len(latencies) / max(1, produced))
    results.add(f"many_{who}_cpu_per_source_minute", "s", cpu_s / source_minutes)


def many_sources(results: Results, sources: int, rate: int, seconds: float, schedule: str,
                 echo: Callable[[str], None] = print) -> None:
    """Bring the stack up, measure Reclock's sources under the scheduler, then Structured Streaming."""
    if schedule not in SCHEDULES:
        raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, not {schedule!r}")
    if sources < 1 or rate < 1 or seconds <= 0:
        raise ValueError("--sources, --rate and --seconds must be positive")
    names = [f"many_{i:02d}" for i in range(sources)]
    results.meta.setdefault("notes", []).append(
        f"many sources: {sources} sources ({schedule}) at {rate} records/s each for {seconds:.0f}s after a "
        f"{WARM_S:.0f}s warm-up, under the Airflow scheduler; beside {sources} Structured Streaming queries "
        "(1 s trigger) in one Spark Connect session; CPU = the machine's busy seconds minus the harness's")
    extra = {"continuous": {"schedule": "continuous", "lease": LEASE, "poll": "200ms"},
             "group": {"schedule": "continuous", "lease": LEASE, "poll": "200ms", "group": "many"},
             "upstream": {"schedule": "upstream", "poll": "500ms"},
             "interval": {"interval": "1s"}}[schedule]
    config = {n: {"kafka": {"connection": "reclock_kafka", "topic": n}, "format": {"type": "json", "schema": SCHEMA},
                  "budget": {"max_records": 1_000_000}, **extra} for n in names}
    source_minutes = sources * seconds / 60
    with bench_stack("reclock-bench-many-", "many sources", config, echo,
                     {"AIRFLOW__CORE__PARALLELISM": str(sources + 4)}) as (root, stack):
        echo(f"many sources: bringing the stack up for {sources} sources ({schedule}) ...")
        stack.up(echo=lambda line: echo(f"  {line}"))
        bootstrap = stack.kafka.bootstrap
        for n in names:
            create_topic(bootstrap, n, TOPIC_PARTITIONS)
        _seed(bootstrap, names)
        dag_ids = ["ingest_group__many"] if schedule == "group" else [f"ingest__{n}" for n in names]
        for d in dag_ids:
            stack.airflow.wait_for_dag(d, timeout=300)
            stack.airflow.unpause(d)
        for n in names:
            _wait_first_cycle(stack.postgres.dsn(), timeout=900, source=n)
        echo("many sources: every source has its first cycle in")
        watchers = [ShardWatcher(stack.postgres.dsn(), stack.state.root / "blobs", n) for n in names]
        echo(f"many sources: warming up for {WARM_S:.0f}s")
        _measure(bootstrap, names, WARM_S, rate, watchers, echo)
        echo(f"many sources: producing {rate:,} records/s to each of {sources} topics for {seconds:.0f}s")
        latencies, produced, cpu, breakdown = _measure(bootstrap, names, seconds, rate, watchers, echo)
        for w in watchers:
            w.conn.close()
        _report(results, f"reclock_{schedule}", latencies, produced, cpu, breakdown, source_minutes, echo)
        _report_writes(results, stack.postgres.dsn(), f"reclock_{schedule}", seconds, echo)
        echo(f"many sources: reclock p50 {results.median(f'many_reclock_{schedule}_p50'):.2f}s, "
             f"{cpu / source_minutes:.2f} CPU s per source-minute")
        for d in dag_ids:
            stack.airflow.api("PATCH", f"dags/{d}", {"is_paused": True})
        _wait_no_tasks(stack.airflow, dag_ids, timeout=600)

        echo(f"many sources: {sources} structured streaming queries in one Spark Connect session")
        latencies, produced, cpu, breakdown = _structured_streaming(stack, root, names, seconds, rate, echo)
        _report(results, "structured_streaming", latencies, produced, cpu, breakdown, source_minutes, echo)
        echo(f"many sources: structured streaming p50 {results.median('many_structured_streaming_p50'):.2f}s, "
             f"{cpu / source_minutes:.2f} CPU s per source-minute")
        results.check(f"many_reclock_{schedule}_p50_s", results.median(f"many_reclock_{schedule}_p50"),
                      TARGET_P50_S, "<=", f"{sources} sources at {rate} records/s each")
        results.check("many_cpu_over_structured_streaming",
                      results.median(f"many_reclock_{schedule}_cpu_per_source_minute")
                      / results.median("many_structured_streaming_cpu_per_source_minute"), 1.0, "<=",
                      "CPU seconds per source-minute, the machine's")


def _report_writes(results: Results, dsn: str, who: str, seconds: float, echo: Callable[[str], None]) -> None:
    """The writes of the measured window (its last ``seconds``): how many, their median seconds, and how many
    sources the Spark job of each wrote (1: a job of its own; more: a group's joint job)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT (metrics->>'seconds')::float8, coalesce((metrics->>'joint_sources')::int, 1) "
                            "FROM reclock.statistics WHERE step = 'write_batches' AND "
                            "at > now() - make_interval(secs => %s)", (seconds,)).fetchall()
    if not rows:
        echo("many sources: no writes in the window")
        return
    secs = sorted(r[0] for r in rows)
    per_job = [r[1] for r in rows]
    results.add(f"many_{who}_writes", "count", len(rows))
    results.add(f"many_{who}_write_s", "s", secs[len(secs) // 2])
    results.add(f"many_{who}_sources_per_job", "sources", sum(per_job) / len(per_job))
    echo(f"many sources: {len(rows)} writes in the window, median {secs[len(secs) // 2]:.2f}s; sources per Spark "
         f"job, as each write saw it: mean {sum(per_job) / len(per_job):.1f}, max {max(per_job)}")


def _seed(bootstrap: str, topics: list[str]) -> None:
    """A record in every partition of every topic: each source's first run (its shard exists from then)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for t in topics:
        for p in range(TOPIC_PARTITIONS):
            producer.produce(t, record(p, _now_ms()), partition=p)
    if producer.flush(30):
        raise RuntimeError("many sources: the seed records were not delivered within 30s")


def _wait_no_tasks(airflow, dag_ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(airflow.api("GET", f"dags/{d}/dagRuns/~/taskInstances?state=running&state=queued")
              .get("task_instances") for d in dag_ids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"many sources: tasks still running {timeout:.0f}s after the DAGs were paused")
        time.sleep(1)


def _structured_streaming(stack, root: Path, names: list[str], seconds: float, rate: int,
                          echo: Callable[[str], None]) -> tuple[list[float], int, float, dict[str, float]]:
    """One query per topic in one session of the stack's Spark Connect server; as :func:`_measure`."""
    spark = stack.spark.session()
    queries = []
    try:
        for n in names:
            stream = decode(spark.readStream.format("kafka").options(**{
                "kafka.bootstrap.servers": stack.kafka.bootstrap, "kafka.isolation.level": "read_committed",
                "kafka.fetch.max.wait.ms": "10", "subscribe": n, "startingOffsets": "latest",
                "failOnDataLoss": "true"}).load())
            queries.append(stream.writeStream.format("parquet").option("path", str(root / "ss" / n))
                           .option("checkpointLocation", str(root / "ss_checkpoint" / n))
                           .queryName(f"ss_{n}").trigger(processingTime="1 second").start())
        deadline = time.monotonic() + 300
        while any(q.lastProgress is None for q in queries):  # each query's first (empty) batch: it is up
            if time.monotonic() > deadline:
                raise RuntimeError("many sources: a structured streaming query made no progress within 300s")
            time.sleep(0.5)
        watchers = [SinkLogWatcher(root / "ss" / n) for n in names]
        echo(f"many sources: structured streaming warming up for {WARM_S:.0f}s")
        _measure(stack.kafka.bootstrap, names, WARM_S, rate, watchers, echo)
        echo(f"many sources: producing {rate:,} records/s to each of {len(names)} topics for {seconds:.0f}s")
        return _measure(stack.kafka.bootstrap, names, seconds, rate, watchers, echo)
    finally:
        for q in queries:
            q.stop()
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.many_sources [--sources 20] [--rate 200] [--seconds 60] [--schedule
    continuous]``: freshness and CPU of many sources under the scheduler, beside as many Structured
    Streaming queries in one Spark application, printed as a table."""
    import argparse

    from benchmarks import report

    ap = argparse.ArgumentParser(prog="python -m benchmarks.many_sources", description=main.__doc__)
    ap.add_argument("--sources", type=int, default=20, help="how many sources (default 20)")
    ap.add_argument("--rate", type=int, default=200, help="records/s per source (default 200)")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to produce (default 60)")
    ap.add_argument("--schedule", choices=SCHEDULES, default="continuous", help="every source's schedule")
    args = ap.parse_args(argv)
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    results = Results()
    many_sources(results, args.sources, args.rate, args.seconds, args.schedule,
                 echo=lambda line: print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True))
    print(report.table(results))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
