"""Protobuf schemas from a Schema Registry: ``.proto`` text compiled at run time, their columns, which writer a
reader can read, and the decoding of one record (run by the Spark job's Python workers).

A registry holds a Protobuf schema as ``.proto`` source with its imports as references (each a subject
version, named by its import path). :func:`bundle` packs a registered schema and everything it imports into
one text (JSON: ``{"proto": ..., "imports": {path: text}}``), the form every other module passes around
(``reclock.registry_plan``'s writer and reader texts); :func:`compile_bundle` turns it into a
``FileDescriptorSet`` with ``protoc`` run in-process (PyPI ``grpcio-tools``, whose ``protoc`` carries the
well-known types such as ``google/protobuf/timestamp.proto``).

The source's message is the first message of the reader's file (the message index path ``[0]``, what a
Confluent serializer writes for a file of one message); a record whose message indexes name another
message is a decode error saying which.

Columns (Spark SQL types, exact for every value):

==================================================  ==================================================
int32, sint32, sfixed32                             int
int64, sint64, sfixed64, uint32, fixed32            bigint
uint64, fixed64                                     decimal(20,0)
float / double / bool / string / bytes              float / double / boolean / string / binary
enum                                                string (the value's name)
message (a well-known type too)                     struct of its fields
repeated T / map<K, V>                              array<T> / map<K, V>
==================================================  ==================================================

A field without presence (a proto3 scalar that is not ``optional``) that a record does not carry has its
default value (0, "", false, empty bytes, the enum's first value), which is what the record means; a field
with presence (``optional``, a message, a ``oneof`` member, proto2) is null there. A recursive message has no
finite columns and is refused.

Resolution is Protobuf's own: a record is parsed with the *reader's* descriptor, field by field number;
:func:`problem` refuses a writer whose fields the reader would misread instead (a number whose name or type
differs, other than a widening on the same wire encoding: int32 to int64, uint32 to uint64, sint32 to
sint64), naming the field. Writer fields the reader lacks are skipped, as Protobuf readers do.
"""

from __future__ import annotations

import decimal
import functools
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from reclock.schema_evolution import CollectionSchema, Column

_PROTOC = threading.Lock()  # protoc's complaints are caught by pointing file descriptor 2 away: one at a time

MAIN = "reclock_schema.proto"
"""The file name the main ``.proto`` text is compiled under (imports keep their own paths)."""


class ProtobufSchemaError(ValueError):
    """A ``.proto`` text that does not compile, or a message that has no columns; the message says why."""


def bundle(schema: Any) -> str:
    """A registered Protobuf schema (``reclock.schema_registry.RegisteredSchema``) with every file it imports,
    as one JSON text."""
    imports: dict[str, str] = {}

    def walk(s: Any) -> None:
        for ref, sub in s.references:
            if ref.name not in imports:
                imports[ref.name] = sub.text
                walk(sub)

    walk(schema)
    return json.dumps({"proto": schema.text, "imports": imports}, sort_keys=True)


def _unbundle(text: str) -> tuple[str, dict[str, str]]:
    try:
        d = json.loads(text)
    except ValueError:
        return text, {}  # a bare .proto text
    if not isinstance(d, dict) or not isinstance(d.get("proto"), str):
        raise ProtobufSchemaError("the schema is neither .proto text nor a bundle of it")
    return d["proto"], dict(d.get("imports") or {})


@functools.lru_cache(maxsize=256)
def compile_bundle(text: str) -> bytes:
    """The serialized ``FileDescriptorSet`` of a bundle (or bare ``.proto`` text), its imports included;
    :class:`ProtobufSchemaError` with protoc's messages when it does not compile."""
    import importlib.resources

    from grpc_tools import protoc

    proto, imports = _unbundle(text)
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="reclock-proto-") as d:
        for name, body in {**imports, MAIN: proto}.items():
            path = os.path.realpath(os.path.join(d, name))
            if not path.startswith(os.path.realpath(d) + os.sep):
                raise ProtobufSchemaError(f"import path {name!r} leaves the schema's folder")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(body)
        out = os.path.join(d, "set.pb")
        errors = os.path.join(d, "errors.txt")
        # protoc writes its complaints to file descriptor 2: catch them in a file, not on the worker's stderr
        with _PROTOC:
            rc = _protoc(protoc, d, well_known, out, errors)
        if rc != 0:
            with open(errors, encoding="utf-8", errors="replace") as f:
                why = f.read().replace(d + os.sep, "").strip()
            raise ProtobufSchemaError(f"the .proto text does not compile: {why or f'protoc exit {rc}'}")
        with open(out, "rb") as f:
            return f.read()


def _protoc(protoc, d: str, well_known: str, out: str, errors: str) -> int:
    saved = os.dup(2)
    try:
        with open(errors, "w") as err:
            os.dup2(err.fileno(), 2)
            return protoc.main(["protoc", f"-I{d}", f"-I{well_known}", "--include_imports",
                                f"--descriptor_set_out={out}", MAIN])
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass(frozen=True)
class Compiled:
    """A compiled bundle: its descriptor pool's main file and the source's message (the file's first)."""

    file: Any  # google.protobuf.descriptor.FileDescriptor
    message: Any  # google.protobuf.descriptor.Descriptor

    def paths(self) -> dict[tuple[int, ...], str]:
        """Every message of the file by its message index path (Confluent's), as its full name."""
        out: dict[tuple[int, ...], str] = {}

        def walk(msgs: Any, prefix: tuple[int, ...]) -> None:
            for i, m in enumerate(msgs):
                out[prefix + (i,)] = m.full_name
                walk(m.nested_types, prefix + (i,))

        walk(self.file.message_types_by_name.values(), ())
        return out


@functools.lru_cache(maxsize=256)
def compiled(text: str) -> Compiled:
    """The bundle compiled into a descriptor pool of its own."""
    return from_descriptor_set(compile_bundle(text))


@functools.lru_cache(maxsize=64)
def from_descriptor_set(data: bytes) -> Compiled:
    """A compiled bundle from its serialized ``FileDescriptorSet`` (what a job's workers get: no protoc there)."""
    from google.protobuf import descriptor_pb2, descriptor_pool

    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    main = pool.FindFileByName(MAIN)
    msgs = list(main.message_types_by_name.values())
    if not msgs:
        raise ProtobufSchemaError("the .proto file declares no message")
    return Compiled(main, msgs[0])


# -- columns ------------------------------------------------------------------------------------------------

_SCALARS = {  # FieldDescriptor.TYPE_* -> Spark SQL type
    1: "double", 2: "float", 3: "bigint", 4: "decimal(20,0)", 5: "int", 6: "decimal(20,0)", 7: "bigint",
    8: "boolean", 9: "string", 12: "binary", 13: "bigint", 14: "string", 15: "int", 16: "bigint", 17: "int",
    18: "bigint",
}
_TYPE_NAMES = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32",
               8: "bool", 9: "string", 10: "group", 11: "message", 12: "bytes", 13: "uint32", 14: "enum",
               15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64"}
_MESSAGE, _GROUP, _ENUM = 11, 10, 14


def _quote(name: str) -> str:
    return name if name.replace("_", "a").isalnum() and not name[0].isdigit() else "`" + name.replace("`", "``") + "`"


def _is_repeated(f: Any) -> bool:
    return bool(getattr(f, "is_repeated", None)) if hasattr(f, "is_repeated") else f.label == 3


def _is_map(f: Any) -> bool:
    return f.type == _MESSAGE and f.message_type.GetOptions().map_entry


def _field_type(f: Any, seen: tuple[str, ...]) -> str:
    if _is_map(f):
        k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return f"map<{_value_type(k, seen)},{_value_type(v, seen)}>"
    t = _value_type(f, seen)
    return f"array<{t}>" if _is_repeated(f) else t


def _value_type(f: Any, seen: tuple[str, ...]) -> str:
    if f.type in (_MESSAGE, _GROUP):
        return _struct_type(f.message_type, seen, f.name)
    return _SCALARS[f.type]


def _struct_type(m: Any, seen: tuple[str, ...], path: str) -> str:
    if m.full_name in seen:
        raise ProtobufSchemaError(f"{path}: message {m.full_name} contains itself; a recursive message has no "
                                  "finite columns")
    inner = ",".join(f"{_quote(f.name)}:{_field_type(f, seen + (m.full_name,))}" for f in m.fields)
    return f"struct<{inner}>"


def collection_schema(text: str) -> CollectionSchema:
    """The columns of the source's message of a bundle (every column nullable: a reader may lack a field a
    writer has, and a field with presence may be unset)."""
    msg = compiled(text).message
    cols = tuple(Column(f.name, _field_type(f, (msg.full_name,))) for f in msg.fields)
    return CollectionSchema(cols)


# -- which writers a reader reads -------------------------------------------------------------------------------

_WIDENINGS = {(5, 3), (13, 4), (17, 18), (13, 3)}  # writer -> reader on the same wire encoding, no value lost


def _kind(f: Any) -> str:
    label = "map" if _is_map(f) else "repeated" if _is_repeated(f) else "singular"
    what = f.message_type.full_name if f.type in (_MESSAGE, _GROUP) else _TYPE_NAMES.get(f.type, str(f.type))
    return f"{label} {what}"


def _message_problem(reader: Any, writer: Any, path: str, seen: set) -> str | None:
    if (reader.full_name, writer.full_name) in seen:
        return None
    seen.add((reader.full_name, writer.full_name))
    by_number = {f.number: f for f in reader.fields}
    by_name = {f.name: f for f in reader.fields}
    for w in writer.fields:
        where = f"{path}{w.name}"
        r = by_number.get(w.number)
        if r is None:
            other = by_name.get(w.name)
            if other is not None:
                return (f"{where}: field number {w.number} in the writer, {other.number} in the reader (a field "
                        "keeps its number)")
            continue  # a field the reader lacks: skipped
        if r.name != w.name:
            return f"{where}: field number {w.number} is `{w.name}` in the writer and `{r.name}` in the reader"
        if _is_map(w) != _is_map(r) or _is_repeated(w) != _is_repeated(r):
            return f"{where}: {_kind(w)} in the writer, {_kind(r)} in the reader"
        if w.type in (_MESSAGE, _GROUP) and r.type in (_MESSAGE, _GROUP):
            why = _message_problem(r.message_type, w.message_type, where + ".", seen)
            if why is not None:
                return why
            continue
        if w.type == _ENUM and r.type == _ENUM:
            missing = [v.name for v in w.enum_type.values if v.number not in r.enum_type.values_by_number]
            if missing:
                return f"{where}: enum values {missing} of the writer are not in the reader's {r.enum_type.full_name}"
            continue
        if w.type != r.type and (w.type, r.type) not in _WIDENINGS:
            return f"{where}: {_kind(w)} in the writer, {_kind(r)} in the reader"
    return None


def problem(reader: str, writer: str) -> str | None:
    """Why the reader's message cannot read records of the writer's (``path: reason``), else None. Both are
    bundles; the messages compared are each file's first."""
    try:
        r = compiled(reader).message
        w = compiled(writer).message
    except ProtobufSchemaError as e:
        return f"(schema): {e}"
    if r.full_name != w.full_name:
        return f"(message): the writer's message is {w.full_name}, the reader's {r.full_name}"
    return _message_problem(r, w, "", set())


# -- decoding a record (on the job's Python workers) ----------------------------------------------------------

class Decoder:
    """Decodes wire-format records of the writers of a plan with the reader's message class.

    ``reader``: the reader's serialized ``FileDescriptorSet`` (:func:`compile_bundle`); ``writers``: per known writer id, the message index paths of its file
    that name the reader's message (any other path names another message); ``unreadable``: writers the
    reader cannot read, with why. :meth:`decode` gives ``(row, None)`` or ``(None, reason)``."""

    def __init__(self, reader: bytes, writers: Mapping[int, Mapping[tuple[int, ...], str]],
                 unreadable: Mapping[int, str]) -> None:
        from google.protobuf import message_factory

        c = from_descriptor_set(reader)
        self.name = c.message.full_name
        self.cls = message_factory.GetMessageClass(c.message)
        self.writers = {int(k): dict(v) for k, v in writers.items()}
        self.unreadable = dict(unreadable)

    def decode(self, value: bytes | None) -> tuple[dict | None, str | None]:
        from google.protobuf.message import DecodeError

        from reclock.wire import WireError, decode_header

        if value is None:
            return None, None
        try:
            head = decode_header(value, protobuf=True)
        except WireError as e:
            if len(value) < 5 or value[0] != 0:
                return None, NO_HEADER
            return None, f"the Protobuf message indexes do not decode: {e.reason}"
        sid = head.schema_id
        if sid in self.unreadable:
            return None, f"writer schema {sid} cannot be read as the collection's schema: {self.unreadable[sid]}"
        paths = self.writers.get(sid)
        if paths is None:
            return None, f"schema id {sid} is not known to the schema registry"
        name = paths.get(head.message_indexes)
        if name != self.name:
            what = f"name message {name}" if name else "name no message"
            return None, (f"the message indexes {list(head.message_indexes)} {what} of writer schema {sid}; the "
                          f"source reads {self.name}")
        try:
            msg = self.cls.FromString(value[head.payload_offset:])
            return _row(msg), None
        except (DecodeError, _Unnamed, RuntimeError, ValueError) as e:
            return None, f"value does not decode as Protobuf {self.name} of writer schema {sid}: {e}"


NO_HEADER = "value has no Confluent wire header (magic byte 0 and a 4-byte schema id)"


class _Unnamed(ValueError):
    pass


def _scalar(f: Any, v: Any) -> Any:
    if f.type == _ENUM:
        ev = f.enum_type.values_by_number.get(v)
        if ev is None:
            raise _Unnamed(f"field {f.name}: enum number {v} is not a value of {f.enum_type.full_name}")
        return ev.name
    if f.type in (_MESSAGE, _GROUP):
        return _row(v)
    if f.type in (4, 6):  # uint64, fixed64 -> decimal(20,0)
        return decimal.Decimal(v)
    return v


def _row(msg: Any) -> dict:
    out = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if _is_map(f):
            vf = f.message_type.fields_by_name["value"]
            out[f.name] = [(k, _scalar(vf, v[k])) for k in v]
        elif _is_repeated(f):
            out[f.name] = [_scalar(f, x) for x in v]
        elif f.has_presence and not msg.HasField(f.name):
            out[f.name] = None
        else:
            out[f.name] = _scalar(f, v)
    return out
