"""``reclock__health``: one task per service, each a smoke check through the Airflow connections."""

from __future__ import annotations


def build_health_dag():
    from airflow.sdk import DAG, task

    from reclock.dev import smoke
    from reclock.orchestration import connections

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
            return smoke.check_postgres(connections.postgres_dsn())

        @task
        def kafka() -> str:
            return smoke.check_kafka(connections.kafka_bootstrap())

        @task
        def spark() -> str:
            return smoke.check_spark_connect(connections.spark_connect_url())

        postgres() >> kafka() >> spark()
    return dag
