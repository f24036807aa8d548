"""How every Kafka client of Reclock reaches a cluster: its brokers and its security settings, in one value.

A :class:`KafkaClientConfig` comes from an Airflow connection (:func:`from_connection`, the Kafka provider's
shape: the librdkafka settings in the extra, the SASL user and password in login and password) or, for an
unsecured cluster, from an address alone (:meth:`KafkaClientConfig.plaintext`). It turns into the two
configurations Reclock's clients take, and nothing else builds them:

- :meth:`~KafkaClientConfig.librdkafka`: confluent-kafka's admin clients, consumers and producers (mint's
  probe, the offset commit, the sinks, the ``schedule: upstream`` triggers, the lag on the status page);
- :meth:`~KafkaClientConfig.spark_options`: Spark's ``kafka.*`` reader options (``write_batches``, rebuilds,
  continuous mode), the Java client's names for the same settings.

=====================================  ===========================================================
connection field / extra key           meaning
=====================================  ===========================================================
``bootstrap.servers`` (else host:port)  the brokers
``security.protocol``                   ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``
``sasl.mechanism``                      ``SCRAM-SHA-512``, ``SCRAM-SHA-256`` or ``PLAIN``
login / password (or ``sasl.username``  the SASL user and its password
/ ``sasl.password``)
``ssl.ca.location`` / ``ssl.ca.pem``    the CA certificates that sign the brokers' (a file, or PEM text)
``ssl.certificate.location`` / ``.pem``  the client's certificate (mutual TLS)
``ssl.key.location`` / ``.pem``          its private key; ``ssl.key.password`` if the key is encrypted
``ssl.endpoint.identification.          ``https`` (default: the broker's name must match its certificate)
algorithm``                             or ``none``
=====================================  ===========================================================

Files are read when the connection is read, so Spark's executors get the certificates as text and need no
file of their own. The password and the private key never appear in ``repr``, in an error or in a log line
of Reclock's; Spark redacts them (``reclock.spark.session.REDACTION``).

Errors: :func:`check` turns a client's Kafka error into :class:`~reclock.errors.KafkaAccessDenied` (naming
the operation and the resource the principal needs an ACL for) or
:class:`~reclock.errors.KafkaAuthenticationFailed`; :class:`ClientErrors` records what librdkafka reports
only through its error callback (a refused login, a failed TLS handshake), so a call that would otherwise
wait for its timeout fails with the reason at once.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

from reclock.errors import ConfigError, KafkaAccessDenied, KafkaAuthenticationFailed, ReclockError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
Operation = Literal["READ", "WRITE", "DESCRIBE", "CREATE", "IDEMPOTENT_WRITE"]
ResourceType = Literal["topic", "group", "transactional id", "cluster"]

SECURITY_KEYS = frozenset({
    "security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password", "ssl.ca.location",
    "ssl.ca.pem", "ssl.certificate.location", "ssl.certificate.pem", "ssl.key.location", "ssl.key.pem",
    "ssl.key.password", "ssl.endpoint.identification.algorithm"})
"""The extra keys :func:`from_connection` understands, besides ``bootstrap.servers``."""

_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


@dataclass(frozen=True)
class KafkaClientConfig:
    """The brokers and the security settings of one Kafka cluster as one principal sees it.

    ``origin`` says where it came from (``connection reclock_kafka``) for error messages. The password,
    the private key and its password are left out of ``repr`` and of :meth:`describe`."""

    bootstrap: str
    protocol: SecurityProtocol = "PLAINTEXT"
    mechanism: SaslMechanism | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_pem: str | None = field(default=None, repr=False)
    cert_pem: str | None = field(default=None, repr=False)
    key_pem: str | None = field(default=None, repr=False)
    key_password: str | None = field(default=None, repr=False)
    verify_hostname: bool = True
    origin: str = "the given brokers"

    def __post_init__(self) -> None:
        what = self.origin
        if not self.bootstrap:
            raise ConfigError(f"{what}: no brokers (bootstrap.servers, or the connection's host and port)")
        if self.protocol not in get_args(SecurityProtocol):
            raise ConfigError(f"{what}: security.protocol {self.protocol!r} is not one of "
                              f"{', '.join(get_args(SecurityProtocol))}")
        if self.sasl:
            if self.mechanism not in get_args(SaslMechanism):
                raise ConfigError(f"{what}: security.protocol {self.protocol} needs sasl.mechanism, one of "
                                  f"{', '.join(get_args(SaslMechanism))} (got {self.mechanism!r})")
            if not self.username or not self.password:
                raise ConfigError(f"{what}: security.protocol {self.protocol} needs the SASL user and password "
                                  "(the connection's login and password)")
        elif self.mechanism or self.username or self.password:
            raise ConfigError(f"{what}: a SASL user or mechanism is given but security.protocol is "
                              f"{self.protocol}; set it to SASL_SSL")
        if not self.tls and (self.ca_pem or self.cert_pem or self.key_pem):
            raise ConfigError(f"{what}: TLS certificates are given but security.protocol is {self.protocol}; set "
                              "it to SSL or SASL_SSL")
        if bool(self.cert_pem) != bool(self.key_pem):
            raise ConfigError(f"{what}: mutual TLS needs both the client certificate (ssl.certificate.location) "
                              "and its key (ssl.key.location)")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @classmethod
    def plaintext(cls, bootstrap: str, origin: str = "the given brokers") -> "KafkaClientConfig":
        """An unsecured cluster at ``bootstrap`` (``RECLOCK_BOOTSTRAP``, ``--bootstrap``, a config's
        ``bootstrap:``: tests and scripts against a local broker)."""
        return cls(bootstrap=bootstrap, origin=origin)

    @property
    def principal(self) -> str:
        """Who the brokers see, in words: the SASL user, the client certificate, or nobody."""
        if self.sasl:
            return f"user {self.username!r}"
        if self.cert_pem:
            return "the client certificate's subject"
        return "ANONYMOUS"

    @property
    def acl_principal(self) -> str:
        """The principal an ACL names: ``User:<SASL user>``; for a client certificate, what the brokers'
        ``ssl.principal.mapping.rules`` make of its subject (shown as ``User:<certificate subject>``)."""
        if self.sasl:
            return f"User:{self.username}"
        if self.cert_pem:
            return "User:<the certificate's mapped subject>"
        return "User:ANONYMOUS"

    def describe(self) -> str:
        """``<brokers> (<protocol>[/<mechanism>] as <principal>)``: no secret."""
        how = self.protocol + (f"/{self.mechanism}" if self.sasl else "") + (" with a client certificate"
                                                                             if self.cert_pem else "")
        return f"{self.bootstrap} ({how} as {self.principal})"

    def librdkafka(self, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """confluent-kafka's configuration for this cluster, with the client's own ``settings`` on top."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "security.protocol": self.protocol.lower()}
        if self.sasl:
            conf.update({"sasl.mechanism": self.mechanism, "sasl.username": self.username,
                         "sasl.password": self.password})
        if self.tls:
            conf["ssl.endpoint.identification.algorithm"] = "https" if self.verify_hostname else "none"
            if self.ca_pem:
                conf["ssl.ca.pem"] = self.ca_pem
            if self.cert_pem:
                conf["ssl.certificate.pem"] = self.cert_pem
                conf["ssl.key.pem"] = self.key_pem
                if self.key_password:
                    conf["ssl.key.password"] = self.key_password
        conf.update(settings or {})
        return conf

    def spark_options(self) -> dict[str, str]:
        """Spark's Kafka source options (``kafka.*``: the Java client's settings) for this cluster."""
        opts = {"kafka.bootstrap.servers": self.bootstrap, "kafka.security.protocol": self.protocol}
        if self.sasl:
            opts["kafka.sasl.mechanism"] = str(self.mechanism)
            opts["kafka.sasl.jaas.config"] = (f"{_LOGIN_MODULES[str(self.mechanism)]} required "
                                              f"username={_jaas_quote(str(self.username))} "
                                              f"password={_jaas_quote(str(self.password))};")
        if self.tls:
            opts["kafka.ssl.endpoint.identification.algorithm"] = "https" if self.verify_hostname else ""
            if self.ca_pem:
                opts["kafka.ssl.truststore.type"] = "PEM"
                opts["kafka.ssl.truststore.certificates"] = self.ca_pem
            if self.cert_pem:
                opts["kafka.ssl.keystore.type"] = "PEM"
                opts["kafka.ssl.keystore.certificate.chain"] = self.cert_pem
                opts["kafka.ssl.keystore.key"] = str(self.key_pem)
                if self.key_password:
                    opts["kafka.ssl.key.password"] = self.key_password
        return opts

    def connection_json(self) -> str:
        """This config as an Airflow connection (``AIRFLOW_CONN_<ID>``: :func:`from_connection` reads it
        back), certificates as PEM text: what a spark-submit job gets in its environment."""
        import json

        extra: dict[str, str] = {"bootstrap.servers": self.bootstrap, "security.protocol": self.protocol}
        if self.mechanism:
            extra["sasl.mechanism"] = self.mechanism
        if self.tls and not self.verify_hostname:
            extra["ssl.endpoint.identification.algorithm"] = "none"
        for key, value in (("ssl.ca.pem", self.ca_pem), ("ssl.certificate.pem", self.cert_pem),
                           ("ssl.key.pem", self.key_pem), ("ssl.key.password", self.key_password)):
            if value:
                extra[key] = value
        conn = {"conn_type": "kafka", "extra": extra}
        if self.sasl:
            conn.update({"login": self.username, "password": self.password})
        return json.dumps(conn)

    def secrets(self) -> tuple[str, ...]:
        """The secret values in this config (tests grep for them)."""
        return tuple(s for s in (self.password, self.key_pem, self.key_password) if s)


def client_config(kafka: "KafkaClientConfig | str") -> KafkaClientConfig:
    """``kafka`` as a config: a string is the address of an unsecured cluster (tests, scripts)."""
    return kafka if isinstance(kafka, KafkaClientConfig) else KafkaClientConfig.plaintext(kafka)


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def from_connection(conn_id: str, host: str | None, port: int | None, login: str | None, password: str | None,
                    extra: Mapping[str, Any]) -> KafkaClientConfig:
    """The config an Airflow connection ``conn_id`` gives (its fields passed in). Any extra key but
    ``bootstrap.servers`` and :data:`SECURITY_KEYS` is refused (Reclock sets its clients' other settings
    itself; a setting it would silently drop must not look set)."""
    what = f"connection {conn_id}"
    unknown = sorted(set(extra) - SECURITY_KEYS - {"bootstrap.servers"})
    if unknown:
        raise ConfigError(f"{what}: extra key(s) {', '.join(unknown)} are not Kafka security settings Reclock "
                          f"reads; allowed: bootstrap.servers, {', '.join(sorted(SECURITY_KEYS))}")

    def one(*names: str, field_value: Any = None, field_name: str = "") -> str | None:
        given = [(n, extra[n]) for n in names if extra.get(n) not in (None, "")]
        if field_value not in (None, ""):
            given.append((field_name, field_value))
        if len({str(v) for _, v in given}) > 1:
            raise ConfigError(f"{what}: {' and '.join(n for n, _ in given)} disagree; give one")
        return str(given[0][1]) if given else None

    def pem(location_key: str, pem_key: str) -> str | None:
        location, text = extra.get(location_key), extra.get(pem_key)
        if location and text:
            raise ConfigError(f"{what}: give {location_key} or {pem_key}, not both")
        if not location:
            return str(text) if text else None
        try:
            return Path(str(location)).read_text()
        except OSError as e:
            raise ConfigError(f"{what}: {location_key} {location}: cannot be read ({e.strerror})") from None

    bootstrap = str(extra.get("bootstrap.servers") or (f"{host}:{port or 9092}" if host else ""))
    protocol = str(extra.get("security.protocol") or "PLAINTEXT").upper()
    algorithm = str(extra.get("ssl.endpoint.identification.algorithm", "https")).lower()
    if algorithm not in ("https", "none", ""):
        raise ConfigError(f"{what}: ssl.endpoint.identification.algorithm is {algorithm!r}; use https or none")
    mechanism = one("sasl.mechanism", "sasl.mechanisms")
    return KafkaClientConfig(
        bootstrap=bootstrap, protocol=protocol,  # type: ignore[arg-type]  (checked in __post_init__)
        mechanism=mechanism.upper() if mechanism else None,  # type: ignore[arg-type]
        username=one("sasl.username", field_value=login, field_name="login"),
        password=one("sasl.password", field_value=password, field_name="password"),
        ca_pem=pem("ssl.ca.location", "ssl.ca.pem"), cert_pem=pem("ssl.certificate.location", "ssl.certificate.pem"),
        key_pem=pem("ssl.key.location", "ssl.key.pem"), key_password=one("ssl.key.password"),
        verify_hostname=algorithm == "https", origin=what)


# -- errors --------------------------------------------------------------------------------------------------

_AUTHZ = {  # librdkafka error name -> the resource type whose ACL is missing
    "TOPIC_AUTHORIZATION_FAILED": "topic",
    "GROUP_AUTHORIZATION_FAILED": "group",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "transactional id",
    "CLUSTER_AUTHORIZATION_FAILED": "cluster",
}
_AUTHN = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL")


class ClientErrors:
    """An ``error_cb`` for a librdkafka client that keeps what it reports: a refused login or TLS
    handshake reaches a client only here, while its calls wait for their timeouts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: Any = None  # a refused login or TLS handshake
        self.denied: Any = None  # an authorization error (a group's coordinator refused, say)

    def logger(self):
        """A logger for the client's ``logger`` setting: its lines go on to ``reclock.kafka`` (so to wherever
        logging goes), and an authorization failure it reports only in a log line (a transaction's added
        partition: ``Failed to add partition "orders" [0] to transaction: ... authorization failed``) is
        kept."""
        import logging

        errors = self

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                text = record.getMessage()
                if "authorization failed" in text.lower():
                    with errors._lock:
                        errors.denied = text

        log = logging.getLogger(f"reclock.kafka.client{id(self)}")
        log.addHandler(Keep())
        log.setLevel(logging.WARNING)
        log.propagate = True
        return log

    def __call__(self, err: Any) -> None:
        with self._lock:
            if _name(err) in _AUTHN or "authentication" in str(err).lower() or "handshake" in str(err).lower():
                self.last = err
            elif denied_resource(err) is not None:
                self.denied = err

    def raise_if_refused(self, config: KafkaClientConfig, what: str) -> None:
        """Raise :class:`KafkaAuthenticationFailed` if the brokers refused this client's login."""
        with self._lock:
            err = self.last
        if err is not None:
            raise KafkaAuthenticationFailed(what, config.describe(), _text(err))


@dataclass
class Client:
    """A confluent-kafka client (``handle``: an admin client, a consumer or a producer) made from ``config``
    for ``what`` (``source orders``), with the errors its callback heard."""

    config: KafkaClientConfig
    what: str
    handle: Any
    errors: ClientErrors

    def metadata(self, topic: str | None = None, timeout: float = 15.0):
        """The cluster's metadata (one ``topic``'s, or every topic the principal may describe). A refused
        login or TLS handshake fails within a second or two with :class:`KafkaAuthenticationFailed`, not
        after ``timeout``."""
        import time

        from confluent_kafka import KafkaException

        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self.handle.list_topics(topic=topic, timeout=max(0.1, min(1.0, left)))
            except KafkaException:
                if not (hasattr(self.handle, "assignment") and self.handle.assignment()):
                    self.handle.poll(0)  # serves the error callback (nothing to consume: nothing assigned)
                self.errors.raise_if_refused(self.config, self.what)
                if left <= 1.0:
                    raise

    def refused(self, err: BaseException | Any, doing: str,
                needs: Mapping[ResourceType, tuple[Operation, str]]) -> ReclockError | None:
        """:func:`check` for this client (``doing``: what it was doing, for the message); an authorization
        error the client reported only to its error callback (a group coordinator's) counts too."""
        try:
            if not (hasattr(self.handle, "assignment") and self.handle.assignment()):
                for _ in range(10):  # serves the error callback; a consumer hears its group's errors as events
                    event = self.handle.poll(0)
                    if event is None:
                        break
                    if hasattr(event, "error") and event.error() is not None:
                        self.errors(event.error())
        except Exception:  # noqa: BLE001 - a closed client: nothing more to hear
            pass
        found = check(err, self.config, f"{self.what}: {doing}", needs, self.errors)
        denied = self.errors.denied
        if found is None and denied is not None:
            named = re.search(r'partition "([^"]+)"', str(denied))  # the topic a log line names
            if named and "topic" in needs:
                needs = {**needs, "topic": (needs["topic"][0], named.group(1))}
            found = check(denied, self.config, f"{self.what}: {doing}", needs)
        return found


def admin(config: KafkaClientConfig, what: str, settings: Mapping[str, Any] | None = None) -> Client:
    """An admin client for ``what``."""
    from confluent_kafka.admin import AdminClient

    errors = ClientErrors()
    return Client(config, what, AdminClient(config.librdkafka({"log_level": 2, **(settings or {}),
                                                               "error_cb": errors})), errors)


def consumer(config: KafkaClientConfig, what: str, settings: Mapping[str, Any]) -> Client:
    """A consumer for ``what`` with ``settings`` (``group.id``, ...)."""
    from confluent_kafka import Consumer

    errors = ClientErrors()
    return Client(config, what, Consumer(config.librdkafka({"log_level": 2, **settings, "error_cb": errors})),
                  errors)


def producer(config: KafkaClientConfig, what: str, settings: Mapping[str, Any]) -> Client:
    """A producer for ``what`` with ``settings`` (``transactional.id``, ...)."""
    from confluent_kafka import Producer

    errors = ClientErrors()
    return Client(config, what, Producer(config.librdkafka({**settings, "error_cb": errors,
                                                            "logger": errors.logger()})), errors)


def _name(err: Any) -> str:
    try:
        return str(err.name())
    except Exception:  # noqa: BLE001 - not a KafkaError
        return ""


def _text(err: Any) -> str:
    try:
        return str(err.str())
    except Exception:  # noqa: BLE001 - not a KafkaError
        return str(err)


def denied_resource(err: Any) -> ResourceType | None:
    """The resource type an authorization error (a ``KafkaError``, a ``KafkaException`` or its text) is about,
    or None if it is not one."""
    if hasattr(err, "args") and err.args and not isinstance(err, str) and _name(err.args[0]):
        err = err.args[0]
    name = _name(err) or str(err)
    for code, resource in _AUTHZ.items():
        if code in name.upper() or code.replace("_", " ").lower() in str(err).lower():
            return resource  # type: ignore[return-value]
    for java, resource in (("TopicAuthorizationException", "topic"), ("GroupAuthorizationException", "group"),
                           ("TransactionalIdAuthorizationException", "transactional id"),
                           ("ClusterAuthorizationException", "cluster")):
        if java in str(err):
            return resource  # type: ignore[return-value]
    return None


def check(err: BaseException | Any, config: KafkaClientConfig, what: str,
          needs: Mapping[ResourceType, tuple[Operation, str]], errors: ClientErrors | None = None) -> ReclockError | None:
    """The Reclock error for a Kafka client error met while ``what`` (``source orders: listing offsets``),
    which ``needs`` an operation on a resource of each type (``{"topic": ("DESCRIBE", "orders")}``):
    :class:`KafkaAuthenticationFailed` when ``errors`` saw the login refused, :class:`KafkaAccessDenied`
    naming the operation and the resource when the broker refused one (an ACL is missing); else None (the
    caller reports the error as before)."""
    if errors is not None:
        try:
            errors.raise_if_refused(config, what)
        except KafkaAuthenticationFailed as e:
            return e
    text = str(err)
    for java in ("SaslAuthenticationException", "SSLHandshakeException", "SslAuthenticationException"):
        if java in text:  # the Java client's (Spark's reader)
            line = next((ln.strip() for ln in text.splitlines() if java in ln), java)
            return KafkaAuthenticationFailed(what, config.describe(), line[:300])
    denied = denied_resource(err)
    if denied is None:
        return None
    operation, resource = needs.get(denied, ("IDEMPOTENT_WRITE", "kafka-cluster") if denied == "cluster"
                                    else ("DESCRIBE", "?"))
    return KafkaAccessDenied(what, config.describe(), config.acl_principal, operation, denied, resource)
