"""A pgoutput protocol v1 encoder for the tests, byte for byte as PostgreSQL's docs lay the messages out
(written apart from the decoder it checks)."""

from __future__ import annotations

import struct

from reclock.sources.postgres import pgoutput as po


def _s(text: str) -> bytes:
    return text.encode() + b"\0"


def _tuple(values) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is po.UNCHANGED_TOAST:
            out += b"u"
        else:
            out += b"t" + struct.pack("!i", len(v)) + v
    return out


def encode(m: po.Message) -> bytes:
    """A protocol v1 message, byte for byte as PostgreSQL's docs lay it out."""
    if isinstance(m, po.Begin):
        return b"B" + struct.pack("!QqI", m.final_lsn, m.commit_time, m.xid)
    if isinstance(m, po.Commit):
        return b"C" + struct.pack("!bQQq", m.flags, m.commit_lsn, m.end_lsn, m.commit_time)
    if isinstance(m, po.Origin):
        return b"O" + struct.pack("!Q", m.commit_lsn) + _s(m.name)
    if isinstance(m, po.Relation):
        out = b"R" + struct.pack("!I", m.relid) + _s(m.namespace) + _s(m.name) + m.replica_identity.encode()
        out += struct.pack("!h", len(m.columns))
        for c in m.columns:
            out += struct.pack("!b", c.flags) + _s(c.name) + struct.pack("!Ii", c.type_oid, c.typmod)
        return out
    if isinstance(m, po.Type):
        return b"Y" + struct.pack("!I", m.oid) + _s(m.namespace) + _s(m.name)
    if isinstance(m, po.Insert):
        return b"I" + struct.pack("!I", m.relid) + b"N" + _tuple(m.new)
    if isinstance(m, po.Update):
        old = b"" if m.old_kind is None else m.old_kind.encode() + _tuple(m.old)
        return b"U" + struct.pack("!I", m.relid) + old + b"N" + _tuple(m.new)
    if isinstance(m, po.Delete):
        return b"D" + struct.pack("!I", m.relid) + m.old_kind.encode() + _tuple(m.old)
    if isinstance(m, po.Truncate):
        return b"T" + struct.pack("!ib", len(m.relids), m.options) + b"".join(struct.pack("!I", r) for r in m.relids)
    raise TypeError(m)
