"""The Confluent wire format (pure): what a Schema Registry serializer puts before a record's payload.

::

    byte 0      magic byte 0
    bytes 1-4   the writer schema's id in the registry, a big-endian signed 32-bit integer
    Protobuf:   the message indexes: which message of the .proto file (a path of indexes into nested
                messages), as a zig-zag varint count followed by that many zig-zag varints; the path [0]
                (the file's first message, the common case) is the single byte 0
    then        the payload: Avro binary (no container), Protobuf binary, or JSON text (JSON Schema)

Law: ``decode_header(encode(id, payload, indexes))`` gives back ``id``, ``indexes`` (``[0]`` where none were
given to a Protobuf encoding) and the payload's offset, for every id and index path
(``tests/unit/test_wire.py``).

Spark decodes without this module (SQL expressions over the bytes, ``reclock.spark.registry_decode``); it
is the definition those expressions are tested against, and what a producer of test records uses.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

MAGIC = 0
HEADER = 5
"""The magic byte and the schema id: the bytes before the payload (Avro, JSON Schema)."""


class WireError(ValueError):
    """Bytes that are not a record in the Confluent wire format; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Header:
    """A record's header: the writer schema's id, the Protobuf message indexes (``()`` for Avro and JSON
    Schema) and where the payload starts."""

    schema_id: int
    message_indexes: tuple[int, ...]
    payload_offset: int


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if at >= len(data):
            raise WireError("the Protobuf message indexes run past the end of the record")
        if shift > 63:
            raise WireError("a Protobuf message index is not a valid varint (longer than 10 bytes)")
        b = data[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, at


def message_indexes_bytes(indexes: Sequence[int]) -> bytes:
    """The message indexes as the wire format writes them (``[0]``: the single byte 0)."""
    if list(indexes) == [0]:
        return b"\x00"
    return _varint(_zigzag(len(indexes))) + b"".join(_varint(_zigzag(i)) for i in indexes)


def encode(schema_id: int, payload: bytes, message_indexes: Sequence[int] | None = None) -> bytes:
    """A record in the wire format: header, (Protobuf: ``message_indexes``), payload."""
    if not -(1 << 31) <= schema_id < (1 << 31):
        raise ValueError(f"schema id {schema_id} does not fit 32 bits")
    head = struct.pack(">bi", MAGIC, schema_id)
    if message_indexes is not None:
        head += message_indexes_bytes(message_indexes)
    return head + payload


def decode_header(value: bytes, protobuf: bool = False) -> Header:
    """The header of a wire-format record (``protobuf``: with message indexes); :class:`WireError` when
    ``value`` is not one."""
    if len(value) < HEADER:
        raise WireError(f"{len(value)} bytes are too short for the Confluent wire header (magic byte and a 4-byte "
                        "schema id)")
    if value[0] != MAGIC:
        raise WireError(f"the first byte is {value[0]}, not the Confluent wire format's magic byte 0")
    (schema_id,) = struct.unpack_from(">i", value, 1)
    if not protobuf:
        return Header(schema_id, (), HEADER)
    count, at = _read_varint(value, HEADER)
    count = _unzigzag(count)
    if count == 0:
        return Header(schema_id, (0,), at)
    if count < 0 or count > 100:
        raise WireError(f"the Protobuf message index count {count} is not plausible")
    indexes = []
    for _ in range(count):
        i, at = _read_varint(value, at)
        indexes.append(_unzigzag(i))
    return Header(schema_id, tuple(indexes), at)
