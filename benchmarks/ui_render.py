"""How long the status overview takes: 50 sources with 10,000 statistics rows each (2,500 recorded cycles
of four steps), a status history and bindings each, read by ``reclock.status_report.overview`` and rendered
by ``reclock.status_page.overview_html`` (the Kafka lag probe left out: it is bounded by its timeout, not by
history). Target: under 1 s. Run: ``python -m benchmarks.ui_render [--sources 50] [--rows 10000]``.

Starts a throwaway Postgres of its own on 127.0.0.1 under a temporary folder and removes it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from benchmarks import stop


STEP_SECONDS = {"mint": 0.2, "write_batches": 3.0, "append": 0.1, "resume": 0.3}


def fill(conn, sources: int, rows: int) -> None:
    """``sources`` registered sources (data and errors shards, 100 bindings, 200 status rows) with ``rows``
    statistics rows each, as cycles write them."""
    from reclock.persist.remap_store import register_source
    from reclock.persist.shards import register_shard

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for s in range(sources):
        name = f"src_{s:02d}"
        register_source(conn, name)
        register_shard(conn, name, source=name, output=0, kind="data")
        register_shard(conn, f"{name}_errors", source=name, output=1, kind="errors")
        with conn.cursor() as cur, cur.copy("COPY reclock.statistics (name, step, metrics, at) FROM STDIN") as cp:
            for i in range(rows):
                step = ("mint", "write_batches", "append", "resume")[i % 4]
                at = t0 + timedelta(seconds=60 * (i // 4) + sum(list(STEP_SECONDS.values())[: i % 4 + 1]))
                m = {"seconds": STEP_SECONDS[step]}
                if step == "mint":
                    m["offsets_known"] = 1000 * (i // 4 + 1)
                elif step == "write_batches":
                    m.update(records={name: 1000}, bytes={name: 64_000})
                elif step == "resume":
                    m["offsets_committed"] = {"0": 1000 * (i // 4 + 1)}
                cp.write_row((name, step, json.dumps(m), at))
        conn.execute("INSERT INTO reclock.status_history (name, status, at) SELECT %s, 'running', "
                     "%s + g * interval '1 minute' FROM generate_series(1, 200) g", (name, t0))
        conn.execute("INSERT INTO reclock.remap_bindings (source, ts) SELECT %s, g FROM generate_series(1, 100) g",
                     (name,))
        conn.execute('INSERT INTO reclock.remap_offsets (source, ts, partition, "offset") '
                     "SELECT %s, g, 0, g * 10 FROM generate_series(1, 100) g", (name,))
        conn.execute("UPDATE reclock.remap_collections SET upper = 101 WHERE source = %s", (name,))
    conn.execute("ANALYZE")


def measure(dsn: str, reps: int) -> list[float]:
    from reclock import status_page, status_report

    times = []
    for _ in range(reps):
        t = time.perf_counter()
        with status_report.open_readonly(dsn) as conn:
            html = status_page.overview_html(status_report.overview(conn))
        times.append(time.perf_counter() - t)
    assert html.count("data-source=") >= 1
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=int, default=50)
    ap.add_argument("--rows", type=int, default=10_000, help="statistics rows per source")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started

    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.state import StackState
    from reclock.persist import connect
    from reclock.persist.migrate import migrate

    root = Path(tempfile.mkdtemp(prefix="reclock-ui-bench-"))
    root.chmod(0o755)  # the postgres user must reach the cluster's files
    pg = LocalPostgres(StackState(root / "stack"), fast=True)
    try:
        pg.start()
        migrate(pg.dsn())
        t = time.perf_counter()
        with connect(pg.dsn()) as conn:
            fill(conn, args.sources, args.rows)
        print(f"filled {args.sources} sources x {args.rows} statistics rows in {time.perf_counter() - t:.1f}s")
        times = measure(pg.dsn(), args.reps)
        print(f"overview of {args.sources} sources ({args.sources * args.rows:,} statistics rows): "
              f"median {statistics.median(times) * 1000:.0f} ms, best {min(times) * 1000:.0f} ms, "
              f"worst {max(times) * 1000:.0f} ms over {args.reps} renders (target < 1000 ms)")
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    main()
