"""A TLS front for a local server that speaks no TLS itself: the Spark Connect server (Spark 4.2's has a
token, ``spark.connect.authenticate.token``, but no TLS; deployments put a TLS proxy such as Envoy or an
ingress in front of it).

``python -m reclock.dev.tls_front --listen 127.0.0.1:P --to 127.0.0.1:Q --cert C --key K`` accepts TLS
(ALPN ``h2``, what gRPC clients require) on P with the certificate C and relays the bytes to Q, which
listens on 127.0.0.1 only. :class:`LocalTlsFront` starts and stops one as a background process.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
import time
from dataclasses import dataclass
from typing import ClassVar

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, StackState
from reclock.dev.tls import LocalCA


@dataclass
class LocalTlsFront(LocalServer):
    """TLS on the port ``<name>`` relayed to ``target_port`` on 127.0.0.1, with the stack CA's certificate."""

    state: StackState
    name: str
    target_port: int

    process: ClassVar[str] = "tls-front"

    def start(self, timeout: float = 30) -> float:
        t0 = time.monotonic()
        if not self.running():
            issued = LocalCA(self.state).issue(f"{self.name}-server", "localhost")
            procs.spawn(self.name, [sys.executable, "-m", "reclock.dev.tls_front", "--listen",
                                    f"{LOOPBACK}:{self.port}", "--to", f"{LOOPBACK}:{self.target_port}", "--cert",
                                    str(issued.cert), "--key", str(issued.key)], log=self.log, pidfile=self.pidfile)
        procs.wait_until(f"TLS front {self.name}", lambda: procs.port_open(self.port), timeout, log=self.log,
                         alive=self.running)
        return time.monotonic() - t0

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001 - already gone
            pass


async def _serve(listen: tuple[str, int], target: tuple[str, int], context: ssl.SSLContext) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(relay, *listen, ssl=context)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["h2"])
    host, _, port = args.listen.rpartition(":")
    to_host, _, to_port = args.to.rpartition(":")
    asyncio.run(_serve((host, int(port)), (to_host, int(to_port)), context))


if __name__ == "__main__":
    main()
