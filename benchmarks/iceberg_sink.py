"""Iceberg export throughput: the exactly-once Iceberg sink against a plain pyiceberg ``table.append`` of the
same Arrow data, into the same SQL catalog (Postgres) and the same local warehouse, in the same run.

The collection is written straight into a shard (``benchmarks.sink_bench.build_collection``: Parquet parts
appended with ``compare_and_append``, no Spark): ``n`` rows of ~200 bytes over 50 timestamps. Contenders,
each into a table of its own per repetition:

- ``sink``: a fresh ``IcebergSink``: ``start`` (the catalog, the table's lineage, the read hold; timed
  apart), then ``step``, the throughput: the part (one of 2M rows here, over 8 MiB) copied into the table
  with a new footer, as the sink does by default with parts whose rows are exactly the table's; with
  ``--no-copies`` read a cluster at a time (string columns the parts keep as small dictionaries as
  dictionaries), consolidated, shaped to the append layout, written on writer threads, one commit per
  budget (``max_rows``) with the frontier in the snapshot summary, the read hold moved after each;
- ``plain append``: the same rows (the user columns and ``_reclock_ts``, read and shaped before the clock
  starts) through one ``table.append`` into a table it creates (timed, as the sink's first step creates its
  table) with the same schema and properties.

Each contender runs once untimed first.

Run alone: ``.venv/bin/python -m benchmarks.iceberg_sink --rows 2000000 --reps 5 [--data varied] [--no-copies]``
(``--data``: :data:`benchmarks.sink_bench.DATA_SHAPES`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

from benchmarks import stop
from benchmarks.sink_bench import DATA_SHAPES, build_collection
from reclock.config import COPY_MIN_BYTES


def run_iceberg_benchmark(dsn: str, workdir: Path, n: int, reps: int, max_rows: int = 1_000_000,
                          echo: Callable[[str], None] = print, data: str = "uniform",
                          copy_min_bytes: int | None = COPY_MIN_BYTES) -> dict:
    """Figures ``{name: {unit, values}}`` for the sink and the plain append (rows/s), and the ratio."""
    from reclock.config import IcebergBudget, IcebergSinkSpec
    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore
    from reclock.read import read_updates
    from reclock.sinks.iceberg import (TABLE_PROPERTIES, CatalogSettings, IcebergSink, IcebergSinkContext, catalog_uri,
                                       consolidate, load_catalog, shape, table_schema)

    blob_root = workdir / "iceberg-blobs"
    shard = f"icebench_{uuid.uuid4().hex[:8]}"
    build_collection(dsn, blob_root, shard, n, timestamps=50, data=data)
    blob = LocalBlobStore(blob_root)
    settings = CatalogSettings(uri=catalog_uri(dsn), warehouse=str(blob_root / "_iceberg"))
    catalog = load_catalog(settings, "bench")
    catalog.create_namespace_if_not_exists("bench")
    with connect(dsn) as conn:
        updates = consolidate(read_updates(conn, blob, shard))
    spec0 = IcebergSinkSpec(name="x", collection=shard, table="bench.x")
    schema = table_schema(updates.schema, "append")
    data = shape(updates, schema, spec0)  # the same rows the sink writes, shaped before the clock
    del updates
    sink_rates, plain_rates, starts, commits = [], [], [], []
    for rep in range(-1, reps):  # rep -1: untimed, warms both (imports, the catalog's tables, page cache)
        spec = IcebergSinkSpec(name=f"{shard}_{rep + 1}", collection=shard, table=f"bench.{shard}_sink_{rep + 1}",
                               catalog="bench", budget=IcebergBudget(max_rows=max_rows),
                               copy_min_bytes=copy_min_bytes)
        sink = IcebergSink(IcebergSinkContext(spec=spec, dsn=dsn, blob=blob, catalog=settings))
        t0 = time.perf_counter()
        sink.start()
        t1 = time.perf_counter()
        result = sink.step()
        sink_s = time.perf_counter() - t1
        assert result.rows == n, result

        p0 = time.perf_counter()  # like the sink's first step, the plain append creates its table
        plain = catalog.create_table(f"bench.{shard}_plain_{rep + 1}", schema=schema,
                                     properties=TABLE_PROPERTIES)
        plain.append(data)
        plain_s = time.perf_counter() - p0
        if rep < 0:
            continue
        sink_rates.append(n / sink_s)
        starts.append(t1 - t0)
        commits.append(result.commits)
        plain_rates.append(n / plain_s)
        echo(f"  iceberg rep {rep + 1}: sink {n / sink_s:,.0f} rows/s ({sink_s:.2f}s, {result.commits} commits, "
             f"start {starts[-1]:.2f}s), plain append {n / plain_s:,.0f} rows/s ({plain_s:.2f}s)")
    ratio = statistics.median(sink_rates) / statistics.median(plain_rates)
    return {"iceberg_sink_throughput": {"unit": "rows/s", "values": sink_rates},
            "iceberg_plain_append_throughput": {"unit": "rows/s", "values": plain_rates},
            "iceberg_sink_start": {"unit": "s", "values": starts},
            "iceberg_sink_commits": {"unit": "commits", "values": commits},
            "iceberg_sink_vs_plain_append": {"value": ratio, "target": 0.8}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-rows", type=int, default=1_000_000, help="the sink's budget per commit")
    ap.add_argument("--data", choices=DATA_SHAPES, default="uniform", help="the rows' shape (see sink_bench)")
    ap.add_argument("--no-copies", action="store_true", help="the sink rewrites every part (copy_min_bytes: null)")
    args = ap.parse_args()
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.state import StackState
    from reclock.persist.migrate import migrate

    root = Path(tempfile.mkdtemp(prefix="reclock-icebench-"))
    os.chmod(root, 0o755)
    pg = LocalPostgres(StackState(root), fast=True)
    try:
        pg.start()
        dsn = pg.dsn("postgres")
        migrate(dsn)
        out = run_iceberg_benchmark(dsn, root, args.rows, args.reps, args.max_rows, data=args.data,
                                    copy_min_bytes=None if args.no_copies else COPY_MIN_BYTES)
        for name, fig in out.items():
            if "values" in fig:
                print(f"{name}: median {statistics.median(fig['values']):,.2f} {fig['unit']} "
                      f"(min {min(fig['values']):,.2f}, max {max(fig['values']):,.2f})")
        r = out["iceberg_sink_vs_plain_append"]
        print(f"iceberg sink vs plain pyiceberg append: {r['value']:.2f}x (target >= {r['target']}x)")
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)  # the shard, the warehouse and Postgres: ~250 MB a run


if __name__ == "__main__":
    main()
