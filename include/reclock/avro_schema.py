"""Avro schema resolution (pure): can a reader schema read what a writer schema wrote?

The rules are the Avro specification's ("Schema Resolution"), the ones Avro's ``GenericDatumReader(writer,
reader)`` applies when Spark's ``from_avro`` decodes with a reader schema (``reclock.spark.registry_decode``):

- primitives match, or the writer's is promoted: int to long, float or double; long to float or double;
  float to double; string to bytes and bytes to string;
- records match by name (unqualified names compare equal too, as Avro's resolver lets them); each reader
  field is read from the writer's field of the same name (or one of the reader field's aliases), else takes
  its default, and without a default the writer cannot be read ("a required field removed"); writer fields
  the reader lacks are skipped;
- enums: every writer symbol is a reader symbol, or the reader has a default symbol;
- arrays and maps: their items / values resolve; fixed: same size and name;
- a writer union: every branch resolves against the reader (a branch that does not fails only records of
  that branch, but a collection must take every record, so Reclock requires every branch); a reader union
  (and not a writer one): the writer's type resolves against one of its branches.

Law: ``problem(s, s) is None`` for every schema; ``problem(r, w)`` names the first field on the path where
resolution fails (``tests/unit/test_avro_schema.py``, with hypothesis, against fastavro's resolver).
"""

from __future__ import annotations

import json
from typing import Any

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
_PROMOTIONS = {("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
               ("float", "double"), ("string", "bytes"), ("bytes", "string")}


def _named(schema: Any, names: dict[str, dict], namespace: str | None) -> None:
    """Collect the named types (record, enum, fixed) of ``schema`` by full name."""
    if isinstance(schema, list):
        for s in schema:
            _named(s, names, namespace)
        return
    if not isinstance(schema, dict):
        return
    t = schema.get("type")
    if t in ("record", "error", "enum", "fixed"):
        full = _fullname(schema, namespace)
        names[full] = schema
        names.setdefault(full.rsplit(".", 1)[-1], schema)
        namespace = full.rsplit(".", 1)[0] if "." in full else namespace
        for f in schema.get("fields", ()) if t != "enum" and t != "fixed" else ():
            _named(f.get("type"), names, namespace)
    elif t == "array":
        _named(schema.get("items"), names, namespace)
    elif t == "map":
        _named(schema.get("values"), names, namespace)
    elif isinstance(t, (dict, list)):
        _named(t, names, namespace)


def _fullname(schema: dict, namespace: str | None) -> str:
    name = schema["name"]
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _Resolver:
    def __init__(self, reader: Any, writer: Any) -> None:
        self.rnames: dict[str, dict] = {}
        self.wnames: dict[str, dict] = {}
        _named(reader, self.rnames, None)
        _named(writer, self.wnames, None)
        self.seen: set[tuple[int, int]] = set()

    def deref(self, s: Any, names: dict[str, dict]) -> Any:
        if isinstance(s, str) and s not in PRIMITIVES:
            if s not in names and _short(s) not in names:
                raise ValueError(f"the schema refers to the type {s!r}, which it does not define")
            return names.get(s) or names[_short(s)]
        if isinstance(s, dict) and isinstance(s.get("type"), (dict, list)) :
            return s["type"]
        if isinstance(s, dict) and s.get("type") in PRIMITIVES and len(s) == 1:
            return s["type"]
        return s

    @staticmethod
    def kind(s: Any) -> str:
        if isinstance(s, list):
            return "union"
        if isinstance(s, str):
            return s
        t = s.get("type")
        return "record" if t == "error" else t

    def problem(self, r: Any, w: Any, path: str) -> str | None:
        r, w = self.deref(r, self.rnames), self.deref(w, self.wnames)
        rk, wk = self.kind(r), self.kind(w)
        if wk == "union":
            for branch in w:
                p = self.problem(r, branch, path)
                if p is not None:
                    return p
            return None
        if rk == "union":
            if any(self.problem(branch, w, path) is None for branch in r):
                return None
            return f"{path or 'the value'}: the writer's {_describe(w)} matches no branch of the reader's union"
        if rk in PRIMITIVES or wk in PRIMITIVES:
            if rk == wk or (wk, rk) in _PROMOTIONS:
                return None
            return f"{path or 'the value'}: the writer's {_describe(w)} cannot be read as {_describe(r)}"
        if rk != wk:
            return f"{path or 'the value'}: the writer's {_describe(w)} cannot be read as {_describe(r)}"
        if rk in ("record", "enum", "fixed") and _short(r["name"]) != _short(w["name"]):
            return f"{path or 'the value'}: the writer's {rk} {w['name']} is not the reader's {r['name']}"
        if rk == "record":
            key = (id(r), id(w))
            if key in self.seen:  # a recursive type already being resolved
                return None
            self.seen.add(key)
            wfields = {f["name"]: f for f in w.get("fields", ())}
            for f in r.get("fields", ()):
                name = f["name"]
                sub = f"{path}.{name}" if path else name
                match = wfields.get(name) or next((wfields[a] for a in f.get("aliases", ()) if a in wfields), None)
                if match is None:
                    if "default" not in f:
                        return f"{sub}: the reader needs it (it has no default) and the writer does not have it"
                    continue
                p = self.problem(f["type"], match["type"], sub)
                if p is not None:
                    return p
            return None
        if rk == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:
                return f"{path or 'the value'}: the writer's enum has symbol(s) {missing} the reader lacks"
            return None
        if rk == "fixed":
            if r["size"] != w["size"]:
                return f"{path or 'the value'}: fixed size {w['size']} cannot be read as size {r['size']}"
            return None
        if rk == "array":
            return self.problem(r["items"], w["items"], f"{path}[]")
        if rk == "map":
            return self.problem(r["values"], w["values"], f"{path}{{}}")
        return f"{path or 'the value'}: unknown Avro type {rk!r}"


def _describe(s: Any) -> str:
    if isinstance(s, str):
        return s
    if isinstance(s, list):
        return "union"
    t = s.get("type")
    if t in ("record", "enum", "fixed", "error"):
        return f"{t} {s.get('name')}"
    if isinstance(t, str) and s.get("logicalType"):
        return f"{t} ({s['logicalType']})"
    return str(t)


def problem(reader: str | Any, writer: str | Any) -> str | None:
    """Why ``reader`` cannot read what ``writer`` wrote (the field's path first), or None when it can.
    Schemas as JSON text or parsed."""
    r = json.loads(reader) if isinstance(reader, str) else reader
    w = json.loads(writer) if isinstance(writer, str) else writer
    return _Resolver(r, w).problem(r, w, "")


def spark_type(schema: Any, names: dict[str, dict] | None = None) -> tuple[str, bool]:
    """The Spark SQL type string of an Avro type, as ``from_avro`` decodes it (Spark's ``SchemaConverters``),
    and whether it may be null: ``["null", T]`` is T, nullable; other unions of several types are structs
    ``member0, member1, ...``; enums are strings; ``fixed`` is binary; logical types ``date``,
    ``timestamp-millis``/``-micros`` (timestamp), ``local-timestamp-*`` (timestamp_ntz) and ``decimal``."""
    if names is None:
        names = {}
        _named(schema, names, None)
    if isinstance(schema, str) and schema not in PRIMITIVES:
        schema = names.get(schema) or names[_short(schema)]
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        nullable = len(branches) < len(schema)
        if len(branches) == 1:
            return spark_type(branches[0], names)[0], nullable
        if set(map(lambda b: b if isinstance(b, str) else "", branches)) <= {"int", "long"}:
            return "bigint", nullable
        if set(map(lambda b: b if isinstance(b, str) else "", branches)) <= {"float", "double"}:
            return "double", nullable
        members = ",".join(f"member{i}:{spark_type(b, names)[0]}" for i, b in enumerate(branches))
        return f"struct<{members}>", True
    if isinstance(schema, dict):
        logical = schema.get("logicalType")
        t = schema.get("type")
        if logical == "date" and t == "int":
            return "date", False
        if logical in ("timestamp-millis", "timestamp-micros") and t == "long":
            return "timestamp", False
        if logical in ("local-timestamp-millis", "local-timestamp-micros") and t == "long":
            return "timestamp_ntz", False
        if logical == "decimal" and t in ("bytes", "fixed"):
            return f"decimal({schema['precision']},{schema.get('scale', 0)})", False
        if t in ("record", "error"):
            fields = [(f["name"], spark_type(f["type"], names)[0]) for f in schema["fields"]]
            return "struct<" + ",".join(f"{n}:{ft}" for n, ft in fields) + ">", False
        if t == "enum":
            return "string", False
        if t == "fixed":
            return "binary", False
        if t == "array":
            return f"array<{spark_type(schema['items'], names)[0]}>", False
        if t == "map":
            return f"map<string,{spark_type(schema['values'], names)[0]}>", False
        return spark_type(t, names)
    return {"null": "void", "boolean": "boolean", "int": "int", "long": "bigint", "float": "float",
            "double": "double", "bytes": "binary", "string": "string"}[schema], schema == "null"


def collection_schema(schema: str | Any):
    """An Avro record schema as the :class:`~reclock.schema_evolution.CollectionSchema` of the columns
    ``from_avro`` gives it (one column per field)."""
    from reclock.schema_evolution import CollectionSchema, Column

    s = json.loads(schema) if isinstance(schema, str) else schema
    names: dict[str, dict] = {}
    _named(s, names, None)
    cols = []
    for f in s["fields"]:
        t, nullable = spark_type(f["type"], names)
        cols.append(Column(f["name"], t, nullable))
    return CollectionSchema(tuple(cols))


def inline_references(schema: str | Any, references: dict[str, str | Any]) -> str:
    """``schema`` with every named type it refers to by name and does not define itself replaced, at its first
    use, by its definition from ``references`` (full name -> schema text, as a registry's Avro references name
    them), recursively; the result is one self-contained schema (JSON text) that ``from_avro`` and
    :func:`problem` read. A name neither defined nor referenced is left as it is (Avro's parser refuses it)."""
    parsed = json.loads(schema) if isinstance(schema, str) else schema
    refs = {k: json.loads(v) if isinstance(v, str) else v for k, v in references.items()}
    defined: set[str] = set()

    def walk(s: Any, namespace: str | None) -> Any:
        if isinstance(s, list):
            return [walk(x, namespace) for x in s]
        if isinstance(s, str):
            if s in PRIMITIVES:
                return s
            full = s if "." in s or not namespace else f"{namespace}.{s}"
            for name in (full, s):
                if name not in defined and name in refs:
                    ref = dict(refs[name])
                    if "." not in ref.get("name", "") and "namespace" not in ref:
                        ref["namespace"] = ""  # its own (null) namespace, not the one it is inlined into
                    return walk(ref, namespace)
            return s
        if not isinstance(s, dict):
            return s
        t = s.get("type")
        out = dict(s)
        if t in ("record", "error", "enum", "fixed"):
            full = _fullname(s, namespace)
            defined.add(full)
            ns = full.rsplit(".", 1)[0] if "." in full else (s.get("namespace") or None)
            if t in ("record", "error"):
                out["fields"] = [dict(f, type=walk(f.get("type"), ns)) for f in s.get("fields", ())]
        elif t == "array":
            out["items"] = walk(s.get("items"), namespace)
        elif t == "map":
            out["values"] = walk(s.get("values"), namespace)
        elif isinstance(t, (dict, list, str)):
            out["type"] = walk(t, namespace)
        return out

    return json.dumps(walk(parsed, None))
