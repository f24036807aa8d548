"""Where a task, a spark-submit job or a ``reclock`` command finds its settings.

Each setting comes from an argument (a command's option), else the environment, else where there is one an
Airflow connection (looked up only then: a command given everything never imports Airflow). A setting given
nowhere is a :class:`~reclock.errors.SettingError` that names every way to give it; nothing falls back to
the dev stack (``reclock dev env`` prints the dev stack's settings).

====================  ==================  ===========================  =====================================
setting               option              environment                  else
====================  ==================  ===========================  =====================================
config file           ``--config``        ``RECLOCK_CONFIG``           the DAG file's include/reclock.yaml
consensus Postgres    ``--dsn``           ``RECLOCK_DSN``              connection ``reclock_postgres``
blob store            ``--blob-url``      ``RECLOCK_BLOB_URL``         --
S3 endpoint and keys  --                  ``AWS_*`` (see objectstore)  connection ``reclock_s3`` (aws)
S3 source's keys      --                  ``AWS_*`` unless the source  its ``connection:`` (aws), which
                                          names ``connection:``        is never passed over
Kafka cluster         ``--bootstrap``     ``RECLOCK_BOOTSTRAP``        the config's ``bootstrap:`` (these
                                                                       three: unsecured), else its
                                                                       ``connection:`` (``reclock_kafka``),
                                                                       security settings included
upstream Postgres     --                  the config's ``dsn_env:``    the config's ``connection:`` (a
                                          variable                     postgres connection; the kind's
                                                                       ``find_upstream_dsn``)
Spark in-process      ``--spark-master``  ``RECLOCK_SPARK_MASTER``     (checked first)
Spark Connect         ``--spark-remote``  ``RECLOCK_SPARK_REMOTE``     connection ``reclock_spark``
Spark's Kafka jars    --                  ``RECLOCK_SPARK_JARS``       Spark's own ``spark.jars``/packages
history kept          --                  RECLOCK_RETAIN_HISTORY_S     an hour
garbage grace period  --                  RECLOCK_GC_GRACE_S           an hour
garbage collection    --                  RECLOCK_GC_INTERVAL_S        every 5 minutes, in resume
statistics kept       --                  RECLOCK_STATS_RETAIN_S       7 days (pruned with the garbage)
Iceberg catalog       --                  RECLOCK_ICEBERG_CATALOG_URI  the consensus Postgres (SQLAlchemy URL)
Iceberg warehouse     --                  RECLOCK_ICEBERG_WAREHOUSE    ``<blob store URL>/_iceberg``
====================  ==================  ===========================  =====================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from reclock import connections
from reclock.specs import KafkaSpec, RegistrySpec
from reclock.errors import ConfigError, SettingError
from reclock.kafka_client import KafkaClientConfig
from reclock.persist import objectstore
from reclock.persist.blob import BlobStore, blob_store_from_url

NO_DSN = ("no consensus Postgres: set RECLOCK_DSN to its DSN (postgresql://user:password@host:5432/db; reclock "
          f"commands: --dsn), or define the Airflow connection {connections.DEFAULT_POSTGRES} "
          f"(e.g. AIRFLOW_CONN_{connections.DEFAULT_POSTGRES.upper()})")
NO_BLOB = ("no blob store: set RECLOCK_BLOB_URL to where the parts live (a folder, file:///path or "
           "s3://bucket/prefix; reclock commands: --blob-url)")
NO_S3 = ("an s3:// blob store needs its keys: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_ENDPOINT_URL "
         "for an S3-compatible store, AWS_REGION on AWS), or define the Airflow connection "
         f"{connections.DEFAULT_S3} (type aws; endpoint_url and region_name in its extra; e.g. "
         f"AIRFLOW_CONN_{connections.DEFAULT_S3.upper()})")
NO_SPARK = ("no Spark: set RECLOCK_SPARK_MASTER to run a session in this process (e.g. local[2]; reclock commands: "
            "--spark-master) or RECLOCK_SPARK_REMOTE to a Spark Connect URL (sc://host:15002; --spark-remote), "
            f"or define the Airflow connection {connections.DEFAULT_SPARK} (type spark_connect, e.g. "
            f"AIRFLOW_CONN_{connections.DEFAULT_SPARK.upper()})")


def _not_found() -> type[Exception]:
    from airflow.sdk.exceptions import AirflowNotFoundException

    return AirflowNotFoundException


def from_connection(lookup: Callable[[], Any], missing: str) -> Any:
    """``lookup()`` (an Airflow connection's setting), or ``SettingError(missing)`` if it is not defined."""
    try:
        return lookup()
    except _not_found() as e:
        raise SettingError(missing) from e


def find_dsn(given: str | None = None) -> str:
    """The consensus Postgres: ``given``, else ``RECLOCK_DSN``, else the ``reclock_postgres`` connection."""
    return given or os.environ.get("RECLOCK_DSN") or from_connection(connections.postgres_dsn, NO_DSN)


def find_blob_url(given: str | None = None) -> str:
    """Where parts live: ``given``, else ``RECLOCK_BLOB_URL``."""
    url = given or os.environ.get("RECLOCK_BLOB_URL")
    if not url:
        raise SettingError(NO_BLOB)
    return url


def find_blob_store(given: str | None = None) -> BlobStore:
    """The blob store at :func:`find_blob_url`; an ``s3://`` one on :func:`find_s3_settings`."""
    url = find_blob_url(given)
    return blob_store_from_url(url, find_s3_settings() if objectstore.is_s3(url) else None)


def find_s3_settings() -> objectstore.S3Settings:
    """The S3 endpoint and keys: the AWS environment variables when a key is set there, else the
    ``reclock_s3`` connection (type aws)."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_SECRET_ACCESS_KEY"):
        return objectstore.s3_settings_from_env()
    return from_connection(connections.s3_settings, NO_S3)


def find_source_s3_settings(connection: str, what: str, named: bool = False) -> objectstore.S3Settings:
    """An S3 source's endpoint and keys. A ``connection:`` the config names (``named``) is never passed over:
    its keys, or ``SettingError`` when it is not defined (the AWS variables of the environment do not stand in
    for it: they may be another account's). The default ``reclock_s3``: given as ``AIRFLOW_CONN_RECLOCK_S3``,
    else the AWS environment variables when a key is set there, else the connection in Airflow."""
    if named:
        return from_connection(lambda: connections.s3_settings(connection), _undefined(
            what, "s3.connection", connection, " (the AWS keys of the environment are not used in its place: "
            "define it, type aws, login/password the keys, extra endpoint_url and region_name; or drop "
            "`connection:` from the config to use the environment's keys or reclock_s3)"))
    if not os.environ.get(f"AIRFLOW_CONN_{connection.upper()}") and (
            os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_SECRET_ACCESS_KEY")):
        return objectstore.s3_settings_from_env()
    try:
        return connections.s3_settings(connection)
    except _not_found():
        raise SettingError(f"{what}: no S3 keys: define the Airflow connection {connection} (its `connection:`; "
                           f"type aws, login/password the keys, extra endpoint_url and region_name; e.g. "
                           f"AIRFLOW_CONN_{connection.upper()}), or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                           "(with AWS_ENDPOINT_URL for an S3-compatible store)") from None


def find_kafka(kafka: KafkaSpec, what: str, given: str | None = None) -> KafkaClientConfig:
    """``what``'s (a source's or a sink's) Kafka cluster: the address ``given``, else ``RECLOCK_BOOTSTRAP``,
    else its ``bootstrap:`` (each an unsecured cluster: tests, scripts), else its Airflow connection, with
    the connection's security settings (``reclock.kafka_client``). A connection the config names is never
    silently passed over: when ``RECLOCK_BOOTSTRAP`` or ``bootstrap:`` gives the brokers instead, the named
    connection must still be defined."""
    found = given or os.environ.get("RECLOCK_BOOTSTRAP") or kafka.bootstrap
    if found:
        origin = ("--bootstrap" if given else "RECLOCK_BOOTSTRAP" if os.environ.get("RECLOCK_BOOTSTRAP")
                  else f"{what}'s bootstrap:")
        if not given and kafka.connection_named:
            from_connection(lambda: connections.kafka_client_config(kafka.connection), _undefined(
                what, "kafka.connection", kafka.connection, " (RECLOCK_BOOTSTRAP gives the brokers, but a connection "
                "the config names is not passed over: define it, or drop `connection:` from the config)"))
        return KafkaClientConfig.plaintext(found, origin)
    return from_connection(
        lambda: connections.kafka_client_config(kafka.connection),
        f"{what}: no Kafka brokers: define the Airflow connection {kafka.connection} (its extra gives "
        "bootstrap.servers and the security settings, e.g. AIRFLOW_CONN_"
        f"{kafka.connection.upper()}), or, for an unsecured cluster, set RECLOCK_BOOTSTRAP (host:port,...; "
        "reclock commands: --bootstrap) or give it `bootstrap:` in the config")


def _undefined(what: str, key: str, conn_id: str, why: str = "") -> str:
    return (f"{what}: its `{key}: {conn_id}` names an Airflow connection that is not defined (neither in Airflow's "
            f"connections nor as AIRFLOW_CONN_{conn_id.upper()}){why}")


def missing_connections(sources: Iterable[Any] = (), sinks: Iterable[Any] = ()) -> list[str]:
    """What is wrong with the Airflow connections ``sources`` and ``sinks`` (their specs) reach their upstreams
    and targets through: one message per connection a spec names that is not defined (its Kafka cluster's,
    also when ``RECLOCK_BOOTSTRAP`` gives the brokers; its Postgres upstream's; the S3 connection an S3 source
    names, also when AWS keys are in the environment; its registry's). Each is one
    connection lookup: run where a task or a command runs, never while a DAG file parses."""
    missing = []
    sources, sinks = list(sources), list(sinks)
    kafkas = [*((f"source {s.name}", s.upstream) for s in sources if isinstance(s.upstream, KafkaSpec)),
              *((f"sink {k.name}", k.kafka) for k in sinks if isinstance(getattr(k, "kafka", None), KafkaSpec))]
    for what, kafka in kafkas:
        used = kafka.bootstrap is None and (kafka.connection_named or not os.environ.get("RECLOCK_BOOTSTRAP"))
        if used and not _defined(lambda: connections.kafka_client_config(kafka.connection)):
            missing.append(_undefined(what, "kafka.connection", kafka.connection))
    for s in sources:
        up = s.upstream
        if getattr(up, "publication", None) is not None and getattr(up, "connection", None) and \
                not getattr(up, "dsn_env", None) and not _defined(lambda: connections.postgres_dsn(up.connection)):
            missing.append(_undefined(f"source {s.name}", "postgres.connection", up.connection))
        if getattr(up, "connection_named", False) and getattr(up, "kind", None) == "s3" and not _defined(
                lambda: connections.s3_settings(up.connection)):
            missing.append(_undefined(f"source {s.name}", "s3.connection", up.connection))
        registry = getattr(s.format, "registry", None)
        if registry is not None and not registry.url and not _defined(
                lambda: connections.registry_settings(registry.connection)):
            missing.append(_undefined(f"source {s.name}", "format.registry.connection", registry.connection))
    return missing


def check_connections(cfg=None, *, sources: Iterable[Any] = (), sinks: Iterable[Any] = ()) -> None:
    """Every Airflow connection the config's (``cfg``'s, or just ``sources``' and ``sinks``') specs name is
    defined; ``ConfigError`` listing every one that is not, naming the source or sink and the key. What
    ``reclock check`` and each task's context (``reclock.orchestration.contexts``) run before any work, so a
    wrong name fails the run's first task loudly; never the DAG file (a lookup there goes through the
    dag-processor's supervisor and can outlast its import timeout)."""
    if cfg is not None:
        sources, sinks = [*sources, *cfg.sources.values()], [*sinks, *cfg.sinks.values()]
    missing = missing_connections(list(sources), list(sinks))
    if missing:
        raise ConfigError("; ".join(missing))


def _defined(lookup: Callable[[], Any]) -> bool:
    try:
        lookup()
    except _not_found():
        return False
    return True


def find_registry(registry: RegistrySpec, what: str):
    """``what``'s Schema Registry settings (``reclock.schema_registry.RegistrySettings``): its ``url:`` (no
    credentials), else its Airflow connection (credentials and TLS files there)."""
    from reclock.schema_registry import RegistrySettings

    if registry.url:
        return RegistrySettings(registry.url)
    return from_connection(
        lambda: connections.registry_settings(registry.connection),
        f"{what}: the Airflow connection {registry.connection} (its `format.registry.connection`) is not defined "
        f"(e.g. AIRFLOW_CONN_{registry.connection.upper()}='{{\"conn_type\": \"http\", \"host\": "
        f"\"https://registry:8081\", \"login\": ..., \"password\": ...}}'), or give `url:`")


def seconds_setting(var: str, default: float) -> float:
    """A non-negative number of seconds from the environment variable ``var``."""
    raw = os.environ.get(var)
    try:
        value = default if raw in (None, "") else float(raw)
    except ValueError:
        raise SettingError(f"{var} must be a number of seconds, got {raw!r}") from None
    if value < 0:
        raise SettingError(f"{var} must not be negative, got {raw!r}")
    return value


def retain_history_ms() -> int:
    """How much history compaction keeps: ``RECLOCK_RETAIN_HISTORY_S`` seconds (default an hour)."""
    return int(float(os.environ.get("RECLOCK_RETAIN_HISTORY_S", "3600")) * 1000)


@dataclass(frozen=True)
class SparkTarget:
    """Where a context's Spark runs: a session in this process on ``master``, or a Spark Connect client to
    ``remote``; neither: the driver session spark-submit configured (a ``spark_jobs/`` job)."""

    master: str | None = None
    remote: str | None = None

    def session(self, scope: str):
        """A session on this target; over Spark Connect, the server-side one ``scope``'s (a source's)
        processes share (``reclock.spark.connect``)."""
        if self.remote:
            from reclock.spark.connect import shared_session

            return shared_session(self.remote, scope)
        from reclock.spark.session import driver_session

        return driver_session(self.master, app=f"reclock-{scope}")


SUBMITTED = SparkTarget()
"""The session of a ``spark-submit`` job: master and jars from the submit."""


def find_spark(master: str | None = None, remote: str | None = None) -> SparkTarget:
    """``master`` / ``RECLOCK_SPARK_MASTER`` (a local session, e.g. ``local[2]``), else ``remote`` /
    ``RECLOCK_SPARK_REMOTE`` (``sc://...``, or several servers comma-separated: ``reclock.spark.connect``), else
    the ``reclock_spark`` connection through the Spark provider's
    ``SparkConnectHook`` (no JVM start-up per task)."""
    master = master or os.environ.get("RECLOCK_SPARK_MASTER")
    if master:
        return SparkTarget(master=master)
    remote = remote or os.environ.get("RECLOCK_SPARK_REMOTE")
    if remote:
        from reclock.spark.connect import remotes

        try:
            remotes(remote)
        except ValueError as e:
            raise SettingError(f"RECLOCK_SPARK_REMOTE / --spark-remote: {e}") from None
        return SparkTarget(remote=remote)
    return SparkTarget(remote=from_connection(connections.spark_connect_url, NO_SPARK))
