"""Benchmarks of the Kinesis source, each side by side with its peers in one run, under ``flock
/tmp/reclock-bench.lock``:

    python -m benchmarks.kinesis throughput [--records 100000] [--shards 4] [--reps 2]
    python -m benchmarks.kinesis state [--cycles 1000] [--reshard-every 50] [--per-cycle 20]

Services of its own in a temporary folder, on 127.0.0.1, stopped at the end: Postgres, the local Kinesis
endpoint (kinesalite, unthrottled: the endpoint's own limit) and one ``local[2]`` Spark session.

``throughput``: ``--records`` JSON records (~150 bytes) in a stream of ``--shards`` shards, split once
half way through the load (so the source crosses a resharding: a parent read to its end, then its
children), read by:

- ``bare``: a bare ``GetRecords`` loop over the same shards, one thread a shard, parents before children,
  counting records (no decode, nothing written): the limit of reading through this endpoint;
- ``kcl_parquet``: what a team writes with boto3 the KCL way: the same loop, each ``GetRecords`` batch's
  JSON parsed into columns and written as a Parquet file (pyarrow), the shard's checkpoint kept after each
  file (no exactly-once across a crash, no per-record timestamps shared by outputs);
- ``reclock``: a new Kinesis source's cycles (``run_cycle`` until nothing is left: mint scans, counts and
  captures, bindings of the budget, Spark reading the bound ranges' captures, decode, write, prove, append,
  resume).

Records/s of each (best of ``--reps``), and ``reclock / bare``, ``reclock / kcl_parquet``.

``state``: ``--cycles`` cycles of one source, ``--per-cycle`` records put before each, the stream split
or merged every ``--reshard-every`` cycles (alternately), history kept 0 s (compaction runs each cycle). At
every tenth of the cycles: the remap store's rows of the source (``remap_offsets``), the kind's counted
segments (``kinesis_segments``), the capture files the mints left in the blob store (``captures``), the shards
the stream has, and the cycle's seconds. Bounded = the last tenth's rows are no more than the first's plus
what the open shards need, however many shards the reshardings closed, and the captures never pile up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from benchmarks import stop

SCHEMA = "id BIGINT, key STRING, note STRING"
STREAM = "bench"


def echo(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


@contextlib.contextmanager
def services() -> Iterator[dict]:
    """Postgres (migrated), kinesalite and one local[2] Spark session in a temporary folder; all stopped and
    removed at the end."""
    from reclock.dev.jars import spark_kafka_jars
    from reclock.dev.kinesis import LocalKinesis
    from reclock.dev.postgres import LocalPostgres
    from reclock.dev.spark import LOOPBACK_CONF
    from reclock.dev.state import StackState
    from reclock.persist.migrate import migrate
    from reclock.spark.session import driver_session

    saved = dict(os.environ)
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", AWS_ACCESS_KEY_ID="reclock-dev", AWS_SECRET_ACCESS_KEY="reclock-dev",
                      AWS_REGION="us-east-1")
    root = Path(tempfile.mkdtemp(prefix="reclock-kinbench-"))
    root.chmod(0o755)
    state = StackState(root / "state")
    pg, kin, spark = LocalPostgres(state, fast=True), LocalKinesis(state), None
    try:
        pg.start()
        migrate(pg.dsn())
        kin.start()
        conf = {**LOOPBACK_CONF, "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                "spark.jars": ",".join(spark_kafka_jars(state))}  # the session wants them; Kinesis reads none
        spark = driver_session("local[2]", "reclock-kinesis-bench", conf)
        yield {"root": root, "pg": pg, "kinesis": kin, "spark": spark}
    finally:
        if spark is not None:
            spark.stop()
        for svc in (kin, pg):
            with contextlib.suppress(Exception):
                svc.stop()
        shutil.rmtree(root, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


def _ctx(env: dict, name: str, stream: str, **extra):
    from reclock import cycle
    from reclock.config import parse_source
    from reclock.persist.blob import LocalBlobStore
    from reclock.sources.kinesis.kind import KINESIS

    raw = {"kinesis": {"stream": stream, "region": "us-east-1", "endpoint_url": env["kinesis"].endpoint_url,
                       **extra.pop("kinesis", {})},
           "format": {"type": "json", "schema": SCHEMA}, **extra}
    spec = parse_source(name, raw)
    return cycle.CycleContext(spec=spec, dsn=env["pg"].dsn(), blob=LocalBlobStore(env["root"] / "blobs"),
                              upstream=KINESIS.find_upstream(spec), spark_factory=lambda: env["spark"])


def _load(kin, stream: str, shards: int, records: int) -> None:
    """``records`` records into a new ``stream``, split once half way (so readers cross a resharding)."""
    from reclock.dev.kinesis import BackgroundProducer

    kin.create_stream(stream, shards)
    c = kin.client()
    p = BackgroundProducer(c, stream, keys=1000)
    p.record = lambda i: {"Data": json.dumps({"id": i, "key": f"k{i % 1000}", "note": "n" * 100}).encode(),
                          "PartitionKey": f"k{i % 1000}"}
    for i in range(0, records, 500):
        if i == (records // 2) // 500 * 500:
            s = c.list_shards(StreamName=stream)["Shards"][0]
            lo, hi = int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"])
            c.split_shard(StreamName=stream, ShardToSplit=s["ShardId"], NewStartingHashKey=str((lo + hi + 1) // 2))
            kin.wait_active(stream)
        p.put(min(500, records - i))


def _levels(client, stream: str) -> list[list[dict]]:
    """The stream's shards in waves: every shard after its parents' wave (the KCL's order)."""
    shards = client.list_shards(StreamName=stream)["Shards"]
    done: set[str] = set()
    waves = []
    while len(done) < len(shards):
        wave = [s for s in shards if s["ShardId"] not in done
                and all(p in done for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p)]
        waves.append(wave)
        done |= {s["ShardId"] for s in wave}
    return waves


def _consume(client, stream: str, on_batch) -> int:
    """Read every shard from TRIM_HORIZON to its end (closed) or tip (open), a thread a shard, parents'
    wave before children's; ``on_batch(shard, records)`` for each non-empty ``GetRecords``; the records."""
    total = [0]
    lock = threading.Lock()

    def shard(s: dict) -> None:
        closed = "EndingSequenceNumber" in s["SequenceNumberRange"]
        it = client.get_shard_iterator(StreamName=stream, ShardId=s["ShardId"],
                                       ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        n = 0
        while it:
            r = client.get_records(ShardIterator=it, Limit=10_000)
            if r["Records"]:
                on_batch(s["ShardId"], r["Records"])
                n += len(r["Records"])
            it = r.get("NextShardIterator")
            if not closed and not r["Records"]:
                break
        with lock:
            total[0] += n

    for wave in _levels(client, stream):
        threads = [threading.Thread(target=shard, args=(s,)) for s in wave]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return total[0]


def bare(kin, stream: str) -> int:
    return _consume(kin.client(), stream, lambda shard, records: None)


def kcl_parquet(kin, stream: str, out: Path) -> int:
    """The KCL-style consumer: each batch parsed and written as a Parquet file, then its checkpoint."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    checkpoints: dict[str, str] = {}
    seq = [0]
    lock = threading.Lock()

    def write(shard: str, records: list[dict]) -> None:
        rows = [json.loads(r["Data"]) for r in records]
        table = pa.table({"id": pa.array([r.get("id") for r in rows], pa.int64()),
                          "key": pa.array([r.get("key") for r in rows], pa.string()),
                          "note": pa.array([r.get("note") for r in rows], pa.string()),
                          "_shard_id": pa.array([shard] * len(rows), pa.string()),
                          "_sequence_number": pa.array([r["SequenceNumber"] for r in records], pa.string())})
        with lock:
            seq[0] += 1
            n = seq[0]
        pq.write_table(table, out / f"part-{n:06d}.parquet")
        checkpoints[shard] = records[-1]["SequenceNumber"]

    n = _consume(kin.client(), stream, write)
    assert pq.read_table(out).num_rows == n
    return n


def reclock_run(env: dict, name: str, stream: str, records: int) -> int:
    from reclock import cycle
    from reclock.persist import connect
    from reclock.read import read_updates

    ctx = _ctx(env, name, stream, budget={"max_records": 1_000_000},
               kinesis={"count_every": 10_000, "task_records": max(10_000, records // 8)})
    for _ in range(20):
        out = cycle.run_cycle(ctx)
        if out["minted"] is None and out["descriptions"] == 0:
            break
    with connect(ctx.dsn) as conn:
        n = read_updates(conn, ctx.blob, name).num_rows
        steps = conn.execute("SELECT step, metrics FROM reclock.statistics WHERE name = %s", (name,)).fetchall()
    assert n == records, f"reclock wrote {n} rows of {records}"
    writes = [m for step, m in steps if step == "write_batches" and "records_read" in m]
    seconds = {}
    for step, m in steps:
        seconds[step] = round(seconds.get(step, 0) + m.get("seconds", 0), 2)
    echo(f"  {name}: records read by the writes {sum(m['records_read'] for m in writes)}, of them from the "
         f"mints' captures {sum(m.get('records_from_captures', 0) for m in writes)}; seconds by step {seconds}")
    return n


def throughput(records: int, shards: int, reps: int) -> dict:
    with services() as env:
        kin = env["kinesis"]
        t0 = time.monotonic()
        _load(kin, STREAM, shards, records)
        echo(f"loaded {records} records into {shards} shards (split once) in {time.monotonic() - t0:.1f}s")
        best: dict[str, float] = {}
        for rep in range(reps):
            for name, run in (("bare", lambda: bare(kin, STREAM)),
                              ("kcl_parquet", lambda: kcl_parquet(kin, STREAM, env["root"] / f"kcl{rep}")),
                              ("reclock", lambda: reclock_run(env, f"bench{rep}", STREAM, records))):
                t = time.monotonic()
                n = run()
                s = time.monotonic() - t
                assert n == records, f"{name} read {n} of {records}"
                echo(f"rep {rep}: {name}: {n} records in {s:.2f}s = {n / s:,.0f} records/s")
                best[name] = max(best.get(name, 0.0), n / s)
        out = {"records": records, "shards": shards, **{f"{k}_records_s": round(v) for k, v in best.items()},
               "reclock_over_bare": round(best["reclock"] / best["bare"], 3),
               "reclock_over_kcl_parquet": round(best["reclock"] / best["kcl_parquet"], 3)}
        echo(json.dumps(out))
        return out


def state(cycles: int, reshard_every: int, per_cycle: int) -> dict:
    from dataclasses import replace

    from reclock import cycle
    from reclock.dev.kinesis import BackgroundProducer
    from reclock.persist import connect
    from reclock.sources.kinesis import capture

    with services() as env:
        kin = env["kinesis"]
        kin.create_stream(STREAM, 2)
        c = kin.client()
        ctx = replace(_ctx(env, "st", STREAM, budget={"max_records": 10_000}), retain_history_ms=0)
        producer = BackgroundProducer(c, STREAM, keys=50)
        samples = []
        split = True
        t0 = time.monotonic()
        for i in range(1, cycles + 1):
            producer.put(per_cycle)
            if i % reshard_every == 0:
                opened = sorted((s for s in c.list_shards(StreamName=STREAM)["Shards"]
                                 if "EndingSequenceNumber" not in s["SequenceNumberRange"]),
                                key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
                if split or len(opened) < 2:
                    s = opened[0]
                    lo, hi = int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"])
                    c.split_shard(StreamName=STREAM, ShardToSplit=s["ShardId"],
                                  NewStartingHashKey=str((lo + hi + 1) // 2))
                else:
                    c.merge_shards(StreamName=STREAM, ShardToMerge=opened[0]["ShardId"],
                                   AdjacentShardToMerge=opened[1]["ShardId"])
                split = not split
                kin.wait_active(STREAM)
            m0 = time.monotonic()
            cycle.run_cycle(ctx)
            mint_s = time.monotonic() - m0
            if i % max(1, cycles // 10) == 0 or i == cycles:
                with connect(ctx.dsn) as conn:
                    offsets, segments = conn.execute(
                        "SELECT (SELECT count(*) FROM reclock.remap_offsets WHERE source = 'st'), "
                        "(SELECT count(*) FROM reclock.kinesis_segments WHERE source = 'st')").fetchone()
                captures = len(ctx.blob.list(capture.folder("st")))  # files of the mints' captures left
                shards = len(c.list_shards(StreamName=STREAM)["Shards"])
                opened = sum(1 for s in c.list_shards(StreamName=STREAM)["Shards"]
                             if "EndingSequenceNumber" not in s["SequenceNumberRange"])
                samples.append({"cycle": i, "remap_offsets": offsets, "kinesis_segments": segments, "captures": captures,
                                "shards": shards, "open_shards": opened, "cycle_s": round(mint_s, 2)})
                echo(json.dumps(samples[-1]) + f" ({time.monotonic() - t0:.0f}s)")
        first, last = samples[0], samples[-1]
        out = {"cycles": cycles, "records": producer.next_id, "first": first, "last": last,
               "bounded": last["remap_offsets"] + last["kinesis_segments"]
               <= first["remap_offsets"] + first["kinesis_segments"] + 4 * last["open_shards"]
               and max(s["captures"] for s in samples) <= 4 * last["open_shards"]}
        echo(json.dumps(out))
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kinesis", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--records", type=int, default=100_000)
    t.add_argument("--shards", type=int, default=4)
    t.add_argument("--reps", type=int, default=2)
    s = sub.add_parser("state")
    s.add_argument("--cycles", type=int, default=1000)
    s.add_argument("--reshard-every", type=int, default=50)
    s.add_argument("--per-cycle", type=int, default=20)
    a = p.parse_args(argv)
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    if a.what == "throughput":
        throughput(a.records, a.shards, a.reps)
    else:
        out = state(a.cycles, a.reshard_every, a.per_cycle)
        return 0 if out["bounded"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
