"""What a cycle costs beyond moving data: the per-cycle overhead, and the state that many cycles leave.

- **Per-cycle overhead**: steady-state cycles (the source exists, its first cycle is not counted) over
  a tiny backlog of :data:`OVERHEAD_RECORDS` records each, run directly. The total and its split into
  the steps ``reclock.statistics`` records (mint, write_batches, append, resume) plus ``other`` (what
  lies outside the steps: statistics and status rows, Python).
- **State size**: ``cycles`` cycles, each after producing one record per partition, with compaction on
  (``retain_history_ms`` = :data:`RETAIN_MS`). The cycles read a simulated clock that advances
  :data:`CLOCK_STEP_MS` per reading (two readings a cycle), so the retention window always spans the
  same number of cycles however fast the machine runs them and the row counts do not jitter. The rows
  of ``reclock.remap_bindings``, ``reclock.remap_offsets`` and ``reclock.shard_batches`` are counted
  after half the cycles and after all of them: bounded state means no growth of the remap rows between
  the two, at most partitions x retained bindings offset rows, and at most the compaction bound of batch
  rows (:func:`_state_rows`). Batch rows saw-tooth (compaction merges a shard's parts at or below since
  once ``min_parts`` of them wait), so they are checked against that bound, not half against full.
"""

from __future__ import annotations

import time
from typing import Callable

from benchmarks.contenders import step_seconds
from benchmarks.env import Env
from benchmarks.report import Results
from benchmarks.workload import PARTITIONS, SCHEMA, create_topic, record

OVERHEAD_RECORDS = 100
RETAIN_MS = 6_000
CLOCK_STEP_MS = 1_000
STEPS = ("mint", "write_batches", "append", "resume")


class SimulatedClock:
    """Milliseconds starting at the wall clock, advancing ``step`` per reading."""

    def __init__(self, step: int = CLOCK_STEP_MS) -> None:
        self.t = int(time.time() * 1000)
        self.step = step

    def __call__(self) -> int:
        self.t += self.step
        return self.t


def _context(env: Env, name: str, topic: str, **extra):
    from reclock.config import parse_source
    from reclock.cycle import CycleContext
    from reclock.persist.blob import LocalBlobStore

    spec = parse_source(name, {"kafka": {"topic": topic, "bootstrap": env.bootstrap},
                               "format": {"type": "json", "schema": SCHEMA}})
    return CycleContext(spec=spec, dsn=env.dsn, upstream=env.bootstrap, blob=LocalBlobStore(env.work / "blobs"),
                        spark_factory=lambda: env.spark, **extra)


def _producer(env: Env):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": env.bootstrap, "linger.ms": 0, "log_level": 2})


def cycle_overhead(env: Env, cycles: int, results: Results, echo: Callable[[str], None] = print) -> None:
    """``cycles`` timed cycles of :data:`OVERHEAD_RECORDS` records each (after one untimed first cycle)."""
    from reclock.cycle import run_cycle

    topic = "bench_overhead"
    create_topic(env.bootstrap, topic)
    ctx = _context(env, "overhead", topic)
    producer = _producer(env)
    n = 0

    def produce() -> None:
        nonlocal n
        for _ in range(OVERHEAD_RECORDS):
            producer.produce(topic, record(n, int(time.time() * 1000)), partition=n % PARTITIONS)
            n += 1
        producer.flush(30)

    produce()
    run_cycle(ctx)  # registers the source, mints the first binding: not a steady-state cycle
    _, last = step_seconds(env.dsn, "overhead")
    for i in range(cycles):
        produce()
        t0 = time.perf_counter()
        run_cycle(ctx)
        total = time.perf_counter() - t0
        steps, last = step_seconds(env.dsn, "overhead", last)
        results.add("cycle_overhead_total", "s", total)
        for step in STEPS:
            results.add(f"cycle_overhead_{step}", "s", steps.get(step, 0.0))
        results.add("cycle_overhead_other", "s", max(0.0, total - sum(steps.get(s, 0.0) for s in STEPS)))
        echo(f"  overhead cycle {i + 1}/{cycles}: {total:.2f}s ("
             + ", ".join(f"{s} {steps.get(s, 0.0):.2f}s" for s in STEPS) + ")")


def _state_rows(env: Env, source: str) -> dict[str, int]:
    """The source's state rows, and ``shard_batch_bound``: what part compaction leaves at most after a
    cycle, per shard ``min_parts - 1`` candidates (small parts at or below since: tiny ones all pack into
    one merge) plus the parts it does not touch (above since, or not small)."""
    from reclock.persist import connect
    from reclock.persist.compact import DEFAULT_MIN_PARTS, DEFAULT_SMALL_BYTES

    with connect(env.dsn) as conn:
        bindings, = conn.execute("SELECT count(*) FROM reclock.remap_bindings WHERE source = %s",
                                 (source,)).fetchone()
        offsets, = conn.execute("SELECT count(*) FROM reclock.remap_offsets WHERE source = %s",
                                (source,)).fetchone()
        batches, = conn.execute("SELECT count(*) FROM reclock.shard_batches b JOIN reclock.shards s "
                                "ON s.id = b.shard WHERE s.source = %s", (source,)).fetchone()
        shards, untouched = conn.execute(
            "SELECT count(DISTINCT s.id), count(b.path) FILTER (WHERE b.upper > s.since + 1 OR b.bytes >= %s) "
            "FROM reclock.shards s LEFT JOIN reclock.shard_batches b ON b.shard = s.id WHERE s.source = %s",
            (DEFAULT_SMALL_BYTES, source)).fetchone()
    return {"remap_bindings": bindings, "remap_offset_rows": offsets, "shard_batch_rows": batches,
            "shard_batch_bound": shards * (DEFAULT_MIN_PARTS - 1) + untouched}


def state_size(env: Env, cycles: int, results: Results, echo: Callable[[str], None] = print) -> None:
    """``cycles`` small cycles with compaction on; row counts after half of them and after all. The shard
    batch rows are checked against the bound part compaction keeps (``shard_batch_bound``), not half
    against full as the remap rows are: with compaction they saw-tooth under that bound instead of growing."""
    from reclock.cycle import run_cycle

    topic = "bench_state"
    create_topic(env.bootstrap, topic)
    ctx = _context(env, "state", topic, clock=SimulatedClock(), retain_history_ms=RETAIN_MS)
    producer = _producer(env)
    half = max(1, cycles // 2)
    snapshots: dict[str, dict[str, int]] = {}
    t0 = time.perf_counter()
    for i in range(1, cycles + 1):
        for p in range(PARTITIONS):
            producer.produce(topic, record(i * PARTITIONS + p, int(time.time() * 1000)), partition=p)
        producer.flush(30)
        run_cycle(ctx)
        if i in (half, cycles):
            snapshots["half" if i == half and i != cycles else "full"] = _state_rows(env, "state")
        if i % max(1, cycles // 10) == 0:
            echo(f"  state cycle {i}/{cycles} ({(time.perf_counter() - t0) / i:.2f}s a cycle): "
                 f"{_state_rows(env, 'state')}")
    snapshots.setdefault("half", snapshots["full"])
    for when, rows in snapshots.items():
        for kind, count in rows.items():
            results.add(f"state_{kind}_{when}", "rows", count)
        results.add(f"state_remap_bound_{when}", "rows", PARTITIONS * rows["remap_bindings"])
    full, halfway = snapshots["full"], snapshots["half"]
    results.add("state_cycle_seconds", "s", (time.perf_counter() - t0) / cycles)
    grown = f"after {cycles} vs {half} cycles"
    results.check("state_remap_offset_rows_full_vs_half",
                  full["remap_offset_rows"] / max(1, halfway["remap_offset_rows"]), 1.0, "<=", grown)
    results.check("state_remap_offset_rows_vs_bound",
                  full["remap_offset_rows"] / max(1, PARTITIONS * full["remap_bindings"]), 1.0, "<=",
                  "partitions x retained bindings")
    results.check("state_shard_batch_rows_vs_bound",
                  full["shard_batch_rows"] / max(1, full["shard_batch_bound"]), 1.0, "<=",
                  "(min_parts - 1) per shard + parts above since")
