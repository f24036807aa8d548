"""Renames told apart from a ``DROP`` and an ``ADD`` (``reclock.sources.postgres.ddl.classify`` with the
registered column numbers and the catalog as of the write's upper, then ``number_columns`` with the renames it
found). A model table takes ``ADD``, ``DROP`` and ``RENAME COLUMN`` (to any name, an old one too), changes
(the stream then shows its columns by name, in column-number order, as a Relation message does) and cuts
into writes at random uppers; the decoder classifies each Relation message a write shows as the source does.
Laws: a column the stream takes for a registered one (renamed or not) is that column, and one it takes for
an added column is none of them (a rename and a column added under the renamed one's old name in one window
are never confused), else the write is refused, never passed; the numbers passed are the true ones; a
history of renames and changes only is never refused."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.sources.postgres import ddl

NAMES = ("a", "b", "c")
OPS = st.lists(st.one_of(st.tuples(st.sampled_from(["add", "drop"]), st.sampled_from(NAMES), st.just("")),
                         st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
                         st.just(("dml", "", "")), st.just(("cut", "", ""))), max_size=24)


def _cols(names):
    return tuple((n, 23, -1) for n in names)


def _write(reg, shown, live, dropped):
    """The decoder over one write: ``reg`` = (names, attnums, upto); ``shown``: each Relation message as
    ``[(name, true attnum)]``. Returns (refused, wrong, numbering)."""
    names, nums, upto = reg
    catalog = ddl.CatalogTable(tuple(live.items()), tuple(sorted(dropped)))
    cur, cur_nums = list(names), list(nums)
    ident: dict[str, int | None] = dict(zip(names, nums))  # the stream's belief: a registered number, None: added
    relations, renamed, wrong = [], [], False
    for rel in shown:
        new = [n for n, _ in rel]
        if new == cur:
            continue
        change = ddl.classify(_cols(cur), _cols(new), (), cur_nums, catalog)
        if change.refused is not None:
            return True, wrong, None
        to = dict(change.renamed)
        ident = {to.get(n, n): i for n, i in ident.items()}
        ident = {n: ident.get(n) if n not in change.added else None for n in new}
        truth = dict(rel)
        for n in new:  # a change written now goes to the column the stream takes it for
            wrong = wrong or (ident[n] is not None and ident[n] != truth[n]) or (ident[n] is None and truth[n] in nums)
        relations.append(tuple(new))
        renamed.append(change.renamed)
        cur = new
        cur_nums = None if change.added or cur_nums is None else [ident[n] for n in new]
    got = ddl.number_columns(list(names), list(nums), upto, relations, catalog, renamed=renamed)
    return got.refused is not None, wrong, got


def _run(ops):
    live = {"id": 1, "a": 2}  # name -> attnum (the catalog)
    dropped: set[int] = set()
    nxt = 3
    reg = (["id", "a"], [1, 2], 2)
    shown: list[list[tuple[str, int]]] = []
    wrong_seen = False
    for op, name, new in [*ops, ("cut", "", "")]:
        if op == "add" and name not in live:
            live[name], nxt = nxt, nxt + 1
        elif op == "drop" and name in live and len(live) > 2:
            dropped.add(live.pop(name))
        elif op == "rename" and name in live and new not in live and name != "id":
            live[new] = live.pop(name)
        elif op == "dml":
            shown.append(sorted(live.items(), key=lambda x: x[1]))
        elif op == "cut":
            refused, wrong, got = _write(reg, shown, live, dropped)
            wrong_seen = wrong_seen or wrong
            if refused:
                return True, wrong_seen
            assert not wrong, "a change written to a column the stream took for another passed"
            ends = [n for n, _ in shown[-1]] if shown else reg[0]
            truth = dict(shown[-1]) if shown else dict(zip(reg[0], reg[1]))
            assert list(got.attnums) == [truth[n] for n in ends], "the numbers passed are the true ones"
            reg, shown = (ends, list(got.attnums), got.upto), []
    return False, wrong_seen


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_a_rename_is_never_taken_for_an_add_nor_an_add_for_a_rename(ops):
    _run(ops)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
                          st.just(("dml", "", "")), st.just(("cut", "", ""))), max_size=24))
def test_a_history_of_renames_is_never_refused(ops):
    refused, _ = _run(ops)
    assert not refused


def test_a_rename_and_a_column_added_under_the_old_name_in_one_window_are_told_apart():
    catalog = ddl.CatalogTable((("id", 1), ("b", 2), ("a", 3)))
    change = ddl.classify(_cols(["id", "a"]), _cols(["id", "b", "a"]), (), [1, 2], catalog)
    assert change.renamed == (("a", "b"),) and change.added == ("a",) and change.refused is None
    got = ddl.number_columns(["id", "a"], [1, 2], 2, [("id", "b", "a")], catalog, renamed=[change.renamed])
    assert got.refused is None and got.attnums == (1, 2, 3)
    # the same Relation message after a DROP a, ADD b, ADD a: the numbers say so, and it is not a rename
    dropped = ddl.CatalogTable((("id", 1), ("b", 3), ("a", 4)), (2,))
    assert ddl.classify(_cols(["id", "a"]), _cols(["id", "b", "a"]), (), [1, 2], dropped).refused is not None
