"""OpenLineage dataset names (reclock.datasets): as OpenLineage's naming spec writes them, with no credential."""

from reclock.datasets import (DatasetName, collection, iceberg_table, kafka_topic, kinesis_stream, objects,
                              postgres_table)


def test_names_follow_openlineage_and_carry_no_credential():
    dsn = "host=db.example port=5433 dbname=shop user=reclock password=s3cret"
    assert kafka_topic("PLAINTEXT://k1:9092,k2:9092", "orders") == DatasetName("kafka://k1:9092", "orders")
    assert postgres_table(dsn, "public.orders") == DatasetName("postgres://db.example:5433", "shop.public.orders")
    assert collection("postgresql://reclock:s3cret@127.0.0.1:5432/reclock", "orders") == DatasetName(
        "reclock://127.0.0.1:5432/reclock", "orders")
    assert iceberg_table("s3a://lake/warehouse/", "db.orders") == DatasetName("s3a://lake/warehouse", "db.orders")
    assert objects("s3://bucket/events/2026/") == DatasetName("s3://bucket", "events/2026/")
    assert objects("/data/incoming") == DatasetName("file", "/data/incoming")
    assert objects("file:///data/incoming") == DatasetName("file", "/data/incoming")
    assert kinesis_stream("clicks", "eu-west-1") == DatasetName("kinesis://kinesis.eu-west-1.amazonaws.com", "clicks")
    assert kinesis_stream("clicks", "us-east-1", "http://127.0.0.1:4567") == DatasetName(
        "kinesis://127.0.0.1:4567", "clicks")
    names = [kafka_topic("k:9092", "t"), postgres_table(dsn, "a.b"), objects("s3://b/p")]
    assert not any("s3cret" in n.namespace + n.name for n in names)
