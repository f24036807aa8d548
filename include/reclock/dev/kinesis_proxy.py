"""A real HTTP proxy in front of a Kinesis endpoint that throttles reads as AWS does.

Kinesis serves each shard at most 5 ``GetRecords`` calls a second (and 2 MB/s); past that it answers
``ProvisionedThroughputExceededException`` (HTTP 400). Kinesalite (``reclock.dev.kinesis``) has no such
limit, so tests that must see throttling put this proxy between their clients (boto3 in the cycle and in
Spark's tasks) and the endpoint: it forwards every request unchanged, and answers a ``GetRecords`` itself with
that error when the shard's budget of calls per second is spent (a token bucket per shard, ``--reads-per-
shard-s``). It learns which shard an iterator reads from the ``GetShardIterator`` requests and every
``NextShardIterator`` it forwards. With ``--expire-every N`` it also answers every N-th read
``ExpiredIteratorException`` (an injected fault: on AWS an iterator expires after 5 minutes), and with
``--throttle-every N`` every N-th read is throttled whatever the rate (a test that must meet throttling then
does not depend on how fast a loaded machine reads). ``GET /stats``
returns ``{"throttled": n, "expired": n, "forwarded": n}``.

Run: ``python -m reclock.dev.kinesis_proxy --port P --upstream http://127.0.0.1:Q --reads-per-shard-s 5``
(listens on 127.0.0.1 only). :class:`KinesisProxy` starts and stops one for a test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import urlsplit

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, StackState

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host",
        "content-length"}


class _State:
    def __init__(self, upstream: str, rate: float, expire_every: int = 0, throttle_every: int = 0) -> None:
        u = urlsplit(upstream)
        self.host, self.port = u.hostname, u.port or 80
        self.rate = rate
        self.expire_every = expire_every
        self.throttle_every = throttle_every
        self.reads = 0
        self.takes = 0
        self.expired = 0
        self.lock = threading.Lock()
        self.iterators: OrderedDict[str, str] = OrderedDict()  # iterator -> "stream/shard"
        self.buckets: dict[str, tuple[float, float]] = {}
        self.local = threading.local()
        self.throttled = 0
        self.forwarded = 0

    def expire(self, iterator: str) -> bool:
        """Whether to answer this read ``ExpiredIteratorException`` (every ``expire_every``-th read of a known
        iterator: an injected fault, as an iterator older than 5 minutes gets on AWS)."""
        if self.expire_every <= 0:
            return False
        with self.lock:
            if iterator not in self.iterators:
                return False
            self.reads += 1
            if self.reads % self.expire_every:
                return False
            self.expired += 1
            return True

    def remember(self, iterator: str | None, shard: str) -> None:
        if not iterator:
            return
        with self.lock:
            self.iterators[iterator] = shard
            while len(self.iterators) > 200_000:
                self.iterators.popitem(last=False)

    def take(self, iterator: str) -> str | None:
        """None if the iterator's shard may be read now, else the shard (its budget is spent, or this is an
        N-th read of ``throttle_every``)."""
        if self.rate <= 0 and self.throttle_every <= 0:
            return None
        with self.lock:
            shard = self.iterators.get(iterator)
            if shard is None:
                return None
            self.takes += 1
            if self.throttle_every > 0 and self.takes % self.throttle_every == 0:
                self.throttled += 1
                return shard
            if self.rate <= 0:
                return None
            now = time.monotonic()
            tokens, at = self.buckets.get(shard, (self.rate, now))
            tokens = min(self.rate, tokens + (now - at) * self.rate)
            if tokens < 1:
                self.buckets[shard] = (tokens, now)
                self.throttled += 1
                return shard
            self.buckets[shard] = (tokens - 1, now)
            return None

    def connection(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        return conn


def _handler(state: _State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            body = json.dumps({"throttled": state.throttled, "expired": state.expired,
                               "forwarded": state.forwarded}).encode()
            self._reply(200, [("Content-Type", "application/json")], body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            action = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
            request = json.loads(body) if action in ("GetShardIterator", "GetRecords") else {}
            if action == "GetRecords" and state.expire(request.get("ShardIterator", "")):
                err = {"__type": "ExpiredIteratorException", "message": "Iterator expired (injected by the proxy)."}
                self._reply(400, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(err).encode())
                return
            if action == "GetRecords":
                shard = state.take(request.get("ShardIterator", ""))
                if shard is not None:
                    stream, _, sid = shard.partition("/")
                    err = {"__type": "ProvisionedThroughputExceededException",
                           "message": f"Rate exceeded for shard {sid} in stream {stream} under account 000000000000."}
                    self._reply(400, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(err).encode())
                    return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            for attempt in (0, 1):
                conn = state.connection()
                try:
                    conn.request("POST", self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    break
                except (http.client.HTTPException, OSError):
                    conn.close()
                    state.local.conn = None
                    if attempt:
                        raise
            state.forwarded += 1
            if resp.status == 200 and action == "GetShardIterator":
                state.remember(json.loads(data).get("ShardIterator"),
                               f"{request.get('StreamName')}/{request.get('ShardId')}")
            elif resp.status == 200 and action == "GetRecords":
                with state.lock:
                    shard = state.iterators.get(request.get("ShardIterator", ""))
                if shard is not None:
                    state.remember(json.loads(data).get("NextShardIterator"), shard)
            self._reply(resp.status, resp.getheaders(), data)

    return Handler


def serve(port: int, upstream: str, reads_per_shard_s: float, expire_every: int = 0, throttle_every: int = 0) -> None:
    state = _State(upstream, reads_per_shard_s, expire_every, throttle_every)
    server = ThreadingHTTPServer((LOOPBACK, port), _handler(state))
    server.daemon_threads = True
    server.serve_forever()


@dataclass
class KinesisProxy(LocalServer):
    """The proxy as a process of its own, under ``state``'s folder ``name``, in front of ``upstream``."""

    state: StackState
    upstream: str
    reads_per_shard_s: float = 5.0
    expire_every: int = 0
    throttle_every: int = 0
    name: str = "kinesis-proxy"

    process: ClassVar[str] = "proxy"

    @property
    def endpoint_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 30) -> None:
        if not self.running():
            procs.spawn("kinesis-proxy", [sys.executable, "-m", "reclock.dev.kinesis_proxy", "--port", str(self.port),
                                          "--upstream", self.upstream, "--reads-per-shard-s",
                                          str(self.reads_per_shard_s), "--expire-every", str(self.expire_every),
                                          "--throttle-every", str(self.throttle_every)],
                        log=self.home / "proxy.log", pidfile=self.pidfile)
        procs.wait_until("kinesis proxy", lambda: procs.port_open(self.port), timeout, log=self.home / "proxy.log",
                         alive=self.running)

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=10)

    def stats(self) -> dict:
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=10)
        try:
            conn.request("GET", "/stats")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--reads-per-shard-s", type=float, default=5.0)
    p.add_argument("--expire-every", type=int, default=0,
                   help="answer every N-th GetRecords of a known iterator ExpiredIteratorException (0: never)")
    p.add_argument("--throttle-every", type=int, default=0,
                   help="answer every N-th GetRecords of a known iterator ProvisionedThroughputExceededException "
                        "whatever the rate (0: never)")
    a = p.parse_args(argv)
    serve(a.port, a.upstream, a.reads_per_shard_s, a.expire_every, a.throttle_every)


if __name__ == "__main__":
    main()
