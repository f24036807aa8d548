"""Benchmarks of the S3 source, each side by side with its peer in one run, under ``flock
/tmp/reclock-bench.lock``:

    python -m benchmarks.s3_source throughput [--objects 64] [--mb 4] [--reps 3]
    python -m benchmarks.s3_source state [--objects 1000000] [--per-cycle 10000]
    python -m benchmarks.s3_source big [--gb 5]

``throughput``: the same objects in one bucket of moto's S3 server (JSON lines, ~200-byte records), the same
decode (``from_json`` with the declared schema; Spark's JSON reader for the peer) into Parquet:

- ``reclock``: one cycle of a new S3 source (``run_cycle``: list, bind, read the bound ranges in Spark tasks
  pinned to each ETag, decode, write, prove, append, resume);
- ``file_stream``: Spark's file stream source on ``s3a://`` with ``trigger(availableNow=True)`` writing
  Parquet with a checkpoint (its ``_spark_metadata`` log and offsets), in the same local Spark session.

Records/s of each (medians; which contender goes first alternates by repetition), each Reclock cycle's
steps' seconds, and reclock / file_stream (target >= 1.0).

``state``: a local folder of ``--objects`` files in date-partitioned folders (``keys: increasing``, the same
discovery code as a bucket), ``--per-cycle`` new files a cycle; at every tenth of the objects: the
catalog's rows, the remap collection's rows and offset rows, the keys the cycle's listing returned and
the directories it entered, and the mint step's seconds. Flat = the last tenth's figures are those of the
first (target: rows and listed keys at 1,000,000 objects <= 1.2 x at 100,000). Beside it, Spark's file
stream source's ``_spark_metadata`` log over the same cycles: it grows with every file ever read.

``big``: one ``--gb`` GB object (a sparse local file: text lines of 1 MiB, most of it holes, so it costs no
disk) read by one cycle with a 256 MB budget; peak RSS of the Spark JVM and its Python workers, beside the
same for an object a tenth of the size (flat: memory bounded by the budget, not by the object).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from benchmarks import stop

HERE = Path(__file__).resolve().parent
SCHEMA = "id BIGINT, customer STRING, amount DOUBLE, note STRING"


def echo(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


@contextlib.contextmanager
def services(with_s3: bool = True) -> Iterator[dict]:
    """Postgres (migrated), moto's S3 server and one local[2] Spark session with S3A, in a temporary folder;
    all stopped and removed at the end."""
    from reclock.dev.jars import spark_kafka_jars, spark_s3a_jars
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.s3 import LocalS3
    from reclock.dev.spark import LOOPBACK_CONF
    from reclock.dev.state import StackState
    from reclock.persist.migrate import migrate
    from reclock.persist.objectstore import jvm_env, spark_s3a_conf
    from reclock.spark.session import driver_session

    saved = dict(os.environ)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    root = Path(tempfile.mkdtemp(prefix="reclock-s3bench-"))
    root.chmod(0o755)
    state = StackState(root / "state")
    pg, s3, spark = LocalPostgres(state, fast=True), LocalS3(state) if with_s3 else None, None
    try:
        pg.start()
        migrate(pg.dsn())
        conf = {**LOOPBACK_CONF, "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"}
        jars = spark_kafka_jars(state)
        if s3 is not None:
            s3.start()
            os.environ.update(jvm_env(s3.settings()))
            conf.update(spark_s3a_conf(s3.settings()))
            jars += spark_s3a_jars(state)
        conf["spark.jars"] = ",".join(jars)
        spark = driver_session("local[2]", "reclock-s3-bench", conf)
        yield {"root": root, "state": state, "pg": pg, "s3": s3, "spark": spark}
    finally:
        if spark is not None:
            spark.stop()
        for svc in (s3, pg):
            if svc is not None:
                with contextlib.suppress(Exception):
                    svc.stop()
        shutil.rmtree(root, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


def _ctx(env: dict, name: str, url: str, settings, fmt: dict | None = None, **extra):
    from reclock import cycle
    from reclock.config import parse_source
    from reclock.persist.blob import LocalBlobStore

    raw = {"s3": {"url": url, **extra.pop("s3", {})}, "format": fmt or {"type": "json", "schema": SCHEMA}, **extra}
    return cycle.CycleContext(spec=parse_source(name, raw), dsn=env["pg"].dsn(),
                              blob=LocalBlobStore(env["root"] / "blobs"), spark_factory=lambda: env["spark"],
                              upstream=settings)


def _records(i0: int, n: int) -> bytes:
    return b"".join(b'{"id": %d, "customer": "c%d", "amount": %d.25, "note": "%s"}\n'
                    % (i, i % 997, i % 1000, b"n" * 120) for i in range(i0, i0 + n))


class CpuMeter:
    """CPU seconds (user + system) of ``pids`` and every descendant: this process, the Spark JVM and its
    Python workers, moto's server (less sensitive to a shared machine's load than wall time). Sampled every
    ``every`` seconds in a thread and kept per process at its highest, so a process that ends between two
    readings (a Python worker) keeps what it used up to its last sample (at most ``every`` seconds lost)."""

    def __init__(self, *pids: int, every: float = 0.25) -> None:
        import threading

        self.pids, self.seen, self.every = pids, {}, every
        self.lock, self.done = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.sample()
        self.thread.start()

    def sample(self) -> float:
        import psutil

        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(pid)
                for proc in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = proc.cpu_times()
                        used = t.user + t.system  # its own: a reaped child is counted by its own samples
                        key = (proc.pid, proc.create_time())
                        with self.lock:
                            self.seen[key] = max(self.seen.get(key, 0.0), used)
        with self.lock:
            return sum(self.seen.values())

    def _run(self) -> None:
        while not self.done.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def throughput(objects: int, mb: float, reps: int) -> dict:
    from reclock.dev.procs import read_pid

    with services() as env:
        s3, spark = env["s3"], env["spark"]
        meter = CpuMeter(os.getpid(), read_pid(s3.pidfile))
        c = s3.client()
        s3.create_bucket("bench")
        per = max(1, int(mb * 1e6 / 190))
        total = 0
        for k in range(objects):
            data = _records(total, per)
            c.put_object(Bucket="bench", Key=f"in/2025/01/{k:05d}.json", Body=data)
            total += per
        size = objects * len(_records(0, per))
        echo(f"{objects} objects, {total} records, {size / 1e6:.0f} MB in moto's S3")
        figures: dict[str, list[float]] = {"reclock": [], "file_stream": []}
        cpu: dict[str, list[float]] = {"reclock": [], "file_stream": []}

        def reclock(rep: int) -> None:
            from reclock import cycle

            ctx = _ctx(env, f"tp{rep}", "s3://bench/in/", s3.settings(), budget={"max_bytes": "2GB"})
            c0, t0 = meter.sample(), time.monotonic()
            cycle.run_cycle(ctx)
            dt, used = time.monotonic() - t0, meter.sample() - c0
            from reclock.persist import connect
            from reclock.persist.shards import shard_info

            with connect(env["pg"].dsn()) as conn:
                rows = conn.execute("SELECT coalesce(sum(rows), 0) FROM reclock.shard_batches WHERE shard = %s",
                                    (f"tp{rep}",)).fetchone()[0]
                assert shard_info(conn, f"tp{rep}").upper > 0
                steps = dict(conn.execute("SELECT step, (metrics->>'seconds')::float FROM reclock.statistics WHERE "
                                          "name = %s AND metrics ? 'seconds'", (f"tp{rep}",)).fetchall())
            assert rows == total, (rows, total)
            if rep:
                figures["reclock"].append(total / dt)
                cpu["reclock"].append(used)
            echo(f"reclock rep {rep}: {dt:.2f}s, {total / dt:,.0f} records/s, {used:.1f} CPU-s; steps {steps}")

        def file_stream(rep: int) -> None:
            out, chk = env["root"] / f"ss{rep}", env["root"] / f"ss{rep}.chk"
            c0, t0 = meter.sample(), time.monotonic()
            q = (spark.readStream.schema(SCHEMA).json("s3a://bench/in/2025/01/")
                 .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(chk))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            dt, used = time.monotonic() - t0, meter.sample() - c0
            n = spark.read.parquet(str(out)).count()
            assert n == total, (n, total)
            if rep:
                figures["file_stream"].append(total / dt)
                cpu["file_stream"].append(used)
            echo(f"file_stream rep {rep}: {dt:.2f}s, {total / dt:,.0f} records/s, {used:.1f} CPU-s")

        try:
            for rep in range(reps + 1):  # the first of each is a warm-up; which goes first alternates
                for run in ((reclock, file_stream) if rep % 2 == 0 else (file_stream, reclock)):
                    run(rep)
        finally:
            meter.stop()
        med = {k: statistics.median(v) for k, v in figures.items()}
        med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
        ratio = med["reclock"] / med["file_stream"]
        echo(f"median records/s: reclock {med['reclock']:,.0f}, file_stream {med['file_stream']:,.0f}; "
             f"reclock / file_stream = {ratio:.2f} (target >= 1.0: {'met' if ratio >= 1.0 else 'NOT met'}); "
             f"median CPU-s: reclock {med_cpu['reclock']:.1f}, file_stream {med_cpu['file_stream']:.1f}; "
             f"load average {os.getloadavg()[0]:.1f}")
        return {"objects": objects, "records": total, "bytes": size, "records_per_s": med, "ratio": ratio,
                "cpu_seconds": med_cpu, "load": os.getloadavg()}


def state(objects: int, per_cycle: int, on_s3: bool = False) -> dict:
    """Flat state and listing cost as a folder source (``on_s3``: a bucket of moto's S3 server) takes
    ``objects`` files (module doc)."""
    from concurrent.futures import ThreadPoolExecutor

    from reclock import cycle
    from reclock.persist import connect
    from reclock.sources.s3 import catalog

    with services(with_s3=on_s3) as env:
        folder = env["root"] / "landing"
        folder.mkdir()
        clock = [1_700_000_000_000]
        s3 = env["s3"]
        if on_s3:
            s3.create_bucket("landing")
            client = s3.client()
            url, settings = "s3://landing/in/", s3.settings()
        else:
            url, settings = str(folder), None
        ctx = _ctx(env, "st", url, settings, s3={"keys": "increasing", "lookback": "10s",
                                                 **({} if on_s3 else {"settle": "1s"})},
                   budget={"max_bytes": "1GB", "max_objects": 1_000_000})
        ctx.clock = lambda: clock[0]
        made, rows_out, put_s = 0, [], 0.0
        line = _records(0, 1)
        cycles = objects // per_cycle
        stream_chk = env["root"] / "fs.chk"
        pool = ThreadPoolExecutor(8)
        for k in range(cycles):
            part = f"{k // 100:04d}/{k % 100:02d}"
            t0 = time.monotonic()
            if on_s3:
                list(pool.map(lambda j: client.put_object(Bucket="landing", Key=f"in/{part}/{j:06d}.json", Body=line),
                              range(per_cycle)))
            else:
                day = folder / part
                day.mkdir(parents=True)
                for j in range(per_cycle):
                    p = day / f"{j:06d}.json"
                    p.write_bytes(line)
                past = (clock[0] - 60_000) / 1000  # settled: written a minute ago on the source's clock
                for p in day.iterdir():
                    os.utime(p, (past, past))
            put_s += time.monotonic() - t0
            made += per_cycle
            t0 = time.monotonic()
            minted = cycle.mint(ctx)
            mint_s = time.monotonic() - t0
            for d in minted.descriptions:
                cycle.append(ctx, cycle.write_batches(ctx, d))
            clock[0] += 20_000  # past the lookback: the next cycle's listing starts after these keys
            cycle.resume(ctx)
            if (k + 1) % max(1, cycles // 10) == 0:
                with connect(ctx.dsn) as conn:
                    cat = catalog.counts(conn, "st")
                    remap_rows = conn.execute("SELECT count(*) FROM reclock.remap_bindings WHERE source = 'st'"
                                              ).fetchone()[0]
                    offset_rows = conn.execute("SELECT count(*) FROM reclock.remap_offsets WHERE source = 'st'"
                                               ).fetchone()[0]
                    stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = 'st' AND step = "
                                         "'discover' ORDER BY id DESC LIMIT 1").fetchone()[0]
                row = {"objects": made, "catalog_rows": sum(v for s, v in cat.items() if s != "forgotten"),
                       "forgotten": cat["forgotten"], "remap_bindings": remap_rows, "remap_offsets": offset_rows,
                       "listed": stats["listed"], "mint_s": round(mint_s, 3), "discover_s": stats["seconds"],
                       "put_per_s": round(made / put_s) if put_s else None}
                rows_out.append(row)
                echo(json.dumps(row))
        first, last = rows_out[min(1, len(rows_out) - 1)], rows_out[-1]  # the first cycle lists no lookback
        growth = {k: (last[k] / first[k] if first[k] else float(last[k] == 0))
                  for k in ("catalog_rows", "remap_bindings", "remap_offsets", "listed")}
        echo(f"growth from {first['objects']:,} to {last['objects']:,} objects: {growth}; mint "
             f"{first['mint_s']}s -> {last['mint_s']}s")
        # the peer's state: Spark's file stream source remembers every file in its _spark_metadata log (over a
        # tenth of the folders: its batches take far longer than the cycles above; the log grows per file)
        spark = env["spark"]
        out = env["root"] / "fs-out"
        sample = max(1, cycles // 10)
        glob = ("s3a://landing/in" if on_s3 else str(folder)) + "/0000/{" + ",".join(
            f"{k:02d}" for k in range(min(sample, 100))) + "}/"
        q = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", per_cycle).json(glob)
             .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(stream_chk))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        meta = out / "_spark_metadata"
        log_bytes = sum(p.stat().st_size for p in meta.iterdir()) if meta.exists() else 0
        sources = stream_chk / "sources" / "0"
        src_bytes = sum(p.stat().st_size for p in sources.iterdir()) if sources.exists() else 0
        files = min(sample, 100) * per_cycle
        echo(f"file stream source after {files:,} files: _spark_metadata {log_bytes / 1e6:.1f} MB, source log "
             f"{src_bytes / 1e6:.1f} MB: {(log_bytes + src_bytes) / files:.0f} bytes per file ever read, "
             f"{(log_bytes + src_bytes) / files * made / 1e6:.0f} MB at {made:,} files")
        pool.shutdown()
        return {"on": "moto's S3 server" if on_s3 else "a local folder", "checks": rows_out, "growth": growth, "file_stream_files": files, "file_stream_metadata_bytes": log_bytes,
                "file_stream_source_log_bytes": src_bytes}


def big(gb: float) -> dict:
    """Peak memory reading one ``gb`` GB object vs one a tenth of it (module doc)."""
    import psutil

    from benchmarks.memory import PeakRss, process_tree
    from reclock import cycle

    out = {}
    with services(with_s3=False) as env:
        jvm = env["spark"].sparkContext._gateway.proc.pid
        for label, size in (("small", gb / 10), ("big", gb)):
            folder = env["root"] / f"big-{label}"
            folder.mkdir()
            path = folder / "one.log"
            line = 1 << 20
            n = int(size * 1e9) // line
            with open(path, "wb") as f:  # a sparse file: a line end every MiB, holes between
                for i in range(n):
                    f.seek((i + 1) * line - 1)
                    f.write(b"\n")
            os.utime(path, (1_600_000_000, 1_600_000_000))
            ctx = _ctx(env, f"big_{label}", str(folder), None, fmt={"type": "text"}, budget={"max_bytes": "256MB"})
            t0 = time.monotonic()
            with PeakRss({"python": lambda: [psutil.Process()], "jvm": lambda: process_tree(jvm)}) as peak:
                cycle.run_cycle(ctx)
            dt = time.monotonic() - t0
            from reclock.persist import connect

            with connect(ctx.dsn) as conn:
                rows = conn.execute("SELECT coalesce(sum(rows), 0) FROM reclock.shard_batches WHERE shard = %s",
                                    (f"big_{label}",)).fetchone()[0]
            assert rows == n, (rows, n)
            out[label] = {"bytes": n * line, "lines": n, "seconds": round(dt, 1), "peak_mb": peak.mb()}
            echo(f"{label}: {n * line / 1e9:.1f} GB in {dt:.1f}s ({n * line / 1e6 / dt:.0f} MB/s), peak RSS "
                 f"{peak.mb()}")
            path.unlink()
        ratio = out["big"]["peak_mb"]["total"] / out["small"]["peak_mb"]["total"]
        echo(f"peak memory {gb:g} GB / {gb / 10:g} GB object = {ratio:.2f} (flat: <= 1.2: "
             f"{'met' if ratio <= 1.2 else 'NOT met'})")
        out["ratio"] = ratio
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.s3_source", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--objects", type=int, default=64)
    t.add_argument("--mb", type=float, default=4.0)
    t.add_argument("--reps", type=int, default=3)
    s = sub.add_parser("state")
    s.add_argument("--objects", type=int, default=1_000_000)
    s.add_argument("--per-cycle", type=int, default=10_000)
    s.add_argument("--s3", action="store_true", help="objects in a bucket of moto's S3 server (default: a folder)")
    b = sub.add_parser("big")
    b.add_argument("--gb", type=float, default=5.0)
    a = p.parse_args(argv)
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    if a.what == "throughput":
        res = throughput(a.objects, a.mb, a.reps)
    elif a.what == "state":
        res = state(a.objects, a.per_cycle, a.s3)
    else:
        res = big(a.gb)
    print(json.dumps(res, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
