"""The input datasets an ingest task reports to OpenLineage for each kind without a broker or a database
(Kinesis: the stream; S3: the bucket and prefix, or the local folder): what
``reclock.orchestration.ingest._read_upstream`` hands the running task's lineage."""

from __future__ import annotations

import pytest

from reclock import cycle
from reclock.config import parse_source
from reclock.datasets import DatasetName
from reclock.orchestration import ingest, lineage
from reclock.persist.blob import LocalBlobStore
from reclock.sources.kinesis.client import StreamAddress


def _reported(spec, upstream, tmp_path) -> list[DatasetName]:
    ctx = cycle.CycleContext(spec=spec, dsn="host=127.0.0.1 port=1 dbname=x", blob=LocalBlobStore(tmp_path),
                             upstream=upstream)
    seen = lineage.Lineage()
    token = lineage._CURRENT.set(seen)
    try:
        ingest._read_upstream(ctx)
    finally:
        lineage._CURRENT.reset(token)
    assert seen.outputs == []
    return seen.inputs


@pytest.mark.parametrize("endpoint, namespace", [
    ("http://127.0.0.1:4567", "kinesis://127.0.0.1:4567"),
    (None, "kinesis://kinesis.eu-west-1.amazonaws.com"),
])
def test_a_kinesis_source_reads_its_stream(tmp_path, endpoint, namespace):
    spec = parse_source("clicks", {"kinesis": {"stream": "clicks-stream", "region": "eu-west-1",
                                               **({"endpoint_url": endpoint} if endpoint else {})},
                                  "format": {"type": "json", "schema": "id BIGINT"}})
    addr = StreamAddress("clicks-stream", "eu-west-1", endpoint)
    assert _reported(spec, addr, tmp_path) == [DatasetName(namespace, "clicks-stream")]


@pytest.mark.parametrize("url, want", [
    ("s3://landing/events/2026/", DatasetName("s3://landing", "events/2026/")),
    ("/data/incoming", DatasetName("file", "/data/incoming")),
])
def test_an_s3_source_reads_its_bucket_and_prefix(tmp_path, url, want):
    spec = parse_source("events", {"s3": {"url": url},
                                   "format": {"type": "json", "schema": "id BIGINT"}})
    assert _reported(spec, None, tmp_path) == [want]
