"""A local Kafka Connect worker (standalone mode) running Debezium's Postgres connector, for the tests and
benchmarks of topics written by Debezium (issue 32, ``envelope: debezium``).

Kafka Connect 4.1.1 and ``io.debezium:debezium-connector-postgres:3.6.1.Final`` from Maven Central
(``pom.xml``'s ``connect`` profile: 70 jars, ~40 MB in ``.reclock/jars/connect``, fetched by ``reclock dev
install``), one JVM: ``ConnectStandalone worker.properties connector.properties``. Its REST API listens on a
free 127.0.0.1 port; its source offsets are a file in its folder, so a restart resumes where the connector
was (and may redeliver what it wrote after its last offset flush, as Debezium does after a crash).

The connector reads the stack's Postgres through a replication slot (``pgoutput``) and a publication of the
tables named, and writes one topic per table (``<prefix>.<schema>.<table>``) with JSON values (with or
without Connect's schemas) or, with ``registry``, Avro keys and values in the Confluent wire format (Apicurio's
converter ``io.apicurio:apicurio-registry-utils-converter`` registering each writer schema in that local
registry under ``<topic>-key`` / ``<topic>-value``; 4-byte content ids, which its Confluent-compatible API
serves as schema ids; no headers), and, with ``transactions``, the transaction metadata topic
``<prefix>.transaction`` (BEGIN and END of each upstream transaction, with its event count per table).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from reclock.dev import procs
from reclock.dev.jars import ensure_jars
from reclock.dev.procs import LOOPBACK
from reclock.dev.registry import CCOMPAT, USER, LocalRegistry
from reclock.dev.state import LocalServer, StackState
from reclock.errors import StackError

CONNECTOR = "reclock-debezium"


@dataclass
class LocalConnect(LocalServer):
    """A standalone worker under ``state``'s ``connect`` folder writing ``dsn``'s ``tables`` to ``bootstrap``.

    ``dsn``: a superuser's (Debezium creates its slot and publication); ``prefix``: the topics' prefix;
    ``schemas``: JSON values carry Connect's schema beside the payload; ``registry``: Avro through that
    :class:`~reclock.dev.registry.LocalRegistry` instead of JSON; ``transactions``:
    ``provide.transaction.metadata``."""

    state: StackState
    bootstrap: str
    dsn: str
    tables: tuple[str, ...]
    prefix: str = "dbz"
    schemas: bool = False
    transactions: bool = True
    heap: str = "384m"
    flush_ms: int = 1000  # how often the worker flushes its source offsets (a kill redelivers since the last)
    jvm_flags: tuple[str, ...] = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
    """Quick to start, slower to run (C1 only): the tests'; a benchmark passes ``()`` for the JVM's defaults."""
    extra: dict = field(default_factory=dict)
    registry: "LocalRegistry | None" = None

    name: ClassVar[str] = "connect"
    process: ClassVar[str] = "connect"

    @property
    def slot(self) -> str:
        return f"{self.prefix}_slot"

    def topic(self, table: str) -> str:
        """The topic of ``table`` (``schema.table``)."""
        return f"{self.prefix}.{table}"

    @property
    def transaction_topic(self) -> str:
        return f"{self.prefix}.transaction"

    def _write_config(self) -> tuple[Path, Path]:
        url = urlsplit(self.dsn)
        worker = {
            "bootstrap.servers": self.bootstrap,
            **self._converters(),
            "offset.storage.file.filename": self.home / "offsets.dat",
            "offset.flush.interval.ms": self.flush_ms,
            "listeners": f"http://{LOOPBACK}:{self.port}",
            "plugin.discovery": "only_scan",
        }
        connector = {
            "name": CONNECTOR,
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": 1,
            "database.hostname": url.hostname, "database.port": url.port or 5432,
            "database.user": url.username, "database.password": url.password or "",
            "database.dbname": url.path.lstrip("/"),
            "topic.prefix": self.prefix,
            "plugin.name": "pgoutput",
            "slot.name": self.slot,
            "publication.name": f"{self.prefix}_publication",
            "publication.autocreate.mode": "filtered",
            "table.include.list": ",".join(self.tables),
            "provide.transaction.metadata": str(self.transactions).lower(),
            "snapshot.mode": "initial",
            "decimal.handling.mode": "string",
            "time.precision.mode": "connect",
            "poll.interval.ms": 100,
            # the broker creates no topic by itself: the worker creates each table's (and the transaction one)
            "topic.creation.default.replication.factor": 1,
            "topic.creation.default.partitions": 1,
            **self.extra,
        }
        (self.home / "log4j2.properties").write_text(
            "rootLogger.level=WARN\nrootLogger.appenderRef.out.ref=out\nappender.out.type=Console\n"
            "appender.out.name=out\nappender.out.layout.type=PatternLayout\n"
            "appender.out.layout.pattern=%d{HH:mm:ss.SSS} %-5p %c{1} - %m%n\n"
            "logger.dbz.name=io.debezium\nlogger.dbz.level=INFO\n")
        files = []
        for name, props in (("worker.properties", worker), ("connector.properties", connector)):
            path = self.home / name
            path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            path.chmod(0o600)  # the database password
            files.append(path)
        return files[0], files[1]

    def _converters(self) -> dict:
        """The worker's key and value converters: Connect's JSON, or Apicurio's Avro in the Confluent wire
        format through ``registry``."""
        out: dict = {}
        for side in ("key", "value"):
            c = f"{side}.converter"
            if self.registry is None:
                out.update({c: "org.apache.kafka.connect.json.JsonConverter",
                            f"{c}.schemas.enable": str(self.schemas).lower()})
                continue
            r = self.registry
            out.update({
                c: "io.apicurio.registry.utils.converter.AvroConverter",
                f"{c}.apicurio.registry.url": r.url.replace(CCOMPAT, "/apis/registry/v2"),
                f"{c}.apicurio.auth.username": USER, f"{c}.apicurio.auth.password": r.password,
                f"{c}.apicurio.registry.auto-register": "true",
                f"{c}.apicurio.registry.find-latest": "true",
                # the Confluent wire format: a magic byte and a 4-byte id (the content id: what the
                # registry's Confluent-compatible API calls a schema id), nothing in the record's headers
                f"{c}.apicurio.registry.as-confluent": "true",
                f"{c}.apicurio.registry.use-id": "contentId",
                f"{c}.apicurio.registry.headers.enabled": "false",
            })
        return out

    def start(self, timeout: float = 180) -> float:
        """Start the worker unless it runs; wait until its connector's task is RUNNING. Seconds it took."""
        t0 = time.monotonic()
        if not self.running():
            java = shutil.which("java")
            if java is None:
                raise StackError("Java 17+ is needed for Kafka Connect; install Debian's `default-jre-headless`")
            jars = ensure_jars(self.state, "connect")
            if procs.port_open(self.port):
                raise StackError(f"connect: port {self.port} on {LOOPBACK} is taken by another process "
                                 "(set RECLOCK_CONNECT_PORT or free it)")
            worker, connector = self._write_config()
            procs.spawn("connect", [java, f"-Xmx{self.heap}", *self.jvm_flags,
                                    f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}", "-cp", f"{jars}/*", "org.apache.kafka.connect.cli.ConnectStandalone",
                                    str(worker), str(connector)],
                        log=self.log, pidfile=self.pidfile, cwd=self.home)
        try:
            procs.wait_until("kafka connect (debezium)", self._task_running, timeout, log=self.log,
                             alive=self.running)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def status(self) -> dict:
        """The connector's status as the worker's REST API gives it."""
        url = f"http://{LOOPBACK}:{self.port}/connectors/{CONNECTOR}/status"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.loads(resp.read())

    def _task_running(self) -> bool:
        try:
            st = self.status()
        except (urllib.error.URLError, OSError, ValueError):
            return False
        tasks = st.get("tasks") or []
        failed = [t for t in tasks if t.get("state") == "FAILED"]
        if failed:
            raise StackError(f"connect: the Debezium task failed: {failed[0].get('trace', '')[:2000]}")
        return bool(tasks) and all(t.get("state") == "RUNNING" for t in tasks)

    def stop(self) -> bool:
        """Stop the worker (SIGTERM: it flushes its offsets); its offsets file stays for a restart."""
        return procs.stop(self.pidfile, timeout=30)

    def kill(self) -> bool:
        """Kill the worker without letting it flush (a crash): a restart redelivers past its last flush."""
        import os
        import signal

        pid = procs.read_pid(self.pidfile)
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while procs.pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pidfile.unlink(missing_ok=True)
        return True
