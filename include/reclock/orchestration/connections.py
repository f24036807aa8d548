"""Settings from Airflow connections (``reclock_postgres``, ``reclock_kafka``, ``reclock_spark``).

Each function raises Airflow's ``AirflowNotFoundException`` when the connection is not defined (neither in
Airflow's metadata database, nor as ``AIRFLOW_CONN_<ID>`` in the environment, nor in a secrets backend);
``reclock.orchestration.settings`` turns that into a ``SettingError`` naming every way to give the setting.
"""

from __future__ import annotations

import json
from urllib.parse import quote

DEFAULT_POSTGRES = "reclock_postgres"
DEFAULT_KAFKA = "reclock_kafka"
DEFAULT_SPARK = "reclock_spark"
DEFAULT_SPARK_SUBMIT = "reclock_spark_submit"
CONNECTIONS = (DEFAULT_POSTGRES, DEFAULT_KAFKA, DEFAULT_SPARK, DEFAULT_SPARK_SUBMIT)
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


def spark_connect_url(conn_id: str = DEFAULT_SPARK) -> str:
    """The Spark Connect URL of a ``spark_connect`` connection, as the Spark provider's hook builds it:
    host and port, the login as ``user_id``, the password as ``token``, extra ``use_ssl``."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    return SparkConnectHook(conn_id).get_connection_url()
