"""Network faults for tests and the fault campaign: Toxiproxy (Shopify's TCP proxy that injects faults),
built from its Go module and run on 127.0.0.1.

Reclock's connections to a service go through a proxy (:meth:`LocalToxiproxy.proxy`: it listens on a port of
its own and forwards to the service's), and a test or the campaign puts a fault on it while a step runs
(:meth:`Proxy.inject`, one of :data:`NETWORK_FAULTS`, then :meth:`Proxy.heal`):

============  =============================================================================================
fault         what the connections see (both directions unless said)
============  =============================================================================================
latency       every chunk of data delayed (``latency`` ms, ``jitter`` ms either way)
bandwidth     at most ``rate`` KB/s
reset         every connection with data in flight reset (TCP RST: "connection reset by peer"), new ones too
blackhole     data accepted and never delivered, connections left open (a hung server or middlebox: the
              client's kernel sees a healthy peer, so no TCP timeout fires; only the client's own timeouts end
              the wait). Data held back is dropped, so a connection that lived through it is unusable
down          the proxy disabled: every connection closed, new ones refused (the service "gone")
============  =============================================================================================

Installing: :func:`ensure_toxiproxy` runs ``go install github.com/Shopify/toxiproxy/v2/cmd/server@<version>``
(the Go module proxy; ``reclock dev install`` calls it; Go 1.23+ must be on the machine: Debian's is older)
into ``.reclock/bin/toxiproxy-server-<version>``: about a minute the first time, nothing after.
No Toxiproxy code is kept in the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, REPO_ROOT, StackState
from reclock.errors import StackError

MODULE = "github.com/Shopify/toxiproxy/v2"
VERSION = "v2.12.0"

NetworkFault = Literal["latency", "bandwidth", "reset", "blackhole", "down"]
NETWORK_FAULTS: tuple[NetworkFault, ...] = ("latency", "bandwidth", "reset", "blackhole", "down")


def bin_dir() -> Path:
    """Where built tools are kept (shared by every stack of this checkout)."""
    return Path(os.environ.get("RECLOCK_BIN", REPO_ROOT / ".reclock" / "bin"))


def ensure_toxiproxy() -> Path:
    """The Toxiproxy server binary, built with ``go install`` from :data:`MODULE` at :data:`VERSION` if it is
    not there yet (an existing binary is reused: the call is then free)."""
    binary = bin_dir() / f"toxiproxy-server-{VERSION}"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    if go is None:
        raise StackError("Go 1.23+ is needed to build Toxiproxy (the network faults of the tests) and none is on "
                         "PATH or in /usr/local/go/bin: install a Go toolchain (Debian's golang-go is too old)")
    binary.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=binary.parent, prefix=".toxiproxy-build-") as tmp:
        env = {**os.environ, "GOBIN": tmp, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
        procs.run([go, "install", f"{MODULE}/cmd/server@{VERSION}"], f"build Toxiproxy {VERSION} with go install",
                  env=env, timeout=1200)
        (Path(tmp) / "server").replace(binary)
    return binary


@dataclass
class LocalToxiproxy(LocalServer):
    """``toxiproxy-server`` under ``<state>/<name>``, its API on 127.0.0.1 (:attr:`api_port`); the proxies it
    makes listen on 127.0.0.1 too."""

    state: StackState
    name: str = "toxiproxy"
    proxies: dict[str, "Proxy"] = field(default_factory=dict)

    process: ClassVar[str] = "toxiproxy"

    @property
    def api_port(self) -> int:
        return self.state.port(self.name)

    def start(self, timeout: float = 60) -> float:
        t0 = time.monotonic()
        if not self.running():
            if procs.port_open(self.api_port):
                raise StackError(f"toxiproxy: port {self.api_port} on {LOOPBACK} is taken by another process")
            procs.spawn("toxiproxy", [str(ensure_toxiproxy()), "-host", LOOPBACK, "-port", str(self.api_port)],
                        log=self.log, pidfile=self.pidfile, cwd=self.home,
                        env={**os.environ, "LOG_LEVEL": "info"})  # its default traces every connection
        procs.wait_until("toxiproxy", lambda: self.api("GET", "/version") is not None, timeout, log=self.log,
                         alive=self.running)
        return time.monotonic() - t0

    def stop(self) -> bool:
        self.proxies.clear()
        return procs.stop(self.pidfile, timeout=10)

    def api(self, method: str, path: str, body: dict | None = None):
        """One call of Toxiproxy's HTTP API; the decoded JSON answer (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{LOOPBACK}:{self.api_port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise StackError(f"toxiproxy {method} {path}: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}")
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def proxy(self, name: str, upstream_port: int, listen_port: int | None = None) -> "Proxy":
        """A proxy ``name`` from ``listen_port`` (default: a port of the state's, ``<name>_proxy``) to
        ``upstream_port`` on 127.0.0.1, made anew (enabled, no faults) if it existed."""
        listen = listen_port if listen_port is not None else self.state.port(f"{name}_proxy")
        try:
            self.api("DELETE", f"/proxies/{name}")
        except StackError:
            pass
        self.api("POST", "/proxies", {"name": name, "listen": f"{LOOPBACK}:{listen}",
                                      "upstream": f"{LOOPBACK}:{upstream_port}", "enabled": True})
        p = Proxy(self, name, listen, upstream_port)
        self.proxies[name] = p
        return p

    def heal(self) -> None:
        """Every proxy enabled and every fault removed (Toxiproxy's ``/reset``)."""
        self.api("POST", "/reset")


@dataclass
class Proxy:
    """One proxy of a :class:`LocalToxiproxy`: clients connect to :attr:`port` instead of the service's."""

    server: LocalToxiproxy
    name: str
    port: int
    upstream_port: int

    def _toxic(self, kind: str, stream: str, **attributes: int) -> str:
        toxic = f"{kind}_{stream}"
        self.server.api("POST", f"/proxies/{self.name}/toxics",
                        {"name": toxic, "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes})
        return toxic

    def inject(self, fault: NetworkFault, *, latency_ms: int = 300, jitter_ms: int = 200,
               rate_kb_s: int = 64) -> None:
        """Put ``fault`` on every connection of the proxy, present and new, until :meth:`heal`."""
        if fault == "latency":
            for stream in ("upstream", "downstream"):
                self._toxic("latency", stream, latency=latency_ms, jitter=jitter_ms)
        elif fault == "bandwidth":
            for stream in ("upstream", "downstream"):
                self._toxic("bandwidth", stream, rate=rate_kb_s)
        elif fault == "reset":
            for stream in ("upstream", "downstream"):
                self._toxic("reset_peer", stream, timeout=0)
        elif fault == "blackhole":
            for stream in ("upstream", "downstream"):
                self._toxic("timeout", stream, timeout=0)
        elif fault == "down":
            self.server.api("POST", f"/proxies/{self.name}", {"enabled": False})
        else:
            raise ValueError(f"unknown network fault {fault!r}: one of {', '.join(NETWORK_FAULTS)}")

    def heal(self) -> None:
        """No fault on this proxy: its toxics removed, the proxy enabled."""
        for toxic in self.server.api("GET", f"/proxies/{self.name}/toxics") or []:
            self.server.api("DELETE", f"/proxies/{self.name}/toxics/{toxic['name']}")
        self.server.api("POST", f"/proxies/{self.name}", {"enabled": True})
