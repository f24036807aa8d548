"""Renames in a collection's schema history (``reclock.schema_evolution``: ``Column.renamed_from``,
``SchemaHistory.read_as``'s ``Column.was``, ``rename_refused``) and reads across parts of several schemas
(``reclock.schema_projection.project_table``). A model collection takes ``ADD``, ``DROP`` and ``RENAME`` of
columns (several at one timestamp too, as one write's versions are), each column an identity of its own,
and a part of rows at each timestamp written with the columns of its time, by their names then. Law: AS OF
every time, every part read through the history equals the model: each live column under its name of that
time holds the values its own identity was written with, null where the row was written before the column
came; never a value of another column of one of its names. A rename the history refuses
(``rename_refused``: the source stalls) is left out of the model."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.schema_evolution import CollectionSchema, Column, SchemaHistory
from reclock.schema_projection import part_schema, project_table

NAMES = ("a", "b", "c")
OP = st.one_of(st.tuples(st.just("add"), st.sampled_from(NAMES), st.just("")),
               st.tuples(st.just("drop"), st.sampled_from(NAMES), st.just("")),
               st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)))
STEPS = st.lists(st.lists(OP, max_size=3), min_size=1, max_size=8)  # the DDL before each timestamp's part


def _schema(live: list[tuple[int, str]], renamed: dict[int, str]) -> CollectionSchema:
    return CollectionSchema(tuple(Column(n, "string", True, renamed_from=renamed.get(i)) for i, n in live))


def _part(live, ts: int, tag: str) -> tuple[int, dict, pa.Table]:
    rows = {n: pa.array([f"{i}:{ts}{tag}:{k}" for k in range(2)]) for i, n in live}
    rows["ts"] = pa.array([ts, ts], pa.int64())
    return ts, {i: f"{i}:{ts}{tag}" for i, _ in live}, pa.table(rows)


def _replay(steps):
    """(history, parts, truth): parts are ``(ts, values by identity, table)``: at each timestamp one written
    before its DDL (the write's changes before it, at the same timestamp) and one after; truth(t) the rows a
    read AS OF t gives."""
    live: list[tuple[int, str]] = [(0, "id")]  # (identity, name), in column order
    nxt, history, parts, lives = 1, SchemaHistory(), [], []
    for ts, ops in enumerate(steps):
        if ops and history.versions:
            parts.append(_part(live, ts, "p"))
        before = dict(live)
        renamed: dict[int, str] = {}  # identity -> its name before this ts (renamed at this ts)
        for op, name, new in ops:
            names = [n for _, n in live]
            if op == "add" and name not in names:
                live.append((nxt, name))
                nxt += 1
            elif op == "drop" and name in names:
                live = [(i, n) for i, n in live if n != name]
            elif op == "rename" and name in names and new not in names:
                ident = next(i for i, n in live if n == name)
                was = renamed.get(ident, name) if ident in before else None
                if was is not None and history.versions and history.rename_refused(was, new) is not None:
                    continue  # the source stalls: left out
                if was is not None:
                    renamed.pop(ident, None)
                    if was != new:
                        renamed[ident] = was
                live = [(i, new if i == ident else n) for i, n in live]
        now = {n: i for i, n in live}
        if any(n in now and now[n] != i for i, n in before.items()):
            if parts and parts[-1][0] == ts:
                parts.pop()
            break  # a column dropped or renamed away and another come under its name at one timestamp: the
            # source stalls (cdc: the parts of that timestamp would hold both under it)
        schema = _schema(live, {i: w for i, w in renamed.items() if i in dict(live)})
        if not history.versions or schema != history.latest():
            history = history.with_change(ts, schema)
        lives.append(list(live))
        parts.append(_part(live, ts, ""))

    def truth(t: int) -> list[dict]:
        out = []
        for ts, values, _ in parts:
            if ts <= t:
                for k in range(2):
                    out.append({n: (f"{values[i]}:{k}" if i in values else None) for i, n in lives[t]} | {"ts": ts})
        return out

    return history, parts, truth, len(lives)


@settings(max_examples=150, deadline=None)
@given(STEPS)
def test_every_read_takes_each_column_from_its_own_identity(steps):
    history, parts, truth, times = _replay(steps)
    for t in range(times):
        target = history.read_as(t)
        got = []
        for ts, _, table in [p for p in parts if p[0] <= t]:
            names = [n for n in table.column_names if n != "ts"]
            got += project_table(table, part_schema(table.schema, names), target, keep=("ts",)).to_pylist()
        assert got == truth(t), f"AS OF {t}: {history}"


def test_a_rename_and_a_column_added_later_under_its_old_name_are_told_apart():
    old = CollectionSchema((Column("id", "int"), Column("a", "string")))
    renamed = CollectionSchema((Column("id", "int"), Column("b", "string", renamed_from="a")))
    added = CollectionSchema((Column("id", "int"), Column("b", "string"), Column("a", "string")))
    history = SchemaHistory().with_change(0, old).with_change(5, renamed).with_change(7, added)
    read = history.read_as(7)
    assert read.column("b").was == ("a",) and read.column("b").from_ts is None
    assert read.column("a").was == () and read.column("a").from_ts == 7
    before = pa.table({"id": pa.array([1], pa.int32()), "a": ["old"], "ts": pa.array([1], pa.int64())})
    got = project_table(before, part_schema(before.schema, ["id", "a"]), read, keep=("ts",)).to_pylist()
    assert got == [{"id": 1, "b": "old", "a": None, "ts": 1}]
    assert CollectionSchema.from_json(renamed.to_json()) == renamed


def test_a_rename_to_a_name_another_column_held_is_refused():
    history = SchemaHistory().with_change(0, CollectionSchema((Column("a", "string"), Column("b", "string")))) \
        .with_change(3, CollectionSchema((Column("a", "string"),)))
    assert "another column was named b" in history.rename_refused("a", "b")
    assert history.rename_refused("a", "c") is None
    back = history.with_change(4, CollectionSchema((Column("c", "string", renamed_from="a"),)))
    assert back.rename_refused("c", "a") is None  # its own earlier name
