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

A third collection, ``changes`` (``--changes`` records, an upsert source: every key written twice, so half
the records retract an earlier value), is read where the consolidation does its work: ``spark_as_of`` and
``duckdb_as_of`` (bit for bit: grouped by a key that tells ``-0.0`` from ``0.0`` and NaNs apart,
``reclock.bitexact``), each beside the same read grouped by SQL equality as the readers did before issue 30
(over the same parts, AS OF the same time), aggregated the same way; ratio SQL / bit-exact time, each the
best of three, alternating which goes first.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from typing import Callable

import psutil

from benchmarks import stop


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


def _sql_grouped_spark(spark, parts, blob):
    """``spark_as_of``'s read of ``parts`` as it was before issue 30: grouped by SQL equality."""
    from pyspark.sql import functions as F

    from reclock.part_layout import own_columns

    df = spark.read.options(recursiveFileLookup="true").parquet(*[blob.url(p) for p in parts.paths])
    own, _ = own_columns(parts.kind, df.columns)
    df = df.select(*own).where(F.col("ts") <= parts.as_of)
    data = [c for c in own if c not in ("ts", "diff")]
    df = df.groupBy(*data).agg(F.sum("diff").alias("diff")).where(F.col("diff") > 0)
    return df.select(*data, F.explode(F.sequence(F.lit(1), F.col("diff").cast("int"))).alias("_n")).drop("_n")


def _sql_grouped_duckdb(con, parts, blob):
    """``duckdb_as_of``'s read of ``parts`` as it was before issue 30: ``GROUP BY ALL``."""
    from reclock.part_layout import own_columns

    src = "read_parquet([%s], union_by_name = true)" % ", ".join(f"'{blob.url(p)}'" for p in parts.paths)
    own, _ = own_columns(parts.kind, con.sql(f"SELECT * FROM {src}").columns)
    data = ", ".join(f'"{c}"' for c in own if c not in ("ts", "diff"))
    agg = (f"SELECT {data}, sum(diff)::BIGINT AS _n FROM {src} WHERE ts <= {parts.as_of} GROUP BY ALL "
           "HAVING sum(diff) > 0")
    return con.sql(f"SELECT {data} FROM ({agg}) AS a, range(a._n)")


def _changes(env, blob, n: int, echo: Callable[[str], None]) -> str:
    """The ``changes`` collection: ingested, then read bit for bit and by SQL equality (see the module)."""
    import duckdb
    from pyspark.sql import functions as F

    from benchmarks.workload import PARTITIONS, SCHEMA, produce_backlog
    from reclock.config import parse_source
    from reclock.cycle import CycleContext, run_cycle
    from reclock.persist import connect
    from reclock.persist.shards import shard_info
    from reclock.tables import duckdb_as_of, list_parts, spark_as_of

    t0 = time.perf_counter()
    keys = max(PARTITIONS, n // 2 // PARTITIONS * PARTITIONS)  # a multiple of the partitions: a key, one partition
    backlog = produce_backlog(env.bootstrap, "changes", "tables_changes", keys, keys=keys)  # every key once
    spec = parse_source("read_changes", {"kafka": {"topic": backlog.topic, "bootstrap": env.bootstrap},
                                         "format": {"type": "json", "schema": SCHEMA}, "envelope": "upsert",
                                         "budget": {"max_records": n}})
    ctx = CycleContext(spec=spec, dsn=env.dsn, upstream=env.bootstrap, blob=blob,
                       spark_factory=lambda: env.spark, retain_history_ms=10**12)
    run_cycle(ctx)  # every key's first value, at one binding
    # the later values: the next binding retracts the first ones (within one binding they would cancel out)
    produce_backlog(env.bootstrap, "changes", "tables_changes", n - keys, keys=keys, start=keys)
    run_cycle(ctx)
    with connect(env.dsn) as conn:
        parts = list_parts(conn, blob, spec.name, shard_info(conn, spec.name).upper - 1)
    if not parts.retractions:
        raise RuntimeError("changes: the collection holds no retraction; nothing would be consolidated")
    echo(f"changes: {n:,} records over {keys:,} keys ingested in {time.perf_counter() - t0:.0f}s, "
         f"{len(parts.paths)} parts")

    def spark_agg(df):
        return tuple(df.agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("amount")).collect()[0])

    def duck_agg(rel):
        return rel.aggregate("count(*), sum(amount)").fetchall()[0]

    con = duckdb.connect()
    contenders = {
        "spark": (lambda: spark_agg(spark_as_of(env.spark, spec.name, parts.as_of, dsn=env.dsn, blob=blob)),
                  lambda: spark_agg(_sql_grouped_spark(env.spark, parts, blob))),
        "duckdb": (lambda: duck_agg(duckdb_as_of(con, spec.name, parts.as_of, dsn=env.dsn, blob=blob)),
                   lambda: duck_agg(_sql_grouped_duckdb(con, parts, blob))),
    }
    out = []
    for engine, (exact, sql) in contenders.items():
        exact(), sql()  # warm, untimed
        best = {"exact": float("inf"), "sql": float("inf")}
        results = {}
        for rep in range(3):
            for label, fn in ((("exact", exact), ("sql", sql)) if rep % 2 == 0 else (("sql", sql), ("exact", exact))):
                secs, _, res = _measure(fn)
                best[label] = min(best[label], secs)
                results[label] = res
        if results["exact"][0] != keys or results["sql"][0] != keys:
            raise RuntimeError(f"changes, {engine}: {results['exact'][0]} rows bit for bit, {results['sql'][0]} by "
                               f"SQL grouping; {keys} keys were written")
        out.append(f"{engine} {best['exact']:.2f}s bit-exact vs {best['sql']:.2f}s SQL-grouped "
                   f"(ratio SQL/bit-exact {best['sql'] / best['exact']:.2f}x)")
    line = f"changes ({n:,} records, {keys:,} rows AS OF the last time): " + "; ".join(out)
    echo(line)
    return line


def tables_read(records: int, echo: Callable[[str], None] = print, changes: int | None = None) -> int:
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
        lines.append(_changes(env, blob, changes if changes is not None else max(16, records // 5), echo))
    for line in lines:
        print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tables_read", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=5_000_000, help="records of the large collection")
    ap.add_argument("--changes", type=int, default=None,
                    help="records of the upsert collection (default: a fifth of --records)")
    args = ap.parse_args(argv)
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    return tables_read(args.records, changes=args.changes)


if __name__ == "__main__":
    sys.exit(main())
