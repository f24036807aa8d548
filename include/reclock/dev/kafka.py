"""A real single-node Kafka broker (KRaft, combined broker + controller) from the Maven jars.

Internal topics use replication factor 1, so idempotent and transactional producers work on one node.

``LocalKafka(state, secure=True)`` runs it as production clusters run: every listener TLS with the stack's CA
(``reclock.dev.tls``), clients on ``bootstrap`` log in with SASL/SCRAM-SHA-512, clients on
``mtls_bootstrap`` with a client certificate (its CN is the principal: ``ssl.principal.mapping.rules``), the
controller listener and the broker's own connections with the broker's certificate, and KRaft's
``StandardAuthorizer`` with no access where no ACL allows it. The principals ``broker`` and ``admin`` are
super users; ``admin`` (:meth:`LocalKafka.admin_config`, mutual TLS) creates SCRAM users
(:meth:`LocalKafka.add_user`) and ACLs (:meth:`LocalKafka.grant`): no password ever goes on a command line.
"""

from __future__ import annotations

import base64
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from reclock.dev import procs
from reclock.dev.jars import ensure_jars
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import StackState
from reclock.dev.tls import LocalCA
from reclock.errors import StackError
from reclock.kafka_client import KafkaClientConfig

SUPER_USERS = ("broker", "admin")

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
    secure: bool = False
    name: str = "kafka"  # the state folder and port names (``<name>``, ``<name>_controller``, ``<name>_mtls``)

    @property
    def home(self) -> Path:
        return self.state.dir(self.name)

    @property
    def port(self) -> int:
        return self.state.port(self.name)

    @property
    def controller_port(self) -> int:
        return self.state.port(f"{self.name}_controller")

    @property
    def mtls_port(self) -> int:
        return self.state.port(f"{self.name}_mtls")

    @property
    def bootstrap(self) -> str:
        """PLAINTEXT, or SASL_SSL (SCRAM-SHA-512) when ``secure``."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def mtls_bootstrap(self) -> str:
        """The mutual-TLS listener of a secured broker."""
        return f"{LOOPBACK}:{self.mtls_port}"

    @property
    def ca(self) -> LocalCA:
        return LocalCA(self.state)

    def admin_config(self) -> KafkaClientConfig:
        """A super user's client config: plaintext, or the ``admin`` certificate on the mutual-TLS listener."""
        if not self.secure:
            return KafkaClientConfig.plaintext(self.bootstrap)
        return self.mtls_config("admin")

    def mtls_config(self, principal: str) -> KafkaClientConfig:
        """A client with a certificate for ``CN=<principal>`` (made on first use) on the mutual-TLS listener."""
        issued = self.ca.issue(f"kafka-client-{principal}", principal)
        return KafkaClientConfig(self.mtls_bootstrap, "SSL", ca_pem=self.ca.pem, cert_pem=issued.cert_pem,
                                 key_pem=issued.key_pem, origin=f"the local broker's {principal} certificate")

    def scram_config(self, user: str, password: str) -> KafkaClientConfig:
        """A SCRAM-SHA-512 client of ``user`` on the SASL_SSL listener."""
        return KafkaClientConfig(self.bootstrap, "SASL_SSL", "SCRAM-SHA-512", user, password, ca_pem=self.ca.pem,
                                 origin=f"the local broker's user {user}")

    def add_user(self, user: str, password: str) -> None:
        """Create (or reset) the SCRAM-SHA-512 credentials of ``user`` (as ``admin``)."""
        from reclock.grants import set_scram_password

        set_scram_password(self.admin_config(), user, password)

    def grant(self, principal: str, operation: str, resource_type: str, name: str, prefixed: bool = False) -> None:
        """Allow ``User:<principal>`` ``operation`` (``READ``, ``WRITE``, ``DESCRIBE``, ``CREATE``, ...) on
        the ``resource_type`` (``TOPIC``, ``GROUP``, ``TRANSACTIONAL_ID``, ``BROKER`` for the cluster) named
        ``name`` (or every one whose name starts with it, ``prefixed``), from any host."""
        from reclock.grants import KafkaAcl, apply_acls

        apply_acls(self.admin_config(), f"User:{principal}", [KafkaAcl(resource_type.upper(), name,  # type: ignore[arg-type]
                                                                        operation.upper())], prefixed=prefixed)

    def revoke(self, principal: str, operation: str, resource_type: str, name: str, prefixed: bool = False) -> None:
        from reclock.grants import KafkaAcl, apply_acls

        apply_acls(self.admin_config(), f"User:{principal}", [KafkaAcl(resource_type.upper(), name,  # type: ignore[arg-type]
                                                                        operation.upper())], delete=True,
                   prefixed=prefixed)

    @property
    def log(self) -> Path:
        return self.home / "kafka.out"

    @property
    def pidfile(self) -> Path:
        return self.home / "kafka.pid"

    def _listeners(self) -> dict[str, str]:
        controller = f"CONTROLLER://{LOOPBACK}:{self.controller_port}"
        if not self.secure:
            listeners = f"PLAINTEXT://{LOOPBACK}:{self.port},{controller}"
            return {"listeners": listeners, "advertised.listeners": listeners,
                    "inter.broker.listener.name": "PLAINTEXT",
                    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"}
        listeners = f"SASL_SSL://{LOOPBACK}:{self.port},SSL://{LOOPBACK}:{self.mtls_port},{controller}"
        issued = self.ca.issue(f"{self.name}-broker", "broker")
        props = {
            "listeners": listeners, "advertised.listeners": listeners,
            "inter.broker.listener.name": "SSL",
            "listener.security.protocol.map": "CONTROLLER:SSL,SASL_SSL:SASL_SSL,SSL:SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.ssl.client.auth": "none",
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.controller.ssl.client.auth": "required",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": issued.cert_pem,
            "ssl.keystore.key": issued.key_pem,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.certificates": self.ca.pem,
            "ssl.endpoint.identification.algorithm": "https",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(f"User:{u}" for u in SUPER_USERS),
        }
        return props

    def _write_config(self) -> Path:
        cfg = self.home / "server.properties"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{self.controller_port}",
            **self._listeners(),
            "controller.listener.names": "CONTROLLER",
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
        fd = os.open(cfg, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a secured broker's key is in it
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k}={_escape(v)}\n" for k, v in props.items()))
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
        for port in (self.port, self.controller_port, *((self.mtls_port,) if self.secure else ())):
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
        admin = AdminClient(self.admin_config().librdkafka({"log_level": 2}))

        def healthy() -> bool:
            md = admin.list_topics(timeout=2)
            return bool(md.brokers)

        procs.wait_until("kafka broker", healthy, timeout, log=self.log, alive=self.running)

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=30)


def _escape(value: str) -> str:
    """A value for a Java properties file: newlines (PEM text) and backslashes escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")
