"""A real single-node Kafka broker (KRaft, combined broker + controller) from the Maven jars.

Internal topics use replication factor 1, so idempotent and transactional producers work on one node.
"""

from __future__ import annotations

import base64
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from reclock.dev import procs
from reclock.dev.jars import ensure_jars
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import StackState
from reclock.errors import StackError

LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.server.name = org.apache.kafka.server
logger.server.level = WARN
"""


@dataclass
class LocalKafka:
    """One broker under ``<state>/kafka``; ``bootstrap`` is ``127.0.0.1:<port>``."""

    state: StackState
    heap: str = "768m"

    @property
    def home(self) -> Path:
        return self.state.dir("kafka")

    @property
    def port(self) -> int:
        return self.state.port("kafka")

    @property
    def controller_port(self) -> int:
        return self.state.port("kafka_controller")

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def log(self) -> Path:
        return self.home / "kafka.out"

    @property
    def pidfile(self) -> Path:
        return self.home / "kafka.pid"

    def _write_config(self) -> Path:
        cfg = self.home / "server.properties"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.home / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.check.interval.ms": "5000",
            "log.segment.delete.delay.ms": "1000",
            "log.cleaner.backoff.ms": "2000",
            "transaction.max.timeout.ms": "900000",
        }
        cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(LOG4J2.format(log=self.home / "server.log"))
        return cfg

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise StackError("Java 17+ is needed for the Kafka broker; install Debian's `default-jre-headless`")
        return java

    def _classpath(self) -> str:
        return str(ensure_jars(self.state, "kafka") / "*")

    def _jvm(self) -> list[str]:
        return [self._java(), f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                "-Djava.net.preferIPv4Stack=true", "-cp", self._classpath()]

    def running(self) -> bool:
        return procs.read_pid(self.pidfile) is not None

    def start(self, timeout: float = 90) -> float:
        """Format storage on first start, start the broker if not running, wait until it serves metadata."""
        t0 = time.monotonic()
        if self.running():
            self.wait_healthy(timeout)
            return time.monotonic() - t0
        for port in (self.port, self.controller_port):
            if procs.port_open(port):
                raise StackError(f"kafka: port {port} on {LOOPBACK} is taken by another process "
                                 "(set RECLOCK_KAFKA_PORT / RECLOCK_KAFKA_CONTROLLER_PORT or free it)")
        cfg = self._write_config()
        if not (self.home / "data" / "meta.properties").exists():
            # a KRaft cluster id is 16 random bytes, base64url without padding (22 chars)
            cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            # `--cluster-id=<id>`: a base64url id may start with '-', which argparse would take for a flag
            procs.run([*self._jvm(), "kafka.tools.StorageTool", "format", f"--cluster-id={cid}", "-c", str(cfg),
                       "--standalone"], "kafka storage format", timeout=120)
        procs.spawn("kafka", [*self._jvm(), "kafka.Kafka", str(cfg)], log=self.log, pidfile=self.pidfile)
        self.wait_healthy(timeout)
        return time.monotonic() - t0

    def wait_healthy(self, timeout: float = 90) -> None:
        from confluent_kafka.admin import AdminClient

        procs.wait_until("kafka broker port", lambda: procs.port_open(self.port), timeout, log=self.log,
                         alive=self.running)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})

        def healthy() -> bool:
            md = admin.list_topics(timeout=2)
            return bool(md.brokers)

        procs.wait_until("kafka broker", healthy, timeout, log=self.log, alive=self.running)

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=30)
