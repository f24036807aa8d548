"""Reading a large collection as a table (issue 18): Spark reads the parts itself, so the Python process that
asks for the read does not grow with the collection; ``read_as_of`` (pyarrow, in-process) does.

    python -m benchmarks.tables_read [--records 5000000]

Two collections of the benchmark workload (``benchmarks.workload``: ~200-byte JSON records over 8 partitions),
one a tenth of the other, each ingested by one cycle. For each it measures, in one run:

- ``spark_as_of(...)`` aggregated (count, sum of ``amount``) and collected: wall time, and the peak RSS growth
  of this Python process (sampled every 50 ms) above its level before the read;
- the same aggregation of a bare ``spark.read.parquet`` of the same part files (the limit: no hold, no
  listing, no consolidation), as the peer of the ratio;
- ``read_as_of`` (the whole collection as one Arrow table in this process): wall time and RSS growth.

It prints the ratios (bare / spark_as_of time) and the RSS growths side by side; the claim holds when the
Spark read's growth stays flat from the small to the large collection while ``read_as_of``'s grows with it.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Callable

import psutil


def _measure(fn: Callable[[], object]) -> tuple[float, float, object]:
    """(seconds, peak RSS growth of this process in MB, result) of ``fn()``."""
    from benchmarks.memory import PeakRss

    gc.collect()
    me = psutil.Process()
    before = me.memory_info().rss
    with PeakRss({"python": lambda: [me]}) as peak:
        t0 = time.perf_counter()
        out = fn()
        secs = time.perf_counter() - t0
    return secs, (peak.peaks["python"] - before) / 1e6, out


def tables_read(records: int, echo: Callable[[str], None] = print) -> int:
    from pyspark.sql import functions as F

    from benchmarks.env import services
    from benchmarks.workload import SCHEMA, produce_backlog
    from reclock.config import parse_source
    from reclock.cycle import CycleContext, run_cycle
    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.shards import batches
    from reclock.read import read_as_of
    from reclock.tables import spark_as_of

    lines = []
    with services(echo) as env:
        blob = LocalBlobStore(env.root / "blobs")
        for label, n in (("small", max(1, records // 10)), ("large", records)):
            t0 = time.perf_counter()
            backlog = produce_backlog(env.bootstrap, label, f"tables_{label}", n)
            spec = parse_source(f"read_{label}", {"kafka": {"topic": backlog.topic, "bootstrap": env.bootstrap},
                                                  "format": {"type": "json", "schema": SCHEMA},
                                                  "budget": {"max_records": n}})
            ctx = CycleContext(spec=spec, dsn=env.dsn, upstream=env.bootstrap, blob=blob,
                               spark_factory=lambda: env.spark, retain_history_ms=10**12)
            run_cycle(ctx)
            with connect(env.dsn) as conn:
                paths = [blob.url(b.path) for b in batches(conn, spec.name)]
            echo(f"{label}: {n:,} records produced and ingested in {time.perf_counter() - t0:.0f}s, {len(paths)} parts")

            def agg(df):
                return df.agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("amount")).collect()[0]

            agg(env.spark.read.parquet(*paths))  # warm: the same files, once, untimed
            bare_s, bare_mb, bare = _measure(lambda: agg(env.spark.read.parquet(*paths)))
            ours_s, ours_mb, ours = _measure(lambda: agg(spark_as_of(env.spark, spec.name, dsn=env.dsn, blob=blob)))
            if (ours["n"], ours["amount"]) != (n, bare["amount"]) or bare["n"] != n:
                raise RuntimeError(f"{label}: spark_as_of counted {ours['n']} rows (amount {ours['amount']}), "
                                   f"the bare read {bare['n']} ({bare['amount']}), {n} were produced")

            def arrow() -> int:
                with connect(env.dsn) as conn:
                    return read_as_of(conn, blob, spec.name).num_rows

            arrow_s, arrow_mb, rows = _measure(arrow)
            if rows > n:
                raise RuntimeError(f"{label}: read_as_of gave {rows} distinct rows for {n} records")
            line = (f"{label} ({n:,} records): spark_as_of {ours_s:.2f}s, Python +{ours_mb:.0f} MB; bare Spark "
                    f"read {bare_s:.2f}s (ratio bare/ours {bare_s / ours_s:.2f}x), Python +{bare_mb:.0f} MB; "
                    f"read_as_of (in-process) {arrow_s:.2f}s, Python +{arrow_mb:.0f} MB")
            echo(line)
            lines.append(line)
    for line in lines:
        print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tables_read", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=5_000_000, help="records of the large collection")
    args = ap.parse_args(argv)
    return tables_read(args.records)


if __name__ == "__main__":
    sys.exit(main())
