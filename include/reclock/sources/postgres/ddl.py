"""DDL on a published table (pure): what a Relation message whose columns differ from the registered ones
means for the table's collection.

pgoutput sends a table's Relation message again, before its first change under a new definition, whenever
DDL changed it. The columns it names (``(name, type oid, typmod)``, in column order, dropped ones left out)
are compared with the registered ones (:func:`classify`):

==============================================  ==========================================================
change                                          what the collection does
==============================================  ==========================================================
``ADD COLUMN`` (new columns after the others)    flows: the collection's schema gains the columns, nullable,
                                                 at the timestamp of the table's first change under the
                                                 new relation (``reclock.schema_evolution``); rows before
                                                 read back with null there. A column whose old rows hold a
                                                 value (a ``DEFAULT``) is checked upstream (``cdc``).
a type widened without changing any value        flows: ``smallint`` to ``integer`` to ``bigint``;
                                                 ``real`` to ``double precision``; ``varchar(n)`` to
                                                 ``varchar(m)`` (m >= n), ``varchar`` or ``text``; ``text``
                                                 to ``varchar``; ``numeric(p,s)`` to one that holds it
                                                 (more integer digits and scale, or an unconstrained
                                                 ``numeric`` whose collection type holds it); an integer
                                                 to a ``numeric`` that holds it. Parts written before
                                                 keep their type; readers cast them up.
``DROP COLUMN`` (``dropped``)                   flows: the collection's schema loses the column at that
                                                 timestamp; reads after it leave it out of older parts, reads
                                                 before keep it. A column added again later under a dropped
                                                 one's name is another column (``Column.from_ts``: older
                                                 rows read null there, never the dropped one's values)
``RENAME COLUMN`` (``renamed``; told from a      flows: the collection's schema calls the column by its new
``DROP`` and an ``ADD`` by column number: every  name at that timestamp (``Column.renamed_from``); readers
registered column's number live in the catalog   read the parts written before under it (``Column.was``)
as of the write's upper)
a column of the replica identity key dropped,   stall (:class:`~reclock.errors.TableSchemaChanged`), naming
a rename the catalog cannot confirm (it looks    the table, the column, the old and new types and the
like a ``DROP`` and an ``ADD``), columns         command that resolves it (``reclock resnapshot <source>``,
reordered, any other type change (a narrowing,   after giving the table an identity again for a key column)
``text`` to ``integer``, a timestamp's
precision, ...), every column dropped
==============================================  ==========================================================

A Relation message carries no column numbers: ``DROP COLUMN c, ADD COLUMN c`` of the same type, ``c`` last,
with no change of the table between, gives one equal to the one before. :func:`number_columns` checks what
the stream showed against the catalog as of each write's upper (by ``attnum``), which catches it.

Only changes that keep every value the table holds are taken: a type change Postgres makes by rewriting
values (``timestamp(6)`` to ``timestamp(3)`` rounds them, ``char(n)`` pads them) would leave the rows the
collection holds unequal to the table's, and their retractions unmatched, so it stalls. Law
(``tests/unit/test_pg_ddl_classify.py``): every change :func:`classify` lets flow is one
``reclock.schema_evolution.evolve`` takes (the collection's schema of the old columns it keeps evolves into
the new one without an incompatibility).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Sequence

from reclock.schema_evolution import CollectionSchema, Column, evolve
from reclock.schema_projection import spark_type
from reclock.sources.postgres import pgoutput as po

PgColumn = tuple[str, int, int]
"""A published column: ``(name, type oid, typmod)``."""

_INT_DIGITS = {po.INT2: 5, po.INT4: 10, po.INT8: 19}
_INT_ORDER = (po.INT2, po.INT4, po.INT8)
_TEXTS = (po.TEXT, po.VARCHAR)
_NAMES = {po.BOOL: "boolean", po.BYTEA: "bytea", po.NAME: "name", po.INT8: "bigint", po.INT2: "smallint",
          po.INT4: "integer", po.TEXT: "text", po.OID: "oid", po.JSON: "json", po.FLOAT4: "real",
          po.FLOAT8: "double precision", po.DATE: "date", po.UUID: "uuid", po.JSONB: "jsonb"}


def type_text(oid: int, typmod: int) -> str:
    """A column type as Postgres prints it (``integer``, ``varchar(20)``, ``numeric(12,2)``, ...); ``type oid
    N`` for a type this module does not name."""
    if oid in _NAMES:
        return _NAMES[oid]
    if oid in (po.VARCHAR, po.BPCHAR):
        name = "varchar" if oid == po.VARCHAR else "char"
        return f"{name}({typmod - 4})" if typmod >= 4 else name
    if oid == po.NUMERIC:
        ps = po.numeric_precision(typmod)
        return "numeric" if ps is None else f"numeric({ps[0]},{ps[1]})"
    if oid in (po.TIMESTAMP, po.TIMESTAMPTZ):
        name = "timestamp" if oid == po.TIMESTAMP else "timestamptz"
        return f"{name}({typmod})" if typmod >= 0 else name
    return f"type oid {oid}" + (f" (typmod {typmod})" if typmod >= 0 else "")


def collection_schema(columns: Sequence[PgColumn]) -> CollectionSchema:
    """The collection's schema of a table's published columns (every column nullable)."""
    return CollectionSchema(tuple(Column(n, spark_type(po.arrow_type(o, m)), True) for n, o, m in columns))


def relation_json(columns: Sequence[PgColumn]) -> str:
    """A schema version's ``upstream``: the relation's columns, as the registration keeps them."""
    return json.dumps({"columns": [list(c) for c in columns]})


def relation_columns(upstream: str) -> tuple[PgColumn, ...]:
    """The columns a schema version's ``upstream`` (:func:`relation_json`) names (none for another's)."""
    return tuple((str(n), int(o), int(m)) for n, o, m in json.loads(upstream or "{}").get("columns", ()))


def _numeric_holds(old: tuple[int, int] | None, new: tuple[int, int] | None) -> bool:
    """Whether ``numeric(new)`` keeps every value of ``numeric(old)`` as it is (None: unconstrained, whose
    collection type is ``decimal(38,10)``)."""
    if old is None:
        return new is None
    p, s = old
    if new is None:
        return s <= 10 and p - s <= 28  # a value of it fits the unconstrained column's decimal(38,10)
    p2, s2 = new
    return s2 >= s and p2 - s2 >= p - s


def value_preserving(old: tuple[int, int], new: tuple[int, int]) -> bool:
    """Whether a column of type ``old`` (oid, typmod) changed to ``new`` keeps every value it holds, equal
    as the collection holds it (the module's list)."""
    (o, m), (o2, m2) = old, new
    if (o, m) == (o2, m2):
        return True
    if o in _INT_ORDER and o2 in _INT_ORDER:
        return _INT_ORDER.index(o) < _INT_ORDER.index(o2)
    if o == po.FLOAT4 and o2 == po.FLOAT8:
        return True
    if o in _TEXTS and o2 in _TEXTS:
        if o2 == po.TEXT or m2 < 0:
            return True  # to text, or to varchar without a length
        return o == po.VARCHAR and 0 <= m <= m2  # a longer varchar(n)
    if o == po.NUMERIC and o2 == po.NUMERIC:
        return _numeric_holds(po.numeric_precision(m), po.numeric_precision(m2))
    if o in _INT_DIGITS and o2 == po.NUMERIC:
        ps = po.numeric_precision(m2)
        return ps is None or ps[0] - ps[1] >= _INT_DIGITS[o]
    return False


@dataclass(frozen=True)
class RelationChange:
    """What a table's new columns are against its registered ones: the columns ``added`` (at the end),
    those whose type ``changed`` in a way that keeps every value (``(name, old type, new type)``), or why
    the source stalls (``refused``; ``column``, ``old`` and ``new`` name it)."""

    added: tuple[str, ...] = ()
    changed: tuple[tuple[str, str, str], ...] = ()
    dropped: tuple[str, ...] = ()
    refused: str | None = None
    column: str | None = None
    old: str | None = None
    new: str | None = None
    rename_first: bool = False  # a re-snapshot cannot read the values the collection holds as the new type
    key_dropped: bool = False  # a column of the replica identity key was dropped
    renamed: tuple[tuple[str, str], ...] = ()  # (old name, new name) of each column renamed

    def describe(self) -> str:
        """For a schema version's cause and for people: ``DROP COLUMN w; ADD COLUMN z; ALTER COLUMN n TYPE bigint
        (was integer)``."""
        parts = [f"RENAME COLUMN {a} TO {b}" for a, b in self.renamed]
        parts += [f"DROP COLUMN {n}" for n in self.dropped]
        parts += [f"ADD COLUMN {n}" for n in self.added]
        parts += [f"ALTER COLUMN {n} TYPE {new} (was {old})" for n, old, new in self.changed]
        return "; ".join(parts)


def resnapshot_remedy(source: str) -> str:
    """What resolves DDL that does not flow when nothing more is needed: a re-snapshot."""
    return f"run `reclock resnapshot {source}` to take the table as it is now"


def remedy(source: str, table: str, change: RelationChange) -> str:
    """The command that resolves a change that stalls the source: ``reclock resnapshot <source>``, after a
    type change that does not keep every value with the column renamed first (the collection keeps the values
    it holds in the old type, and a re-snapshot cannot read them as the new one; under a new name the column
    is a new one)."""
    if change.key_dropped:
        return (f"give {table} a replica identity again (ALTER TABLE {table} ADD PRIMARY KEY (...), or ALTER TABLE "
                f"{table} REPLICA IDENTITY FULL); then `reclock resnapshot {source}`")
    if change.rename_first:
        return (f"run ALTER TABLE {table} RENAME COLUMN {change.column} TO <a new name>; then `reclock resnapshot "
                f"{source}` (the collection keeps the values it holds as {change.old} and cannot read them as "
                f"{change.new}), or ALTER the column back to {change.old}")
    return resnapshot_remedy(source)


def kept_types_refused(old: Sequence[PgColumn], new: Sequence[PgColumn]) -> RelationChange | None:
    """A re-snapshot from columns ``old`` to ``new``: a column kept by name whose type changed in a way
    the values the collection holds cannot be read as (not a widening of the collection's type), which a
    re-snapshot refuses (:func:`remedy`); None when every kept column reads its old values exactly."""
    have = {n: (o, m) for n, o, m in old}
    for n, o2, m2 in new:
        if n in have and have[n] != (o2, m2):
            was = collection_schema([(n, *have[n])])
            now = collection_schema([(n, o2, m2)])
            if was != now and evolve(was, now, previous=was).incompatible is not None:
                return RelationChange(refused=f"column {n} changed type from {type_text(*have[n])} to "
                                      f"{type_text(o2, m2)}", column=n, old=type_text(*have[n]),
                                      new=type_text(o2, m2), rename_first=True)
    return None


def classify(old: Sequence[PgColumn], new: Sequence[PgColumn], key: Sequence[str] = (),
             attnums: Sequence[int] | None = None, catalog: "CatalogTable | None" = None) -> RelationChange:
    """The change from the registered columns ``old`` to a Relation message's ``new`` (see the module;
    ``key``: the table's replica identity key, whose columns may not be dropped).

    With the registered columns' numbers (``attnums``) and the table in the catalog as of the write's upper
    (``catalog``), renames are told apart from a ``DROP`` and an ``ADD``: when every registered column's
    number is live at the upper, none was dropped before this Relation message (Postgres never reuses a
    number), and a Relation message lists the live columns in column-number order with the added ones
    last, so its first ``len(old)`` columns are the registered ones, in order, under the names they have
    now: a different name there is a rename (``renamed``), whatever happens to that name after; the rest
    were added (a column added under a renamed one's old name among them). Otherwise, by name: a name
    gone and another come stall, as they cannot be told apart."""
    if attnums is not None and catalog is not None and len(new) >= len(old):
        live = {a for _, a in catalog.live}
        if all(a in live for a in attnums):
            renamed = tuple((o[0], n[0]) for o, n in zip(old, new) if o[0] != n[0])
            if renamed:
                to = dict(renamed)
                change = classify([(to.get(n, n), o, m) for n, o, m in old], new, [to.get(k, k) for k in key])
                return replace(change, renamed=renamed)
    old_names = [n for n, _, _ in old]
    new_names = [n for n, _, _ in new]
    by_name = {n: (o, m) for n, o, m in new}
    gone = [(i, c) for i, c in enumerate(old) if c[0] not in by_name]
    came = [c for c in new if c[0] not in old_names]
    for i, (n, o, m) in gone:
        was = type_text(o, m)
        if came:  # a rename and a DROP + ADD look alike: both a name gone and another come
            there = new[i] if i < len(new) and new[i][0] not in old_names else came[0]
            return RelationChange(refused=f"column {n} ({was}) was renamed to {there[0]} ({type_text(*there[1:])}), "
                                  "or dropped and another added in its place (the two cannot be told apart in "
                                  "one Relation message)", column=n, old=was, new=f"{there[0]} {type_text(*there[1:])}")
        if n in key:
            return RelationChange(refused=f"column {n} ({was}) of its replica identity key ({', '.join(key)}) was "
                                  "dropped: its updates and deletes can no longer name their rows", column=n,
                                  old=was, new="dropped", key_dropped=True)
    kept = [n for n in old_names if n in by_name]
    if not kept:
        return RelationChange(refused=f"every column it had ({', '.join(old_names)}) was dropped")
    if new_names[:len(kept)] != kept:
        return RelationChange(refused=f"its columns were reordered ({', '.join(old_names)} -> "
                              f"{', '.join(new_names)})")
    changed = []
    for n, o, m in old:
        if n not in by_name:
            continue
        o2, m2 = by_name[n]
        if (o, m) == (o2, m2):
            continue
        was, now = type_text(o, m), type_text(o2, m2)
        if not value_preserving((o, m), (o2, m2)):
            return RelationChange(refused=f"column {n} changed type from {was} to {now}, a change that does not "
                                  "keep every value the collection holds (a narrowing, another type, or values "
                                  "Postgres rewrote)", column=n, old=was, new=now,
                                  rename_first=kept_types_refused([(n, o, m)], [(n, o2, m2)]) is not None)
        changed.append((n, was, now))
    return RelationChange(added=tuple(new_names[len(kept):]), changed=tuple(changed),
                          dropped=tuple(c[0] for _, c in gone))


@dataclass(frozen=True)
class CatalogTable:
    """A table's columns in the catalog as of a binding's upper (read by the mint under an ``ACCESS SHARE``
    lock, ``PostgresUpstream.catalog_upper``): its live columns ``(name, attnum)`` and the numbers of its
    dropped columns (a dropped column keeps its number; Postgres never reuses one)."""

    live: tuple[tuple[str, int], ...]
    dropped: tuple[int, ...] = ()

    def to_json(self) -> dict:
        return {"live": [list(c) for c in self.live], "dropped": list(self.dropped)}

    @staticmethod
    def from_json(d: dict) -> "CatalogTable":
        return CatalogTable(tuple((str(n), int(a)) for n, a in d["live"]), tuple(int(a) for a in d.get("dropped", ())))


@dataclass(frozen=True)
class Numbering:
    """The outcome of :func:`number_columns`: each column the stream ends with its column number
    (``attnums``, in the columns' order; None: not known yet), the highest number accounted for (``upto``), or why the source
    stalls (``refused``, naming ``column``)."""

    attnums: tuple[int, ...] | None = ()
    upto: int = 0
    refused: str | None = None
    column: str | None = None


def number_columns(columns: Sequence[str], attnums: Sequence[int] | None, upto: int | None,
                   relations: Sequence[Sequence[str]], catalog: CatalogTable,
                   column_list: Sequence[str] | None = None,
                   renamed: Sequence[Sequence[tuple[str, str]]] = ()) -> Numbering:
    """Whether what a write's stream showed of a table agrees with the catalog as of the write's upper, by
    column number (``attnum``), which a Relation message does not carry.

    ``columns``/``attnums``/``upto``: the table as registered before the write (its columns' numbers, None for a
    registration older than them; the highest number accounted for); ``relations``: the column names of each
    Relation message of other columns the write adopted, in order; ``catalog``: the table at the upper;
    ``renamed``: for each of ``relations``, the ``(old, new)`` names of the columns :func:`classify` found
    renamed in it (a renamed column keeps its number; under its new name it must not be live at another).

    Every column number above ``upto`` was taken by an ``ADD COLUMN`` since. The n-th column the stream saw
    added took the n-th of them: it must be live under that name at the upper, or dropped if the stream saw it
    dropped. A column carried over from the registration keeps its number: its name live at another number
    means it was dropped and added again where no Relation message showed it (a stall, never a guess). The
    numbers after the ones the stream explains are columns added with no change of the table since (live:
    a later Relation message shows them) or added and dropped again, which is harmless only when no column
    the stream knew was dropped in the write (else the dropped one may have been a silent re-add that rows
    were written to). Law: ``tests/unit/test_pg_attnum_law.py``."""
    live = dict(catalog.live)
    named = {a: n for n, a in catalog.live}
    dropped = set(catalog.dropped)
    ends = list(relations[-1]) if relations else list(columns)
    if attnums is None:  # a registration older than column numbers: take the catalog's where the names agree
        if any(n not in live for n in ends):  # a drop a later Relation message shows: number them then
            return Numbering(None, upto or 0)
        got = tuple(live[n] for n in ends)
        return Numbering(got, max([upto or 0, *got]))
    known = dict(zip(columns, attnums))
    upto = upto or 0
    source: dict[str, int | None] = {n: None for n in columns}  # None: carried over; i: the i-th add
    orig = {n: n for n in columns}  # a carried-over column's name now -> its registered name
    adds: list[list] = []  # [name, still there]
    carried_dropped = False
    for k, rel in enumerate(relations):
        for a, b in (renamed[k] if k < len(renamed) else ()):  # a rename the write told apart (classify)
            source[b] = source.pop(a)
            if source[b] is None:
                orig[b] = orig.pop(a)
            else:
                adds[source[b]][0] = b
        for n in [n for n in source if n not in rel]:
            if source[n] is None:
                carried_dropped = True
            else:
                adds[source[n]][1] = False
            del source[n]
        for n in rel:
            if n not in source:
                source[n] = len(adds)
                adds.append([n, True])
    for n, i in source.items():
        if i is None and n in live and live[n] != known[orig[n]]:
            return Numbering(refused=f"column {n} was dropped and added again where no Relation message showed it "
                             f"(its column number is {live[n]} in the catalog at this binding's upper, "
                             f"{known[orig[n]]} when it was registered): the rows the table holds in it are not the "
                             "ones the collection holds", column=n)
    if column_list is not None:  # a column re-added to a column list redefines the publication: only names
        return Numbering(tuple(known[orig[n]] if source[n] is None else live.get(n, 0) for n in ends), upto)
    taken = sorted(a for a in (*named, *dropped) if a > upto)
    if len(adds) > len(taken):
        return Numbering(refused=f"the stream showed {len(adds)} column(s) added, the catalog at this binding's "
                         f"upper {len(taken)} column number(s) taken since", column=adds[-1][0])
    for (n, there), a in zip(adds, taken):
        if (named.get(a) == n) if there else (a in dropped):
            continue
        return Numbering(refused=f"column {n}, which the stream showed {'added' if there else 'added and dropped'}, "
                         f"is not column number {a} of the catalog at this binding's upper "
                         f"({'dropped' if a in dropped else named.get(a)}): a column was dropped and added again "
                         "where no Relation message showed it", column=n)
    disturbed = carried_dropped or any(not there for _, there in adds) or any(
        known[orig[n]] in dropped for n, i in source.items() if i is None)
    settled = len(adds)
    for a in taken[len(adds):]:
        if a in named:
            break  # added with no change of the table since: a later Relation message shows it
        if disturbed:
            return Numbering(refused=f"a column (number {a}) was added and dropped again, and a column the stream "
                             "knew was dropped: whether it was one of them added again, with rows written to it, "
                             "cannot be told", column=None)
        settled += 1
    got = tuple(known[orig[n]] if source[n] is None else taken[source[n]] for n in ends)
    return Numbering(got, taken[settled - 1] if settled else upto)
