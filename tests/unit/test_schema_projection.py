"""Reading a part of one schema as another (reclock.schema_projection): the Arrow projection and DuckDB's SQL
give the same values, a column the part lacks is null, a widened one keeps its values, and reading the
evolved schema back as the old one gives the part's values again (the laws, with hypothesis). Spark's SQL
is checked against the same values on real Spark in tests/integration/test_evolving_reads.py."""

from __future__ import annotations

from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.schema_evolution import CollectionSchema, Column, evolve
from reclock.schema_projection import (arrow_project, arrow_type, duckdb_sql, duckdb_type, part_schema,
                                       project_part, project_table, spark_sql, spark_type)

WIDER = {"tinyint": ["smallint", "int", "bigint"], "smallint": ["int", "bigint"], "int": ["bigint", "double"],
         "float": ["double"], "decimal(10,2)": ["decimal(12,2)", "decimal(14,4)"]}
PRIMITIVES = ["tinyint", "smallint", "int", "bigint", "float", "double", "string", "boolean", "decimal(10,2)",
              "binary", "date"]
VALUES = {
    "tinyint": st.integers(-128, 127), "smallint": st.integers(-2**15, 2**15 - 1),
    "int": st.integers(-2**31, 2**31 - 1), "bigint": st.integers(-2**63, 2**63 - 1),
    "float": st.sampled_from([0.0, -0.0, 1.5, -2.25, float("inf")]),
    "double": st.sampled_from([0.0, -0.0, 1.5, 1e300, float("-inf")]),
    "string": st.text(max_size=3), "boolean": st.booleans(), "binary": st.binary(max_size=3),
    "decimal(10,2)": st.sampled_from([Decimal("0.00"), Decimal("-1.50"), Decimal("99999999.99")]),
    "date": st.integers(-1000, 30000).map(lambda d: __import__("datetime").date(1970, 1, 1)
                                          + __import__("datetime").timedelta(days=d)),
}


@st.composite
def types(draw, depth: int = 0) -> str:
    kind = draw(st.sampled_from(["p", "p", "p"] + (["struct", "array", "map"] if depth < 2 else [])))
    if kind == "p":
        return draw(st.sampled_from(PRIMITIVES))
    if kind == "array":
        return f"array<{draw(types(depth + 1))}>"
    if kind == "map":
        return f"map<string,{draw(types(depth + 1))}>"
    names = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    return "struct<" + ",".join(f"{n}:{draw(types(depth + 1))}" for n in names) + ">"


@st.composite
def wider(draw, t: str) -> str:
    """A type ``t`` widens to: a wider primitive, or a struct with its fields widened and one more."""
    from reclock.schema_evolution import _container, struct_fields

    fields = struct_fields(t)
    if fields is not None:
        out = [(n, draw(wider(ft))) for n, ft in fields]
        if draw(st.booleans()) and "z" not in dict(fields):
            out.append(("z", draw(types(2))))
        return "struct<" + ",".join(f"{n}:{ft}" for n, ft in out) + ">"
    inner = _container(t, "array")
    if inner is not None:
        return f"array<{draw(wider(inner[0]))}>"
    kv = _container(t, "map")
    if kv is not None:
        return f"map<string,{draw(wider(kv[1]))}>"
    if t in WIDER and draw(st.booleans()):
        return draw(st.sampled_from(WIDER[t]))
    return t


def values(t: str):
    from reclock.schema_evolution import _container, struct_fields

    fields = struct_fields(t)
    if fields is not None:
        return st.one_of(st.none(), st.fixed_dictionaries({n: values(ft) for n, ft in fields}))
    inner = _container(t, "array")
    if inner is not None:
        return st.one_of(st.none(), st.lists(values(inner[0]), max_size=2))
    kv = _container(t, "map")
    if kv is not None:
        return st.one_of(st.none(), st.dictionaries(st.sampled_from(["k", "j"]), values(kv[1]), max_size=2)
                         .map(lambda d: list(d.items())))
    return st.one_of(st.none(), VALUES[t])


@st.composite
def evolutions(draw):
    """(part schema, target schema, the part's rows): the target widens the part's columns and may add some."""
    names = draw(st.lists(st.sampled_from(["x", "y", "w"]), min_size=1, max_size=3, unique=True))
    part = CollectionSchema(tuple(Column(n, draw(types())) for n in names))
    incoming = CollectionSchema(tuple(Column(c.name, draw(wider(c.type))) for c in part.columns)
                                + ((Column("added", draw(types())),) if draw(st.booleans()) else ()))
    ev = evolve(part, incoming)
    assert ev.incompatible is None, ev.incompatible
    rows = draw(st.lists(st.fixed_dictionaries({c.name: values(c.type) for c in part.columns}), max_size=4))
    return part, ev.schema, rows


def _dq(name: str) -> str:
    return '"' + name + '"'


def _table(schema: CollectionSchema, rows: list[dict]) -> pa.Table:
    return pa.table({c.name: pa.array([r[c.name] for r in rows], arrow_type(c.type)) for c in schema.columns})


def _plain(v):
    """A value comparable across a widening (floats of a float column read as doubles are the same number)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, Decimal):
        return ("d", v.normalize() if v else Decimal(0))
    return v


def _expected(schema: CollectionSchema, target: CollectionSchema, rows: list[dict]) -> list:
    """The rows as the target reads them: every target column, a missing one (or struct field) null."""
    from reclock.schema_evolution import _container, struct_fields

    def conv(v, have, want):
        if v is None or have is None:
            return None
        wf, hf = struct_fields(want), struct_fields(have)
        if wf is not None:
            got = dict(hf)
            return {n: conv(v.get(n), got.get(n), t) for n, t in wf}
        if _container(want, "array") is not None:
            return [conv(x, _container(have, "array")[0], _container(want, "array")[0]) for x in v]
        if _container(want, "map") is not None:
            return [(k, conv(x, _container(have, "map")[1], _container(want, "map")[1])) for k, x in v]
        return float(v) if want in ("float", "double") else v

    return [_plain({c.name: conv(r.get(c.name), schema.column(c.name).type if schema.column(c.name) else None,
                                 c.type) for c in target.columns}) for r in rows]


@settings(max_examples=150)
@given(evolutions())
def test_arrow_projection_keeps_values_and_reads_back(example) -> None:
    part, target, rows = example
    table = _table(part, rows)
    assert part_schema(table.schema) == CollectionSchema(tuple(Column(c.name, c.type, True) for c in part.columns))
    up = project_table(table, part, target, keep=())
    assert [spark_type(f.type) for f in up.schema] == [c.type for c in target.columns]
    assert [_plain(r) for r in up.to_pylist()] == _expected(part, target, rows)
    back = project_table(up, target, part, keep=())
    assert [_plain(r) for r in back.to_pylist()] == [_plain(r) for r in table.to_pylist()]


@settings(max_examples=60)
@given(evolutions())
def test_duckdb_projection_gives_the_arrow_values(tmp_path_factory, example) -> None:
    part, target, rows = example
    path = tmp_path_factory.mktemp("p") / "part.parquet"
    pq.write_table(_table(part, rows), path)
    con = duckdb.connect()
    cols = ", ".join(duckdb_sql(_dq(c.name), part.column(c.name).type if part.column(c.name) else None, c.type)
                     + " AS " + _dq(c.name) for c in target.columns)
    got = con.sql(f"SELECT {cols} FROM read_parquet('{path}')").to_arrow_table()
    assert [_plain(r) for r in got.to_pylist()] == _expected(part, target, rows)


def test_sql_text_of_a_struct_field_added_and_a_widened_type() -> None:
    have, want = "struct<a:int>", "struct<a:bigint,b:string>"
    assert spark_sql("`s`", have, want) == ("CASE WHEN `s` IS NULL THEN NULL ELSE named_struct('a', "
                                            "CAST(`s`.`a` AS bigint), 'b', CAST(NULL AS string)) END")
    assert duckdb_type(want) == 'STRUCT("a" BIGINT, "b" VARCHAR)'
    assert spark_sql("`x`", None, "int") == "CAST(NULL AS int)"
    assert spark_sql("`x`", "array<int>", "array<bigint>") == "transform(`x`, _x0 -> CAST(_x0 AS bigint))"


def test_arrow_types_of_the_parts_spark_and_pyarrow_write() -> None:
    assert spark_type(pa.timestamp("ns")) == "timestamp"  # Spark's INT96, as pyarrow reads it
    assert spark_type(pa.timestamp("us", tz="UTC")) == "timestamp"
    assert spark_type(pa.timestamp("us")) == "timestamp_ntz"
    assert spark_type(pa.dictionary(pa.int32(), pa.string())) == "string"
    assert spark_type(pa.large_string()) == "string"
    assert spark_type(pa.map_(pa.string(), pa.list_(pa.int32()))) == "map<string,array<int>>"
    with pytest.raises(ValueError, match="no Arrow type"):
        arrow_type("interval")


def test_a_dictionary_column_of_the_right_type_passes_through() -> None:
    t = pa.table({"s": pa.array(["a", "b", "a"]).dictionary_encode(), "ts": [1, 2, 3], "diff": [1, 1, 1]})
    part = CollectionSchema((Column("s", "string"),))
    target = CollectionSchema((Column("s", "string"), Column("n", "int")))
    out = project_table(t, part, target)
    assert pa.types.is_dictionary(out["s"].type) and out.column_names == ["s", "n", "ts", "diff"]
    assert out["n"].null_count == 3
    assert arrow_project(None, None, "int", 2).to_pylist() == [None, None]


def test_a_column_dropped_and_added_again_reads_null_before_it_came_back():
    """DROP COLUMN x at 10, ADD COLUMN x (another type) at 20: AS OF 25, the rows before 20 read null in x (the
    old column's values are another column's), the rows at 20 on their own; AS OF 5 the old x as it was;
    updates across the drop keep the old x before it (``read_across``)."""
    from reclock.schema_evolution import CollectionSchema, Column, SchemaHistory, SchemaVersion

    v0 = CollectionSchema((Column("id", "bigint"), Column("x", "string")))
    v1 = CollectionSchema((Column("id", "bigint"),))
    v2 = CollectionSchema((Column("id", "bigint"), Column("x", "int")))
    history = SchemaHistory((SchemaVersion(0, v0), SchemaVersion(10, v1), SchemaVersion(20, v2)))
    assert history.read_as(5) == v0 and history.read_as(15) == v1
    assert history.read_as(25).column("x").from_ts == 20 and history.read_as(25).column("id").from_ts is None
    assert history.read_across(5, 16).names == ("id", "x")  # the dropped x, for the updates before 10
    assert history.read_across(12, 16) == v1
    old = pa.table({"id": pa.array([1, 2], pa.int64()), "x": ["a", "b"], "ts": pa.array([3, 4], pa.int64()),
                    "diff": pa.array([1, 1], pa.int64())})
    new = pa.table({"id": pa.array([1, 3], pa.int64()), "x": pa.array([None, 7], pa.int32()),
                    "ts": pa.array([12, 21], pa.int64()), "diff": pa.array([-1, 1], pa.int64())})
    assert project_part(old, history.read_as(25))["x"].to_pylist() == [None, None]  # never cast: 'a' is no int
    assert project_part(new, history.read_as(25))["x"].to_pylist() == [None, 7]
    assert project_part(old, history.read_as(5))["x"].to_pylist() == ["a", "b"]
    assert project_part(old, history.read_as(15)).column_names == ["id", "ts", "diff"]
