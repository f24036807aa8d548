"""``reclock__health``: one task per service, each a check through the Airflow connections that the service
does the real thing Reclock needs (the dev stack's smoke checks run the same functions)."""

from __future__ import annotations

import time
import uuid

import psycopg

from reclock import connections


def check_postgres(dsn: str) -> str:
    """The ``reclock`` schema is migrated and ``wal_level`` is logical."""
    with psycopg.connect(dsn) as conn:
        (wal,) = conn.execute("SHOW wal_level").fetchone()
        row = conn.execute("SELECT max(version) FROM reclock.schema_migrations").fetchone()
    if wal != "logical":
        raise RuntimeError(f"postgres: wal_level is {wal}, expected logical")
    return f"schema reclock at migration {row[0]}, wal_level={wal}"


def check_kafka(kafka, timeout: float = 30) -> str:
    """A transactional producer commits one record and a ``read_committed`` consumer reads it back, on the
    cluster ``kafka`` (a ``KafkaClientConfig``, or an unsecured cluster's address). On a secured cluster
    the principal needs CREATE (or an existing topic), READ and WRITE on ``_reclock_smoke``, WRITE on the
    transactional id ``reclock-smoke`` and READ on the groups ``reclock-smoke-*``."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from reclock.kafka_client import client_config

    config = client_config(kafka)
    topic = "_reclock_smoke"
    admin = AdminClient(config.librdkafka())
    if topic not in admin.list_topics(timeout=10).topics:
        for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            try:
                fut.result()
            except Exception as e:  # noqa: BLE001 - created concurrently is fine
                if "TOPIC_ALREADY_EXISTS" not in str(e):
                    raise
    token = uuid.uuid4().hex.encode()
    producer = Producer(config.librdkafka({"transactional.id": "reclock-smoke", "transaction.timeout.ms": 60000}))
    producer.init_transactions(timeout)
    producer.begin_transaction()
    producer.produce(topic, token)
    producer.commit_transaction(timeout)
    consumer = Consumer(config.librdkafka({"group.id": f"reclock-smoke-{token.decode()}",
                                           "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                                           "enable.auto.commit": False}))
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and msg.value() == token:
                return "transactional write committed and read back with read_committed"
    finally:
        consumer.close()
    raise RuntimeError(f"kafka: the committed smoke record was not read back within {timeout}s")


def check_spark_connect(url: str) -> str:
    """A query runs over Spark Connect."""
    from reclock.spark.connect import remote_session

    spark = remote_session(url)
    try:
        n = spark.range(1000).selectExpr("sum(id) AS s").collect()[0]["s"]
    finally:
        spark.stop()
    if n != 499500:
        raise RuntimeError(f"spark connect: sum(0..999) returned {n}")
    return "query over Spark Connect returned the right answer"


def build_health_dag():
    from airflow.sdk import DAG, task

    with DAG(
        dag_id="reclock__health",
        description="Checks that Postgres, Kafka and Spark Connect answer through the Airflow connections",
        schedule=None,
        catchup=False,
        max_active_runs=1,
        tags=["reclock"],
    ) as dag:

        @task
        def postgres() -> str:
            return check_postgres(connections.postgres_dsn())

        @task
        def kafka() -> str:
            return check_kafka(connections.kafka_client_config())

        @task
        def spark() -> str:
            return check_spark_connect(connections.spark_connect_url())

        postgres() >> kafka() >> spark()
    return dag
