"""``reclock.ddl`` (the config's schema check, without Spark) against Spark's own parser: on every schema
string hypothesis makes (valid ones from the grammar, and the same with a word, a character or a bracket
mangled), it accepts exactly what Spark accepts, with the same field names."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reclock.ddl import parse_schema

PRIMS = ["BOOLEAN", "tinyint", "Byte", "SMALLINT", "short", "INT", "integer", "BIGINT", "long", "FLOAT", "real",
         "DOUBLE", "DATE", "TIMESTAMP", "timestamp_ntz", "TIMESTAMP_LTZ", "STRING", "BINARY", "VOID", "VARIANT",
         "DECIMAL", "DECIMAL(12, 3)", "dec(5)", "NUMERIC(38,38)", "CHAR(4)", "VARCHAR(12)", "TIME", "TIME(3)",
         "INTERVAL", "INTERVAL YEAR", "INTERVAL YEAR TO MONTH", "INTERVAL DAY TO SECOND", "INTERVAL HOUR TO MINUTE",
         "STRING COLLATE UTF8_LCASE"]
NAMES = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), st.just("`a b`"), st.just("`x``y`"))


def types(depth: int = 2):
    prim = st.sampled_from(PRIMS)
    if depth == 0:
        return prim
    inner = types(depth - 1)
    return st.one_of(prim, prim, inner.map(lambda t: f"ARRAY<{t}>"),
                     st.tuples(inner, inner).map(lambda kv: f"MAP<{kv[0]}, {kv[1]}>"),
                     st.lists(st.tuples(NAMES, inner), min_size=0, max_size=3).map(
                         lambda fs: "STRUCT<" + ", ".join(f"{n}: {t}" for n, t in fs) + ">"))


def fields():
    return st.tuples(NAMES, st.sampled_from(["", ":"]), types(), st.sampled_from(["", " NOT NULL"]),
                     st.sampled_from(["", " COMMENT 'c'", ' comment "d"'])).map(
        lambda f: f"{f[0]}{f[1]} {f[2]}{f[3]}{f[4]}")


SCHEMAS = st.lists(fields(), min_size=1, max_size=4).map(", ".join)


@st.composite
def mangled(draw):
    s = draw(SCHEMAS)
    how = draw(st.sampled_from(["keep", "char", "drop", "word"]))
    if how == "keep" or not s:
        return s
    i = draw(st.integers(0, len(s) - 1))
    if how == "char":
        return s[:i] + draw(st.sampled_from(list("x<>(),:` 1'"))) + s[i + 1:]
    if how == "drop":
        return s[:i] + s[i + 1:]
    return s.replace(draw(st.sampled_from(["INT", "BIGINT", "STRING", "DOUBLE", "<", ">"])), "BIGNT", 1)


def _spark_verdict(ddl: str):
    from pyspark.sql import types as T

    try:
        parsed = T._parse_datatype_string(ddl)
    except Exception:  # noqa: BLE001 - a parse error, whatever its class
        return None
    return [f.name for f in parsed.fields] if isinstance(parsed, T.StructType) else None


def _mine(ddl: str):
    try:
        return [f.name for f in parse_schema(ddl)]
    except ValueError:
        return None


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mangled())
@example("`a b` BOOLEAN, `a b` BOOLEAN, `a b` STRING COLLATE TF8_LCASE")  # found 2026-11-27: any name was taken
@example("1 BOOLEAN")  # found 2026-11-28: a name that reads as a number was taken
@example("00_ BOOLEAN, `a b` BOOLEAN, 0_ INT, 1e2_ INT, 12_3 STRING")  # found 2026-11-28: a name after leading digits was cut
@example("a INT, 1e2 INT, 1L STRING, `1` INT, 1e2l INT, 1bd INT, 1_0 INT, 1e INT")
@example("s STRING COLLATE utf8_lcase_rtrim, t STRING COLLATE UNICODE_CI_CS, u STRING COLLATE `UTF8_LCASE`")
def test_the_config_check_agrees_with_spark(spark, ddl):
    assert _mine(ddl) == _spark_verdict(ddl), ddl
