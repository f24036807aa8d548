"""The Kinesis source's fault campaign: exactly once while a producer writes, the stream is split and merged,
reads are throttled, and cycles are SIGKILLed at random moments (and at fail points inside their steps),
checked by an oracle that reads every shard of the stream itself from ``TRIM_HORIZON``.

    python -m benchmarks.kinesis_chaos [--seconds 600] [--seed 7] [--gap 4 16] [--reshard 6 14]

Services of its own in a temporary folder, all on 127.0.0.1, stopped at the end however the run ends:
Postgres, the local Kinesis endpoint (kinesalite, ``reclock.dev.kinesis``) behind the throttling proxy
(``reclock.dev.kinesis_proxy``: 5 ``GetRecords`` a second per shard as AWS allows, and every 40th read of
an iterator answered ``ExpiredIteratorException``), and a Spark Connect server on ``local[2]``.

One Kinesis source ``clicks`` on a stream of 2 shards, small budgets (a binding and a write of at most 500
records, counted every 20, Spark tasks of at most 60: a shard's range is read by several tasks), history kept
30 s (so compaction advances ``since`` and drops shards read to their ends while the campaign runs). For
``--seconds``:

- a producer puts JSON records ``{"id": n, "key": k}`` (ids increasing, 40 partition keys) straight to
  kinesalite;
- every ``--reshard`` seconds the stream is split (an open shard at the middle of its hash range) or merged
  (two open shards whose hash ranges touch), alternately;
- the source's cycles run in a process of their own (``run_cycle`` in a loop, over Spark Connect), started
  again when it dies; every ``--gap`` seconds it is SIGKILLed wherever it is (the scan, the counts'
  transaction, a Spark job, append, resume, the drop of finished shards), or started with a fail point that
  ends it with ``os._exit`` at a chosen place (``mint:after_scan``, ``write_batches:before_job``,
  ``write_batches:after_slice``: some parts written, not all; ``append:in_transaction``;
  ``resume:after_commit``).

Then the producer and the resharding stop, the source catches up without faults, and the oracle reads every
shard itself and compares record by record:

- every record in the stream is in the collection exactly once (``lost``, ``duplicated``), and nothing else;
- each at the timestamp of the first binding whose position for its shard is beyond its sequence number (at
  least ``since``) (``wrong timestamps``); children's records after their parents' (the KCL rule: a child's
  first binding is after its parents' last);
- AS OF each binding at or after ``since``: exactly the oracle's records those bindings cover.

Prints ``lost 0, duplicated 0, wrong timestamps 0`` and exits 0 when all hold and there were kills and
reshardings, else 1.
"""

from __future__ import annotations

import argparse
import collections
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

SOURCE = "clicks"
STREAM = "clicks"
FAILPOINTS = ("mint:after_scan", "write_batches:before_job", "write_batches:after_slice", "append:in_transaction",
              "resume:after_commit")


def _echo(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def runner(source: str, until_idle: bool = False) -> int:
    """``run_cycle`` of ``source`` in a loop (``benchmarks.chaos.run_cycles``); the catch-up ends after two
    cycles in a row found nothing new."""
    return run_cycles(source, until_idle=until_idle, catch_up_cycles=300, idle_cycles=2, pause=0.2, idle_pause=0.5)


def open_shards(client) -> list[dict]:
    """The stream's open shards, by hash range."""
    shards = client.list_shards(StreamName=STREAM)["Shards"]
    return sorted((s for s in shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]),
                  key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))


class Resharder(threading.Thread):
    """Splits and merges the stream, alternately, every ``every`` seconds, until stopped."""

    def __init__(self, kinesis, rng: random.Random, every: tuple[float, float]) -> None:
        super().__init__(name="resharder", daemon=True)
        self.kinesis, self.rng, self.every = kinesis, rng, every
        self.stop = threading.Event()
        self.splits = 0
        self.merges = 0
        self.errors: list[str] = []

    def reshard(self, split: bool) -> None:
        c = self.kinesis.client()
        shards = open_shards(c)
        if split or len(shards) < 2:
            s = self.rng.choice(shards)
            lo, hi = int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"])
            c.split_shard(StreamName=STREAM, ShardToSplit=s["ShardId"], NewStartingHashKey=str((lo + hi + 1) // 2))
            self.splits += 1
            what = f"split {s['ShardId']}"
        else:
            pairs = [(a, b) for a, b in zip(shards, shards[1:])
                     if int(a["HashKeyRange"]["EndingHashKey"]) + 1 == int(b["HashKeyRange"]["StartingHashKey"])]
            a, b = self.rng.choice(pairs)
            c.merge_shards(StreamName=STREAM, ShardToMerge=a["ShardId"], AdjacentShardToMerge=b["ShardId"])
            self.merges += 1
            what = f"merged {a['ShardId']} and {b['ShardId']}"
        self.kinesis.wait_active(STREAM, 60)
        _echo(f"resharder: {what}; {len(open_shards(c))} open shards")

    def run(self) -> None:
        split = True
        while not self.stop.wait(self.rng.uniform(*self.every)):
            try:
                self.reshard(split)
                split = not split
            except Exception as e:  # noqa: BLE001 - reported; the campaign fails on it
                self.errors.append(repr(e))
                _echo(f"resharder: {e!r}")


def check(dsn: str, blob, address, client, acked) -> dict:
    """The collection against the stream read by itself (see the module)."""
    from reclock.dev.kinesis import read_stream
    from reclock.persist import connect
    from reclock.persist.remap_store import load_remap
    from reclock.persist.shards import shard_info
    from reclock.read import read_as_of, read_updates
    from reclock.sources.kinesis.client import KinesisUpstream
    from reclock.sources.kinesis.kind import effective
    from reclock.sources.kinesis.sequence import shard_number

    truth = read_stream(client, STREAM)
    listing = KinesisUpstream(SOURCE, address).shards()
    with connect(dsn) as conn:
        rc = load_remap(conn, SOURCE)
        upper = shard_info(conn, SOURCE).upper
        ups = read_updates(conn, blob, SOURCE)
        (dropped,) = conn.execute("SELECT dropped_records FROM reclock.kinesis_streams WHERE source = %s",
                                  (SOURCE,)).fetchone()
        frontier_rows = conn.execute("SELECT count(*) FROM reclock.remap_offsets WHERE source = %s",
                                     (SOURCE,)).fetchone()[0]
    bindings = [(b.ts, effective(listing, dict(b.frontier))) for b in rc.bindings]

    def ts_of(sid: str, seq: int) -> int | None:
        for ts, positions in bindings:
            if seq < positions.get(shard_number(sid), 0):
                return max(ts, rc.since)
        return None

    want: dict[int, tuple[str, int, int]] = {}  # id -> (shard, sequence number, ts)
    in_stream = 0
    for sid, recs in truth.items():
        for r in recs:
            in_stream += 1
            n = json.loads(r["Data"])["id"]
            assert n not in want, f"record {n} twice in the stream"
            ts = ts_of(sid, int(r["SequenceNumber"]))
            if ts is not None and ts < upper:
                want[n] = (sid, int(r["SequenceNumber"]), ts)
    in_stream_ids = {json.loads(r["Data"])["id"] for recs in truth.values() for r in recs}
    rows = [] if ups is None else ups.to_pylist()
    seen = collections.Counter(r["id"] for r in rows)
    lost = sorted(set(want) - set(seen))
    extra = sorted(set(seen) - set(want))
    duplicated = sorted(n for n, c in seen.items() if c > 1)
    wrong = [r["id"] for r in rows if r["id"] in want and (r["_shard_id"], int(r["_sequence_number"]),
                                                           max(r["ts"], rc.since)) != want[r["id"]]]
    wrong += [r["id"] for r in rows if r["diff"] != 1]
    # the KCL rule, seen in the result: a child's first record is at a ts after each parent's last
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for sid, _, ts in want.values():
        first[sid] = min(first.get(sid, ts), ts)
        last[sid] = max(last.get(sid, ts), ts)
    order = 0
    for s in listing:
        for parent in s.parents:
            p, c = f"shardId-{parent:012d}", f"shardId-{s.number:012d}"
            if p in last and c in first and not last[p] < first[c] and last[p] > rc.since:
                order += 1
    as_of = 0
    with connect(dsn) as conn:
        stamps = [ts for ts, _ in bindings if rc.since <= ts < upper]
        step = max(1, len(stamps) // 15)
        for ts in stamps[::step] + stamps[-1:]:
            got = sorted(read_as_of(conn, blob, SOURCE, ts).column("id").to_pylist())
            exp = sorted(n for n, (_, _, t) in want.items() if t <= ts)
            if got != exp:
                wrong.append(f"AS OF {ts}: {len(got)} rows, the oracle {len(exp)}")
            as_of += 1
    return {"in_stream": in_stream, "bound": len(want), "rows": len(rows), "lost": len(lost) + len(extra),
            "duplicated": len(duplicated), "wrong": len(wrong) + order, "order_violations": order,
            "unbound": in_stream - len(want), "lost_sample": lost[:10], "extra_sample": extra[:10],
            "dup_sample": duplicated[:10], "wrong_sample": wrong[:5], "bindings": len(rc.bindings),
            "as_of_checked": as_of, "acked_not_in_stream": len(set(acked) - in_stream_ids), "shards": len(listing), "frontier_rows": frontier_rows,
            "dropped_records": dropped}


def campaign(seconds: float, seed: int, gap: tuple[float, float], reshard: tuple[float, float]) -> int:
    from benchmarks.chaos import Driver
    from reclock.dev.kinesis import BackgroundProducer, LocalKinesis
    from reclock.dev.kinesis_proxy import KinesisProxy
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.spark import LocalSparkConnect
    from reclock.dev.state import StackState
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.migrate import migrate
    from reclock.sources.kinesis.client import StreamAddress

    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="reclock-kinchaos-"))
    root.chmod(0o755)
    state = StackState(root / "state")
    # kinesalite checks no keys; boto3 (here, in the cycles and in Spark's Python workers) needs some
    os.environ.update(AWS_ACCESS_KEY_ID="reclock-dev", AWS_SECRET_ACCESS_KEY="reclock-dev", AWS_REGION="us-east-1")
    pg, kin = LocalPostgres(state, fast=True), LocalKinesis(state)
    proxy = None
    spark = LocalSparkConnect(state, master="local[2]", driver_memory="1g")
    drivers: list = []
    producer = resharder = None
    try:
        _echo(f"seed {seed}; services in {root}")
        with ThreadPoolExecutor(1, thread_name_prefix="spark-start") as pool:
            spark_up = pool.submit(spark.start)  # its JVM starts beside the others (each waits on its port)
            pg.start()
            migrate(pg.dsn())
            kin.start()
            proxy = KinesisProxy(state, kin.endpoint_url, reads_per_shard_s=5.0, expire_every=40)
            proxy.start()
            spark_up.result()
        kin.create_stream(STREAM, 2)
        config = root / "reclock.yaml"
        config.write_text(json.dumps({"sources": {SOURCE: {
            "kinesis": {"stream": STREAM, "count_every": 20, "task_records": 60},
            "format": {"type": "json", "schema": "id BIGINT, key STRING"},
            "include": ["shard_id", "sequence_number"], "budget": {"max_records": 500}}}}))
        path = os.pathsep.join([str(REPO / "include"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": pg.dsn(),
               "RECLOCK_BLOB_URL": str(root / "blobs"), "RECLOCK_SPARK_REMOTE": spark.url,
               "RECLOCK_KINESIS_ENDPOINT": proxy.endpoint_url, "RECLOCK_RETAIN_HISTORY_S": "30",
               "RECLOCK_GC_GRACE_S": "20", "RECLOCK_GC_INTERVAL_S": "5"}
        logs = root / "logs"
        logs.mkdir()
        driver = Driver(SOURCE, [sys.executable, "-m", "benchmarks.kinesis_chaos", "--runner", SOURCE], env, logs)
        drivers.append(driver)
        producer = BackgroundProducer(kin.client(), STREAM, batch=10, pause=0.2, keys=40).start()
        resharder = Resharder(kin, rng, reshard)
        resharder.start()
        driver.tick()
        kills, armed = 0, collections.Counter()
        end = time.monotonic() + seconds
        next_kill = time.monotonic() + rng.uniform(*gap)
        while time.monotonic() < end:
            driver.tick()
            if time.monotonic() >= next_kill and driver.ready():
                if rng.random() < 0.4:
                    point = rng.choice(FAILPOINTS)
                    driver.arm({"RECLOCK_FAILPOINTS": f"{point}=exit"})
                    armed[point] += 1
                elif driver.kill():
                    kills += 1
                next_kill = time.monotonic() + rng.uniform(*gap)
            time.sleep(0.1)
        resharder.stop.set()
        resharder.join(90)
        done = [json.loads(line)["s"] for f in logs.glob(f"{SOURCE}-*.log") for line in f.read_text().splitlines()
                if line.startswith("{")]
        _echo(f"cycles completed under faults: {len(done)} in {driver.launches} launches"
              + (f" ({sum(done) / len(done):.1f} s each)" if done else ""))
        acked = producer.stop()
        driver.stop()
        _echo(f"producer: {len(acked)} records acknowledged ({len(producer.errors)} errors); resharder: "
              f"{resharder.splits} splits, {resharder.merges} merges ({len(resharder.errors)} errors)")
        _echo("catching up without faults")
        cycles = catch_up("benchmarks.kinesis_chaos", SOURCE, env, logs / "catch-up.log")
        if cycles is None:
            return 1
        _echo(f"caught up in {len(cycles)} cycles ({sum(c['descriptions'] for c in cycles)} descriptions; "
              f"{', '.join(str(c['s']) for c in cycles)} s)")
        verdict = check(pg.dsn(), LocalBlobStore(root / "blobs"), StreamAddress(STREAM, "us-east-1", kin.endpoint_url),
                        kin.client(), acked)
        _echo(f"{SOURCE}: {verdict}")
        stats = proxy.stats()
        _echo(f"kills: {kills + driver.failpoint_exits} (SIGKILL {kills}, fail points reached "
              f"{driver.failpoint_exits} of {dict(armed)} armed), launches: "
              f"{driver.launches}; proxy: {stats}")
        print(f"lost {verdict['lost']}, duplicated {verdict['duplicated']}, wrong timestamps {verdict['wrong']}",
              flush=True)
        ok = (not verdict["lost"] and not verdict["duplicated"] and not verdict["wrong"] and not verdict["unbound"]
              and not verdict["acked_not_in_stream"] and not producer.errors
              and not resharder.errors and kills + driver.failpoint_exits > 0 and resharder.splits > 0
              and resharder.merges > 0)
        if verdict["unbound"]:
            _echo(f"{verdict['unbound']} records in the stream were not bound after the catch-up")
        return 0 if ok else 1
    finally:
        if producer is not None:
            producer.stop()
        if resharder is not None:
            resharder.stop.set()
        for d in drivers:
            d.stop()
        from reclock.dev.procs import side_by_side

        _, errors = side_by_side({type(svc).__name__: svc.stop for svc in (spark, proxy, kin, pg) if svc is not None})
        for name, e in errors.items():  # each stopped anyway
            _echo(f"stopping {name}: {e}")
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kinesis_chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--gap", type=float, nargs=2, default=(4.0, 16.0), help="seconds between faults (a range)")
    p.add_argument("--reshard", type=float, nargs=2, default=(6.0, 14.0), help="seconds between reshardings")
    p.add_argument("--runner", help=argparse.SUPPRESS)
    p.add_argument("--until-idle", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.runner:
        return runner(a.runner, a.until_idle)
    stop.install()  # SIGTERM or Ctrl-C: the finally block stops the services
    return campaign(a.seconds, a.seed, tuple(a.gap), tuple(a.reshard))


if __name__ == "__main__":
    sys.exit(main())
