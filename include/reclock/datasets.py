"""Datasets as OpenLineage names them (``namespace``, ``name``): what a task reads and writes, reported by
``reclock.orchestration.lineage``. Pure: names from addresses, no credential in any of them."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from psycopg.conninfo import conninfo_to_dict


@dataclass(frozen=True)
class DatasetName:
    namespace: str
    name: str


def kafka_topic(bootstrap: str, topic: str) -> DatasetName:
    first = bootstrap.split(",")[0].strip()
    return DatasetName(f"kafka://{first.split('://')[-1]}", topic)


def objects(url: str) -> DatasetName:
    """The objects under an S3 source's ``url``: ``s3://<bucket>`` / the prefix (OpenLineage's S3 naming), a
    local folder ``file`` / its absolute path."""
    u = urlsplit(url)
    if u.scheme in ("s3", "s3a"):
        return DatasetName(f"s3://{u.netloc}", u.path.lstrip("/"))
    return DatasetName("file", u.path if u.scheme == "file" else url)


def kinesis_stream(stream: str, region: str, endpoint_url: str | None = None) -> DatasetName:
    """A Kinesis stream: ``kinesis://<endpoint host[:port]>`` / the stream's name; AWS's endpoint is
    ``kinesis.<region>.amazonaws.com`` (so one stream name in two regions is two datasets)."""
    host = urlsplit(endpoint_url).netloc if endpoint_url else f"kinesis.{region}.amazonaws.com"
    return DatasetName(f"kinesis://{host}", stream)


def _pg(dsn: str) -> tuple[str, str]:
    d = conninfo_to_dict(dsn)
    return f"{d.get('host') or 'localhost'}:{d.get('port') or 5432}", d.get("dbname") or d.get("user") or ""


def postgres_table(dsn: str, table: str) -> DatasetName:
    """``table`` is ``schema.table``."""
    where, db = _pg(dsn)
    return DatasetName(f"postgres://{where}", f"{db}.{table}")


def collection(dsn: str, shard: str) -> DatasetName:
    where, db = _pg(dsn)
    return DatasetName(f"reclock://{where}/{db}", shard)


def iceberg_table(warehouse: str, table: str) -> DatasetName:
    u = urlsplit(warehouse if "://" in warehouse else f"file://{warehouse}")
    return DatasetName(f"{u.scheme}://{u.hostname or ''}{u.path}".rstrip("/"), table)
