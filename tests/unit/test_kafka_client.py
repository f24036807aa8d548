"""``reclock.kafka_client``: one Airflow connection -> librdkafka settings and Spark ``kafka.*`` options, bad
connections refused with the key named, no secret in ``repr`` or in the error texts, authorization errors
named by operation and resource."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.errors import ConfigError, KafkaAccessDenied
from reclock.kafka_client import KafkaClientConfig, check, from_connection

CA = "-----BEGIN CERTIFICATE-----\nMIIB...ca\n-----END CERTIFICATE-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nMIIB...client\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIG...secretkey\n-----END PRIVATE KEY-----\n"


def scram(**extra) -> KafkaClientConfig:
    return from_connection("reclock_kafka", "broker", 9093, "reclock", "pa\"ss\\word",
                           {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "ssl.ca.pem": CA,
                            **extra})


def test_plaintext_address_from_host_and_port():
    cfg = from_connection("k", "broker", None, None, None, {})
    assert cfg.librdkafka() == {"bootstrap.servers": "broker:9092", "security.protocol": "plaintext"}
    assert cfg.spark_options() == {"kafka.bootstrap.servers": "broker:9092", "kafka.security.protocol": "PLAINTEXT"}


def test_scram_over_tls_in_both_clients():
    cfg = scram()
    assert cfg.librdkafka({"group.id": "g"}) == {
        "bootstrap.servers": "broker:9093", "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "reclock", "sasl.password": 'pa"ss\\word', "ssl.endpoint.identification.algorithm": "https",
        "ssl.ca.pem": CA, "group.id": "g"}
    opts = cfg.spark_options()
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    # JAAS quoting: the password's quote and backslash escaped, so it reaches the broker unchanged
    assert opts["kafka.sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                              'username="reclock" password="pa\\"ss\\\\word";')
    assert opts["kafka.ssl.truststore.type"] == "PEM" and opts["kafka.ssl.truststore.certificates"] == CA
    assert opts["kafka.ssl.endpoint.identification.algorithm"] == "https"


def test_mutual_tls_from_files(tmp_path):
    for name, text in (("ca.pem", CA), ("c.pem", CERT), ("c.key", KEY)):
        (tmp_path / name).write_text(text)
    cfg = from_connection("k", None, None, None, None, {
        "bootstrap.servers": "b1:9094,b2:9094", "security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.certificate.location": str(tmp_path / "c.pem"), "ssl.key.location": str(tmp_path / "c.key")})
    conf = cfg.librdkafka()
    assert (conf["ssl.ca.pem"], conf["ssl.certificate.pem"], conf["ssl.key.pem"]) == (CA, CERT, KEY)
    opts = cfg.spark_options()  # as text: Spark's executors need no file of their own
    assert opts["kafka.ssl.keystore.type"] == "PEM"
    assert (opts["kafka.ssl.keystore.certificate.chain"], opts["kafka.ssl.keystore.key"]) == (CERT, KEY)
    assert cfg.acl_principal.startswith("User:")


def test_no_secret_in_repr_or_description():
    cfg = scram()
    mtls = KafkaClientConfig("b:1", "SSL", ca_pem=CA, cert_pem=CERT, key_pem=KEY, key_password="kp-secret")
    for c in (cfg, mtls):
        for text in (repr(c), str(c), c.describe()):
            for secret in c.secrets():
                assert secret not in text
    assert "SASL_SSL/SCRAM-SHA-512 as user 'reclock'" in cfg.describe()


@pytest.mark.parametrize("extra, login, words", [
    ({"security.protocol": "SASL_SSL"}, "u", "needs sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "u", "needs sasl.mechanism"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, None, "needs the SASL user and password"),
    ({}, "u", "security.protocol is PLAINTEXT"),
    ({"security.protocol": "TLS"}, None, "security.protocol 'TLS' is not one of"),
    ({"ssl.ca.pem": CA}, None, "TLS certificates are given but security.protocol is PLAINTEXT"),
    ({"security.protocol": "SSL", "ssl.certificate.pem": CERT}, None, "needs both the client certificate"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}, None, "cannot be read"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/x", "ssl.ca.pem": CA}, None, "not both"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "yes"}, None, "use https or none"),
    ({"group.id": "mine"}, None, "extra key(s) group.id are not Kafka security settings"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "a"}, "b", "disagree"),
])
def test_bad_connections_are_refused_naming_the_key(extra, login, words):
    with pytest.raises(ConfigError, match="connection reclock_kafka") as e:
        from_connection("reclock_kafka", "b", 1, login, "pw-secret" if login else None, extra)
    assert words in str(e.value)
    assert "pw-secret" not in str(e.value)


def test_denied_names_operation_resource_and_principal():
    from confluent_kafka import KafkaError, KafkaException

    err = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    refused = check(err, scram(), "source orders: committing offsets",
                    {"group": ("READ", "reclock-orders"), "topic": ("READ", "orders")})
    assert isinstance(refused, KafkaAccessDenied)
    assert (refused.operation, refused.resource_type, refused.resource) == ("READ", "group", "reclock-orders")
    assert "denied READ on group 'reclock-orders'" in str(refused)
    assert "--allow-principal User:reclock --operation Read --group reclock-orders" in str(refused)
    java = "org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access topics: [orders]"
    refused = check(RuntimeError(java), scram(), "source orders: reading", {"topic": ("READ", "orders")})
    assert isinstance(refused, KafkaAccessDenied) and refused.operation == "READ"
    assert check(RuntimeError("broker down"), scram(), "x", {"topic": ("READ", "orders")}) is None


@settings(max_examples=50)
@given(st.text(min_size=1, max_size=30))
def test_jaas_quoting_round_trips(password):
    """Law: the JAAS value unquotes (the Java parser's rules: a backslash escapes the next character) to
    the password itself."""
    cfg = KafkaClientConfig("b:1", "SASL_SSL", "SCRAM-SHA-256", "u", password)
    jaas = cfg.spark_options()["kafka.sasl.jaas.config"]
    quoted = jaas.split(" password=", 1)[1][:-1]
    assert quoted[0] == quoted[-1] == '"'
    out, chars, i = [], quoted[1:-1], 0
    while i < len(chars):
        if chars[i] == "\\":
            i += 1
        out.append(chars[i])
        i += 1
    assert "".join(out) == password
