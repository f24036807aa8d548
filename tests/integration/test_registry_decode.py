"""The Schema Registry client against a real registry (Apicurio, Confluent-compatible API, basic auth, TLS),
and records in the Confluent wire format decoded on Spark against a real broker: old and new writers into
one reader schema, and every bad record with its reason."""

from __future__ import annotations

import io
import json
import socket
from dataclasses import replace

import fastavro
import pytest
from ingest_support import produce

from reclock.errors import RegistryUnavailable, SchemaNotFound
from reclock.registry_plan import avro_plan
from reclock.schema_registry import RegistryClient, RegistrySettings
from reclock.spark.registry_decode import avro_decoded, json_decoded, unknown_ids_metric
from reclock.wire import encode

V1 = {"type": "record", "name": "order", "namespace": "shop",
      "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "int"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}
V3_BAD = {**V1, "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "int"}]}


def avro_bytes(schema: dict, datum: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), datum)
    return buf.getvalue()


@pytest.fixture
def client(registry) -> RegistryClient:
    return RegistryClient(registry.settings())


def _subject(request) -> str:
    return f"{request.node.name[:40]}-{id(request)}-value"


def test_schemas_by_id_and_subject_versions(client, request) -> None:
    subject = _subject(request)
    i1 = client.register(subject, json.dumps(V1))
    i2 = client.register(subject, json.dumps(V2))
    assert i1 != i2
    assert json.loads(client.schema(i1).text) == V1 and client.schema(i2).type == "AVRO"
    assert [(v.version, v.schema.id) for v in client.subject_versions(subject)] == [(1, i1), (2, i2)]
    with pytest.raises(SchemaNotFound, match="schema id 987654 does not exist"):
        client.schema(987654)


def test_schemas_are_cached_by_id(registry, client, request) -> None:
    i = client.register(_subject(request), json.dumps(V1))
    assert client.schema(i).id == i
    client._auth = "Basic " + "eDp5"  # x:y, refused from now on: only the cache can answer
    assert client.schema(i).id == i
    with pytest.raises(RegistryUnavailable, match="HTTP 401.*credentials"):
        client.schema(i + 1000)


def test_tls_and_basic_auth(registry, request) -> None:
    tls = RegistryClient(registry.settings(tls=True))
    i = tls.register(_subject(request), json.dumps(V1))
    assert tls.schema(i).id == i
    with pytest.raises(RegistryUnavailable, match="TLS failed.*ca_file"):  # the system CAs do not know it
        RegistryClient(replace(registry.settings(tls=True), ca_file=None)).schema(i)
    with pytest.raises(RegistryUnavailable, match="HTTP 401"):
        RegistryClient(replace(registry.settings(tls=True), password="wrong")).schema(i)
    with pytest.raises(RegistryUnavailable, match="HTTP 401"):
        RegistryClient(RegistrySettings(registry.url)).schema(i)  # no credentials at all


def test_registry_down_is_unavailable_not_missing() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens once closed
    with pytest.raises(RegistryUnavailable, match="refused"):
        RegistryClient(RegistrySettings(f"http://127.0.0.1:{port}/apis/ccompat/v7", timeout_s=2)).schema(1)


def _kafka_values(spark, kafka, topic: str):
    return (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").option("endingOffsets", "latest")
            .load().select("partition", "offset", "value"))


def test_avro_of_old_and_new_writers_decodes_into_one_reader(registry, client, kafka, topic, spark, request):
    subject = _subject(request)
    i1 = client.register(subject, json.dumps(V1))
    i2 = client.register(subject, json.dumps(V2))
    i3 = client.register(subject, json.dumps(V3_BAD))  # the registry allows it (compatibility NONE)
    name = topic(partitions=1)
    values = [
        encode(i1, avro_bytes(V1, {"id": 1, "amount": 10})),
        encode(i2, avro_bytes(V2, {"id": 2, "amount": 20, "note": "hi"})),
        encode(i2, avro_bytes(V2, {"id": 3, "amount": -0, "note": None})),
        None,                                               # a tombstone: a row of nulls, no error
        json.dumps({"id": 4}).encode(),                     # no magic byte
        b"\x00\x00",                                        # too short
        encode(987_654, avro_bytes(V1, {"id": 5, "amount": 1})),  # an id the registry does not hold
        encode(i1, b"\xff\xff\xff"),                        # a known writer, bytes that are not its Avro
        encode(i3, avro_bytes(V3_BAD, {"id": "x", "amount": 1})),  # a writer the reader cannot read
    ]
    produce(kafka, name, [(0, None, v) for v in values])
    plan = avro_plan(client, json.dumps(V2), subject)
    assert {w.schema_id: w.unreadable is None for w in plan.writers} == {i1: True, i2: True, i3: False}
    from reclock.spark.jobs import observation as _observation

    seen = _observation(spark)
    df = avro_decoded(_kafka_values(spark, kafka, name), plan).observe(
        seen, unknown_ids_metric(plan.ids).alias("unknown"))
    # the columns from_avro gives are the ones schema evolution reasons about (reclock.avro_schema; in
    # PERMISSIVE mode Spark makes every field nullable, where evolution keeps Avro's "required")
    from reclock.avro_schema import collection_schema

    struct = [fl for fl in df.schema["_d"].dataType.fields if fl.name != "_reclock_ok"]
    assert [(fl.name, fl.dataType.simpleString()) for fl in struct] == \
        [(c.name, c.type) for c in collection_schema(V2).columns]
    rows = df.select("offset", "_d.id", "_d.amount", "_d.note", "_reason").orderBy("offset").collect()
    got = [(r.id, r.amount, r.note, r._reason) for r in rows]
    assert got[:4] == [(1, 10, None, None), (2, 20, "hi", None), (3, 0, None, None), (None, None, None, None)]
    assert "no Confluent wire header" in got[4][3] and "no Confluent wire header" in got[5][3]
    assert got[6][3] == "schema id 987654 is not known to the schema registry"
    assert got[7][3] == f"value does not decode as Avro of writer schema {i1}"
    assert got[8][3].startswith(f"writer schema {i3} cannot be read as the collection's schema: id: ")
    assert sorted(seen.get["unknown"]) == ["987654"]
    # asked again with the id: the registry says it does not exist, so the plan knows it is missing
    assert avro_plan(client, json.dumps(V2), subject, ids=[987_654]).missing == (987_654,)


def test_json_schema_records(registry, client, kafka, topic, spark, request):
    from pyspark.sql import types as T

    subject = _subject(request)
    js = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    i = client.register(subject, json.dumps(js), "JSON")
    assert client.schema(i).type == "JSON"
    name = topic(partitions=1)
    produce(kafka, name, [(0, None, encode(i, b'{"id": 1, "name": "a"}')), (0, None, b'{"id": 2}'),
                          (0, None, encode(i + 500, b'{"id": 3}')), (0, None, encode(i, b"{not json"))])
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])
    rows = json_decoded(_kafka_values(spark, kafka, name), schema, [i]).orderBy("offset").collect()
    assert (rows[0]._d.id, rows[0]._d.name, rows[0]._reason) == (1, "a", None)
    assert "no Confluent wire header" in rows[1]._reason
    assert rows[2]._reason == f"schema id {i + 500} is not known to the schema registry"
    assert rows[3]._reason == "value does not parse as JSON of the collection's schema"
