"""A Parquet file's footer rewritten without touching its data pages: columns dropped or renamed, Parquet
field ids set. The Iceberg export copies a part's bytes and puts a new footer after them
(``reclock.sinks.iceberg``), so a part whose rows are exactly what a commit exports becomes a data file
without being decoded and encoded again.

::

    part:  PAR1 | column chunks (pages, dictionaries, page indexes, bloom filters) | footer | len | PAR1
    copy:  PAR1 | the same bytes, unread                                          | footer' | len' | PAR1

The footer is a Thrift ``FileMetaData`` in the compact protocol. :func:`decode` reads any Thrift struct into
plain values (every field kept, unknown ones too) and :func:`encode` writes them back byte for byte;
:func:`rewrite` edits only what a column's identity is made of: the schema elements (name, field id), each
row group's column chunks (``path_in_schema``), the row groups' sizes and first offset, the column orders;
it drops the sorting columns (they count columns by position) and the key-value metadata (an embedded
Arrow or Spark schema would still name the old columns). A dropped column's pages stay in the file,
unreferenced. Pure: no I/O, nothing of Reclock's imported.

Law (tested with hypothesis): reading the rewritten file gives the original's columns minus the dropped
ones, renamed, the same values, with the field ids asked for; ``encode(decode(b)) == b`` for every footer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Mapping

MAGIC = b"PAR1"

# compact protocol type ids
STOP, TRUE, FALSE, I8, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT, UUID = range(14)


class FooterError(ValueError):
    """The footer cannot be read or is of a shape :func:`rewrite` does not handle (an encrypted footer, a
    nested column): the caller writes the rows anew instead. ``need``: when only the tail given was too
    short, how many bytes from the file's end hold the footer whole (read those and try again)."""

    def __init__(self, message: str, need: int | None = None) -> None:
        super().__init__(message)
        self.need = need


# -- the compact protocol --------------------------------------------------------------------------------


@dataclass
class Field:
    """One field of a struct as read: its id, its compact type and its value (a bool, an int, ``bytes``
    for binaries and doubles (kept raw), a :class:`List`, a :class:`Map` or a ``list[Field]`` struct)."""

    id: int
    type: int
    value: Any


@dataclass
class List:
    type: int  # the elements' compact type
    items: list
    set: bool = False


@dataclass
class Map:
    key_type: int
    value_type: int
    items: list  # (key, value) pairs


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.at = buf, 0

    def byte(self) -> int:
        if self.at >= len(self.buf):
            raise FooterError("the footer ends inside a value")
        b = self.buf[self.at]
        self.at += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 70:
                raise FooterError("a varint of more than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.buf):
            raise FooterError("the footer ends inside a value")
        out = self.buf[self.at:self.at + n]
        self.at += n
        return out

    def value(self, t: int) -> Any:
        if t in (TRUE, FALSE):  # an element of a container: one byte
            return self.byte()
        if t == I8:
            return self.byte()
        if t in (I16, I32, I64):
            return self.zigzag()
        if t == DOUBLE:
            return self.take(8)
        if t == BINARY:
            return self.take(self.varint())
        if t == UUID:
            return self.take(16)
        if t in (LIST, SET):
            head = self.byte()
            size, et = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            return List(et, [self.value(et) for _ in range(size)], t == SET)
        if t == MAP:
            size = self.varint()
            if not size:
                return Map(0, 0, [])
            kv = self.byte()
            kt, vt = kv >> 4, kv & 0x0F
            return Map(kt, vt, [(self.value(kt), self.value(vt)) for _ in range(size)])
        if t == STRUCT:
            return self.struct()
        raise FooterError(f"unknown Thrift compact type {t}")

    def struct(self) -> list[Field]:
        fields: list[Field] = []
        last = 0
        while True:
            head = self.byte()
            t = head & 0x0F
            if t == STOP:
                return fields
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            if t in (TRUE, FALSE):
                fields.append(Field(fid, t, t == TRUE))
            else:
                fields.append(Field(fid, t, self.value(t)))
            last = fid


def decode(buf: bytes) -> list[Field]:
    """The Thrift struct (compact protocol) ``buf`` holds, whole (``FooterError`` if anything is left)."""
    r = _Reader(buf)
    out = r.struct()
    if r.at != len(buf):
        raise FooterError(f"{len(buf) - r.at} bytes after the struct")
    return out


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while True:
            if n < 0x80:
                self.out.append(n)
                return
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, t: int, v: Any) -> None:
        if t in (TRUE, FALSE, I8):
            self.out.append(v & 0xFF)
        elif t in (I16, I32, I64):
            self.zigzag(v)
        elif t in (DOUBLE, UUID):
            self.out += v
        elif t == BINARY:
            self.varint(len(v))
            self.out += v
        elif t in (LIST, SET):
            n = len(v.items)
            if n < 15:
                self.out.append((n << 4) | v.type)
            else:
                self.out.append(0xF0 | v.type)
                self.varint(n)
            for item in v.items:
                self.value(v.type, item)
        elif t == MAP:
            self.varint(len(v.items))
            if v.items:
                self.out.append((v.key_type << 4) | v.value_type)
                for k, x in v.items:
                    self.value(v.key_type, k)
                    self.value(v.value_type, x)
        elif t == STRUCT:
            self.struct(v)
        else:
            raise FooterError(f"unknown Thrift compact type {t}")

    def struct(self, fields: list[Field]) -> None:
        last = 0
        for f in fields:
            t = (TRUE if f.value else FALSE) if f.type in (TRUE, FALSE) else f.type
            delta = f.id - last
            if 0 < delta <= 15:
                self.out.append((delta << 4) | t)
            else:
                self.out.append(t)
                self.zigzag(f.id)
            if t not in (TRUE, FALSE):
                self.value(t, f.value)
            last = f.id
        self.out.append(STOP)


def encode(fields: list[Field]) -> bytes:
    """The Thrift struct ``fields`` in the compact protocol (the inverse of :func:`decode`)."""
    w = _Writer()
    w.struct(fields)
    return bytes(w.out)


def _get(fields: list[Field], fid: int) -> Field | None:
    return next((f for f in fields if f.id == fid), None)


def _put(fields: list[Field], fid: int, t: int, value: Any) -> list[Field]:
    """``fields`` with field ``fid`` set (added in id order if missing)."""
    out = [f for f in fields if f.id != fid] + [Field(fid, t, value)]
    return sorted(out, key=lambda f: f.id)


def _drop(fields: list[Field], *fids: int) -> list[Field]:
    return [f for f in fields if f.id not in fids]


# -- the footer ---------------------------------------------------------------------------------------------

# FileMetaData
FMD_SCHEMA, FMD_NUM_ROWS, FMD_ROW_GROUPS, FMD_KV, FMD_COLUMN_ORDERS, FMD_ENCRYPTION = 2, 3, 4, 5, 7, 8
# SchemaElement
SE_NAME, SE_NUM_CHILDREN, SE_FIELD_ID = 4, 5, 9
# RowGroup
RG_COLUMNS, RG_TOTAL_BYTES, RG_SORTING, RG_FILE_OFFSET, RG_TOTAL_COMPRESSED = 1, 2, 4, 5, 6
# ColumnChunk and ColumnMetaData
CC_FILE_PATH, CC_META, CC_CRYPTO, CC_ENCRYPTED_META = 1, 3, 8, 9
CMD_PATH, CMD_UNCOMPRESSED, CMD_COMPRESSED, CMD_DATA_PAGE, CMD_DICT_PAGE = 3, 6, 7, 9, 11


@dataclass(frozen=True)
class Footer:
    """Where a Parquet file's footer lies (``start``: the first byte after the column chunks) and its
    decoded ``FileMetaData``."""

    start: int
    meta: list[Field]

    @property
    def num_rows(self) -> int:
        f = _get(self.meta, FMD_NUM_ROWS)
        return 0 if f is None else f.value

    def columns(self) -> list[str]:
        """The top-level column names, in order (``FooterError`` for a nested schema)."""
        return [n for n, _ in _leaves(self.meta)]


def read_footer(tail: bytes, size: int) -> Footer:
    """The footer of a Parquet file of ``size`` bytes whose last ``len(tail)`` bytes are ``tail``
    (``FooterError`` if the tail does not hold it whole, or the footer is encrypted)."""
    if size < 12 or len(tail) < 8 or tail[-4:] != MAGIC:
        raise FooterError("not a Parquet file (an encrypted footer ends in PARE)")
    n = struct.unpack("<I", tail[-8:-4])[0]
    if n + 12 > size:
        raise FooterError(f"the footer says it is {n} bytes long, in a file of {size}")
    if n + 8 > len(tail):
        raise FooterError(f"the footer ({n} bytes) is not in the last {len(tail)} bytes read", need=n + 8)
    meta = decode(bytes(tail[-8 - n:-8]))
    if _get(meta, FMD_ENCRYPTION) is not None:
        raise FooterError("the file's columns are encrypted")
    return Footer(size - 8 - n, meta)


def _leaves(meta: list[Field]) -> list[tuple[str, list[Field]]]:
    """The schema's leaf elements (name, element) of a flat schema: the root, then one primitive per column."""
    schema = _get(meta, FMD_SCHEMA)
    if schema is None or not schema.value.items:
        raise FooterError("the footer has no schema")
    root, *leaves = schema.value.items
    children = _get(root, SE_NUM_CHILDREN)
    if children is None or children.value != len(leaves) or any(_get(e, SE_NUM_CHILDREN) for e in leaves):
        raise FooterError("a nested schema (only flat ones are rewritten)")
    return [(_get(e, SE_NAME).value.decode(), e) for e in leaves]


def rewrite(footer: Footer, keep: Mapping[str, str], field_ids: Mapping[str, int]) -> bytes:
    """The new end of the file: the footer with only the columns ``keep`` names (old name -> new name), each
    with its new name's id from ``field_ids``, then its length and the magic. Written after the file's
    first ``footer.start`` bytes it makes a whole Parquet file."""
    meta = footer.meta
    leaves = _leaves(meta)
    names = [n for n, _ in leaves]
    missing = sorted(set(keep) - set(names))
    if missing:
        raise FooterError(f"no column(s) {', '.join(missing)} in the file")
    kept = [i for i, n in enumerate(names) if n in keep]
    schema = _get(meta, FMD_SCHEMA).value
    root = _put(schema.items[0], SE_NUM_CHILDREN, I32, len(kept))
    elements = [root]
    for i in kept:
        new = keep[names[i]]
        e = _put(leaves[i][1], SE_NAME, BINARY, new.encode())
        if new in field_ids:
            e = _put(e, SE_FIELD_ID, I32, int(field_ids[new]))
        elements.append(e)
    out = _put(meta, FMD_SCHEMA, LIST, List(STRUCT, elements))
    groups = []
    for rg in _get(meta, FMD_ROW_GROUPS).value.items:
        chunks = _get(rg, RG_COLUMNS).value.items
        if len(chunks) != len(names):
            raise FooterError("a row group's columns do not match the schema")
        new_chunks, total, compressed, first = [], 0, 0, None
        for i in kept:
            cc = chunks[i]
            if _get(cc, CC_FILE_PATH) is not None or _get(cc, CC_CRYPTO) or _get(cc, CC_ENCRYPTED_META):
                raise FooterError("a column chunk in another file, or encrypted")
            md = _get(cc, CC_META).value
            md = _put(md, CMD_PATH, LIST, List(BINARY, [keep[names[i]].encode()]))
            total += _get(md, CMD_UNCOMPRESSED).value
            compressed += _get(md, CMD_COMPRESSED).value
            starts = [f.value for f in (_get(md, CMD_DICT_PAGE), _get(md, CMD_DATA_PAGE)) if f is not None]
            first = min([first, *starts]) if first is not None else min(starts)
            new_chunks.append(_put(cc, CC_META, STRUCT, md))
        rg = _put(_drop(rg, RG_SORTING), RG_COLUMNS, LIST, List(STRUCT, new_chunks))
        rg = _put(rg, RG_TOTAL_BYTES, I64, total)
        if _get(rg, RG_TOTAL_COMPRESSED) is not None:
            rg = _put(rg, RG_TOTAL_COMPRESSED, I64, compressed)
        if _get(rg, RG_FILE_OFFSET) is not None and first is not None:
            rg = _put(rg, RG_FILE_OFFSET, I64, first)
        groups.append(rg)
    out = _put(out, FMD_ROW_GROUPS, LIST, List(STRUCT, groups))
    orders = _get(out, FMD_COLUMN_ORDERS)
    if orders is not None:
        out = _put(out, FMD_COLUMN_ORDERS, LIST, List(STRUCT, [orders.value.items[i] for i in kept]))
    body = encode(_drop(out, FMD_KV))
    return body + struct.pack("<I", len(body)) + MAGIC
