"""A registry source's reader over time (``reclock.registry_plan``: choose_reader, versions_seen) and JSON
Schema as columns (``reclock.json_schema``), pure: hypothesis over chains of writers, each a compatible step
(a field added with a default, an int widened to long) or an incompatible one (a type narrowed, a required
field removed, a field added without a default that older records cannot be read as)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.json_schema import JsonSchemaError, collection_schema
from reclock.registry_plan import AvroPlan, AvroWriter, Choice, Reader, choose_reader, versions_seen, writer_columns
from reclock.schema_evolution import CollectionSchema, Column, evolve


def record(fields: list[tuple[str, object, bool]]) -> str:
    """An Avro record of ``(name, type, with a null default)`` fields."""
    out = []
    for name, t, default in fields:
        out.append({"name": name, "type": ["null", t], "default": None} if default else {"name": name, "type": t})
    return json.dumps({"type": "record", "name": "r", "fields": out})


STEPS = ("add_optional", "widen", "same", "narrow", "remove_required", "add_required")


@st.composite
def chains(draw):
    """Writers 1..n: writer 1 ``id:long, a:int``; each next one a step from the one before."""
    fields = [("id", "long", False), ("a", "int", False)]
    writers = {1: record(fields)}
    steps = []
    for i in range(2, draw(st.integers(2, 6)) + 1):
        step = draw(st.sampled_from(STEPS))
        if step == "add_optional":
            fields = fields + [(f"f{i}", "string", True)]
        elif step == "widen" and ("a", "int", False) in fields:
            fields = [(n, "long" if n == "a" else t, d) for n, t, d in fields]
        elif step == "narrow":
            fields = [(n, "int" if n == "id" else t, d) for n, t, d in fields]
        elif step == "remove_required":
            fields = [f for f in fields if f[0] != "a"] or fields
        elif step == "add_required":
            fields = fields + [(f"r{i}", "long", False)]
        else:
            step = "same"
        writers[i] = record(fields)
        steps.append(step)
    return writers, steps


@settings(max_examples=300, deadline=None)
@given(chains())
def test_evolve_takes_the_newest_writer_every_compatible_step_leads_to(chain):
    writers, steps = chain
    reader = Reader("avro", writers[1], 1)
    choice = choose_reader("evolve", reader, reader.columns(), writers)
    # every writer not refused fits the chosen columns, and the chosen reader reads every older writer
    for i, text in writers.items():
        if i not in choice.incompatible:
            fits = evolve(choice.columns, writer_columns("avro", text)).incompatible is None
            assert fits or i < choice.reader.schema_id
    from reclock.avro_schema import problem

    taken = [i for i in writers if i not in choice.incompatible and i <= choice.reader.schema_id]
    assert all(problem(choice.reader.text, writers[i]) is None for i in taken)
    # a narrowing or a required field removed right after the first writer is refused
    if steps and steps[0] == "narrow":
        assert 2 in choice.incompatible and choice.incompatible[2].change == "type narrowed"
    if steps and steps[0] == "remove_required" and 2 in choice.incompatible:
        assert choice.incompatible[2].change == "required field removed"
    if steps and steps[0] == "add_required":
        assert 2 in choice.incompatible and "older records cannot be read" in choice.incompatible[2].change
    if steps and steps[0] == "add_optional":
        assert 2 not in choice.incompatible and choice.reader.schema_id >= 2
    # fixed: the reader never changes
    assert choose_reader("fixed", reader, reader.columns(), writers) == Choice(reader, reader.columns())


def plan_of(reader: Reader, writers: dict[int, str], unreadable: dict[int, str] | None = None) -> AvroPlan:
    return AvroPlan(reader.text, tuple(AvroWriter(i, t, (unreadable or {}).get(i)) for i, t in sorted(writers.items())))


def test_versions_begin_at_the_first_record_carrying_them_in_the_order_met():
    w1 = record([("id", "long", False), ("a", "int", False)])
    w2 = record([("id", "long", False), ("a", "int", False), ("b", "string", True)])
    w3 = record([("id", "long", False), ("a", "long", False), ("b", "string", True), ("c", "string", True)])
    writers = {1: w1, 2: w2, 3: w3}
    reader = Reader("avro", w1, 1)
    choice = choose_reader("evolve", reader, reader.columns(), writers)
    assert choice.reader.schema_id == 3 and not choice.incompatible
    versions, refusal = versions_seen(choice, plan_of(choice.reader, writers), reader.columns(),
                                      {1: 5, 3: 20, 2: 10})
    assert refusal is None
    assert [(v.since_ts, v.schema.names) for v in versions] == [(10, ("id", "a", "b")), (20, ("id", "a", "b", "c"))]
    assert versions[1].schema.column("a").type == "bigint" and "writer schema 3: adds c; widens a" == versions[1].cause
    assert Reader.from_upstream(versions[1].upstream) == choice.reader
    # met at one timestamp: one version, the newest
    versions, _ = versions_seen(choice, plan_of(choice.reader, writers), reader.columns(), {2: 7, 3: 7})
    assert [(v.since_ts, v.schema.names) for v in versions] == [(7, ("id", "a", "b", "c"))]
    # nothing new met: no version
    assert versions_seen(choice, plan_of(choice.reader, writers), reader.columns(), {1: 3}) == ([], None)


def test_a_refused_writer_met_stops_the_versions_there():
    w1 = record([("id", "long", False)])
    w2 = record([("id", "int", False)])
    reader = Reader("avro", w1, 1)
    choice = choose_reader("evolve", reader, reader.columns(), {1: w1, 2: w2})
    versions, refusal = versions_seen(choice, plan_of(reader, {1: w1, 2: w2}), reader.columns(), {2: 4})
    assert versions == [] and (refusal.writer, refusal.reader) == (2, 1)
    assert (refusal.incompatibility.field, refusal.incompatibility.change) == ("id", "type narrowed")
    # a writer the plan's reader cannot read (fixed elsewhere, met under evolve): refused with Avro's reason
    plan = plan_of(reader, {1: w1, 5: w1}, {5: "id: the writer's string cannot be read as long"})
    _, refusal = versions_seen(Choice(reader, reader.columns()), plan, reader.columns(), {5: 1})
    assert refusal.writer == 5 and refusal.incompatibility.field == "id"
    # ids the registry does not hold change nothing (their records are decode errors)
    assert versions_seen(Choice(reader, reader.columns()), plan_of(reader, {1: w1}), reader.columns(),
                         {99: 1}) == ([], None)


def test_json_schema_columns():
    s = {"type": "object", "required": ["id", "tags"], "properties": {
        "id": {"type": "integer"}, "price": {"type": "number"}, "name": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "addr": {"type": "object", "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}}},
        "attrs": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "maybe": {"oneOf": [{"type": "null"}, {"type": "integer"}]}, "ts": {"type": "string", "format": "date-time"}}}
    assert collection_schema(json.dumps(s)) == CollectionSchema((
        Column("id", "bigint", False), Column("price", "double"), Column("name", "string"),
        Column("tags", "array<string>", False), Column("addr", "struct<zip:string,n:bigint>"),
        Column("attrs", "map<string,boolean>"), Column("maybe", "bigint"), Column("ts", "string")))


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"a": {"$ref": "#/defs/x"}}}, "a: \\$ref"),
    ({"type": "object", "properties": {"a": {"type": ["string", "integer"]}}}, "a: type .* is not one type"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}, "a: anyOf"),
    ({"type": "array", "items": {"type": "string"}}, "must be an object with `properties`"),
    ({"type": "object", "properties": {"a": {"type": "object"}}}, "a: an object without `properties`"),
])
def test_json_schemas_without_columns_say_where(schema, words):
    with pytest.raises(JsonSchemaError, match=words):
        collection_schema(schema)
