"""Debezium change events written as Avro through a Schema Registry, as the JSON text the ``debezium``
envelope folds (pure): ``envelope: debezium`` with ``format: {type: avro, registry: ...}``.

A record (key or value) is in the Confluent wire format: a zero magic byte, the writer schema's 4-byte
registry id (big-endian), then the Avro binary encoding of the datum by that writer schema. :class:`AvroJson`
decodes it by its writer schema (looked up by id, cached) straight into JSON text, the text Kafka Connect's
``JsonConverter`` (``schemas.enable=false``, ``decimal.format=NUMERIC``) writes for the same Connect value,
so that one envelope (``reclock.debezium``: the fold, redelivery, the upsert state) reads both:

=====================================  ======================================================================
Avro (Connect's AvroData)              JSON text
=====================================  ======================================================================
null, boolean, int, long, string       as JSON (a string with its characters as written)
union (an optional column)             the branch's value, no wrapper
double                                 the shortest text that reads back to the same 64 bits; -0.0 stays
                                       ``-0.0``; NaN and the infinities the strings ``"NaN"``, ``"Infinity"``,
                                       ``"-Infinity"`` (as Connect's Jackson writes them; Spark's JSON
                                       reader takes them)
float                                  the shortest text that reads back to the same 32 bits
bytes, fixed                           base64 (Connect's JSON writes bytes so, Spark reads BINARY so)
bytes with logicalType decimal         the exact decimal digits of unscaled * 10^-scale
int/long logical types (date,          the number (days, millis, micros: Connect's JSON writes the same
time-*, timestamp-*, Debezium's)       number, its ``schema.name`` says what it counts)
record, map                            an object; array: an array; enum: its symbol
=====================================  ======================================================================

A record that is not in the wire format (no magic byte, too short), whose writer id the registry does not
hold, or whose bytes do not decode by its writer schema (truncated, bytes left over) raises
:class:`~reclock.debezium.EventInvalid` with the reason: the envelope routes it to the error collection or
stalls (``on_decode_error``). A registry that does not answer raises what ``lookup`` raises (the source
stalls naming it); never a record dropped.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from decimal import Decimal
from typing import Any, Callable

from reclock.debezium import EventInvalid

__all__ = ["AvroJson", "wire_id", "datum_json", "double_text", "float_text", "row_columns"]

MAGIC = 0


def wire_id(record: bytes, what: str) -> int:
    """The writer schema id of a Confluent wire-format ``record``; EventInvalid if it is not one."""
    if len(record) < 5 or record[0] != MAGIC:
        first = f"first byte {record[0]}" if record else "empty"
        raise EventInvalid(f"{what} is not in the Confluent wire format (a zero magic byte and a 4-byte schema id "
                           f"first; {len(record)} bytes, {first}): is the topic written by a registry's "
                           "Avro converter?")
    return int.from_bytes(record[1:5], "big")


def double_text(x: float) -> str:
    """A double as JSON text that reads back to the same bits (NaN, infinities as Jackson's strings)."""
    if math.isnan(x):
        return '"NaN"'
    if math.isinf(x):
        return '"Infinity"' if x > 0 else '"-Infinity"'
    return repr(x)


def float_text(x: float) -> str:
    """A float (32 bits, given as the double it widens to) as the shortest JSON text that reads back to the
    same 32 bits."""
    if math.isnan(x) or math.isinf(x):
        return double_text(x)
    bits = struct.pack("<f", x)
    for digits in range(1, 10):  # 9 significant digits always read back to the same 32 bits
        text = f"{x:.{digits}g}"
        try:
            if struct.pack("<f", float(text)) == bits:
                break
        except OverflowError:  # rounded up past the largest float (3.4028235e38 near FLT_MAX)
            continue
    if "e" not in text and "." not in text and "n" not in text:
        text += ".0"
    return text


class _Reader:
    """Avro binary decoding of one datum into JSON text pieces."""

    __slots__ = ("buf", "pos", "names")

    def __init__(self, buf: bytes, pos: int, names: dict[str, Any]) -> None:
        self.buf, self.pos, self.names = buf, pos, names

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise EventInvalid(f"the Avro datum ends early (at byte {self.pos} of {len(self.buf)}, {n} more wanted)")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def long(self) -> int:
        shift = acc = 0
        while True:
            if self.pos >= len(self.buf):
                raise EventInvalid(f"the Avro datum ends early (in a number at byte {self.pos})")
            b = self.buf[self.pos]
            self.pos += 1
            acc |= (b & 0x7F) << shift
            if not b & 0x80:
                return (acc >> 1) ^ -(acc & 1)
            shift += 7
            if shift > 63:
                raise EventInvalid(f"an Avro number at byte {self.pos} is longer than 10 bytes")

    def datum(self, schema: Any, out: list[str]) -> None:
        if isinstance(schema, str):
            schema = self.names.get(schema, schema)
        if isinstance(schema, list):  # a union: the branch's index, then its value
            i = self.long()
            if not 0 <= i < len(schema):
                raise EventInvalid(f"an Avro union branch {i} of {len(schema)} at byte {self.pos}")
            return self.datum(schema[i], out)
        t = schema if isinstance(schema, str) else schema["type"]
        if isinstance(t, (dict, list)):
            return self.datum(t, out)
        logical = schema.get("logicalType") if isinstance(schema, dict) else None
        if t == "null":
            out.append("null")
        elif t == "boolean":
            b = self._take(1)[0]
            if b > 1:
                raise EventInvalid(f"an Avro boolean is {b} at byte {self.pos - 1}")
            out.append("true" if b else "false")
        elif t in ("int", "long"):
            out.append(str(self.long()))
        elif t == "double":
            out.append(double_text(struct.unpack("<d", self._take(8))[0]))
        elif t == "float":
            out.append(float_text(struct.unpack("<f", self._take(4))[0]))
        elif t == "string":
            raw = self._take(self.long())
            try:
                out.append(json.dumps(raw.decode("utf-8"), ensure_ascii=False))
            except UnicodeDecodeError:
                raise EventInvalid(f"an Avro string before byte {self.pos} is not UTF-8") from None
        elif t in ("bytes", "fixed"):
            raw = self._take(self.long() if t == "bytes" else int(schema["size"]))
            if logical == "decimal":
                unscaled = int.from_bytes(raw, "big", signed=True)
                out.append(str(Decimal(unscaled).scaleb(-int(schema.get("scale", 0)))))
            else:
                out.append('"' + base64.b64encode(raw).decode("ascii") + '"')
        elif t == "record":
            self.names.setdefault(schema.get("name", ""), schema)
            out.append("{")
            for j, f in enumerate(schema["fields"]):
                out.append(("," if j else "") + json.dumps(f["name"], ensure_ascii=False) + ":")
                self.datum(f["type"], out)
            out.append("}")
        elif t == "enum":
            self.names.setdefault(schema.get("name", ""), schema)
            i = self.long()
            symbols = schema["symbols"]
            if not 0 <= i < len(symbols):
                raise EventInvalid(f"an Avro enum index {i} of {len(symbols)} at byte {self.pos}")
            out.append(json.dumps(symbols[i]))
        elif t in ("array", "map"):
            out.append("[" if t == "array" else "{")
            first = True
            while True:
                n = self.long()
                if n == 0:
                    break
                if n < 0:
                    n = -n
                    self.long()  # the block's size in bytes
                for _ in range(n):
                    if not first:
                        out.append(",")
                    first = False
                    if t == "map":
                        self.datum("string", out)
                        out.append(":")
                    self.datum(schema["items" if t == "array" else "values"], out)
            out.append("]" if t == "array" else "}")
        else:
            raise EventInvalid(f"the writer schema has a type {t!r} this reader does not know")


def _names(schema: Any, names: dict[str, Any], namespace: str | None = None) -> None:
    """Every named type of ``schema`` by its full and short name (a later field may name an earlier type)."""
    if isinstance(schema, list):
        for s in schema:
            _names(s, names, namespace)
    elif isinstance(schema, dict):
        t = schema.get("type")
        if t in ("record", "enum", "fixed", "error"):
            name = schema["name"]
            ns = schema.get("namespace", namespace)
            full = name if "." in name or not ns else f"{ns}.{name}"
            names.setdefault(full, schema)
            names.setdefault(name.rsplit(".", 1)[-1], schema)
            namespace = full.rsplit(".", 1)[0] if "." in full else ns
            for f in schema.get("fields", ()):
                _names(f["type"], names, namespace)
        elif t in ("array", "map"):
            _names(schema.get("items" if t == "array" else "values"), names, namespace)
        elif isinstance(t, (dict, list)):
            _names(t, names, namespace)


def datum_json(schema: Any, data: bytes, start: int = 0) -> str:
    """The Avro binary datum ``data[start:]`` of writer ``schema`` (parsed JSON) as JSON text; every byte
    must be read."""
    names: dict[str, Any] = {}
    _names(schema, names)
    r = _Reader(data, start, names)
    out: list[str] = []
    r.datum(schema, out)
    if r.pos != len(data):
        raise EventInvalid(f"{len(data) - r.pos} bytes are left after the Avro datum (is the writer schema the "
                           "one its id names?)")
    return "".join(out)


class AvroJson:
    """Wire-format records to JSON text by their writer schemas. ``lookup(id)`` gives a writer schema's JSON
    text (``reclock.schema_registry.RegistryClient.schema``), raising ``missing`` (e.g. ``SchemaNotFound``)
    for an id the registry does not hold; anything else it raises propagates (a registry that does not
    answer stalls the source)."""

    def __init__(self, lookup: Callable[[int], str], missing: type[Exception] | tuple = ()) -> None:
        self._lookup = lookup
        self._missing = missing
        self._schemas: dict[int, Any] = {}

    def prime(self, schema_id: int, text: str) -> None:
        """Hold writer schema ``schema_id`` (its Avro JSON ``text``) without asking ``lookup``."""
        if schema_id not in self._schemas:
            self._schemas[schema_id] = json.loads(text)

    def schema(self, schema_id: int, what: str) -> Any:
        got = self._schemas.get(schema_id)
        if got is None:
            try:
                text = self._lookup(schema_id)
            except self._missing as e:  # type: ignore[misc]
                raise EventInvalid(f"{what}'s writer schema id {schema_id} is not in the registry ({e})") from None
            got = json.loads(text)
            if not (isinstance(got, dict) and got.get("type") == "record") and what == "the value":
                raise EventInvalid(f"{what}'s writer schema id {schema_id} is not an Avro record "
                                   "(a Debezium change event is one)")
            self._schemas[schema_id] = got
        return got

    def text(self, record: bytes | None, what: str) -> bytes | None:
        """The JSON text (UTF-8) of a key or value ``record`` (None stays None: a tombstone)."""
        if record is None:
            return None
        sid = wire_id(record, what)
        return datum_json(self.schema(sid, what), record, 5).encode()


_JSON_TYPES = {"boolean": "boolean", "int": "int", "long": "bigint", "float": "float", "double": "double",
               "string": "string", "bytes": "binary", "fixed": "binary", "enum": "string"}


def _json_type(schema: Any, names: dict[str, Any]) -> tuple[str, bool]:
    """The Spark type that reads the JSON text :func:`datum_json` writes for an Avro type (``from_json``), and
    whether it may be null: an int or long logical type (a date, a time, a timestamp) is the number it
    holds (``int``, ``bigint``), a decimal ``decimal(p,s)`` (p the schema's ``precision``, else Connect's
    ``connect.decimal.precision``, else 38), bytes ``binary`` (base64), a record a struct."""
    if isinstance(schema, str) and schema not in _JSON_TYPES and schema != "null":
        schema = names.get(schema, names.get(schema.rsplit(".", 1)[-1], schema))
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise ValueError(f"a union of {len(branches)} types is no column Debezium writes")
        return _json_type(branches[0], names)[0], len(branches) < len(schema)
    if isinstance(schema, str):
        return _JSON_TYPES.get(schema, "void"), schema == "null"
    t = schema.get("type")
    if isinstance(t, (dict, list)):
        return _json_type(t, names)
    if schema.get("logicalType") == "decimal" and t in ("bytes", "fixed"):
        params = schema.get("connect.parameters") or {}
        precision = int(schema.get("precision") or params.get("connect.decimal.precision") or 38)
        return f"decimal({min(precision, 38)},{int(schema.get('scale', 0))})", False
    if t in ("record", "error"):
        fields = [(f["name"], _json_type(f["type"], names)[0]) for f in schema["fields"]]
        return "struct<" + ",".join(f"`{n}`:{ft}" if not n.isidentifier() else f"{n}:{ft}"
                                    for n, ft in fields) + ">", False
    if t == "array":
        return f"array<{_json_type(schema['items'], names)[0]}>", False
    if t == "map":
        return f"map<string,{_json_type(schema['values'], names)[0]}>", False
    return _json_type(t, names)


def row_columns(writer: str | Any):
    """The columns of the rows (``after``) of a Debezium change event's writer schema (JSON text or parsed), as
    the collection holds them: each field of the table's ``Value`` record with the Spark type of the JSON
    text this module decodes it to (:func:`_json_type`). ``ValueError`` when the schema has no ``after``
    record."""
    from reclock.schema_evolution import CollectionSchema, Column

    s = json.loads(writer) if isinstance(writer, str) else writer
    after = next((f for f in s.get("fields", ()) if f.get("name") == "after"), None) if isinstance(s, dict) else None
    if after is None:
        raise ValueError("after: the writer schema has no `after` field (is it a Debezium change event's?)")
    names: dict[str, Any] = {}
    _names(s, names)
    row = after["type"]
    row = next((b for b in row if b != "null"), None) if isinstance(row, list) else row
    row = names.get(row, row) if isinstance(row, str) else row
    if not isinstance(row, dict) or row.get("type") not in ("record", "error"):
        raise ValueError("after: not an Avro record")
    cols = []
    for f in row["fields"]:
        t, nullable = _json_type(f["type"], names)
        cols.append(Column(f["name"], t, nullable))
    return CollectionSchema(tuple(cols))
