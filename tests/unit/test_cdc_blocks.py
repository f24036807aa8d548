"""``ChangeDecoder.feed_blocks`` (the slot's messages read a block at a time with numpy) against
``ChangeDecoder.feed`` (decoded one by one), on generated message streams (hypothesis).

Law: over any stream, cut into blocks anyhow, both write the same parts (same files, same rows in the same
order), emit the same rows per shard and count the same stats, or both raise the same error. The streams
mix what the fast reading takes (inserts, updates and deletes with the whole old row, text and NULL
values, several tables, rewinds, skipped transactions) with everything that sends it message by message:
unchanged TOASTed values, key-only and missing old rows (also of a table of key identity, whose old rows
the decoder keeps), Relation messages mid-stream (also changed
columns or identity), Truncate, Type and Origin messages, tables of no output, malformed and truncated
messages, changes outside a transaction, and tuples of another column count.
"""

from __future__ import annotations

import struct
import tempfile

from blob_support import files_rows
from hypothesis import given, settings, strategies as st
from pgoutput_encode import encode

from reclock.sources.postgres import cdc
from reclock.errors import ReclockError
from reclock.persist.blob import LocalBlobStore
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import TableInfo

COLUMNS = (("id", po.INT8, -1), ("v", po.TEXT, -1), ("n", po.NUMERIC, (12 << 16 | 2) + 4))
TABLES = [TableInfo("public.t0", 100, COLUMNS), TableInfo("public.t1", 101, COLUMNS[:2]),
          TableInfo("public.t2", 103, COLUMNS[:2], identity="default", key=("id",))]  # old rows by key
OTHER = TableInfo("public.other", 102, COLUMNS[:1])  # published, no output of the source
OUTPUTS = [cdc.Output(t, f"s__t{k}") for k, t in enumerate(TABLES)]


def _relation(info: TableInfo, identity: str | None = None, columns=None) -> po.Relation:
    schema, _, name = info.table.partition(".")
    cols = info.columns if columns is None else columns
    identity = identity or ("d" if info.keyed else "f")
    return po.Relation(info.relid, schema, name, identity,
                       tuple(po.Column(int(n in info.key), n, o, m) for n, o, m in cols))


values = st.one_of(st.none(), st.just(po.UNCHANGED_TOAST) | st.none(), st.text(max_size=6).map(str.encode),
                   st.integers(-10**6, 10**6).map(lambda i: str(i).encode()))
plain_values = st.one_of(st.none(), st.integers(-10**6, 10**6).map(lambda i: str(i).encode()))


@st.composite
def tuples(draw, info: TableInfo, irregular: bool):
    n = len(info.columns)
    if irregular and draw(st.integers(0, 20)) == 0:
        n = draw(st.integers(0, 4))  # another column count
    out = []
    for i in range(n):
        if i < len(info.columns) and info.columns[i][1] == po.TEXT:
            v = draw(values if irregular else st.one_of(st.none(), st.text(max_size=6).map(str.encode)))
        else:
            v = draw(plain_values if not irregular or draw(st.integers(0, 15)) else values)
        if v is not po.UNCHANGED_TOAST and v is not None and i < len(info.columns) and info.columns[i][1] != po.TEXT:
            v = str(int(v) if v.lstrip(b"-").isdigit() else 0).encode()  # numbers stay numbers: no conversion error
        out.append(v)
    return tuple(out)


@st.composite
def streams(draw):
    """The encoded messages of a slot, and the decoder's bindings, range and rewind."""
    irregular = draw(st.integers(0, 3)) == 0
    tables = TABLES + [OTHER]
    msgs: list[bytes] = []
    sent = set()
    lsn = 1000
    commits = []
    for _ in range(draw(st.integers(0, 10))):
        lsn += draw(st.integers(1, 300))
        commits.append(lsn)
        msgs.append(encode(po.Begin(lsn, 0, lsn)))
        for _ in range(draw(st.integers(0, 30))):
            info = draw(st.sampled_from(tables))
            if info.relid not in sent or (irregular and draw(st.integers(0, 30)) == 0):
                ident, cols = None, None
                if irregular and draw(st.integers(0, 10)) == 0:
                    ident = draw(st.sampled_from("dni"))
                if irregular and draw(st.integers(0, 10)) == 0:
                    cols = info.columns[:1]
                msgs.append(encode(_relation(info, ident, cols)))
                sent.add(info.relid)
            op = draw(st.sampled_from(["insert", "update", "delete"]))
            tag = "O" if not irregular or draw(st.integers(0, 8)) else draw(st.sampled_from(["K", None]))
            if info.keyed:  # its updates name the old row by its key, or not at all
                tag = draw(st.sampled_from(["K", None]))
            new, old = draw(tuples(info, irregular)), draw(tuples(info, irregular))
            if op == "insert":
                m = po.Insert(info.relid, new)
            elif op == "update":
                m = po.Update(info.relid, tag, None if tag is None else old, new)
            else:
                m = po.Delete(info.relid, tag or "O", old)
            msgs.append(encode(m))
            if irregular and draw(st.integers(0, 40)) == 0:
                msgs.append(draw(st.sampled_from([
                    encode(po.Truncate(0, (draw(st.sampled_from(tables)).relid,))),
                    encode(po.Type(9999, "public", "t")), encode(po.Origin(lsn, "o")),
                    b"", b"Z", encode(po.Insert(info.relid, new))[:-1], encode(po.Insert(info.relid, new)) + b"x",
                    b"I" + struct.pack("!I", info.relid) + b"N\x00\x01q"])))
        msgs.append(encode(po.Commit(0, lsn, lsn + 1, 0)))
        if irregular and draw(st.integers(0, 30)) == 0:
            msgs.append(encode(po.Insert(TABLES[0].relid, (b"1", None, None))))  # outside a transaction
    top = lsn + 10
    cuts = sorted(set(draw(st.lists(st.integers(1000, top), min_size=1, max_size=4))))
    bindings = [(1000 * (i + 1), c) for i, c in enumerate(cuts)]
    start = draw(st.sampled_from([0, *cuts[:-1]]))
    rewind = None
    if draw(st.booleans()):
        lo = draw(st.integers(1000, top))
        hi = draw(st.integers(lo, top + 10))
        rewind = cdc.Rewind(bindings[0][0], lo, hi, draw(st.sampled_from([-1, 1])))
    return msgs, bindings, start, cuts[-1], rewind


def _run(stream, chunk: int, strict: bool, blocks: list[int] | None):
    msgs, bindings, start, end, rewind = stream
    with tempfile.TemporaryDirectory() as tmp:
        blob = LocalBlobStore(tmp)
        writer = cdc.PartWriter(blob, "w", OUTPUTS, chunk)
        dec = cdc.ChangeDecoder("s", OUTPUTS, writer, bindings, start, end, rewind, strict_tables=strict)
        try:
            if blocks is None:
                stats = dec.feed(po.decode(m) for m in msgs)
            else:
                cut, at = [], 0
                for size in blocks:
                    cut.append(msgs[at:at + size])
                    at += size
                cut.append(msgs[at:])
                stats = dec.feed_blocks(cut)
            emitted = writer.close()
        except ReclockError as e:
            return ("error", type(e).__name__, str(e))
        files = files_rows(blob, "w")
        return stats, emitted, files


@settings(max_examples=120, deadline=None)
@given(streams(), st.integers(1, 7), st.booleans(), st.lists(st.integers(1, 40), max_size=8))
def test_blocks_equal_message_by_message(stream, chunk, strict, blocks):
    assert _run(stream, chunk, strict, blocks) == _run(stream, chunk, strict, None)


def test_tuples_at_reads_what_decode_reads():
    msgs = [encode(po.Insert(100, (b"12", None, b"", b"x" * 300))), encode(po.Insert(100, (None, b"-", b"a", None)))]
    import numpy as np

    buf = np.frombuffer(b"".join(msgs), np.uint8)
    pos = np.array([6, len(msgs[0]) + 6])
    t = po.tuples_at(buf, pos, np.array([len(msgs[0]), len(buf)]), 4)
    assert t.end.tolist() == [len(msgs[0]), len(buf)]
    for j in range(4):
        col = po.binary_column(buf, t.start[:, j], t.length[:, j], t.null[:, j]).to_pylist()
        assert col == [po.decode(m).new[j] for m in msgs]
