"""``reclock.debezium_avro``: a Confluent wire-format Avro record as the JSON text Debezium's JSON converter
writes, checked against fastavro's encoding (hypothesis): the text parses to the datum, floats and doubles
bit for bit (-0.0, NaN, the infinities), decimals exact, bytes as base64; and every malformed record is an
``EventInvalid`` naming why."""

from __future__ import annotations

import base64
import io
import json
import math
import struct
from decimal import Decimal

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.debezium import EventInvalid, parse_key, parse_value
from reclock.debezium_avro import AvroJson, datum_json, float_text

ROW = {"type": "record", "name": "Value", "namespace": "dbz.public.kinds", "fields": [
    {"name": "id", "type": "int"},
    {"name": "f4", "type": ["null", "float"], "default": None},
    {"name": "f8", "type": ["null", "double"], "default": None},
    {"name": "d", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3,
                                     "connect.name": "org.apache.kafka.connect.data.Decimal"}], "default": None},
    {"name": "b", "type": ["null", "bytes"], "default": None},
    {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
    {"name": "t", "type": ["null", "string"], "default": None},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    {"name": "m", "type": {"type": "map", "values": "long"}, "default": {}},
]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": "dbz.public.kinds", "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},
    {"name": "source", "type": {"type": "record", "name": "Source", "fields": [
        {"name": "lsn", "type": ["null", "long"]}, {"name": "txId", "type": ["null", "long"]},
        {"name": "sequence", "type": ["null", "string"]},
        {"name": "snapshot", "type": [{"type": "string", "connect.name": "io.debezium.data.Enum"}, "null"]}]}},
    {"name": "op", "type": "string"},
    {"name": "ts_ms", "type": ["null", "long"], "default": None},
]}
KEY = {"type": "record", "name": "Key", "namespace": "dbz.public.kinds", "fields": [{"name": "id", "type": "int"}]}


_PARSED = {id(ENVELOPE): fastavro.parse_schema(ENVELOPE), id(KEY): fastavro.parse_schema(KEY)}


def wire(schema_id: int, schema: dict, datum: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, _PARSED[id(schema)], datum)
    return b"\0" + schema_id.to_bytes(4, "big") + buf.getvalue()


def conv() -> AvroJson:
    return AvroJson({7: json.dumps(ENVELOPE), 8: json.dumps(KEY)}.__getitem__, KeyError)


f32 = st.floats(width=32)
rows = st.fixed_dictionaries({
    "id": st.integers(-2**31, 2**31 - 1), "f4": st.none() | f32, "f8": st.none() | st.floats(),
    "d": st.none() | st.decimals(min_value=-10**9 + 1, max_value=10**9 - 1, places=3, allow_nan=False),
    "b": st.none() | st.binary(max_size=8), "ts": st.none() | st.integers(-2**62, 2**62),
    "t": st.none() | st.text(max_size=8), "tags": st.lists(st.text(max_size=3), max_size=3),
    "m": st.dictionaries(st.text(max_size=3), st.integers(-2**63, 2**63 - 1), max_size=3)})


def same_float(a: float, b: float, fmt: str) -> bool:
    return struct.pack(fmt, a) == struct.pack(fmt, b) or (math.isnan(a) and math.isnan(b))


@settings(max_examples=80, deadline=None)
@given(rows)
def test_a_row_reads_back_bit_for_bit(row):
    record = wire(7, ENVELOPE, {"before": None, "after": row, "op": "c", "ts_ms": 1,
                                "source": {"lsn": 10, "txId": 2, "sequence": '["5","10"]', "snapshot": "false"}})
    text = conv().text(record, "the value")
    event = parse_value(text)
    got = json.loads(event.after, parse_float=str, parse_int=int)
    assert got["id"] == row["id"] and got["t"] == row["t"] and got["ts"] == row["ts"]
    assert got["tags"] == row["tags"] and got["m"] == row["m"]
    for name, fmt in (("f4", "<f"), ("f8", "<d")):
        if row[name] is None:
            assert got[name] is None
        else:
            g = got[name]
            v = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(g) if isinstance(g, str) \
                and g in ("NaN", "Infinity", "-Infinity") else float(g)
            assert same_float(v, row[name], fmt), (g, row[name])
    assert (got["b"] is None) if row["b"] is None else base64.b64decode(got["b"]) == row["b"]
    assert (got["d"] is None) if row["d"] is None else Decimal(got["d"]) == row["d"]
    assert event.position.lsn == 10 and event.position.commit == 5


def test_negative_zero_and_nan_as_connect_writes_them():
    assert float_text(-0.0) == "-0.0" and float_text(struct.unpack("<f", struct.pack("<f", 1.1))[0]) == "1.1"
    biggest = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
    assert struct.pack("<f", float(float_text(biggest))) == b"\xff\xff\x7f\x7f"
    assert datum_json("double", struct.pack("<d", -0.0)) == "-0.0"
    assert datum_json("double", struct.pack("<d", math.nan)) == '"NaN"'
    assert datum_json("float", struct.pack("<f", -math.inf)) == '"-Infinity"'


def test_a_key_is_the_json_key():
    assert parse_key(conv().text(wire(8, KEY, {"id": 42}), "the key")) == b'{"id":42}'
    assert conv().text(None, "the value") is None  # a tombstone


@pytest.mark.parametrize("record, reason", [
    (b'{"id": 1}', "not in the Confluent wire format"),
    (b"\0\0\0", "not in the Confluent wire format"),
    (b"\0\0\0\0\x09" + b"\x02", "writer schema id 9 is not in the registry"),
    (b"\0\0\0\0\x08", "ends early"),
    (b"\0\0\0\0\x08\x02\x02", "1 bytes are left"),
])
def test_malformed_records_are_named(record, reason):
    with pytest.raises(EventInvalid, match=reason):
        conv().text(record, "the key")


AVRO = {"type": "avro", "registry": {"connection": "reclock_registry"}}


def test_the_config_takes_debezium_avro_and_refuses_what_is_not_built():
    from reclock.config import parse_source
    from reclock.errors import ConfigError

    kafka = {"bootstrap": "localhost:9092"}
    one = parse_source("k", {"kafka": {**kafka, "topic": "dbz.public.k"}, "envelope": "debezium",
                             "format": {**AVRO, "schema": "id INT, v STRING"}})
    assert one.format.type == "avro" and one.format.schema == "id INT, v STRING" and one.keyed
    topics = [{"topic": "dbz.public.a", "schema": "id INT"}, {"topic": "dbz.public.b", "schema": "id INT, n BIGINT"}]
    several = parse_source("s", {"kafka": kafka, "envelope": "debezium", "topics": topics, "format": AVRO})
    assert several.format.type == "avro" and len(several.upstream.tables) == 2
    evolving = parse_source("e", {"kafka": {**kafka, "topic": "dbz.public.k"}, "envelope": "debezium",
                                  "format": {**AVRO, "schema": "id INT"}, "schema": "evolve"})
    assert evolving.schema_mode == "evolve"
    tx = parse_source("s", {"kafka": kafka, "envelope": "debezium", "topics": topics, "format": AVRO,
                            "transaction_topic": "dbz.transaction"})
    assert tx.upstream.transaction_topic == "dbz.transaction" and tx.format.type == "avro"
    for raw, words in [
        ({"kafka": {**kafka, "topic": "t"}, "envelope": "debezium", "format": AVRO}, "needs `schema:`"),
        ({"kafka": {**kafka, "topic": "t"}, "envelope": "debezium", "format": {"type": "json", "schema": "id INT"},
          "schema": "evolve"}, "needs writer schemas from a registry"),
        ({"kafka": {**kafka, "topic": "t"}, "envelope": "debezium",
          "format": {"type": "protobuf", "registry": {}}}, "envelope debezium reads"),
    ]:
        with pytest.raises(ConfigError, match=words):
            parse_source("x", raw)


def test_row_columns_are_the_types_of_the_json_text():
    """A Debezium writer's ``after`` columns as the collection reads the JSON text they decode to: logical
    types as their numbers, decimals with Connect's precision, optional columns nullable, nested records."""
    from reclock.debezium_avro import row_columns

    value = {"type": "record", "name": "Value", "namespace": "dbz.public.t", "fields": [
        {"name": "id", "type": "int"},
        {"name": "d", "type": ["null", {"type": "bytes", "logicalType": "decimal", "scale": 3,
                                        "connect.parameters": {"connect.decimal.precision": "12"}}]},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "b", "type": ["null", "bytes"]}, {"name": "f", "type": "float"},
        {"name": "r", "type": {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}]}
    envelope = {"type": "record", "name": "Envelope", "namespace": "dbz.public.t",
                "fields": [{"name": "before", "type": ["null", value]}, {"name": "after", "type": ["null", "Value"]},
                           {"name": "op", "type": "string"}]}
    cols = row_columns(json.dumps(envelope))
    assert [(c.name, c.type, c.nullable) for c in cols.columns] == [
        ("id", "int", False), ("d", "decimal(12,3)", True), ("day", "int", True), ("at", "bigint", False),
        ("b", "binary", True), ("f", "float", False), ("r", "struct<x:bigint>", False), ("e", "string", False)]
    with pytest.raises(ValueError, match="no `after`"):
        row_columns(json.dumps(value))
