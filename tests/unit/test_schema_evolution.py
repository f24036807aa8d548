"""Schemas that change (``reclock.schema_evolution``): the rules, and the laws over generated schemas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reclock.schema_evolution import (CollectionSchema, Column, SchemaHistory, evolve, projection, struct_fields,
                                      widen)


def schema(*cols: tuple) -> CollectionSchema:
    return CollectionSchema(tuple(Column(*c) for c in cols))


BASE = schema(("id", "bigint", False), ("amount", "int"), ("name", "string"))


@pytest.mark.parametrize("incoming, added, widened", [
    (BASE, (), ()),
    (schema(("id", "bigint", False), ("amount", "int"), ("name", "string"), ("note", "string", False)), ("note",), ()),
    (schema(("id", "bigint", False), ("amount", "bigint"), ("name", "string")), (), ("amount",)),
    (schema(("id", "bigint", True), ("amount", "int"), ("name", "string")), (), ("id",)),  # became nullable
    (schema(("id", "bigint", False), ("amount", "int")), (), ()),  # a nullable column no longer sent
    (schema(("id", "bigint", False), ("amount", "smallint"), ("name", "string")), (), ()),  # an older writer
])
def test_compatible_changes(incoming, added, widened) -> None:
    e = evolve(BASE, incoming)
    assert e.incompatible is None and (e.added, e.widened) == (added, widened)
    for name in added:
        assert e.schema.column(name).nullable  # rows before the change have none


@pytest.mark.parametrize("incoming, previous, words", [
    (schema(("amount", "int"), ("name", "string")), None, "'id' required field removed (from bigint to absent)"),
    (schema(("id", "bigint", False), ("amount", "string"), ("name", "string")), None, "'amount' type changed"),
    (schema(("id", "int", False), ("amount", "int"), ("name", "string")), BASE,
     "'id' type narrowed (from bigint to int)"),
])
def test_incompatible_changes(incoming, previous, words) -> None:
    e = evolve(BASE, incoming, previous)
    assert e.incompatible is not None and words in e.incompatible.describe()
    assert e.schema == BASE  # nothing changes


def test_nested_struct_gets_a_field() -> None:
    cur = schema(("a", "struct<x:int,y:string>"))
    e = evolve(cur, schema(("a", "struct<x:bigint,y:string,z:double>")))
    assert e.schema.column("a").type == "struct<x:bigint,y:string,z:double>" and e.widened == ("a",)
    assert struct_fields("struct<`a b`:int,c:array<struct<d:int>>>") == [("a b", "int"), ("c", "array<struct<d:int>>")]


def test_decimals_and_dates() -> None:
    assert widen("decimal(10,2)", "decimal(12,2)", "d") == "decimal(12,2)"
    assert widen("decimal(12,2)", "decimal(10,2)", "d") == "decimal(12,2)"
    assert widen("int", "decimal(12,2)", "d") == "decimal(12,2)"
    assert widen("date", "timestamp", "d") == "timestamp"
    assert evolve(schema(("d", "decimal(10,2)")), schema(("d", "decimal(10,3)"))).incompatible is not None


def test_history_and_projection() -> None:
    v2 = evolve(BASE, schema(("id", "bigint", False), ("amount", "bigint"), ("name", "string"),
                             ("note", "string"))).schema
    h = SchemaHistory().with_change(100, BASE).with_change(250, v2)
    assert h.at(99) is None and h.at(100) == BASE and h.at(249) == BASE and h.at(250) == v2
    assert h.with_change(250, BASE).versions[-1].schema == BASE  # one change per timestamp
    with pytest.raises(ValueError):
        h.with_change(200, v2)
    p = {c.name: c for c in projection(BASE, v2)}
    assert p["amount"].cast and p["amount"].type == "bigint" and not p["note"].present and not p["id"].cast
    assert [c.name for c in projection(v2, BASE)] == ["id", "amount", "name"]  # the newer column left out
    assert CollectionSchema.from_json(v2.to_json()) == v2


prims = st.sampled_from(["tinyint", "smallint", "int", "bigint", "float", "double", "string", "binary", "date",
                         "timestamp", "boolean", "decimal(10,2)", "decimal(12,2)", "decimal(12,4)"])
types = st.recursive(prims, lambda inner: st.builds(lambda t: f"array<{t}>", inner)
                     | st.lists(st.tuples(st.sampled_from("abcd"), inner), min_size=1, max_size=3,
                                unique_by=lambda f: f[0]).map(lambda fs: "struct<" + ",".join(f"{n}:{t}" for n, t in fs)
                                                               + ">"), max_leaves=4)
schemas = st.lists(st.tuples(st.sampled_from(["c0", "c1", "c2", "c3", "c4"]), types, st.booleans()), max_size=5,
                   unique_by=lambda c: c[0]).map(lambda cs: CollectionSchema(tuple(Column(*c) for c in cs)))


@given(schemas)
def test_a_schema_takes_itself(s) -> None:
    e = evolve(s, s)
    assert not e.changed and e.schema == s


@given(schemas, schemas)
def test_laws_of_a_compatible_change(c, x) -> None:
    e = evolve(c, x)
    if e.incompatible is not None:
        return
    c2 = e.schema
    assert not evolve(c2, x).changed  # idempotent
    for col in c.columns:  # old parts stay readable: their types widen to the new ones
        assert widen(col.type, c2.column(col.name).type, col.name) == c2.column(col.name).type
    for col in x.columns:  # the incoming rows fit
        assert widen(c2.column(col.name).type, col.type, col.name) == c2.column(col.name).type


_WIDER = {"tinyint": "int", "smallint": "bigint", "int": "bigint", "float": "double", "date": "timestamp",
          "decimal(10,2)": "decimal(12,2)"}


@given(schemas, st.data())
def test_widened_added_and_dropped_columns_are_taken(c, data) -> None:
    """An upstream that widens some columns, adds one and stops sending nullable ones: the collection takes
    it, with exactly those columns added and widened."""
    cols = []
    widened = []
    for col in c.columns:
        if col.nullable and data.draw(st.booleans(), "drop"):
            continue
        if col.type in _WIDER and data.draw(st.booleans(), "widen"):
            cols.append(Column(col.name, _WIDER[col.type], col.nullable))
            widened.append(col.name)
        else:
            cols.append(col)
    cols.append(Column("new", data.draw(types, "new type"), False))
    e = evolve(c, CollectionSchema(tuple(cols)))
    assert e.incompatible is None and e.added == ("new",) and set(e.widened) == set(widened)
    assert e.schema.column("new").nullable and not evolve(e.schema, CollectionSchema(tuple(cols))).changed
