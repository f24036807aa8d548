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
CONNECTIONS = (DEFAULT_POSTGRES, DEFAULT_KAFKA, DEFAULT_SPARK, DEFAULT_SPARK_SUBMIT, DEFAULT_S3)
"""Every Airflow connection Reclock reads (a deployment defines them, e.g. as ``AIRFLOW_CONN_*``)."""


def _get(conn_id: str):
    from airflow.sdk import BaseHook

    return BaseHook.get_connection(conn_id)


def postgres_dsn(conn_id: str = DEFAULT_POSTGRES) -> str:
    c = _get(conn_id)
    auth = quote(c.login or "", safe="")
    if c.password:
        auth += ":" + quote(c.password, safe="")
    return f"postgresql://{auth}@{c.host}:{c.port or 5432}/{c.schema or 'reclock'}"


def kafka_bootstrap(conn_id: str = DEFAULT_KAFKA) -> str:
    c = _get(conn_id)
    extra = json.loads(c.extra or "{}") if isinstance(c.extra, str) else (c.extra or {})
    return extra.get("bootstrap.servers") or f"{c.host}:{c.port or 9092}"


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
    try:
        return S3Settings(endpoint, region, c.login, c.password,
                          path_style=parse_path_style(extra.get("path_style"), endpoint, "extra path_style"))
    except ConfigError as e:
        raise ConfigError(f"connection {conn_id}: {e}") from None
