"""Which writer schemas a slice of wire-format records may carry, and how each resolves to the collection's
reader schema: asked of the registry in the driver, before the Spark job (``reclock.spark.registry_decode``
turns an :class:`AvroPlan` into the job's expressions).

A source reading through a registry (``format: {type: avro | json_schema, registry: ...}``) decodes with a
:class:`Reader`: with ``schema: fixed``, the ``schema_file`` or the subject's latest version at the first
cycle, recorded with the collection's first schema version so that every later cycle and every replay uses
it; with ``schema: evolve``, :func:`choose_reader` takes the newest writer the collection can evolve to
(``reclock.schema_evolution.evolve``), and after the job :func:`versions_seen` records each change at the
timestamp of the first record whose writer carries it (the job's :class:`WriterTally`). A writer the
collection cannot take (a type narrowed, a required field removed, a field the older writers' records cannot
be read as) is an :class:`~reclock.schema_evolution.Incompatibility` that stalls the source once a record
of it is met.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

from reclock import avro_schema, json_schema, protobuf_schema
from reclock.avro_schema import problem
from reclock.errors import SchemaNotFound
from reclock.schema_evolution import CollectionSchema, Incompatibility, SchemaVersion, evolve
from reclock.schema_registry import RegisteredSchema, RegistryClient

RegistryFormat = Literal["avro", "json_schema", "protobuf", "debezium"]
"""A plan's format: a registry source's, or ``debezium``: Debezium's Avro change events, each decoded by its
writer into JSON text and folded by the envelope (:func:`debezium_plan`)."""

OK_FIELD = "_reclock_ok"
"""A boolean field with default ``true`` that the reader schema gets: every record that decodes has it set
(its writer lacks it, so Avro fills the default), and ``from_avro``'s PERMISSIVE mode leaves it null for
one that does not, so an all-null record stays distinguishable from a malformed one."""


@dataclass(frozen=True)
class AvroWriter:
    """A writer schema that may appear: its registry id, its JSON text, and, when the reader cannot read it,
    why (records of such a writer are decode errors carrying that reason)."""

    schema_id: int
    schema: str
    unreadable: str | None = None


@dataclass(frozen=True)
class AvroPlan:
    """How one slice decodes: the reader schema (the collection's, Avro JSON) and every known writer."""

    reader: str
    writers: tuple[AvroWriter, ...]
    missing: tuple[int, ...] = ()  # ids the registry answered it does not hold
    format: RegistryFormat = "avro"
    columns: CollectionSchema | None = None  # json_schema: the type records are parsed into

    @property
    def decoded_columns(self) -> CollectionSchema:
        """The columns a decoded record has: the Avro reader's fields, or the JSON plan's ``columns``."""
        return self.columns if self.columns is not None else writer_columns(self.format, self.reader)

    @property
    def unreadable(self) -> dict[int, str]:
        """The writers the reader cannot read, with why."""
        return {w.schema_id: w.unreadable for w in self.writers if w.unreadable is not None}

    @property
    def ids(self) -> tuple[int, ...]:
        """Every id the plan has an answer for (a writer, or the registry's "no such schema")."""
        return tuple(sorted({w.schema_id for w in self.writers} | set(self.missing)))

    def protobuf_decoder_args(self) -> dict:
        """What a job's :class:`reclock.protobuf_schema.Decoder` is built from: the reader's compiled descriptor
        set (base64: the workers run no protoc), the message index paths of each readable writer's file with
        the message each names, and the unreadable writers."""
        writers = {str(w.schema_id): [[list(p), n] for p, n in protobuf_schema.compiled(w.schema).paths().items()]
                   for w in self.writers if w.unreadable is None}
        descriptor = base64.b64encode(protobuf_schema.compile_bundle(self.reader)).decode("ascii")
        return {"reader": descriptor, "writers": writers,
                "unreadable": {str(i): why for i, why in self.unreadable.items()}}

    @property
    def reader_with_ok(self) -> str:
        schema = json.loads(self.reader)
        return json.dumps(dict(schema, fields=schema["fields"] + [{"name": OK_FIELD, "type": "boolean",
                                                                    "default": True}]))


def avro_plan(client: RegistryClient, reader: str, subject: str | None, ids: Iterable[int] = (),
              fmt: RegistryFormat = "avro", columns: CollectionSchema | None = None) -> AvroPlan:
    """The plan of a slice: every version of ``subject`` (the registry asked now) and every id in ``ids``
    (ids met before, by this source or in an earlier attempt of the slice), each checked against ``reader``
    once; an id the registry answers it does not hold is in the plan's ``missing``. ``fmt`` json_schema:
    records are parsed into ``columns`` by field name, so a JSON writer needs no check of its own.
    :class:`~reclock.errors.RegistryUnavailable` when the registry does not answer (or a subject named does
    not exist: a source's subject must)."""
    schemas = {}
    missing = []
    if subject is not None:
        for v in client.subject_versions(subject):
            schemas[v.schema.id] = v.schema
    for i in ids:
        if i not in schemas:
            try:
                schemas[i] = client.schema(i)
            except SchemaNotFound:
                missing.append(i)
    writers = []
    for i, s in sorted(schemas.items()):
        if fmt == "protobuf":
            text = schema_text(fmt, s)
            writers.append(AvroWriter(i, text, f"schema {i} is {s.type}, not Protobuf" if s.type != "PROTOBUF"
                                      else protobuf_schema.problem(reader, text)))
        elif fmt == "json_schema":
            writers.append(AvroWriter(i, s.text, None if s.type == "JSON" else f"schema {i} is {s.type}, not JSON"))
        elif s.type != "AVRO":
            writers.append(AvroWriter(i, s.text, f"schema {i} is {s.type}, not Avro"))
        else:
            text = schema_text(fmt, s)
            writers.append(AvroWriter(i, text, problem(reader, text)))
    return AvroPlan(reader, tuple(writers), tuple(sorted(missing)), fmt, columns)


def subject_texts(client: RegistryClient, subject: str) -> dict[int, str]:
    """:func:`writer_texts` of an Avro ``subject``, none when the registry does not hold it."""
    try:
        return writer_texts(client, subject)
    except SchemaNotFound:
        return {}


def debezium_plan(client: RegistryClient, subjects: Iterable[str], ids: Iterable[int],
                  columns: CollectionSchema | None = None) -> AvroPlan:
    """The plan of an ``envelope: debezium`` description over Avro: every version of ``subjects`` (each topic's
    ``-key`` and ``-value``; a subject the registry does not hold has none) and every id in ``ids`` (met
    before), asked now, in the driver, so the job's tasks ask no registry
    (``reclock.spark.debezium_decode``); an id the registry answers it does not hold is in ``missing``.
    ``columns``: the rows' (None: each topic's declared ``schema``). :class:`~reclock.errors.RegistryUnavailable`
    when the registry does not answer."""
    schemas: dict[int, str] = {}
    for subject in subjects:
        schemas.update(subject_texts(client, subject))
    missing = []
    for i in sorted(set(ids) - set(schemas)):
        try:
            schemas[i] = schema_text("avro", client.schema(i))
        except SchemaNotFound:
            missing.append(i)
    return AvroPlan("", tuple(AvroWriter(i, t) for i, t in sorted(schemas.items())), tuple(missing), "debezium",
                    columns)


# -- a source's reader over time ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Reader:
    """The schema a registry source decodes with: its text (Avro JSON, or a JSON Schema) and its registry id
    (None: a ``schema_file``)."""

    format: RegistryFormat
    text: str
    schema_id: int | None = None

    def columns(self) -> CollectionSchema:
        return writer_columns(self.format, self.text)

    def upstream(self, writer: int | None = None) -> str:
        """What a schema version records of it (``SchemaVersion.upstream``): enough to decode as it again."""
        return json.dumps({"format": self.format, "reader_id": self.schema_id, "reader": self.text,
                           "writer": writer}, sort_keys=True)

    @staticmethod
    def from_upstream(text: str) -> "Reader | None":
        """The reader a recorded version names (None: the version was not recorded by a registry source)."""
        d = json.loads(text or "{}")
        if "reader" not in d or d.get("format") not in ("avro", "json_schema", "protobuf"):
            return None
        return Reader(d["format"], d["reader"], d.get("reader_id"))


def schema_text(fmt: RegistryFormat, schema: RegisteredSchema) -> str:
    """The text a plan holds of a registered schema: Protobuf's is a bundle of its ``.proto`` and every file it
    imports (``reclock.protobuf_schema.bundle``); Avro's has the named types it references inlined
    (``reclock.avro_schema.inline_references``); JSON Schema's is its own."""
    if fmt == "protobuf" and schema.type == "PROTOBUF":
        return protobuf_schema.bundle(schema)
    if schema.type == "AVRO" and schema.references:
        refs: dict[str, str] = {}

        def walk(s: RegisteredSchema) -> None:
            for ref, sub in s.references:
                if ref.name not in refs:
                    refs[ref.name] = sub.text
                    walk(sub)

        walk(schema)
        return avro_schema.inline_references(schema.text, refs)
    return schema.text


def writer_columns(fmt: RegistryFormat, text: str) -> CollectionSchema:
    """A writer (or reader) schema's columns; ``ValueError`` (a ``JsonSchemaError`` for JSON, a
    ``ProtobufSchemaError`` for Protobuf) when it has none."""
    if fmt == "json_schema":
        return json_schema.collection_schema(text)
    if fmt == "protobuf":
        return protobuf_schema.collection_schema(text)
    if fmt == "debezium":  # a change event's writer: its rows' (after) columns
        from reclock.debezium_avro import row_columns

        return row_columns(text)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the schema is not JSON: {e}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise ValueError("(root): the schema of a record must be an Avro record")
    return avro_schema.collection_schema(parsed)


def writer_texts(client: RegistryClient, subject: str, fmt: RegistryFormat = "avro") -> dict[int, str]:
    """Every version of ``subject`` (the registry asked now) as its schema text by id (:func:`schema_text`)."""
    return {v.schema.id: schema_text(fmt, v.schema) for v in client.subject_versions(subject)}


def initial_reader(client: RegistryClient, fmt: RegistryFormat, subject: str, schema_file: str | None) -> Reader:
    """A new source's reader: its ``schema_file`` (Avro) if given, else the subject's latest version now.
    ``RegistryUnavailable`` when the registry does not answer or the subject has no version."""
    if schema_file is not None:
        return Reader(fmt, schema_file, None)
    versions = client.subject_versions(subject)
    latest = versions[-1].schema
    return Reader(fmt, schema_text(fmt, latest), latest.id)


@dataclass(frozen=True)
class Choice:
    """What a description decodes with: the reader, the columns its decoded records have (Avro: the
    reader's; JSON: ``columns``, the collection evolved by every writer taken), and the writers the
    collection cannot take, each with why."""

    reader: Reader
    columns: CollectionSchema
    incompatible: Mapping[int, Incompatibility] = field(default_factory=dict)


def choose_reader(mode: Literal["fixed", "evolve"], reader: Reader, collection: CollectionSchema,
                  writers: Mapping[int, str]) -> Choice:
    """The reader of a description. ``fixed``: ``reader`` itself. ``evolve``: the newest writer (by id, the
    registry's order of registration) the collection can evolve to through every writer newer than
    ``reader`` in turn (each checked against the one before it, to tell a narrowing); the writers that it
    cannot take are the choice's ``incompatible``. An Avro writer becomes the reader only if it can read
    the records of the reader and of every older writer by Avro's resolution (a field added needs a
    default)."""
    fmt = reader.format
    if mode == "fixed":
        return Choice(reader, collection if fmt == "json_schema" else reader.columns())
    cols, best, prev = collection, reader, reader.columns()
    incompatible: dict[int, Incompatibility] = {}
    for i in sorted(writers):
        if i == reader.schema_id:
            continue
        try:
            wc = writer_columns(fmt, writers[i])
        except ValueError as e:
            path, _, why = str(e).partition(": ")
            incompatible[i] = Incompatibility(path, why or str(e), "columns", "none")
            continue
        newer = reader.schema_id is None or i > reader.schema_id
        ev = evolve(cols, wc, previous=prev if newer else None)
        if ev.incompatible is not None:
            incompatible[i] = ev.incompatible
            continue
        if not newer:
            continue
        if ev.changed and fmt != "json_schema":
            check = problem if fmt == "avro" else protobuf_schema.problem
            others = [t for j, t in writers.items() if j < i and j not in incompatible] + [best.text]
            why = next((p for p in (check(writers[i], t) for t in others) if p is not None), None)
            if why is not None:
                path, _, reason = why.partition(": ")
                incompatible[i] = Incompatibility(path or "(record)", f"older records cannot be read as it "
                                                  f"({reason or why})", "readable", "unreadable")
                continue
        if ev.changed:
            cols, best = ev.schema, Reader(fmt, writers[i], i)
        prev = wc
    return Choice(best, cols if fmt == "json_schema" else best.columns(), incompatible)


class WriterTally:
    """What a job reports of the writers it met (filled from its ``Observation``): per writer id, the
    timestamp of its first record, and the ids it met that its plan did not know."""

    def __init__(self) -> None:
        self.first_ts: dict[int, int] = {}
        self.unknown: set[int] = set()

    def add(self, first_ts: Mapping[int, int | None], unknown: Iterable[int]) -> None:
        for i, ts in first_ts.items():
            if ts is not None:
                self.first_ts[i] = min(ts, self.first_ts.get(i, ts))
        self.unknown.update(unknown)


@dataclass(frozen=True)
class Refusal:
    """A writer met in a description that the collection cannot take: its id, the reader's, and why."""

    writer: int
    reader: int | None
    incompatibility: Incompatibility


def versions_seen(choice: Choice, plan: AvroPlan, collection: CollectionSchema,
                  first_ts: Mapping[int, int]) -> tuple[list[SchemaVersion], Refusal | None]:
    """``evolve``: the schema versions a description begins (each compatible writer that changes the
    collection, at the timestamp of its first record, in the order they are met), or the :class:`Refusal`
    of the first writer met that the collection cannot take (the choice's incompatible writers, and Avro
    writers the plan's reader cannot read). Ids the registry does not hold change nothing (their records are
    decode errors)."""
    writers = {w.schema_id: w.schema for w in plan.writers}
    unreadable = plan.unreadable
    cols = collection
    out: dict[int, SchemaVersion] = {}
    for i, ts in sorted(first_ts.items(), key=lambda x: (x[1], x[0])):
        if i in choice.incompatible:
            return list(out.values()), Refusal(i, choice.reader.schema_id, choice.incompatible[i])
        if i in unreadable:
            path, _, why = unreadable[i].partition(": ")
            return list(out.values()), Refusal(i, choice.reader.schema_id, Incompatibility(
                path or "(record)", f"cannot be read as the collection's schema ({why or unreadable[i]})",
                f"schema {choice.reader.schema_id}", f"schema {i}"))
        if i not in writers:
            continue
        ev = evolve(cols, writer_columns(plan.format, writers[i]))
        if ev.incompatible is not None:
            return list(out.values()), Refusal(i, choice.reader.schema_id, ev.incompatible)
        if ev.changed:
            cols = ev.schema
            what = "; ".join(x for x in (f"adds {', '.join(ev.added)}" if ev.added else "",
                                         f"widens {', '.join(ev.widened)}" if ev.widened else "") if x)
            out[ts] = SchemaVersion(ts, cols, choice.reader.upstream(i), f"writer schema {i}: {what}")
    return [out[t] for t in sorted(out)], None
