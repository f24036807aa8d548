"""Schemas that change (pure): a collection's columns over time, and which upstream changes it can take.

Shared by every source kind: a Kafka source whose writer schemas evolve in a registry, a JSON source whose
declared schema the user changes, a Postgres source whose tables change by DDL. Each kind maps its own
schema (Avro, JSON Schema, Spark DDL, a Postgres relation) to a :class:`CollectionSchema` of Spark SQL type
strings (``DataType.simpleString()``: ``bigint``, ``decimal(10,2)``, ``struct<a:int,b:string>``, ...), and
asks :func:`evolve` what the collection becomes.

The rules (DESIGN.md, "Schemas change"):

- a new column, or a new field of a struct column: compatible; it is nullable in the collection (rows
  before it have none);
- a type widened (``tinyint`` < ``smallint`` < ``int`` < ``bigint``; ``float`` < ``double``; any integer or
  ``float`` to ``double``; ``decimal(p,s)`` to one that holds it; ``date`` to ``timestamp``): compatible,
  the column takes the wider type, and parts written before keep theirs (readers cast them up);
- a column that becomes nullable: compatible; a column the upstream stops sending: compatible when it is
  nullable in the collection (later rows have null there), else **incompatible** ("a required field
  removed");
- a type the upstream *narrows* from its previous version (``previous`` given: ``bigint`` to ``int``), or
  changes to an unrelated type (``string`` to ``int``): **incompatible**; the source stalls
  (:class:`~reclock.errors.SchemaIncompatible`). A narrower type from an older writer that is still
  writing (no ``previous``, or ``previous`` itself narrower) fits the collection as it is.

A Postgres ``DROP COLUMN`` is the one change that takes a column out of a collection's schema (a version
without it: reads at and after it leave the column out); a column of the same name in a later version is
another column (``Column.from_ts``, set by :meth:`SchemaHistory.read_as`).

A collection's :class:`SchemaHistory` records each change at the timestamp of the first update that
carries it; a read AS OF t uses the schema in force at t, and each part is read through
:func:`projection` from the schema it was written with to that one.

Laws (``tests/unit/test_schema_evolution.py``, hypothesis): ``evolve(s, s)`` changes nothing; when
``evolve(c, x)`` gives ``c2``, then ``evolve(c2, x)`` changes nothing (idempotent), every column of ``c``
is in ``c2`` with a type it widens to (old parts stay readable), and every column of ``x`` fits ``c2``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Sequence

_INTS = ("tinyint", "smallint", "int", "bigint")
_FLOATS = ("float", "double")
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


@dataclass(frozen=True)
class Column:
    """A column of a collection: its name, Spark SQL type string and whether it may be null. ``from_ts``
    (set by :meth:`SchemaHistory.read_as` only): the column is another one than an earlier column of its name
    that a version in between dropped (a Postgres ``DROP COLUMN`` and an ``ADD COLUMN`` of the same name), so
    a read takes its values from the updates at ``ts >= from_ts`` only; an update before holds the old
    column's value there, and reads null (as the table shows the rows it held when the column came).

    ``renamed_from`` (recorded in a version): the column is the one the version before named so (a Postgres
    ``RENAME COLUMN``). ``was`` (set by :meth:`SchemaHistory.read_as` only): the names the column had before,
    newest first, under which parts written before a rename hold its values (:func:`source_names`)."""

    name: str
    type: str
    nullable: bool = True
    from_ts: int | None = None
    renamed_from: str | None = None
    was: tuple[str, ...] = ()


@dataclass(frozen=True)
class CollectionSchema:
    """A collection's user columns, in order."""

    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"a schema names a column twice: {names}")

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def to_json(self) -> str:
        return json.dumps([[c.name, c.type, c.nullable] + ([c.renamed_from] if c.renamed_from else [])
                           for c in self.columns])

    @staticmethod
    def from_json(text: str) -> "CollectionSchema":
        return CollectionSchema(tuple(Column(n, t, bool(nl), renamed_from=(rest[0] if rest else None))
                                      for n, t, nl, *rest in json.loads(text)))


def _lineage_name(part: "CollectionSchema", column: Column) -> str | None:
    for name in (column.name, *column.was):
        if part.column(name) is not None:
            return name
    return None


def source_names(part: "CollectionSchema", target: "CollectionSchema") -> dict[str, str | None]:
    """For each column of ``target``, the name under which a part written with ``part`` holds its values (None:
    the part has none): its own name, else the newest of the names it had before a rename (``Column.was``)
    that the part has. A part's column that a target column takes under an earlier name is that column's,
    not the one of its name now when that one is another column than an earlier one of its name
    (``Column.from_ts``: a ``RENAME COLUMN a TO b`` and an ``ADD COLUMN a`` at one time, where a part written
    before holds ``b``'s values under ``a``, and the new ``a`` reads null there)."""
    found = {c.name: _lineage_name(part, c) for c in target.columns}
    claimed = {src for name, src in found.items() if src is not None and src != name}
    # only a column another one was before its own lineage began can be the one claimed (Column.from_ts)
    return {c.name: (None if found[c.name] == c.name and c.name in claimed and c.from_ts is not None
                     else found[c.name]) for c in target.columns}


# -- Spark type strings -------------------------------------------------------------------------------------

def _split_top(text: str, sep: str = ",") -> list[str]:
    """``text`` split at ``sep`` outside <>, () and backquotes."""
    out, depth, cur, quoted = [], 0, [], False
    for ch in text:
        if ch == "`":
            quoted = not quoted
        elif not quoted and ch in "<(":
            depth += 1
        elif not quoted and ch in ">)":
            depth -= 1
        if ch == sep and depth == 0 and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out]


def struct_fields(t: str) -> list[tuple[str, str]] | None:
    """The ``(name, type)`` fields of a ``struct<...>`` type string, else None."""
    t = t.strip()
    if not (t.startswith("struct<") and t.endswith(">")):
        return None
    inner = t[len("struct<"):-1]
    if not inner.strip():
        return []
    fields = []
    for part in _split_top(inner):
        name, _, ftype = part.partition(":") if not part.startswith("`") else _quoted_field(part)
        fields.append((name.strip("`"), ftype.strip()))
    return fields


def _quoted_field(part: str) -> tuple[str, str, str]:
    end = part.index("`", 1)
    while end + 1 < len(part) and part[end + 1] == "`":  # a doubled backquote inside the name
        end = part.index("`", end + 2)
    return part[1:end].replace("``", "`"), ":", part[end + 2:]


def _struct(fields: Sequence[tuple[str, str]]) -> str:
    def name(n: str) -> str:
        return n if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", n) else "`" + n.replace("`", "``") + "`"

    return "struct<" + ",".join(f"{name(n)}:{t}" for n, t in fields) + ">"


def _container(t: str, kind: str) -> list[str] | None:
    t = t.strip()
    if t.startswith(kind + "<") and t.endswith(">"):
        return _split_top(t[len(kind) + 1:-1])
    return None


class _Incompatible(Exception):
    def __init__(self, path: str, change: str, old: str, new: str) -> None:
        self.path, self.change, self.old, self.new = path, change, old, new
        super().__init__(f"{path}: {change}")


def widen(old: str, new: str, path: str, previous: str | None = None) -> str:
    """The type a column of type ``old`` takes when rows of type ``new`` arrive (``previous``: the type the
    upstream had before ``new``, to tell a narrowing); :class:`_Incompatible` when it cannot."""
    old, new = old.strip(), new.strip()
    if previous is not None and previous.strip() != new and _narrower(new, previous.strip()):
        raise _Incompatible(path, "type narrowed", previous.strip(), new)
    if old == new:
        return old
    if _narrower(new, old):  # an older, narrower writer still writing: its values fit
        return old
    if _narrower(old, new):
        return new
    of, nf = struct_fields(old), struct_fields(new)
    if of is not None and nf is not None:
        prev = dict(struct_fields(previous) or []) if previous else {}
        merged = dict(of)
        order = [n for n, _ in of]
        for n, t in nf:
            if n in merged:
                merged[n] = widen(merged[n], t, f"{path}.{n}", prev.get(n))
            else:
                merged[n] = t
                order.append(n)
        return _struct([(n, merged[n]) for n in order])
    for kind in ("array", "map"):
        oc, nc = _container(old, kind), _container(new, kind)
        if oc is not None and nc is not None and len(oc) == len(nc):
            pc = _container(previous, kind) if previous else None
            parts = [widen(o, n, f"{path}[]" if kind == "array" else f"{path}{{}}",
                           pc[i] if pc and len(pc) == len(oc) else None) for i, (o, n) in enumerate(zip(oc, nc))]
            return f"{kind}<{','.join(parts)}>"
    raise _Incompatible(path, "type changed", old, new)


def _narrower(a: str, b: str) -> bool:
    """Whether every value of type ``a`` is a value of type ``b`` and ``a != b`` (primitives only)."""
    if a == b:
        return False
    if a in _INTS and b in _INTS:
        return _INTS.index(a) < _INTS.index(b)
    if a in _INTS + ("float",) and b == "double":
        return True
    if a in ("tinyint", "smallint") and b == "float":
        return True
    if a == "date" and b == "timestamp":
        return True
    da, db = _DECIMAL.match(a), _DECIMAL.match(b)
    if da and db:
        (pa, sa), (pb, sb) = map(int, da.groups()), map(int, db.groups())
        return (pa, sa) != (pb, sb) and sb >= sa and pb - sb >= pa - sa
    if a in _INTS and db:
        p, s = map(int, db.groups())
        return p - s >= {"tinyint": 3, "smallint": 5, "int": 10, "bigint": 19}[a]
    return False


@dataclass(frozen=True)
class Incompatibility:
    """Why a collection cannot take an upstream schema: the field's path, the change, old and new types."""

    field: str
    change: str
    old: str
    new: str

    def describe(self) -> str:
        return f"field {self.field!r} {self.change} (from {self.old} to {self.new})"


@dataclass(frozen=True)
class Evolution:
    """What :func:`evolve` found: the collection's schema after the change (``schema``), and the columns
    added and widened, or the :class:`Incompatibility` that stops it."""

    schema: CollectionSchema
    added: tuple[str, ...] = ()
    widened: tuple[str, ...] = ()
    incompatible: Incompatibility | None = None

    @property
    def changed(self) -> bool:
        return bool(self.added or self.widened) or self.incompatible is not None


def evolve(current: CollectionSchema, incoming: CollectionSchema,
           previous: CollectionSchema | None = None) -> Evolution:
    """The collection ``current`` taking rows of ``incoming`` (an upstream schema; ``previous``: the upstream
    schema ``incoming`` replaces, to tell a narrowing). The rules are the module's."""
    cols = {c.name: c for c in current.columns}
    order = list(current.names)
    added, widened = [], []
    try:
        for c in incoming.columns:
            prev = previous.column(c.name) if previous is not None else None
            have = cols.get(c.name)
            if have is None:
                cols[c.name] = Column(c.name, c.type, True)
                order.append(c.name)
                added.append(c.name)
                continue
            t = widen(have.type, c.type, c.name, prev.type if prev is not None else None)
            nullable = have.nullable or c.nullable
            if t != have.type or nullable != have.nullable:
                cols[c.name] = Column(c.name, t, nullable)
                widened.append(c.name)
        for name in current.names:
            if incoming.column(name) is None and not cols[name].nullable:
                raise _Incompatible(name, "required field removed", cols[name].type, "absent")
    except _Incompatible as e:
        return Evolution(current, incompatible=Incompatibility(e.path, e.change, e.old, e.new))
    return Evolution(CollectionSchema(tuple(cols[n] for n in order)), tuple(added), tuple(widened))


# -- over time ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SchemaVersion:
    """From ``since_ts`` on (until the next version), the collection's schema is ``schema``. ``upstream``: what
    the source kind needs to decode records as this version (JSON text: an Avro reader schema and its
    writers' ids, a declared DDL, a relation's columns; ``{}`` when nothing); ``cause``: why it begins (for
    people: ``writer schema 7 adds note``)."""

    since_ts: int
    schema: CollectionSchema
    upstream: str = "{}"
    cause: str = ""


@dataclass(frozen=True)
class SchemaHistory:
    """A collection's schemas over time, oldest first; times strictly increase."""

    versions: tuple[SchemaVersion, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        ts = [v.since_ts for v in self.versions]
        if ts != sorted(set(ts)):
            raise ValueError(f"schema versions must have strictly increasing times, got {ts}")

    def at(self, ts: int) -> CollectionSchema | None:
        """The schema in force at ``ts`` (None before the first version)."""
        v = self.version_at(ts)
        return v.schema if v is not None else None

    def version_at(self, ts: int) -> SchemaVersion | None:
        """The version in force at ``ts`` (None before the first one)."""
        found = None
        for v in self.versions:
            if v.since_ts > ts:
                break
            found = v
        return found

    def read_as(self, ts: int) -> CollectionSchema | None:
        """The schema a read AS OF ``ts`` gives: the one in force then, or before the first version the first
        (a collection's columns are known before its first row); None for a collection without a history.
        A column renamed since it came carries its earlier names (``Column.was``); one that is another than an
        earlier column of its first name, ``Column.from_ts``."""
        if not self.versions:
            return None
        at = self.version_index(ts)
        schema = self.versions[at].schema
        lineage = {c.name: self.lineage(at, c.name) for c in schema.columns}
        if not any(len(names) > 1 or start is not None for names, start in lineage.values()) and \
                not any(c.renamed_from for c in schema.columns):
            return schema
        return CollectionSchema(tuple(replace(c, renamed_from=None, was=lineage[c.name][0][1:],
                                              from_ts=lineage[c.name][1]) for c in schema.columns))

    def lineage(self, at: int, name: str) -> tuple[tuple[str, ...], int | None]:
        """Version ``at``'s column ``name``: its names, newest first, back through the renames that led to it
        (``Column.renamed_from``), and the time from which it is the column it is when an earlier version had
        another column of its first name (dropped in between; else None)."""
        ours = self._names_back(at, name)
        start = min(ours)
        names = tuple(dict.fromkeys(ours[i] for i in sorted(ours, reverse=True)))
        reborn = start > 0 and any(v.schema.column(ours[start]) is not None for v in self.versions[:start])
        return names, (self.versions[start].since_ts if reborn else None)

    def _names_back(self, at: int, name: str) -> dict[int, str]:
        """Version index -> the name version ``at``'s column ``name`` has in it, from ``at`` back to the version
        it came in (added; or added under a name another column was renamed from at that version)."""
        ours, cur, i = {}, name, at
        while True:
            ours[i] = cur
            if i == 0:
                return ours
            schema, prev = self.versions[i].schema, self.versions[i - 1].schema
            col = schema.column(cur)
            if col.renamed_from and prev.column(col.renamed_from) is not None:
                cur = col.renamed_from
            elif prev.column(cur) is None or any(c.renamed_from == cur for c in schema.columns):
                return ours
            i -= 1

    def rename_refused(self, old: str, new: str) -> str | None:
        """Why the newest version's column ``old`` cannot be renamed ``new`` in a next version (None: it can):
        another column held ``new`` in some version (one dropped since, renamed away, or added under a name
        this one had), so a part written then holds that column's values under the name a read would take
        this one's from."""
        if not self.versions:
            return None
        ours = self._names_back(len(self.versions) - 1, old)
        for j, v in enumerate(self.versions):
            if v.schema.column(new) is not None and ours.get(j) != new:
                return (f"another column was named {new} earlier in the collection's history, and parts written "
                        "then hold its values under that name")
        return None

    def read_across(self, lower: int, upper: int) -> CollectionSchema | None:
        """A schema that holds the updates at ``lower <= ts < upper`` each as the schema in force at its ts
        reads it: :meth:`read_as` ``upper - 1``, then every column an earlier version in force in the range
        had and that one lacks (a column dropped in the range), as that version had it (the newest such)."""
        last = self.read_as(max(lower, upper - 1))
        if last is None:
            return None
        have, extra = set(last.names), {}
        for i in range(self.version_index(lower), self.version_index(max(lower, upper - 1))):
            for c in self.versions[i].schema.columns:
                if c.name not in have:
                    extra[c.name] = replace(c, nullable=True, renamed_from=None)
        return CollectionSchema(last.columns + tuple(extra.values())) if extra else last

    def version_index(self, ts: int) -> int:
        """The index of the version a read AS OF ``ts`` gives (0 before the first one); the history is not
        empty."""
        found = 0
        for i, v in enumerate(self.versions):
            if v.since_ts > ts:
                break
            found = i
        return found

    def latest(self) -> CollectionSchema | None:
        return self.versions[-1].schema if self.versions else None

    def with_change(self, ts: int, schema: CollectionSchema, upstream: str = "{}", cause: str = "") -> "SchemaHistory":
        """The history with ``schema`` from ``ts`` on: a version at or after the newest one's time (at the same
        time, it replaces it: two changes at one timestamp are one)."""
        if self.versions and ts < self.versions[-1].since_ts:
            raise ValueError(f"a schema change at {ts} is before the newest version's {self.versions[-1].since_ts}")
        kept = tuple(v for v in self.versions if v.since_ts != ts)
        return SchemaHistory(kept + (SchemaVersion(ts, schema, upstream, cause),))


@dataclass(frozen=True)
class ProjectedColumn:
    """One column of a read: ``name`` from the part's column of that name cast to ``type`` (``cast`` when the
    part's type differs), or a null of ``type`` when the part has no such column (``present`` false)."""

    name: str
    type: str
    present: bool
    cast: bool


def projection(part: CollectionSchema | None, target: CollectionSchema) -> tuple[ProjectedColumn, ...]:
    """How a part written with ``part`` (None: unknown, taken as ``target``) is read as ``target``: the
    part's columns that ``target`` lacks are left out, the ones it lacks are nulls, widened ones are cast."""
    if part is None:
        return tuple(ProjectedColumn(c.name, c.type, True, False) for c in target.columns)
    out = []
    names = source_names(part, target)
    for c in target.columns:
        src = names[c.name]
        have = part.column(src) if src is not None else None
        out.append(ProjectedColumn(c.name, c.type, have is not None, have is not None and have.type != c.type))
    return tuple(out)
