"""Avro schema resolution (``reclock.avro_schema.problem``): the specification's rules, checked against
fastavro's resolver on real encoded data where it decides."""

from __future__ import annotations

import io
import json

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.avro_schema import problem


def rec(*fields: dict, name: str = "r") -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


def f(name: str, t, **kw) -> dict:
    return {"name": name, "type": t, **kw}


BASE = rec(f("id", "long"), f("name", "string"))

CASES = [
    # (reader, writer, readable, words in the reason)
    (BASE, BASE, True, ""),
    (rec(f("id", "long"), f("name", "string"), f("note", ["null", "string"], default=None)), BASE, True, ""),
    (rec(f("id", "long"), f("name", "string"), f("note", "string")), BASE, False, "note: the reader needs it"),
    (rec(f("id", "long")), BASE, True, ""),  # a writer field the reader lacks is skipped
    (rec(f("id", "long"), f("name", "string")), rec(f("id", "int"), f("name", "string")), True, ""),  # widened
    (rec(f("id", "int"), f("name", "string")), BASE, False, "id: the writer's long cannot be read as int"),
    (rec(f("id", "double"), f("name", "bytes")), BASE, True, ""),
    (rec(f("id", "long"), f("name", ["null", "string"])), BASE, True, ""),  # reader union takes the string
    (rec(f("id", "long"), f("name", "string")), rec(f("id", "long"), f("name", ["null", "string"])), False,
     "name: the writer's null"),
    (rec(f("id", "long"), f("e", {"type": "enum", "name": "E", "symbols": ["A", "B"]})),
     rec(f("id", "long"), f("e", {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]})), False, "symbol"),
    (rec(f("id", "long"), f("e", {"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "A"})),
     rec(f("id", "long"), f("e", {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]})), True, ""),
    (rec(f("xs", {"type": "array", "items": "long"})), rec(f("xs", {"type": "array", "items": "int"})), True, ""),
    (rec(f("xs", {"type": "map", "values": "int"})), rec(f("xs", {"type": "map", "values": "long"})), False,
     "xs{}"),
    (rec(f("a", rec(f("x", "long"), name="A"))), rec(f("a", rec(f("x", "long"), f("y", "int"), name="A"))), True, ""),
    (rec(f("a", rec(f("x", "long"), f("z", "int"), name="A"))), rec(f("a", rec(f("x", "long"), name="A"))), False,
     "a.z"),
    (rec(f("new_name", "long", aliases=["id"])), rec(f("id", "long")), True, ""),
    (rec(f("h", {"type": "fixed", "name": "H", "size": 4})), rec(f("h", {"type": "fixed", "name": "H", "size": 8})),
     False, "size"),
    (rec(f("id", "long"), name="other"), rec(f("id", "long")), False, "not the reader's"),
]


@pytest.mark.parametrize("reader, writer, readable, words", CASES)
def test_resolution_rules(reader, writer, readable, words) -> None:
    got = problem(json.dumps(reader), writer)
    assert (got is None) == readable, got
    if words:
        assert words in got


def _example(schema):
    """A datum of ``schema`` (the first branch of unions, the first enum symbol)."""
    if isinstance(schema, list):
        return _example(schema[-1])
    if isinstance(schema, str):
        return {"null": None, "boolean": True, "int": 7, "long": 7, "float": 1.5, "double": 1.5,
                "bytes": b"x", "string": "x"}[schema]
    t = schema["type"]
    if t == "record":
        return {fl["name"]: _example(fl["type"]) for fl in schema["fields"]}
    if t == "enum":
        return schema["symbols"][-1]
    if t == "array":
        return [_example(schema["items"])]
    if t == "map":
        return {"k": _example(schema["values"])}
    if t == "fixed":
        return b"\x00" * schema["size"]
    return _example(t)


@pytest.mark.parametrize("reader, writer, readable, words", [c for c in CASES if "null" not in c[3]])
def test_agrees_with_fastavro(reader, writer, readable, words) -> None:
    """Where fastavro decodes a record of the writer with the reader (or refuses to), the check says the same."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), _example(writer))
    buf.seek(0)
    try:
        fastavro.schemaless_reader(buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader))
        ok = True
    except Exception:  # noqa: BLE001 - fastavro's resolution errors have several types
        ok = False
    assert ok == readable


prims = st.sampled_from(["boolean", "int", "long", "float", "double", "bytes", "string"])
types = st.recursive(prims | st.lists(prims, min_size=1, max_size=3, unique=True).map(lambda b: ["null", *b]),
                     lambda inner: st.builds(lambda t: {"type": "array", "items": t}, inner)
                     | st.builds(lambda t: {"type": "map", "values": t}, inner), max_leaves=4)


@settings(max_examples=200)
@given(st.lists(types, min_size=1, max_size=6))
def test_a_schema_reads_itself(field_types) -> None:
    s = rec(*[f(f"c{i}", t) for i, t in enumerate(field_types)])
    assert problem(s, s) is None


def test_collection_schema_of_an_avro_record() -> None:
    """The columns ``from_avro`` gives a record (their Spark types and nullability), which schema evolution
    compares; V2 adds an optional field to V1: a compatible change adding one nullable column."""
    from reclock.avro_schema import collection_schema
    from reclock.schema_evolution import evolve

    v1 = rec(f("id", "long"), f("when", {"type": "long", "logicalType": "timestamp-micros"}),
             f("price", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}),
             f("tags", {"type": "array", "items": "string"}), f("kind", {"type": "enum", "name": "K", "symbols": ["a"]}))
    v2 = dict(v1, fields=v1["fields"] + [f("note", ["null", "string"], default=None)])
    c1 = collection_schema(v1)
    assert [(c.name, c.type, c.nullable) for c in c1.columns] == [
        ("id", "bigint", False), ("when", "timestamp", False), ("price", "decimal(10,2)", False),
        ("tags", "array<string>", False), ("kind", "string", False)]
    e = evolve(c1, collection_schema(v2))
    assert e.added == ("note",) and e.incompatible is None
    narrowed = dict(v1, fields=[f("id", "int")] + v1["fields"][1:])
    assert evolve(c1, collection_schema(narrowed), previous=c1).incompatible.change == "type narrowed"


def test_inline_references_makes_one_schema():
    """A registry's Avro references (named types defined in other subjects) inlined at their first use: the
    result parses alone, and a record written with the parts reads back the same."""
    import io

    import fastavro

    from reclock.avro_schema import inline_references

    money = {"type": "record", "name": "Money", "namespace": "fin", "fields": [{"name": "cents", "type": "long"}]}
    kind = {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}  # no namespace: it keeps the null one
    order = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "price", "type": "fin.Money"}, {"name": "refund", "type": ["null", "fin.Money"]},
        {"name": "kind", "type": "Kind"}]}
    text = inline_references(json.dumps(order), {"fin.Money": json.dumps(money), "Kind": json.dumps(kind)})
    inlined = json.loads(text)
    assert inlined["fields"][0]["type"]["name"] == "Money" and inlined["fields"][1]["type"] == ["null", "fin.Money"]
    assert problem(text, text) is None
    parsed = fastavro.parse_schema(inlined)
    buf = io.BytesIO()
    datum = {"price": {"cents": -1}, "refund": None, "kind": "B"}
    fastavro.schemaless_writer(buf, parsed, datum)
    buf.seek(0)
    assert fastavro.schemaless_reader(buf, parsed) == datum
