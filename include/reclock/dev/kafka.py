"""Real Kafka brokers from the Maven jars (KRaft): one combined broker + controller for the stack and most
tests (:class:`LocalKafka`), or a cluster of three (:class:`LocalKafkaCluster`) for the faults a deployment's
cluster has: a partition leader, a transaction coordinator or the active controller killed and restarted.

A single node keeps its internal topics at replication factor 1, so idempotent and transactional producers
work on one node. A cluster is a static quorum of ``size`` combined nodes (every node a voter and a broker)
with what a production cluster sets: replication factor 3 for every topic that does not say otherwise and
for the offsets and transaction state logs, ``min.insync.replicas`` 2 (a write acknowledged by ``acks=all``
is on two nodes), no unclean leader election.

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
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from reclock.dev import procs
from reclock.dev.jars import ensure_jars
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, StackState
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
class LocalKafka(LocalServer):
    """One node under ``<state>/<name>``; ``bootstrap`` is ``127.0.0.1:<port>``. Alone (``voters`` None) it is
    its own quorum with replication factor 1; in a :class:`LocalKafkaCluster` it is node ``node_id`` of the
    static quorum ``voters`` (node id -> controller port) with the cluster's replication settings."""

    state: StackState
    heap: str = "768m"
    secure: bool = False
    name: str = "kafka"
    node_id: int = 1
    voters: dict[int, int] | None = None
    cluster_id: str | None = None  # a cluster's nodes share one; a single node makes its own
    proxied: bool = False
    """Also a listener for clients behind a proxy (``reclock.dev.toxiproxy``): ``EXTERNAL`` on
    :attr:`external_port`, advertised at :attr:`proxy_port`, where the proxy listens and forwards to it; a
    client bootstrapped at :attr:`proxied_bootstrap` reaches every broker through proxies, while the brokers
    and the controllers (and clients of :attr:`bootstrap`) talk directly."""

    process: ClassVar[str] = "kafka"

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
    def external_port(self) -> int:
        return self.state.port(f"{self.name}_external")

    @property
    def proxy_port(self) -> int:
        return self.state.port(f"{self.name}_proxy")

    @property
    def proxied_bootstrap(self) -> str:
        """Where a client behind the proxy bootstraps (``proxied`` nodes only)."""
        if not self.proxied:
            raise StackError(f"{self.name} has no proxied listener (LocalKafka(proxied=True))")
        return f"{LOOPBACK}:{self.proxy_port}"

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

    def _listeners(self) -> dict[str, str]:
        controller = f"CONTROLLER://{LOOPBACK}:{self.controller_port}"
        if not self.secure:
            listeners = f"PLAINTEXT://{LOOPBACK}:{self.port},{controller}"
            advertised = listeners
            if self.proxied:  # clients behind a proxy: the broker listens on its own port, names the proxy's
                listeners += f",EXTERNAL://{LOOPBACK}:{self.external_port}"
                advertised += f",EXTERNAL://{LOOPBACK}:{self.proxy_port}"
            return {"listeners": listeners, "advertised.listeners": advertised,
                    "inter.broker.listener.name": "PLAINTEXT",
                    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT"}
        if self.proxied:
            raise StackError(f"{self.name}: a secured broker has no proxied listener (proxied=True needs secure=False)")
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

    def _replication(self) -> dict[str, str]:
        if self.voters is None:
            return {"offsets.topic.replication.factor": "1", "transaction.state.log.replication.factor": "1",
                    "transaction.state.log.min.isr": "1", "share.coordinator.state.topic.replication.factor": "1",
                    "share.coordinator.state.topic.min.isr": "1",
                    "controller.quorum.bootstrap.servers": f"{LOOPBACK}:{self.controller_port}"}
        rf = str(min(3, len(self.voters)))
        isr = str(min(2, len(self.voters)))
        return {"offsets.topic.replication.factor": rf, "transaction.state.log.replication.factor": rf,
                "transaction.state.log.min.isr": isr, "share.coordinator.state.topic.replication.factor": rf,
                "share.coordinator.state.topic.min.isr": isr, "default.replication.factor": rf,
                "min.insync.replicas": isr, "unclean.leader.election.enable": "false",
                "controller.quorum.voters": ",".join(f"{n}@{LOOPBACK}:{p}" for n, p in sorted(self.voters.items()))}

    def _write_config(self) -> Path:
        cfg = self.home / "server.properties"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            **self._listeners(),
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.home / "data"),
            "num.partitions": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.check.interval.ms": "5000",
            "log.segment.delete.delay.ms": "1000",
            "log.cleaner.backoff.ms": "2000",
            "transaction.max.timeout.ms": "900000",
            **self._replication(),
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

    def spawn(self) -> bool:
        """Format the storage on the first start and start the node's JVM unless it runs; no waiting. True if
        it was started now."""
        if self.running():
            return False
        for port in (self.port, self.controller_port, *((self.mtls_port,) if self.secure else ()),
                     *((self.external_port,) if self.proxied else ())):
            if procs.port_open(port):
                raise StackError(f"kafka: port {port} on {LOOPBACK} is taken by another process "
                                 f"(set RECLOCK_{self.name.upper()}_PORT / RECLOCK_{self.name.upper()}_CONTROLLER_PORT "
                                 "or free it)")
        cfg = self._write_config()
        if not (self.home / "data" / "meta.properties").exists():
            # a KRaft cluster id is 16 random bytes, base64url without padding (22 chars)
            cid = self.cluster_id or base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            # `--cluster-id=<id>`: a base64url id may start with '-', which argparse would take for a flag
            standalone = ["--standalone"] if self.voters is None else []  # a static quorum names its voters
            procs.run([*self._jvm(), "kafka.tools.StorageTool", "format", f"--cluster-id={cid}", "-c", str(cfg),
                       *standalone], "kafka storage format", timeout=120)
        procs.spawn(self.name, [*self._jvm(), "kafka.Kafka", str(cfg)], log=self.log, pidfile=self.pidfile)
        return True

    def start(self, timeout: float = 90) -> float:
        """Start the node if it is not running and wait until it serves metadata."""
        t0 = time.monotonic()
        self.spawn()
        self.wait_healthy(timeout)
        return time.monotonic() - t0

    def wait_healthy(self, timeout: float = 90) -> None:
        from confluent_kafka.admin import AdminClient

        procs.wait_until(f"{self.name} broker port", lambda: procs.port_open(self.port), timeout, log=self.log,
                         alive=self.running)
        admin = AdminClient(self.admin_config().librdkafka({"log_level": 2}))

        def healthy() -> bool:
            md = admin.list_topics(timeout=2)
            return self.node_id in md.brokers

        procs.wait_until(f"{self.name} broker", healthy, timeout, log=self.log, alive=self.running)

    def kill(self) -> bool:
        """SIGKILL the node's JVM (a crash: no controlled shutdown); True if it ran."""
        return procs.kill_group(self.pidfile)

    def stop(self, grace: float = 30) -> bool:
        """SIGTERM (a controlled shutdown), SIGKILL after ``grace`` seconds (a throwaway test broker: a few)."""
        return procs.stop(self.pidfile, timeout=grace)


@dataclass
class LocalKafkaCluster:
    """``size`` KRaft nodes under ``<state>/kafka-<id>``, each a broker and a voter of the static controller
    quorum; ``bootstrap`` names every node. Replication factor ``min(3, size)`` and ``min.insync.replicas``
    ``min(2, size)`` for every topic (unless it says otherwise) and for the offsets and transaction state
    logs. :meth:`kill` and :meth:`start_node` are the faults; :meth:`leader`, :meth:`transaction_coordinator`
    and :meth:`active_controller` say which node to aim them at."""

    state: StackState
    size: int = 3
    heap: str = "384m"
    proxied: bool = False  # each node also behind a proxy (LocalKafka.proxied)
    nodes: dict[int, LocalKafka] = field(init=False)

    def __post_init__(self) -> None:
        cid = self.state.secret("kafka_cluster_id", 16)  # token_urlsafe(16): 16 random bytes, base64url (22 chars)
        names = {n: f"kafka-{n}" for n in range(1, self.size + 1)}
        voters = {n: self.state.port(f"{name}_controller") for n, name in names.items()}
        self.nodes = {n: LocalKafka(self.state, heap=self.heap, name=name, node_id=n, voters=voters, cluster_id=cid,
                                    proxied=self.proxied)
                      for n, name in names.items()}

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes.values())

    @property
    def proxied_bootstrap(self) -> str:
        return ",".join(node.proxied_bootstrap for node in self.nodes.values())

    def start(self, timeout: float = 180) -> float:
        """Start every node that is not running (together: a static quorum needs a majority to elect) and
        wait until every broker is registered (the offsets and transaction state logs are made by Kafka at
        their first use)."""
        t0 = time.monotonic()
        for node in self.nodes.values():
            node.spawn()
        for node in self.nodes.values():
            node.wait_healthy(timeout)
        procs.wait_until(f"{self.size} kafka brokers registered", lambda: len(self.brokers()) == self.size, timeout,
                         log=self.nodes[1].log)
        return time.monotonic() - t0

    def start_node(self, node_id: int, timeout: float = 180) -> float:
        """Start node ``node_id`` again and wait until it serves metadata and has caught up: every partition
        it replicates lists it in sync again (so the next fault never finds fewer than two copies)."""
        t0 = time.monotonic()
        self.nodes[node_id].start(timeout)
        procs.wait_until(f"kafka node {node_id} back in sync", lambda: not self.under_replicated(), timeout,
                         log=self.nodes[node_id].log)
        return time.monotonic() - t0

    def kill(self, node_id: int) -> bool:
        return self.nodes[node_id].kill()

    def running(self) -> bool:
        return any(node.running() for node in self.nodes.values())

    def stop(self, grace: float = 30) -> list[int]:
        """Stop every node at once (one at a time, the last would wait out its controlled shutdown without a
        quorum), each SIGKILLed after ``grace`` seconds; return the ids of those that ran."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(self.nodes)) as pool:
            stopped = dict(zip(self.nodes, pool.map(lambda node: node.stop(grace), self.nodes.values())))
        return [n for n, ran in stopped.items() if ran]

    def _admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})

    def brokers(self) -> set[int]:
        """The node ids the cluster's metadata lists as brokers (registered and not fenced)."""
        return set(self._admin().list_topics(timeout=5).brokers)

    def under_replicated(self, topics: list[str] | None = None) -> list[tuple[str, int]]:
        """``(topic, partition)`` of every partition (of ``topics``, default all, internal ones too) with
        fewer replicas in sync than it has."""
        md = self._admin().list_topics(timeout=5)
        out = []
        for name, t in md.topics.items():
            if topics is not None and name not in topics:
                continue
            if t.error is not None:
                out.append((name, -1))
                continue
            out += [(name, p) for p, pm in t.partitions.items() if len(pm.isrs) < len(pm.replicas) or pm.leader < 0]
        return out

    def leader(self, topic: str, partition: int = 0) -> int:
        """The node leading ``topic``'s ``partition`` (-1: none now)."""
        md = self._admin().list_topics(topic, timeout=5)
        return md.topics[topic].partitions[partition].leader

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``'s transactions: the leader of its partition of
        ``__transaction_state`` (Kafka's ``abs(id.hashCode()) % partitions``, the Java string hash)."""
        md = self._admin().list_topics("__transaction_state", timeout=5)
        parts = md.topics["__transaction_state"].partitions
        if not parts:  # Kafka makes the log at the first transactional producer's FindCoordinator
            raise StackError(f"kafka cluster: no transaction state log yet (no transactional producer has started): "
                             f"{transactional_id!r} has no coordinator")
        return parts[java_string_hash_partition(transactional_id, len(parts))].leader

    def active_controller(self) -> int:
        """The node leading the controller quorum (the KRaft leader of ``__cluster_metadata``): Kafka's
        DescribeQuorum request, asked of any running node."""
        errors = []
        for node in self.nodes.values():
            if not node.running():
                continue
            try:
                return describe_quorum_leader(LOOPBACK, node.port)
            except OSError as e:
                errors.append(f"{node.name}: {e}")
        raise StackError(f"kafka cluster: no node answered DescribeQuorum ({'; '.join(errors) or 'none runs'})")


def java_string_hash_partition(key: str, partitions: int) -> int:
    """Kafka's partition of a coordinator key (``Utils.abs(key.hashCode()) % partitions``): Java's
    ``String.hashCode`` over UTF-16 code units, in 32-bit arithmetic."""
    h = 0
    for unit in struct.unpack(f">{len(key.encode('utf-16-be')) // 2}H", key.encode("utf-16-be")):
        h = (31 * h + unit) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_uvarint(buf: bytes, at: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[at]
        at += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, at


def describe_quorum_leader(host: str, port: int, timeout: float = 5.0) -> int:
    """The leader id of the KRaft quorum (``__cluster_metadata`` partition 0) by one DescribeQuorum request
    (API key 55, version 0, a flexible version) to the broker at ``host:port``. Written against Kafka's
    message definitions (``DescribeQuorumRequest.json``/``Response.json``): the request is the header v2
    (api key, version, correlation id, client id, no tagged fields) and one topic with one partition; the
    response's partition starts with its index, error code and leader id."""
    topic = b"__cluster_metadata"
    body = (_uvarint(2) + _uvarint(len(topic) + 1) + topic  # one topic (compact array and string)
            + _uvarint(2) + struct.pack(">i", 0) + b"\0"  # one partition: index 0, no tagged fields
            + b"\0" + b"\0")  # the topic's and the request's tagged fields
    client = b"reclock-dev"
    header = struct.pack(">hhih", 55, 0, 1, len(client)) + client + b"\0"
    msg = header + body
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(msg)) + msg)
        size = struct.unpack(">i", _recv(s, 4))[0]
        buf = _recv(s, size)
    at = 4  # correlation id
    _, at = _read_uvarint(buf, at)  # response header tagged fields (none)
    (error,) = struct.unpack_from(">h", buf, at)
    at += 2
    if error:
        raise OSError(f"DescribeQuorum error code {error}")
    _, at = _read_uvarint(buf, at)  # topics
    n, at = _read_uvarint(buf, at)  # topic name (compact string)
    at += n - 1
    _, at = _read_uvarint(buf, at)  # partitions
    _, perror, leader = struct.unpack_from(">ihi", buf, at)
    if perror:
        raise OSError(f"DescribeQuorum partition error code {perror}")
    return leader


def _recv(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise OSError("connection closed mid-response")
        out += chunk
    return bytes(out)


def _escape(value: str) -> str:
    """A value for a Java properties file: newlines (PEM text) and backslashes escaped."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")
