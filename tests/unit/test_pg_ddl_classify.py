"""DDL on a published table (``reclock.sources.postgres.ddl``): which changes flow and which stall, and the
law that every change that flows is one the shared schema evolution takes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reclock.schema_evolution import evolve
from reclock.sources.postgres import ddl
from reclock.sources.postgres import pgoutput as po


def _num(p: int, s: int) -> int:
    return (p << 16 | s) + 4


def _vc(n: int) -> int:
    return n + 4


BASE = (("id", po.INT8, -1), ("v", po.VARCHAR, _vc(10)), ("c", po.INT4, -1), ("amount", po.NUMERIC, _num(8, 2)),
        ("w", po.TEXT, -1))


def _with(name: str, oid: int, typmod: int = -1) -> tuple:
    return tuple((n, oid, typmod) if n == name else (n, o, m) for n, o, m in BASE)


def test_added_columns_and_value_keeping_type_changes_flow():
    change = ddl.classify(BASE, BASE + (("z", po.INT4, -1), ("y", po.TEXT, -1)))
    assert change.refused is None and change.added == ("z", "y") and change.describe() == "ADD COLUMN z; ADD COLUMN y"
    for name, oid, typmod, was, now in [("c", po.INT8, -1, "integer", "bigint"), ("v", po.TEXT, -1, "varchar(10)", "text"),
                                        ("v", po.VARCHAR, _vc(20), "varchar(10)", "varchar(20)"),
                                        ("amount", po.NUMERIC, _num(12, 4), "numeric(8,2)", "numeric(12,4)"),
                                        ("amount", po.NUMERIC, -1, "numeric(8,2)", "numeric"),
                                        ("c", po.NUMERIC, _num(12, 2), "integer", "numeric(12,2)")]:
        change = ddl.classify(BASE, _with(name, oid, typmod))
        assert change.refused is None and change.changed == ((name, was, now),), (name, oid, typmod)


def test_dropped_columns_flow_unless_of_the_key_or_every_one():
    change = ddl.classify(BASE, tuple(c for c in BASE if c[0] not in ("v", "w")), key=("id",))
    assert change.refused is None and change.dropped == ("v", "w") and change.added == ()
    assert change.describe() == "DROP COLUMN v; DROP COLUMN w"
    change = ddl.classify(BASE, BASE[1:], key=("id",))
    assert change.refused.startswith("column id (bigint) of its replica identity key (id) was dropped")
    remedy = ddl.remedy("s", "public.t", change)
    assert "REPLICA IDENTITY FULL" in remedy and remedy.endswith("then `reclock resnapshot s`")
    assert ddl.classify(BASE, BASE[1:]).dropped == ("id",)  # identity FULL: no key
    assert ddl.classify(BASE, ()).refused.startswith("every column it had")
    # a name gone and another come in one Relation: a rename or a DROP + ADD, which cannot be told apart
    change = ddl.classify(BASE, BASE[:2] + BASE[3:] + (("c2", po.INT4, -1),))
    assert change.refused.startswith("column c (integer) was renamed to c2 (integer), or dropped and another added")


def test_renames_narrowings_and_other_types_stall_naming_column_and_types():
    cases = [
        (_with("w", po.TEXT)[:4] + (("w2", po.TEXT, -1),), "column w (text) was renamed to w2 (text)", None),
        (_with("c", po.INT2), "column c changed type from integer to smallint", True),
        (_with("w", po.INT4), "column w changed type from text to integer", True),
        (_with("v", po.VARCHAR, _vc(5)), "column v changed type from varchar(10) to varchar(5)", False),
        (_with("amount", po.NUMERIC, _num(8, 1)), "column amount changed type from numeric(8,2) to numeric(8,1)", True),
        (_with("amount", po.NUMERIC, _num(7, 2)), "column amount changed type from numeric(8,2) to numeric(7,2)", True),
        (BASE[1:2] + BASE[:1] + BASE[2:], "its columns were reordered", None),
    ]
    for new, message, rename_first in cases:
        change = ddl.classify(BASE, new)
        assert change.refused is not None and change.refused.startswith(message), (message, change)
        remedy = ddl.remedy("s", "public.t", change)
        assert "`reclock resnapshot s`" in remedy
        if rename_first:
            assert remedy.startswith(f"run ALTER TABLE public.t RENAME COLUMN {change.column} TO <a new name>")
        elif rename_first is False:
            assert remedy == "run `reclock resnapshot s` to take the table as it is now"
    # a timestamp's precision and char(n) rewrite values: they stall, and a re-snapshot alone resolves them
    ts = (("t", po.TIMESTAMP, 6),)
    assert ddl.classify(ts, (("t", po.TIMESTAMP, 3),)).refused is not None
    assert ddl.kept_types_refused(ts, (("t", po.TIMESTAMP, 3),)) is None


TYPES = [(po.INT2, -1), (po.INT4, -1), (po.INT8, -1), (po.FLOAT4, -1), (po.FLOAT8, -1), (po.TEXT, -1),
         (po.VARCHAR, -1), (po.VARCHAR, _vc(5)), (po.VARCHAR, _vc(50)), (po.NUMERIC, -1), (po.NUMERIC, _num(8, 2)),
         (po.NUMERIC, _num(12, 4)), (po.NUMERIC, _num(20, 0)), (po.NUMERIC, _num(30, 12)), (po.BOOL, -1),
         (po.DATE, -1), (po.TIMESTAMP, -1), (po.TIMESTAMPTZ, -1), (po.BYTEA, -1), (po.JSONB, -1)]


@given(st.sampled_from(TYPES), st.sampled_from(TYPES), st.integers(0, 2), st.booleans())
def test_law_every_change_that_flows_is_one_schema_evolution_takes(old, new, added, drop):
    before = (("id", po.INT8, -1), ("x", *old), ("d", po.TEXT, -1))
    after = (("id", po.INT8, -1), ("x", *new)) + (() if drop else (("d", po.TEXT, -1),)) + tuple(
        (f"a{i}", po.TEXT, -1) for i in range(added))
    change = ddl.classify(before, after)
    if drop and added:
        assert change.refused is not None  # a name gone and others come: a rename or not, cannot be told
        return
    if change.refused is None:
        assert change.dropped == (("d",) if drop else ())
        kept = tuple(c for c in before if c[0] not in change.dropped)  # a dropped column: left out of reads after
        was, now = ddl.collection_schema(kept), ddl.collection_schema(after)
        evolution = evolve(was, now, previous=was)
        assert evolution.incompatible is None and evolution.schema == now, (old, new)
        assert ddl.kept_types_refused(before, after) is None
    assert (change.refused is None) == (old == new or ddl.value_preserving(old, new))
