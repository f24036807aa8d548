"""Freshness under the real Airflow scheduler (``--freshness``), and Structured Streaming beside it.

The full local stack (:class:`reclock.dev.stack.Stack`: Postgres, Kafka, a warm Spark Connect server,
Airflow's scheduler, API server, DAG processor and triggerer) comes up in a temporary folder of its own,
with a config that declares one source, ``fresh_orders`` (interval :data:`INTERVAL_S`). Then:

1. **Reclock**: the ``ingest__fresh_orders`` DAG is unpaused and runs on its schedule; once its first cycle
   is in and :data:`WARM_S` seconds of the workload have gone through (untimed: the Spark Connect server
   is warm then), records are produced at ``rate`` records/s for ``seconds`` (each carries its produce
   time in ``created_ms``). A watcher polls the shard's upper every :data:`POLL_S` seconds; when it moves, the new
   updates (what a read AS OF the new ``upper - 1`` adds) are read and each record's produce -> visible
   latency is taken. The DAG is paused afterwards (its tasks under way finish first).
   Then the same workload on ``fresh_events`` (``schedule: upstream``, probed every 200 ms) and on
   ``fresh_cont`` (``schedule: continuous``, cycles back to back), each alone, measured the same way.
2. **The cycle's time, split**, per cycle, from the task instances of the runs (Airflow's REST API) and
   the steps' seconds in ``reclock.statistics``: scheduler gaps (a task's start minus the previous task's
   end, across runs too), task overhead (a task's duration minus its step's seconds: process start,
   imports, XCom), Spark (write_batches) and Postgres + Kafka offsets (mint, append, resume).
3. **Structured Streaming** on the same Spark Connect server: the same topic from ``latest``, the same
   decode, a Parquet file sink with ``trigger(processingTime=f"{INTERVAL_S} seconds")``; a record is visible when the
   sink's ``_spark_metadata`` log lists its file (what a Spark reader of the folder sees). Same warm-up,
   same rate, same duration.
4. Peak RSS of the Spark Connect server's and Airflow's process trees (the task processes are children
   of the scheduler) while each runs.

Everything the stack started is stopped at the end (``Stack.down``), also on failure or Ctrl-C; after a
failure the stack's folder (logs included) is kept and named.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import unquote, urlparse

from benchmarks import stop
from benchmarks.contenders import decode
from benchmarks.memory import PeakRss, process_tree
from benchmarks.report import Results
from benchmarks.workload import PARTITIONS, SCHEMA, create_topic, record

SOURCE = "fresh_orders"
EVENT_SOURCE = "fresh_events"
"""The same workload on a source with ``schedule: upstream`` (its DAG runs when the topic moves)."""
EVENT_POLL = "200ms"
CONT_SOURCE = "fresh_cont"
"""The same workload on a source with ``schedule: continuous`` (cycles back to back, a run per lease)."""
TARGET_EVENT_P50_S = 2.0
INTERVAL_S = 1
"""The ingest DAG's schedule and Structured Streaming's processing-time trigger, in seconds."""
POLL_S = 0.1
WARM_S = 15.0
DRAIN_S = 90.0
TARGET_P50_S = 10.0
TARGET_OVERHEAD_S = 3.0
STEP_KIND = {"mint": "postgres_kafka", "write_batches": "spark", "append": "postgres_kafka",
             "resume": "postgres_kafka"}
TASK_STEPS = {"mint_write": ("mint", "write_batches"), "append": ("append", "resume"),
              "cycle": ("mint", "write_batches", "append", "resume")}
"""The ingest DAGs' tasks and the cycle steps each runs (``cycle``: the event-driven DAG's one task)."""
RUN_TASKS = ({"mint_write", "append"}, {"cycle"})
"""The task ids of one whole run, by schedule (interval, upstream)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


Watcher = Callable[[], tuple[int, list[int]]]
"""Returns (when it looked, in ms; ``created_ms`` of every record that became visible since its last call)."""


def _measure(bootstrap: str, topics: list[str], seconds: float, rate: int, watchers: list[Watcher],
             echo: Callable[[str], None], partitions: int = PARTITIONS, tick: float = 0.01,
             poll_s: float = POLL_S, drain_s: float = DRAIN_S) -> tuple[list[float], int]:
    """Produce ``rate`` records/s to every topic of ``topics`` (record ``i`` of each into partition
    ``i % partitions``) for ``seconds`` while polling ``watchers`` every ``poll_s``; the latencies (s) of the
    records produced in the window, and how many were produced. Waits up to ``drain_s`` for the last ones."""
    from confluent_kafka import Producer

    start_ms = _now_ms()
    produced = 0
    done = threading.Event()
    failure: list[BaseException] = []

    def produce() -> None:
        nonlocal produced
        try:
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 2})
            per_tick = rate * tick
            t0 = time.monotonic()
            due = 0.0
            i = 0
            while time.monotonic() - t0 < seconds:
                due += per_tick
                while i < int(due):
                    for topic in topics:
                        producer.produce(topic, record(i, _now_ms()), partition=i % partitions)
                    produced += len(topics)
                    i += 1
                producer.poll(0)
                time.sleep(max(0.0, t0 + tick * (int((time.monotonic() - t0) / tick) + 1) - time.monotonic()))
            producer.flush(30)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            failure.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=produce, name="freshness-producer", daemon=True)
    thread.start()
    latencies: list[float] = []
    drain_deadline: float | None = None
    last_report = time.monotonic()
    while True:
        for watch in watchers:
            seen_ms, created = watch()
            latencies += [(seen_ms - c) / 1000 for c in created if c >= start_ms]
        if done.is_set():
            if failure:
                raise RuntimeError(f"freshness producer failed: {failure[0]}") from failure[0]
            drain_deadline = drain_deadline or time.monotonic() + drain_s
            if len(latencies) >= produced or time.monotonic() > drain_deadline:
                break
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            p50 = statistics.median(latencies) if latencies else float("nan")
            echo(f"  {produced:,} produced, {len(latencies):,} visible, p50 so far {p50:.2f}s")
        time.sleep(poll_s)
    thread.join()
    return latencies, produced


class ShardWatcher:
    """New records of a Reclock shard: when its upper moves, the updates in ``[old upper, new upper)``."""

    def __init__(self, dsn: str, blob_root: Path, shard: str) -> None:
        from reclock.persist import connect
        from reclock.persist.blob import LocalBlobStore
        from reclock.persist.shards import shard_info

        self.conn = connect(dsn)
        self.blob = LocalBlobStore(blob_root)
        self.shard = shard
        self.upper = shard_info(self.conn, shard).upper

    def __call__(self) -> tuple[int, list[int]]:
        from reclock.persist.shards import shard_info
        from reclock.read import read_updates

        seen = _now_ms()
        upper = shard_info(self.conn, self.shard).upper
        if upper <= self.upper:
            return seen, []
        table = read_updates(self.conn, self.blob, self.shard, self.upper, upper)
        self.upper = upper
        return seen, [] if table is None else table.column("created_ms").to_pylist()


class SinkLogWatcher:
    """New records of a Structured Streaming file sink: the files its ``_spark_metadata`` log adds."""

    def __init__(self, out: Path) -> None:
        self.log = out / "_spark_metadata"
        self.entries: set[str] = set()
        self.files: set[str] = set()

    def __call__(self) -> tuple[int, list[int]]:
        import pyarrow.parquet as pq

        seen = _now_ms()
        created: list[int] = []
        if not self.log.is_dir():
            return seen, created
        for entry in sorted(self.log.iterdir()):
            if entry.name.startswith(".") or entry.name in self.entries:
                continue
            self.entries.add(entry.name)
            for line in entry.read_text().splitlines()[1:]:  # the first line is the log's version
                path = unquote(urlparse(json.loads(line)["path"]).path)
                if path not in self.files:
                    self.files.add(path)
                    created += pq.read_table(path, columns=["created_ms"]).column("created_ms").to_pylist()
        return seen, created


def _api_all(airflow, path: str, key: str) -> list[dict]:
    """Every item of a paged list endpoint of Airflow's REST API."""
    token = airflow.token()
    items: list[dict] = []
    while True:
        sep = "&" if "?" in path else "?"
        page = airflow.api("GET", f"{path}{sep}limit=100&offset={len(items)}", token=token).get(key, [])
        items += page
        if len(page) < 100:
            return items


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def cycle_split(airflow, dsn: str, dag_id: str, since: datetime, source: str = SOURCE) -> list[dict[str, float]]:
    """Per cycle (a run whose tasks all started after ``since`` and finished): its seconds split into
    scheduler gaps, task overhead, Spark and Postgres + Kafka work (see the module doc)."""
    from reclock.persist import connect

    tis = [t for t in _api_all(airflow, f"dags/{dag_id}/dagRuns/~/taskInstances", "task_instances")
           if t.get("start_date") and t.get("end_date")]
    with connect(dsn) as conn:
        stats = conn.execute("SELECT step, metrics, at FROM reclock.statistics WHERE name = %s AND at >= %s",
                             (source, since)).fetchall()
    runs: dict[str, list[dict]] = {}
    for t in sorted(tis, key=lambda t: t["start_date"]):
        runs.setdefault(t["dag_run_id"], []).append(t)
    ordered = sorted(runs.values(), key=lambda ts: ts[0]["start_date"])
    out = []
    previous_end: datetime | None = None
    for tasks in ordered:
        first, last = _ts(tasks[0]["start_date"]), max(_ts(t["end_date"]) for t in tasks)
        if {t["task_id"] for t in tasks} not in RUN_TASKS or first < since:
            previous_end = last
            continue
        split = {"scheduler_gap": 0.0, "task_overhead": 0.0, "spark": 0.0, "postgres_kafka": 0.0}
        prev = previous_end
        for t in tasks:
            start, end = _ts(t["start_date"]), _ts(t["end_date"])
            if prev is not None:
                split["scheduler_gap"] += max(0.0, (start - prev).total_seconds())
            in_task = 0.0
            for step in TASK_STEPS[t["task_id"]]:
                step_s = sum(float(m.get("seconds", 0)) for st, m, at in stats
                             if st == step and start <= at <= end)
                split[STEP_KIND[step]] += step_s
                in_task += step_s
            split["task_overhead"] += max(0.0, (end - start).total_seconds() - in_task)
            prev = end
        split["total"] = sum(split.values())
        out.append(split)
        previous_end = last
    return out


def _memory_groups(stack) -> dict[str, Callable[[], list]]:
    from reclock.dev.airflow import COMPONENTS
    from reclock.dev.procs import read_pid

    def tree(pidfile: Path) -> Callable[[], list]:
        return lambda: process_tree(read_pid(pidfile) or -1)

    airflow = [tree(stack.airflow.pidfile(c)) for c in COMPONENTS]
    return {"spark_connect": tree(stack.spark.pidfile),
            "airflow": lambda: [p for find in airflow for p in find()]}


def _wait_first_cycle(dsn: str, timeout: float = 300, source: str = SOURCE) -> None:
    from reclock.persist import connect
    from reclock.persist.shards import shard_info

    deadline = time.monotonic() + timeout
    while True:
        try:
            with connect(dsn) as conn:
                if shard_info(conn, source).upper > 0:
                    return
        except Exception:  # noqa: BLE001 - the shard does not exist before the first mint
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"ingest__{source} did not complete a cycle within {timeout:.0f}s")
        time.sleep(0.5)


def _pause(airflow, dag_id: str, timeout: float = 300) -> None:
    """Pause ``dag_id`` and wait until none of its tasks is queued or running. (A paused DAG's run that
    is under way gets no further tasks scheduled: it stays ``running`` and does no work.)"""
    airflow.api("PATCH", f"dags/{dag_id}", {"is_paused": True})
    deadline = time.monotonic() + timeout
    while airflow.api("GET", f"dags/{dag_id}/dagRuns/~/taskInstances?state=running&state=queued"
                      ).get("task_instances"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{dag_id} still has a task running {timeout:.0f}s after it was paused")
        time.sleep(0.5)


def _report(results: Results, who: str, latencies: list[float], produced: int) -> None:
    if not latencies:
        raise RuntimeError(f"freshness: no record produced for {who} became visible")
    results.add(f"freshness_{who}_p50", "s", _percentile(latencies, 0.5))
    results.add(f"freshness_{who}_p95", "s", _percentile(latencies, 0.95))
    results.add(f"freshness_{who}_visible_share", "fraction", len(latencies) / max(1, produced))


@contextlib.contextmanager
def bench_stack(prefix: str, label: str, sources: dict, echo: Callable[[str], None],
                airflow_settings: dict[str, str] | None = None) -> Iterator:
    """A full local stack (not yet up) in a new temporary folder, its config ``{"sources": sources}``, the
    environment pointing the tasks at it (this process's own ``RECLOCK_*`` settings left out, restored
    afterwards), and ``airflow_settings`` on top of Airflow's. On leaving, everything it started is stopped;
    the folder is deleted, or kept and named (with the stack's logs) when the block raised."""
    from reclock.dev.stack import Stack
    from reclock.dev.state import StackState

    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    config = root / "reclock.yaml"
    config.write_text(json.dumps({"sources": sources}))
    saved = dict(os.environ)
    for key in ("RECLOCK_DSN", "RECLOCK_BLOB_URL", "RECLOCK_SPARK_MASTER"):  # the tasks use the stack's
        os.environ.pop(key, None)
    os.environ.update({"RECLOCK_CONFIG": str(config), "RECLOCK_HOME": str(root / "stack")})
    stack = Stack(StackState(root / "stack"))
    if airflow_settings:
        base_settings = stack.airflow_settings
        stack.airflow_settings = lambda: {**base_settings(), **airflow_settings}
    try:
        yield root, stack
    except BaseException:
        stack.down(echo=lambda line: echo(f"  {line}"))
        echo(f"{label}: failed; kept {root} (the stack's logs are under stack/)")
        raise
    else:
        stack.down(echo=lambda line: echo(f"  {line}"))
        shutil.rmtree(root, ignore_errors=True)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def freshness(results: Results, seconds: float, rate: int, echo: Callable[[str], None] = print) -> None:
    """Bring the stack up, measure Reclock under the scheduler and Structured Streaming, bring it down."""
    results.meta.setdefault("notes", []).append(
        f"freshness: the full local stack (Airflow scheduler with LocalExecutor, Spark Connect); {rate} records/s "
        f"for {seconds:.0f}s after a {WARM_S:.0f}s warm-up; a record is visible when the shard's upper passes it "
        "(Reclock) or the file sink's log lists its file (Structured Streaming)")
    sources = {
        SOURCE: {"kafka": {"connection": "reclock_kafka", "topic": SOURCE}, "format": {"type": "json", "schema": SCHEMA},
                 "interval": f"{INTERVAL_S}s", "budget": {"max_records": 1_000_000}},
        EVENT_SOURCE: {"kafka": {"connection": "reclock_kafka", "topic": EVENT_SOURCE},
                       "format": {"type": "json", "schema": SCHEMA}, "schedule": "upstream", "poll": EVENT_POLL,
                       "budget": {"max_records": 1_000_000}},
        CONT_SOURCE: {"kafka": {"connection": "reclock_kafka", "topic": CONT_SOURCE},
                      "format": {"type": "json", "schema": SCHEMA}, "schedule": "continuous", "lease": "2m",
                      "poll": "100ms", "budget": {"max_records": 1_000_000}}}
    dag_id = f"ingest__{SOURCE}"
    with bench_stack("reclock-bench-fresh-", "freshness", sources, echo) as (root, stack):
        echo("freshness: bringing the stack up (Postgres, Kafka, Spark Connect, Airflow) ...")
        stack.up(echo=lambda line: echo(f"  {line}"))
        create_topic(stack.kafka.bootstrap, SOURCE)
        stack.airflow.wait_for_dag(dag_id, timeout=180)
        stack.airflow.unpause(dag_id)
        _wait_first_cycle(stack.postgres.dsn())
        watcher = ShardWatcher(stack.postgres.dsn(), stack.state.root / "blobs", SOURCE)
        echo(f"freshness: {dag_id} runs every {INTERVAL_S}s; warming up for {WARM_S:.0f}s")
        _measure(stack.kafka.bootstrap, [SOURCE], WARM_S, rate, [watcher], echo)
        echo(f"freshness: producing {rate:,} records/s for {seconds:.0f}s")
        since = datetime.now().astimezone()
        with PeakRss(_memory_groups(stack)) as peak:
            latencies, produced = _measure(stack.kafka.bootstrap, [SOURCE], seconds, rate, [watcher], echo)
        watcher.conn.close()
        _pause(stack.airflow, dag_id)
        _report(results, "reclock", latencies, produced)
        for group, mb in peak.mb().items():
            results.add(f"memory_freshness_reclock_{group}", "MB", mb)
        cycles = cycle_split(stack.airflow, stack.postgres.dsn(), dag_id, since)
        for c in cycles:
            for part, value in c.items():
                results.add(f"freshness_cycle_{part}", "s", value)
            results.add("freshness_cycle_outside_spark", "s", c["total"] - c["spark"])
        echo(f"freshness: reclock p50 {results.median('freshness_reclock_p50'):.2f}s over {len(latencies):,} "
             f"records, {len(cycles)} cycles")

        # the same workload on a source whose DAG runs when its topic moves, then on a continuous one
        for source, label in ((EVENT_SOURCE, "upstream"), (CONT_SOURCE, "continuous")):
            _other_schedule(results, stack, source, label, seconds, rate, echo)

        echo(f"freshness: structured streaming on Spark Connect, processingTime {INTERVAL_S}s")
        latencies, produced, ss_peak = _structured_streaming(stack, root, seconds, rate, echo)
        _report(results, "structured_streaming", latencies, produced)
        for group, mb in ss_peak.items():
            results.add(f"memory_freshness_structured_streaming_{group}", "MB", mb)
        echo(f"freshness: structured streaming p50 {results.median('freshness_structured_streaming_p50'):.2f}s")
        results.check("freshness_reclock_p50_s", results.median("freshness_reclock_p50"), TARGET_P50_S, "<=",
                      f"under the scheduler, interval {INTERVAL_S}s")
        results.check("freshness_continuous_p50_over_structured_streaming",
                      results.median("freshness_reclock_continuous_p50")
                      / results.median("freshness_structured_streaming_p50"), 1.0, "<=",
                      "continuous mode vs a 1 s processing-time trigger, the same workload")
        results.check("freshness_upstream_p50_s", results.median("freshness_reclock_upstream_p50"),
                      TARGET_EVENT_P50_S, "<=", f"schedule upstream, probed every {EVENT_POLL}")
        results.check("scheduler_cycle_overhead_s", results.median("freshness_cycle_outside_spark"),
                      TARGET_OVERHEAD_S, "<=", "a cycle's time outside write_batches, gaps included")


def _other_schedule(results: Results, stack, source: str, label: str, seconds: float, rate: int,
                    echo: Callable[[str], None]) -> None:
    """Freshness of ``source`` (``schedule: <label>``): its DAG unpaused, a first run, the warm-up, the timed
    production, the DAG paused; figures ``freshness_reclock_<label>_*``."""
    from confluent_kafka import Producer

    dag_id = f"ingest__{source}"
    create_topic(stack.kafka.bootstrap, source)
    stack.airflow.wait_for_dag(dag_id, timeout=180)
    stack.airflow.unpause(dag_id)
    seed = Producer({"bootstrap.servers": stack.kafka.bootstrap})
    for i in range(PARTITIONS):  # the first records: the first run (the shard exists from then)
        seed.produce(source, record(i, _now_ms()), partition=i)
    seed.flush(30)
    _wait_first_cycle(stack.postgres.dsn(), source=source)
    watcher = ShardWatcher(stack.postgres.dsn(), stack.state.root / "blobs", source)
    echo(f"freshness: {dag_id} (schedule {label}); warming up for {WARM_S:.0f}s")
    _measure(stack.kafka.bootstrap, [source], WARM_S, rate, [watcher], echo)
    latencies, produced = _measure(stack.kafka.bootstrap, [source], seconds, rate, [watcher], echo)
    watcher.conn.close()
    _pause(stack.airflow, dag_id, timeout=900)
    _report(results, f"reclock_{label}", latencies, produced)
    echo(f"freshness: reclock (schedule {label}) p50 {results.median(f'freshness_reclock_{label}_p50'):.2f}s "
         f"over {len(latencies):,} records")


def _structured_streaming(stack, root: Path, seconds: float, rate: int,
                          echo: Callable[[str], None]) -> tuple[list[float], int, dict[str, float]]:
    """Structured Streaming on the stack's Spark Connect server at the same rate; latencies, produced."""
    out, checkpoint = root / "ss_out", root / "ss_checkpoint"
    spark = stack.spark.session()
    query = None
    try:
        stream = decode(spark.readStream.format("kafka").options(**{
            "kafka.bootstrap.servers": stack.kafka.bootstrap, "kafka.isolation.level": "read_committed",
            "kafka.fetch.max.wait.ms": "10", "subscribe": SOURCE, "startingOffsets": "latest",
            "failOnDataLoss": "true"}).load())
        query = (stream.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint)).trigger(processingTime=f"{INTERVAL_S} seconds").start())
        deadline = time.monotonic() + 120
        while query.lastProgress is None:  # the first (empty) batch: the query is up
            if time.monotonic() > deadline:
                raise RuntimeError("structured streaming made no progress within 120s")
            time.sleep(0.5)
        watcher = SinkLogWatcher(out)
        echo(f"freshness: structured streaming warming up for {WARM_S:.0f}s")
        _measure(stack.kafka.bootstrap, [SOURCE], WARM_S, rate, [watcher], echo)
        echo(f"freshness: producing {rate:,} records/s for {seconds:.0f}s")
        with PeakRss(_memory_groups(stack)) as peak:
            latencies, produced = _measure(stack.kafka.bootstrap, [SOURCE], seconds, rate, [watcher], echo)
        return latencies, produced, {"spark_connect": peak.mb()["spark_connect"]}
    finally:
        if query is not None:
            query.stop()
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.freshness [--seconds 60] [--rate 2000]``: the freshness figures alone (interval
    and upstream schedules under the scheduler, Structured Streaming beside them), printed as a table."""
    import argparse

    from benchmarks import report

    ap = argparse.ArgumentParser(prog="python -m benchmarks.freshness", description=main.__doc__)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to produce (default 60)")
    ap.add_argument("--rate", type=int, default=2000, help="records/s (default 2000)")
    args = ap.parse_args(argv)
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    results = Results()
    results.meta.setdefault("notes", [])
    freshness(results, seconds=args.seconds, rate=args.rate,
              echo=lambda line: print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True))
    print(report.table(results))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
