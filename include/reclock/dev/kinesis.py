"""A local Kinesis Data Streams endpoint for tests and benchmarks: kinesalite (npm ``kinesalite``, mhart's
implementation of the Kinesis API on LevelDB, in memory here), unmodified, on a free 127.0.0.1 port.

Why kinesalite and not moto's Kinesis (the dev stack's moto server serves S3, SQS and DynamoDB): moto 5's
SplitShard re-puts a parent's records into its children and its MergeShards copies both parents' records
into the child, its closed shards never end and its sequence numbers are 1, 2, 3 per shard. Kinesalite does
what AWS documents: a split or merge closes the parents with their records and opens empty children, a
closed shard read to its end returns no ``NextShardIterator``, sequence numbers are AWS's 56-digit ones
(increasing per shard, far apart, validated on ``GetShardIterator``), iterators expire after 5 minutes,
records older than the retention period are trimmed.

What kinesalite does not model, and how the tests get it:

* **time**: retention is at least 24 hours and an iterator lives 5 minutes. The server runs with a clock
  the test can move forward (:meth:`LocalKinesis.advance_clock`: ``Date.now`` plus an offset read from a
  file, a ``--require``d module, :data:`CLOCK_JS`); nothing else of kinesalite changes. A server whose clock
  a test moves is that test's own (``name``), never the shared one.
* **read throttling** (``ProvisionedThroughputExceededException``, 5 reads a second per shard on AWS): a
  real HTTP proxy in front of it enforces that limit (``reclock.dev.kinesis_proxy``).
* ``MillisBehindLatest`` is always 0 except at the end of a closed shard; Reclock's lag in milliseconds
  comes from the records' ``ApproximateArrivalTimestamp`` instead, on AWS too.

Kinesalite installs with npm into ``.reclock/npm`` (:func:`ensure_kinesalite`, run by ``reclock dev
install``); Node.js and npm come from Debian (``scripts/bootstrap.sh``).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, REPO_ROOT, StackState
from reclock.errors import StackError

KINESALITE = "kinesalite@3.3.3"
CLOCK_JS = """\
// Reclock's dev stack: kinesalite's clock, moved forward by a test (the offset in ms is in RECLOCK_CLOCK_FILE)
const fs = require('fs')
const file = process.env.RECLOCK_CLOCK_FILE
const realNow = Date.now
Date.now = function () {
  let offset = 0
  try { offset = Number(fs.readFileSync(file, 'utf8')) || 0 } catch (e) { offset = 0 }
  return realNow() + offset
}
"""


def npm_dir() -> Path:
    """Where npm packages are installed (shared by every stack of this checkout)."""
    return Path(os.environ.get("RECLOCK_NPM", REPO_ROOT / ".reclock" / "npm"))


def ensure_kinesalite() -> Path:
    """The path of kinesalite's ``cli.js``, installing :data:`KINESALITE` with npm if it is missing (LevelDB's
    native module is optional and left out: the server keeps its streams in memory)."""
    folder = npm_dir()
    cli = folder / "node_modules" / "kinesalite" / "cli.js"
    if cli.is_file():
        return cli
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise StackError(f"`{tool}` is needed for the local Kinesis endpoint (kinesalite); install Debian's "
                             "`nodejs` and `npm` packages")
    folder.mkdir(parents=True, exist_ok=True)
    procs.run(["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--omit=optional",
               "--no-save", KINESALITE], f"install {KINESALITE} with npm", timeout=600)
    if not cli.is_file():
        raise StackError(f"npm finished but {cli} is not there")
    return cli


@dataclass
class LocalKinesis(LocalServer):
    """kinesalite under ``state``'s folder ``name`` (``kinesis``; another name: a second server beside it)."""

    state: StackState
    name: str = "kinesis"
    region: str = "us-east-1"

    process: ClassVar[str] = "kinesalite"

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def clock_file(self) -> Path:
        return self.home / "clock-offset-ms"

    def start(self, timeout: float = 60) -> float:
        t0 = time.monotonic()
        if not self.running():
            cli = ensure_kinesalite()
            clock = self.home / "clock.js"
            clock.write_text(CLOCK_JS)
            self.clock_file.write_text("0")
            env = dict(os.environ, RECLOCK_CLOCK_FILE=str(self.clock_file))
            procs.spawn("kinesalite", ["node", "--require", str(clock), str(cli), "--port", str(self.port),
                                       "--createStreamMs", "50", "--deleteStreamMs", "50", "--updateStreamMs", "50",
                                       "--shardLimit", "10000"],
                        log=self.log, pidfile=self.pidfile, env=env, cwd=self.home)
        try:
            procs.wait_until("kinesalite", lambda: procs.port_open(self.port), timeout, log=self.log,
                             alive=self.running)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=10)

    def advance_clock(self, seconds: float) -> None:
        """Move the server's clock ``seconds`` further forward (iterators expire, retention trims)."""
        now = float(self.clock_file.read_text() or 0)
        self.clock_file.write_text(str(int(now + seconds * 1000)))

    def client(self):
        """A boto3 Kinesis client for this endpoint (kinesalite checks no keys; boto3 needs some)."""
        import boto3

        return boto3.client("kinesis", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id="reclock-dev", aws_secret_access_key="reclock-dev")

    def create_stream(self, name: str, shards: int, timeout: float = 30) -> None:
        """Create ``name`` with ``shards`` shards and wait until it is ACTIVE."""
        c = self.client()
        c.create_stream(StreamName=name, ShardCount=shards)
        self.wait_active(name, timeout)

    def wait_deleted(self, name: str, timeout: float = 30) -> None:
        c = self.client()

        def gone() -> bool:
            try:
                c.describe_stream_summary(StreamName=name)
                return False
            except c.exceptions.ResourceNotFoundException:
                return True
        procs.wait_until(f"stream {name} deleted", gone, timeout, log=self.log)

    def wait_active(self, name: str, timeout: float = 30) -> None:
        c = self.client()
        procs.wait_until(f"stream {name} ACTIVE", lambda: c.describe_stream_summary(StreamName=name)
                         ["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE", timeout, log=self.log)


def read_stream(client, stream: str) -> dict[str, list[dict]]:
    """Every shard of ``stream`` read by itself from ``TRIM_HORIZON`` to its tip (an open shard) or end (a
    closed one): shard id -> its records (boto3's dicts) in order. What a test's or the fault campaign's
    oracle holds a source's collections against; it knows nothing of Reclock."""
    out: dict[str, list[dict]] = {}
    token = None
    while True:
        resp = client.list_shards(NextToken=token) if token else client.list_shards(StreamName=stream)
        for s in resp["Shards"]:
            closed = "EndingSequenceNumber" in s["SequenceNumberRange"]
            it = client.get_shard_iterator(StreamName=stream, ShardId=s["ShardId"],
                                           ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
            got: list[dict] = []
            while it:
                r = client.get_records(ShardIterator=it, Limit=10_000)
                got += r["Records"]
                it = r.get("NextShardIterator")
                if not closed and len(r["Records"]) < 10_000:
                    break
            out[s["ShardId"]] = got
        token = resp.get("NextToken")
        if not token:
            return out


class BackgroundProducer:
    """Writes records to a stream from a thread until stopped: JSON ``{"id": n, "key": k, ...}`` with
    partition key ``k`` (``keys`` distinct keys, round robin), ``batch`` records a ``PutRecords`` about
    every ``pause`` seconds. A record ``PutRecords`` rejects is sent again; ``acked`` holds the ids
    Kinesis acknowledged, ``errors`` what went wrong (a test asserts it empty)."""

    def __init__(self, client, stream: str, batch: int = 50, pause: float = 0.05, keys: int = 100,
                 start: int = 0) -> None:
        import threading

        self.client, self.stream, self.batch, self.pause, self.keys = client, stream, batch, pause, keys
        self.next_id = start
        self.acked: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer-{stream}", daemon=True)

    def record(self, i: int) -> dict:
        import json

        key = f"k{i % self.keys}"
        return {"Data": json.dumps({"id": i, "key": key, "note": f"record {i}"}).encode(), "PartitionKey": key}

    def put(self, n: int) -> list[int]:
        """Put the next ``n`` records now (in this thread), until every one is acknowledged."""
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        pending = ids
        while pending:
            resp = self.client.put_records(StreamName=self.stream, Records=[self.record(i) for i in pending])
            failed = [i for i, r in zip(pending, resp["Records"]) if "ErrorCode" in r]
            self.acked += [i for i, r in zip(pending, resp["Records"]) if "ErrorCode" not in r]
            pending = failed
        return ids

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.put(self.batch)
            except Exception as e:  # noqa: BLE001 - kept for the test to see
                self.errors.append(repr(e))
                if len(self.errors) > 100:
                    return
            self._stop.wait(self.pause)

    def start(self) -> "BackgroundProducer":
        self._thread.start()
        return self

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(60)
        return self.acked
