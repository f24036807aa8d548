"""Whether a driver session has Spark's Kafka connector (``reclock.spark.session.has_kafka_connector``),
from its configuration alone."""

from __future__ import annotations

import pytest

from reclock.spark.session import has_kafka_connector


class _Session:
    def __init__(self, **conf: str) -> None:
        self.sparkContext = self
        self.conf = {k.replace("_", "."): v for k, v in conf.items()}

    def getConf(self):
        return self

    def get(self, key: str, default: str = "") -> str:
        return self.conf.get(key, default)


@pytest.fixture
def no_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    return tmp_path


def test_jars_packages_globs_and_urls_count(no_home):
    jars = no_home / "jars"
    jars.mkdir()
    (jars / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()
    assert has_kafka_connector(_Session(spark_jars=str(jars / "spark-sql-kafka-0-10_2.13-4.2.0.jar")))
    assert has_kafka_connector(_Session(spark_jars=f"file:{jars}/*.jar"))
    assert has_kafka_connector(_Session(spark_jars="https://repo/x/spark-sql-kafka-0-10_2.13-4.2.0.jar"))
    assert has_kafka_connector(_Session(spark_jars_packages="a:b:1,org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"))


def test_without_it_is_false_and_spark_home_counts(no_home):
    assert not has_kafka_connector(_Session())
    assert not has_kafka_connector(_Session(spark_jars=f"{no_home}/nothing/*.jar,/x/kafka-clients.jar"))
    (no_home / "spark" / "jars" / "spark-sql-kafka-0-10_2.13-4.2.0.jar").touch()
    assert has_kafka_connector(_Session())
