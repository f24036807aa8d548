"""A local S3 API endpoint for tests and benchmarks: moto's server (``moto_server``, the ``moto[server]``
package) on a free 127.0.0.1 port with one bucket, its objects in memory, gone when it stops.

It is a real HTTP endpoint: Spark's S3A and Python's s3fs reach it exactly as they reach S3 or MinIO
(path-style addressing, any keys: moto checks none). With ``tls``, moto serves HTTPS itself
(``--ssl-cert``/``--ssl-key``) with a certificate of the stack's CA (``reclock.dev.tls``), and the
settings name that CA as the bundle clients trust.
"""

from __future__ import annotations

import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import StackState
from reclock.dev.tls import LocalCA
from reclock.errors import StackError
from reclock.persist.objectstore import S3Settings, fsspec_options


@dataclass
class LocalS3:
    """``moto_server -H 127.0.0.1 -p PORT`` under ``state``'s ``s3`` folder, with the bucket ``bucket``."""

    state: StackState
    bucket: str = "reclock"
    tls: bool = False
    name: str = "s3"  # the state folder and port name

    @property
    def home(self) -> Path:
        return self.state.dir(self.name)

    @property
    def port(self) -> int:
        return self.state.port(self.name)

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{LOOPBACK}:{self.port}"

    @property
    def pidfile(self) -> Path:
        return self.home / "moto.pid"

    @property
    def log(self) -> Path:
        return self.home / "moto.log"

    def settings(self) -> S3Settings:
        """Settings for this endpoint (keys generated once per state folder; moto accepts any)."""
        return S3Settings(self.endpoint_url, "us-east-1", "reclock-" + self.state.secret("s3_access_key", 6),
                          self.state.secret("s3_secret_key"), path_style=True,
                          ca_bundle=str(LocalCA(self.state).cert) if self.tls else None)

    def running(self) -> bool:
        return procs.read_pid(self.pidfile) is not None

    def start(self, timeout: float = 60) -> float:
        t0 = time.monotonic()
        if not self.running():
            server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
            if server is None:
                raise StackError("moto's server is not installed: pip install 'moto[server]' (the test extra)")
            tls: list[str] = []
            if self.tls:
                issued = LocalCA(self.state).issue(f"{self.name}-server", "s3")
                tls = ["--ssl-cert", str(issued.cert), "--ssl-key", str(issued.key)]
            procs.spawn("moto", [server, "-H", LOOPBACK, "-p", str(self.port), *tls], log=self.log,
                        pidfile=self.pidfile, cwd=self.home)
        try:
            procs.wait_until("moto S3 server", lambda: procs.port_open(self.port), timeout, log=self.log,
                             alive=self.running)
            self._ensure_bucket()
        except BaseException:
            self.stop()  # a server that cannot serve its bucket is no use, and nobody else would stop it
            raise
        return time.monotonic() - t0

    def _ensure_bucket(self) -> None:
        import s3fs

        fs = s3fs.S3FileSystem(**fsspec_options(self.settings()))
        if not fs.exists(self.bucket):
            fs.mkdir(self.bucket)

    def url(self, prefix: str = "") -> str:
        """The blob store URL ``s3://<bucket>/<prefix>``."""
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=10)
