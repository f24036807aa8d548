"""The S3 source's fault campaign: exactly once while objects arrive and cycles are SIGKILLed at random
moments, checked by an oracle that reads the bucket itself.

    python -m benchmarks.s3_chaos [--seconds 600] [--seed 7] [--gap 1 4]

Services of its own in a temporary folder (Postgres, moto's S3 + SQS server, a Spark Connect server on
``local[2]``), all on 127.0.0.1, stopped at the end however the run ends. Two S3 sources on one bucket:

- ``evl``: ``discovery: listing``, ``keys: increasing`` with a 4 s lookback, under ``l/``;
- ``evn``: ``discovery: notifications`` (the bucket's events to an SQS queue), under ``n/``.

A writer puts objects into both prefixes for ``--seconds``: JSON lines with a global record number, keys
increasing by time (some late, within the lookback; some with spaces and non-ASCII), some gzip'd, some
empty. Each source's cycles run in a process of their own (``run_cycle`` in a loop, over Spark Connect),
started again when it dies; every ``--gap`` seconds one of them is SIGKILLed, wherever it is (listing,
the catalog's transaction, receiving or deleting messages, a Spark job, append, resume). Then the writer
stops, each source catches up without faults, and the oracle lists and reads every object of each prefix
with boto3 and compares record by record:

- every record of every object exactly once in the source's collection, under its object's key
  (``lost``, ``duplicated``);
- one object (bound whole) at one timestamp, a timestamp the remap collection bound (``wrong timestamps``);
- nothing in the error collection but the empty and gzip'd objects' own problems (there are none here).

Prints ``lost 0, duplicated 0, wrong timestamps 0`` and exits 0 when all hold, else 1.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import stop
from benchmarks.chaos import REPO, catch_up, run_cycles

SOURCES = {"evl": "l/", "evn": "n/"}
LOOKBACK = "4s"


def _echo(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _notifications_pending(ctx) -> bool:
    """Messages a killed cycle received are hidden until their visibility timeout ends: a notifications
    source is not idle while its queue holds any."""
    return ctx.spec.upstream.discovery == "notifications" and ctx.source().queue().depth() > 0


def runner(source: str, until_idle: bool = False) -> int:
    """``run_cycle`` of ``source`` in a loop (``benchmarks.chaos.run_cycles``); the catch-up ends after two
    cycles in a row found nothing new and the source's queue is empty."""
    return run_cycles(source, until_idle=until_idle, catch_up_cycles=200, idle_cycles=2, pause=0.2, idle_pause=1.0,
                      busy=_notifications_pending)


class Writer(threading.Thread):
    """Puts objects into both prefixes until stopped, ``pause`` (a uniform range, seconds) between rounds;
    what it wrote is only for the log (the oracle reads the bucket)."""

    def __init__(self, client, bucket: str, rng: random.Random, pause: tuple[float, float] = (0.02, 0.4)) -> None:
        super().__init__(name="writer", daemon=True)
        self.client, self.bucket, self.rng, self.pause = client, bucket, rng, pause
        self.stop = threading.Event()
        self.objects = 0
        self.records = 0
        self.n = 0

    def _body(self, gz: bool, empty: bool) -> bytes:
        if empty:
            return b""
        lines = []
        for _ in range(self.rng.randint(1, 60)):
            lines.append(json.dumps({"n": self.n, "s": f"r{self.n} ü"}).encode())
            self.n += 1
        data = b"\n".join(lines) + (b"\n" if self.rng.random() < 0.8 else b"")  # some without a last line end
        return gzip.compress(data) if gz else data

    def run(self) -> None:
        seq = 0
        while not self.stop.is_set():
            seq += 1
            for prefix in SOURCES.values():
                late = self.rng.random() < 0.1 and seq > 3
                base = f"{prefix}{time.strftime('%Y/%m/%d/%H%M')}/{(seq - 2 if late else seq):07d}"
                name = base + ("x late" if late else "") + (" ü" if self.rng.random() < 0.1 else "")
                gz = self.rng.random() < 0.15
                empty = self.rng.random() < 0.03
                key = name + (".json.gz" if gz else ".json")
                before = self.n
                data = self._body(gz, empty)
                for attempt in range(5):
                    try:
                        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
                        break
                    except Exception as e:  # noqa: BLE001 - moto busy for a moment: try again
                        if attempt == 4:
                            raise
                        _echo(f"writer: {e}; again")
                        time.sleep(1)
                self.objects += 1
                self.records += self.n - before
            time.sleep(self.rng.uniform(*self.pause))


def oracle(client, bucket: str, prefix: str) -> dict[int, str]:
    """Record number -> object key, for every record under ``prefix``, read from S3 itself."""
    out: dict[int, str] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", ()):
            data = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            if o["Key"].endswith(".gz"):
                data = gzip.decompress(data)
            for line in data.split(b"\n"):
                if line.strip():
                    n = json.loads(line)["n"]
                    assert n not in out, f"record {n} twice in the bucket"
                    out[n] = o["Key"]
    return out


def check(dsn: str, blob, source: str, expected: dict[int, str]) -> dict:
    from reclock.persist import connect
    from reclock.persist.remap_store import load_remap
    from reclock.read import read_updates

    with connect(dsn) as conn:
        t = read_updates(conn, blob, source)
        errors = read_updates(conn, blob, f"{source}_errors")
        rc = load_remap(conn, source)
    rows = [] if t is None else t.to_pylist()
    seen = collections.Counter(r["n"] for r in rows)
    lost = sorted(set(expected) - set(seen))
    duplicated = sorted(n for n, c in seen.items() if c > 1)
    extra = sorted(set(seen) - set(expected))
    bound = {b.ts for b in rc.bindings} | {rc.since}
    ts_of: dict[str, set] = collections.defaultdict(set)
    wrong = 0
    for r in rows:
        ts_of[r["_key"]].add(r["ts"])
        if r["ts"] not in bound or expected.get(r["n"]) != r["_key"]:
            wrong += 1
    wrong += sum(len(v) - 1 for v in ts_of.values())
    return {"rows": len(rows), "expected": len(expected), "lost": len(lost) + len(extra), "duplicated": len(duplicated),
            "wrong": wrong, "errors": 0 if errors is None else errors.num_rows, "lost_sample": lost[:10],
            "dup_sample": duplicated[:10], "bindings": len(rc.bindings)}


def campaign(seconds: float, seed: int, gap: tuple[float, float]) -> int:
    from benchmarks.chaos import Driver
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.s3 import LocalS3
    from reclock.dev.spark import LocalSparkConnect
    from reclock.dev.state import StackState
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.migrate import migrate

    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="reclock-s3chaos-"))
    root.chmod(0o755)
    state = StackState(root / "state")
    pg, s3, spark = LocalPostgres(state, fast=True), LocalS3(state), LocalSparkConnect(state, master="local[2]",
                                                                                           driver_memory="1g")
    drivers: list = []
    writer = None
    try:
        _echo(f"seed {seed}; services in {root}")
        with ThreadPoolExecutor(1, thread_name_prefix="spark-start") as pool:
            spark_up = pool.submit(spark.start)  # its JVM starts beside the others (each waits on its port)
            pg.start()
            migrate(pg.dsn())
            s3.start()
            spark_up.result()
        bucket = "landing"
        s3.create_bucket(bucket)
        queue, arn = s3.queue("landing-events")
        s3.notify(bucket, SOURCES["evn"], arn)
        st = s3.settings()
        config = root / "reclock.yaml"
        config.write_text(json.dumps({"sources": {
            "evl": {"s3": {"url": f"s3://{bucket}/{SOURCES['evl']}", "keys": "increasing", "lookback": LOOKBACK},
                    "format": {"type": "json", "schema": "n BIGINT, s STRING"}, "include": ["key"],
                    "budget": {"max_bytes": "64KB"}},
            "evn": {"s3": {"url": f"s3://{bucket}/{SOURCES['evn']}", "discovery": "notifications", "queue": queue},
                    "format": {"type": "json", "schema": "n BIGINT, s STRING"}, "include": ["key"],
                    "budget": {"max_bytes": "64KB"}}}}))
        path = os.pathsep.join([str(REPO / "include"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": pg.dsn(),
               "RECLOCK_BLOB_URL": str(root / "blobs"), "RECLOCK_SPARK_REMOTE": spark.url,
               "RECLOCK_RETAIN_HISTORY_S": "1000000000", "RECLOCK_GC_GRACE_S": "20", "RECLOCK_GC_INTERVAL_S": "5",
               "AWS_ACCESS_KEY_ID": st.access_key, "AWS_SECRET_ACCESS_KEY": st.secret_key,
               "AWS_ENDPOINT_URL": st.endpoint_url, "AWS_REGION": st.region, "RECLOCK_S3_PATH_STYLE": "true"}
        logs = root / "logs"
        logs.mkdir()
        for name in SOURCES:
            drivers.append(Driver(name, [sys.executable, "-m", "benchmarks.s3_chaos", "--runner", name], env, logs))
        writer = Writer(s3.client(), bucket, rng)
        writer.start()
        for d in drivers:
            d.tick()
        kills = collections.Counter()
        end = time.monotonic() + seconds
        next_kill = time.monotonic() + rng.uniform(*gap)
        while time.monotonic() < end:
            for d in drivers:
                d.tick()
            if time.monotonic() >= next_kill:
                d = rng.choice(drivers)
                if d.kill():
                    kills[d.name] += 1
                next_kill = time.monotonic() + rng.uniform(*gap)
            time.sleep(0.1)
        writer.stop.set()
        writer.join(30)
        for d in drivers:
            d.stop()
        _echo(f"writer: {writer.objects} objects, {writer.records} records; kills {dict(kills)}")
        time.sleep(float(LOOKBACK[:-1]) + 1)
        with ThreadPoolExecutor(len(SOURCES), thread_name_prefix="catch-up") as pool:  # without faults, side by side
            caught = list(pool.map(lambda name: catch_up("benchmarks.s3_chaos", name, env,
                                                         logs / f"catch-up-{name}.log"), SOURCES))
        if any(c is None for c in caught):
            return 1
        client = s3.client()
        total = {"lost": 0, "duplicated": 0, "wrong": 0}
        for name, prefix in SOURCES.items():
            verdict = check(pg.dsn(), LocalBlobStore(root / "blobs"), name, oracle(client, bucket, prefix))
            _echo(f"{name}: {verdict}")
            for k in total:
                total[k] += verdict[k]
        _echo(f"kills: {sum(kills.values())} ({dict(kills)}), launches: "
              f"{ {d.name: d.launches for d in drivers} }")
        print(f"lost {total['lost']}, duplicated {total['duplicated']}, wrong timestamps {total['wrong']}", flush=True)
        return 0 if not any(total.values()) and sum(kills.values()) > 0 else 1
    finally:
        if writer is not None:
            writer.stop.set()
        for d in drivers:
            d.stop()
        from reclock.dev.procs import side_by_side

        _, errors = side_by_side({type(svc).__name__: svc.stop for svc in (spark, s3, pg)})
        for name, e in errors.items():  # each stopped anyway
            _echo(f"stopping {name}: {e}")
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.s3_chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--gap", type=float, nargs=2, default=(1.0, 4.0))
    p.add_argument("--runner", help=argparse.SUPPRESS)
    p.add_argument("--until-idle", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.runner:
        return runner(a.runner, a.until_idle)
    stop.install()  # SIGTERM or Ctrl-C: the finally block stops the services
    return campaign(a.seconds, a.seed, tuple(a.gap))


if __name__ == "__main__":
    sys.exit(main())
