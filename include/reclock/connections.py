"""Settings from Airflow connections (``reclock_postgres``, ``reclock_kafka``, ``reclock_spark``,
``reclock_spark_submit``, ``reclock_s3``).

Each function raises Airflow's ``AirflowNotFoundException`` when the connection is not defined (neither in
Airflow's metadata database, nor as ``AIRFLOW_CONN_<ID>`` in the environment, nor in a secrets backend);
``reclock.settings`` turns that into a ``SettingError`` naming every way to give the setting.
"""

from __future__ import annotations

import json
from urllib.parse import quote

DEFAULT_POSTGRES = "reclock_postgres"
DEFAULT_KAFKA = "reclock_kafka"
DEFAULT_SPARK = "reclock_spark"
DEFAULT_SPARK_SUBMIT = "reclock_spark_submit"
DEFAULT_S3 = "reclock_s3"
DEFAULT_REGISTRY = "reclock_registry"
CONNECTIONS = (DEFAULT_POSTGRES, DEFAULT_KAFKA, DEFAULT_SPARK, DEFAULT_SPARK_SUBMIT, DEFAULT_S3)
"""Every Airflow connection Reclock reads (a deployment defines them, e.g. as ``AIRFLOW_CONN_*``)."""


def _get(conn_id: str):
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


POSTGRES_TLS_KEYS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslsni")
"""The libpq settings a Postgres connection's extra may give (as the Postgres provider's extras do)."""


def postgres_dsn(conn_id: str = DEFAULT_POSTGRES) -> str:
    """The libpq DSN of a Postgres connection: login, password, host, port, schema (the database), and the
    TLS settings of its extra (:data:`POSTGRES_TLS_KEYS`, e.g. ``{"sslmode": "verify-full", "sslrootcert":
    "/etc/reclock/ca.pem"}``)."""
    from urllib.parse import urlencode

    c = _get(conn_id)
    auth = quote(c.login or "", safe="")
    if c.password:
        auth += ":" + quote(c.password, safe="")
    tls = {k: str(v) for k, v in _extra(c).items() if k in POSTGRES_TLS_KEYS and v not in (None, "")}
    query = "?" + urlencode(tls) if tls else ""
    return f"postgresql://{auth}@{c.host}:{c.port or 5432}/{c.schema or 'reclock'}{query}"


def kafka_client_config(conn_id: str = DEFAULT_KAFKA):
    """The brokers and security settings (``reclock.kafka_client.KafkaClientConfig``) of a Kafka connection:
    the Kafka provider's shape, librdkafka settings in the extra (``bootstrap.servers``,
    ``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ...), the SASL user and password as login
    and password (:func:`reclock.kafka_client.from_connection` lists every key)."""
    from reclock.kafka_client import from_connection

    c = _get(conn_id)
    return from_connection(conn_id, c.host, c.port, c.login, c.password, _extra(c))


def _extra(c) -> dict:
    return json.loads(c.extra or "{}") if isinstance(c.extra, str) else dict(c.extra or {})


def registry_settings(conn_id: str):
    """The Schema Registry settings (``reclock.schema_registry.RegistrySettings``) of an Airflow connection
    (type ``http``, or any): host (with its scheme, ``https://`` for TLS; or extra ``url``), port, schema (the
    API's path, e.g. ``apis/ccompat/v7`` for Apicurio), login and password (HTTP basic auth); extra
    ``ca_file`` (a PEM bundle the server's certificate must verify against), ``cert_file`` and ``key_file``
    (a client certificate), ``timeout`` (seconds)."""
    from reclock.errors import ConfigError
    from reclock.schema_registry import RegistrySettings

    c = _get(conn_id)
    extra = json.loads(c.extra or "{}") if isinstance(c.extra, str) else (c.extra or {})
    url = extra.get("url")
    if not url:
        host = c.host or ""
        if not host:
            raise ConfigError(f"connection {conn_id}: no host (the registry's address) and no extra url")
        scheme = "https" if extra.get("tls") or (c.conn_type or "") == "https" else "http"
        if "://" in host:
            scheme, host = host.split("://", 1)
        url = f"{scheme}://{host.rstrip('/')}" + (f":{c.port}" if c.port else "")
        if c.schema:
            url += "/" + c.schema.strip("/")
    try:
        return RegistrySettings(url, c.login or None, c.password or None, ca_file=extra.get("ca_file"),
                                cert_file=extra.get("cert_file"), key_file=extra.get("key_file"),
                                timeout_s=float(extra.get("timeout", 10)))
    except ValueError as e:
        raise ConfigError(f"connection {conn_id}: {e}") from None


def spark_connect_url(conn_id: str = DEFAULT_SPARK) -> str:
    """The Spark Connect URL of a ``spark_connect`` connection, as the Spark provider's hook builds it:
    host and port, the login as ``user_id``, the password as ``token``, extra ``use_ssl``."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    return SparkConnectHook(conn_id).get_connection_url()


def s3_settings(conn_id: str = DEFAULT_S3):
    """The S3 settings (``reclock.persist.objectstore.S3Settings``) of an Airflow connection of type ``aws``:
    login and password are the access key and the secret; extra ``endpoint_url`` (absent: AWS itself),
    ``region_name`` (absent: required on AWS, ``us-east-1`` on an S3-compatible endpoint) and ``path_style``
    (absent: path style exactly when an endpoint is given)."""
    from reclock.errors import ConfigError
    from reclock.persist.objectstore import DEFAULT_REGION, S3Settings, parse_path_style

    c = _get(conn_id)
    if c.conn_type != "aws":
        raise ConfigError(f"connection {conn_id}: type is {c.conn_type!r}, expected 'aws'")
    extra = json.loads(c.extra or "{}") if isinstance(c.extra, str) else (c.extra or {})
    missing = [what for what, v in (("login (the access key)", c.login), ("password (the secret key)", c.password))
               if not v]
    if missing:
        raise ConfigError(f"connection {conn_id}: {' and '.join(missing)} not set")
    endpoint = extra.get("endpoint_url") or None
    region = extra.get("region_name") or (DEFAULT_REGION if endpoint else None)
    if not region:
        raise ConfigError(f"connection {conn_id}: extra region_name is not set (needed without an endpoint_url)")
    verify = extra.get("verify")
    if verify is False or str(verify).lower() in ("false", "0", "no"):
        raise ConfigError(f"connection {conn_id}: extra verify is false: Reclock does not turn off TLS "
                          "verification; give verify the path of a PEM file of the endpoint's CA instead")
    try:
        return S3Settings(endpoint, region, c.login, c.password,
                          path_style=parse_path_style(extra.get("path_style"), endpoint, "extra path_style"),
                          ca_bundle=verify if isinstance(verify, str) and verify.lower() != "true" else None)
    except ConfigError as e:
        raise ConfigError(f"connection {conn_id}: {e}") from None
