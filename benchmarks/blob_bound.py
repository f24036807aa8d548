"""The blob bound (issue 15): after many cycles with compaction and a rebuild, the blob store holds the live
parts plus what the grace period keeps, and nothing older.

    python -m benchmarks.chaos --blob-bound [--cycles 1000]

One source over :data:`~benchmarks.workload.PARTITIONS` partitions (its own Postgres, Kafka and local Spark
session, ``benchmarks.env.services``) runs ``cycles`` cycles, each after one record per partition, with no
history kept (``retain_history_ms`` = 0: since follows the resumption frontier, so part compaction merges
every cycle's small parts), a small budget, one rebuild halfway, and garbage collection in resume every
:data:`GC_INTERVAL_S` with a grace period of :data:`GC_GRACE_S` (the same pass prunes statistics and status
rows older than :data:`STATS_KEEP_S`). Every tenth of the run it prints, beside
the state rows, the blob store's files and bytes split into

- ``live``: the parts the shards' batch rows reference;
- ``grace``: unreferenced blobs that became garbage (written, or retired by compaction / rebuild) less
  than ``grace + interval`` (+ :data:`SLACK_S`, a cycle's length) seconds ago: what the grace period keeps;
- ``stale``: unreferenced blobs older than that, which garbage collection should have deleted.

The bound holds when ``stale`` is 0 files, i.e. blob bytes = live + grace at every check.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

GC_GRACE_S = 5.0
GC_INTERVAL_S = 2.0
STATS_KEEP_S = 30.0  # statistics and status rows kept (RECLOCK_STATS_RETAIN_S; 7 days by default)
BUDGET = 8  # records a slice: a cycle's records (one per partition) in one Spark job
SLACK_S = 5.0  # a cycle's own duration: the census follows a resume, whose GC pass saw the blobs a bit earlier


def blob_census(conn, root: Path, sources: list[str], window_s: float, now: float | None = None) -> dict:
    """Files and bytes under the blob store's ``root``: live (referenced), grace (garbage younger than
    ``window_s``), stale (garbage older)."""
    now = time.time() if now is None else now
    referenced = {p for (p,) in conn.execute("SELECT path FROM reclock.shard_batches")}
    retired = {p: float(at) for p, at in conn.execute(
        "SELECT path, extract(epoch FROM retired_at) FROM reclock.retired_parts")}
    out = {k: 0 for k in ("live_files", "live_bytes", "grace_files", "grace_bytes", "stale_files", "stale_bytes")}
    for f in root.rglob("*"):
        if not f.is_file():
            continue
        rel = f.relative_to(root).as_posix()
        parents = rel.split("/")
        paths = [rel, *("/".join(parents[:i]) for i in range(1, len(parents)))]
        size = f.stat().st_size
        if any(p in referenced for p in paths):
            kind = "live"
        else:
            became = max([f.stat().st_mtime, *(retired[p] for p in paths if p in retired)])
            kind = "grace" if now - became < window_s else "stale"
        out[f"{kind}_files"] += 1
        out[f"{kind}_bytes"] += size
    out["blob_files"] = out["live_files"] + out["grace_files"] + out["stale_files"]
    out["blob_bytes"] = out["live_bytes"] + out["grace_bytes"] + out["stale_bytes"]
    return out


def state_rows(conn, source: str) -> dict[str, int]:
    q = {"remap_bindings": "SELECT count(*) FROM reclock.remap_bindings WHERE source = %s",
         "remap_offset_rows": "SELECT count(*) FROM reclock.remap_offsets WHERE source = %s",
         "shard_batch_rows": "SELECT count(*) FROM reclock.shard_batches b JOIN reclock.shards s ON s.id = b.shard "
                             "WHERE s.source = %s",
         "retired_part_rows": "SELECT count(*) FROM reclock.retired_parts",
         "write_lease_rows": "SELECT count(*) FROM reclock.write_leases",
         "statistics_rows": "SELECT count(*) FROM reclock.statistics WHERE name = %s",
         "status_rows": "SELECT count(*) FROM reclock.status_history WHERE name = %s"}
    return {k: conn.execute(sql, (source,) if "%s" in sql else ()).fetchone()[0] for k, sql in q.items()}


def blob_bound(cycles: int = 1000, echo: Callable[[str], None] = print) -> int:
    from benchmarks.env import services
    from benchmarks.workload import PARTITIONS, SCHEMA, create_topic, record
    from confluent_kafka import Producer

    from reclock.config import parse_source
    from reclock.specs import BudgetSpec
    from reclock.cycle import CycleContext, rebuild, run_cycle
    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore

    window = GC_GRACE_S + GC_INTERVAL_S + SLACK_S
    with services(echo) as env:
        topic = "bench_blob"
        create_topic(env.bootstrap, topic)
        spec = parse_source("blobs", {"kafka": {"topic": topic, "bootstrap": env.bootstrap},
                                      "format": {"type": "json", "schema": SCHEMA},
                                      "budget": {"max_records": BUDGET}})
        root = env.work / "blobs"
        ctx = CycleContext(spec=spec, dsn=env.dsn, upstream=env.bootstrap, blob=LocalBlobStore(root),
                           spark_factory=lambda: env.spark, retain_history_ms=0,
                           gc_grace_s=GC_GRACE_S, gc_interval_s=GC_INTERVAL_S, stats_keep_s=STATS_KEEP_S)
        producer = Producer({"bootstrap.servers": env.bootstrap, "linger.ms": 0, "log_level": 2})
        t0 = time.perf_counter()
        worst_stale = 0
        written = 0
        for i in range(1, cycles + 1):
            for p in range(PARTITIONS):
                producer.produce(topic, record(i * PARTITIONS + p, int(time.time() * 1000)), partition=p)
            producer.flush(30)
            if i == cycles // 2:
                # one rebuild (replays every binding; larger slices, or it would be one Spark job per 8
                # records); the cycle after it collects what it replaced
                out = rebuild(replace(ctx, spec=replace(spec, budget=BudgetSpec(max_records=100_000))))
                echo(f"  rebuild before cycle {i}: {out}")
            run_cycle(ctx)
            if i % max(1, cycles // 10) == 0 or i == cycles:
                with connect(env.dsn) as conn:
                    census = blob_census(conn, root, ["blobs"], window)
                    rows = state_rows(conn, "blobs")
                    written, = conn.execute(
                        "SELECT coalesce(sum((metrics->'bytes'->>'blobs')::bigint), 0) FROM reclock.statistics "
                        "WHERE name = 'blobs' AND step = 'write_batches'").fetchone()
                worst_stale = max(worst_stale, census["stale_files"])
                echo(f"  cycle {i}/{cycles} ({(time.perf_counter() - t0) / i:.2f}s a cycle): "
                     f"blob {census['blob_files']} files {census['blob_bytes']:,} B = live {census['live_files']} "
                     f"files {census['live_bytes']:,} B + grace {census['grace_files']} files "
                     f"{census['grace_bytes']:,} B + stale {census['stale_files']} files {census['stale_bytes']:,} B; "
                     f"written so far {written:,} B; rows {rows}")
        bound = census["live_bytes"] + census["grace_bytes"]
        echo(f"blob bound after {cycles} cycles (compaction, retain 0, budget {BUDGET}, one rebuild, GC grace "
             f"{GC_GRACE_S:.0f}s / interval {GC_INTERVAL_S:.0f}s, window {window:.0f}s): blob store {census['blob_files']} files, "
             f"{census['blob_bytes']:,} B; bound live + grace = {bound:,} B; stale {census['stale_files']} files "
             f"(worst at any check: {worst_stale}); {written:,} B written by all cycles; state rows {rows}; "
             f"{time.perf_counter() - t0:.0f}s")
        return 0 if census["blob_bytes"] <= bound and worst_stale == 0 else 1
