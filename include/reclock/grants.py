"""Least privilege: exactly what Reclock's principals need, derived from a config, and nothing more.

- :func:`kafka_acls`: the ACLs of the principal in a Kafka connection (its SASL user, or its client
  certificate's mapped subject). A source reads its topic and commits its consumer group; a sink writes its
  topic and its progress topic in transactions under its transactional id, and reads both at start (where
  it left off, whether the topic already holds data). Reclock creates a sink's topics only when they are
  missing (then it needs ``CREATE`` on them): create them beforehand and it needs no ``CREATE`` at all.
- :func:`consensus_grants`: the consensus role owns the ``reclock`` schema and nothing else (the Iceberg
  export's SQL catalog tables, when the catalog is the consensus database, live in that schema too).
- :func:`cdc_grants`: a Postgres source's role logs in with ``REPLICATION`` (slots, logical decoding) and
  reads the published tables, and nothing else; the publication is created by the tables' owner.

``reclock grants`` prints them for a config (``docs/deployment.md`` shows them for the example). The secured
tests grant exactly these and run every source kind, the sink and the export with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from reclock.config import Config, SinkSpec
from reclock.specs import KafkaSpec, SourceSpec
from reclock.kafka_client import KafkaClientConfig

AclOperation = Literal["READ", "WRITE", "DESCRIBE", "CREATE", "IDEMPOTENT_WRITE"]
AclResource = Literal["TOPIC", "GROUP", "TRANSACTIONAL_ID", "BROKER"]


@dataclass(frozen=True, order=True)
class KafkaAcl:
    """Allow ``operation`` on the ``resource_type`` named ``name`` (``why``: for whom, in words)."""

    resource_type: AclResource
    name: str
    operation: AclOperation
    why: str = ""

    def command(self, principal: str) -> str:
        """The ``kafka-acls.sh`` line that grants it to ``principal`` (``User:reclock``)."""
        flag = {"TOPIC": f"--topic {self.name}", "GROUP": f"--group {self.name}",
                "TRANSACTIONAL_ID": f"--transactional-id {self.name}", "BROKER": "--cluster"}[self.resource_type]
        op = self.operation.title().replace("_", "")
        return (f"kafka-acls.sh --bootstrap-server $BROKERS --command-config admin.properties --add "
                f"--allow-principal {principal} --operation {op} {flag}")


def source_acls(spec: SourceSpec) -> tuple[KafkaAcl, ...]:
    """A Kafka source's: its topic (DESCRIBE for the probe and the triggers, READ for Spark's reader and the
    offset commit) and its consumer group (READ: the offset commit; it covers DESCRIBE, the lag)."""
    kafka = spec.upstream
    if not isinstance(kafka, KafkaSpec):  # a source not on a Kafka cluster needs no ACL
        return ()
    why = f"source {spec.name}"
    return (*(KafkaAcl("TOPIC", t, op, why) for t in kafka.topics for op in ("DESCRIBE", "READ")),
            KafkaAcl("GROUP", spec.consumer_group, "READ", why))


def sink_acls(spec: SinkSpec) -> tuple[KafkaAcl, ...]:
    """A Kafka sink's: its topic and its progress topic (WRITE in its transactions; READ at start; DESCRIBE),
    its transactional id (WRITE), and DESCRIBE on the groups of the two consumers that read the topics at
    start (assigned, they commit nothing, but a consumer of a group finds its coordinator)."""
    from reclock.sinks.kafka import check_group, progress_group

    why = f"sink {spec.name}"
    out = [KafkaAcl("TOPIC", topic, op, why) for topic in (spec.kafka.topic, spec.progress_topic)
           for op in ("DESCRIBE", "READ", "WRITE")]
    out.append(KafkaAcl("TRANSACTIONAL_ID", spec.transactional_id, "WRITE", why))
    out += [KafkaAcl("GROUP", g, "DESCRIBE", why) for g in (progress_group(spec.name), check_group(spec.name))]
    return tuple(out)


def kafka_acls(config: Config, connection: str | None = None) -> tuple[KafkaAcl, ...]:
    """Every ACL the config's Kafka sources and sinks need (those on ``connection`` only, if given), each
    once, sorted; the reasons of one ACL joined."""
    found: dict[tuple[str, str, str], set[str]] = {}
    acls: list[KafkaAcl] = []
    for spec in config.sources.values():
        if isinstance(spec.upstream, KafkaSpec) and connection in (None, spec.upstream.connection):
            acls.extend(source_acls(spec))
    for sink in config.sinks.values():
        if isinstance(sink, SinkSpec) and connection in (None, sink.kafka.connection):
            acls.extend(sink_acls(sink))
    for a in acls:
        found.setdefault((a.resource_type, a.name, a.operation), set()).add(a.why)
    return tuple(sorted(KafkaAcl(t, n, o, ", ".join(sorted(w))) for (t, n, o), w in found.items()))  # type: ignore[arg-type]


def set_scram_password(admin: KafkaClientConfig, user: str, password: str) -> None:
    """Create (or reset) ``user``'s SCRAM-SHA-512 credentials, as the administrator ``admin`` (a super
    user's client config): through the admin API, so the password is on no command line."""
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    client = AdminClient(admin.librdkafka({"log_level": 2}))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    for fut in client.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, password.encode())]
                                                   ).values():
        fut.result(30)


def apply_acls(admin: KafkaClientConfig, principal: str, acls: Iterable[KafkaAcl], delete: bool = False,
               prefixed: bool = False) -> None:
    """Allow (or, ``delete``, stop allowing) ``principal`` (``User:reclock``) ``acls`` from any host, as the
    administrator ``admin``."""
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)

    client = AdminClient(admin.librdkafka({"log_level": 2}))
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    bindings = [(ResourceType[a.resource_type], a.name, pattern, principal, "*", AclOperation[a.operation],
                 AclPermissionType.ALLOW) for a in acls]
    if not bindings:
        return
    futures = (client.delete_acls([AclBindingFilter(*b) for b in bindings]) if delete
               else client.create_acls([AclBinding(*b) for b in bindings]))
    for fut in futures.values():
        fut.result(30)


def create_sink_topics(admin: KafkaClientConfig, config: Config) -> list[str]:
    """Create, as the administrator ``admin``, the Kafka sinks' topics (``partitions:``) and progress topics
    (compacted, one partition) that are missing; the topics made. A sink given these needs no CREATE."""
    from confluent_kafka.admin import AdminClient, NewTopic

    client = AdminClient(admin.librdkafka({"log_level": 2}))
    existing = set(client.list_topics(timeout=30).topics)
    wanted: dict[str, NewTopic] = {}
    for sink in config.sinks.values():
        if isinstance(sink, SinkSpec):
            wanted.setdefault(sink.progress_topic, NewTopic(sink.progress_topic, 1, -1,
                                                            config={"cleanup.policy": "compact"}))
            wanted.setdefault(sink.kafka.topic, NewTopic(sink.kafka.topic, sink.partitions, -1))
    missing = [t for name, t in wanted.items() if name not in existing]
    for fut in (client.create_topics(missing).values() if missing else ()):
        fut.result(30)
    return sorted(t.topic for t in missing)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def consensus_grants(role: str, database: str = "reclock") -> tuple[str, ...]:
    """SQL, run by an administrator in ``database``, that lets ``role`` (a login role without other rights)
    migrate and use the consensus schema, and nothing more."""
    r = _ident(role)
    return (f"REVOKE ALL ON DATABASE {_ident(database)} FROM PUBLIC",
            f"GRANT CONNECT ON DATABASE {_ident(database)} TO {r}",
            f"CREATE SCHEMA reclock AUTHORIZATION {r}",
            f"ALTER ROLE {r} IN DATABASE {_ident(database)} SET search_path = reclock")


def cdc_grants(role: str, tables: Iterable[str], database: str) -> tuple[str, ...]:
    """SQL, run by an administrator in ``database``, that lets ``role`` (a login role) run a Postgres source
    over ``tables`` (``schema.table``): replication (its slot, logical decoding) and SELECT on the tables
    (the snapshot), and nothing more."""
    r = _ident(role)
    out = [f"ALTER ROLE {r} REPLICATION", f"GRANT CONNECT ON DATABASE {_ident(database)} TO {r}"]
    for schema in sorted({t.partition(".")[0] for t in tables}):
        out.append(f"GRANT USAGE ON SCHEMA {_ident(schema)} TO {r}")
    out += [f"GRANT SELECT ON TABLE {'.'.join(_ident(p) for p in t.split('.', 1))} TO {r}" for t in tables]
    return tuple(out)
