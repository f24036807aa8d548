"""``reclock.sources.postgres.cdc`` over generated transactions (hypothesis), against a model of the tables.

Laws: the updates the decoder writes, consolidated AS OF each binding, are the tables as of that binding's
LSN; every row a transaction writes carries the timestamp of the least binding beyond its commit LSN; a
snapshot at any LSN ``S`` rewound to the first binding's LSN ``L1`` gives the tables as of ``L1`` at the
first timestamp, whether ``S`` is before or after ``L1``; parts never hold more than the budget's rows;
the parts hold exactly the rows emitted (``collect``).
"""

from __future__ import annotations

import tempfile
from collections import Counter

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st
from pgoutput_encode import encode

from reclock.sources.postgres import cdc
from reclock.errors import TableSchemaChanged, TableTruncated
from reclock.persist.blob import LocalBlobStore
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import TableInfo

COLUMNS = (("id", po.INT8, -1), ("v", po.TEXT, -1))
TABLES = [TableInfo(f"public.t{k}", 100 + k, COLUMNS) for k in range(2)]
OUTPUTS = [cdc.Output(t, f"s__t{k}") for k, t in enumerate(TABLES)]


def _relation(info: TableInfo) -> po.Relation:
    schema, _, name = info.table.partition(".")
    return po.Relation(info.relid, schema, name, "f", tuple(po.Column(0, n, o, m) for n, o, m in info.columns))


def _row(key: int, value: str | None) -> tuple:
    return (str(key).encode(), None if value is None else value.encode())


@st.composite
def histories(draw):
    """Transactions over the two tables, each ``(commit_lsn, [(table, op, key, old, new)])`` with the
    table states they leave, and binding LSNs."""
    state: list[dict[int, str | None]] = [{}, {}]
    txns = []
    lsn = 1000
    for _ in range(draw(st.integers(0, 12))):
        ops = []
        for _ in range(draw(st.integers(1, 5))):
            k = draw(st.integers(0, 1))
            live = state[k]
            kind = draw(st.sampled_from(["insert", "update", "delete"] if live else ["insert"]))
            if kind == "insert":
                key = draw(st.integers(0, 30).filter(lambda x: x not in live))
                new = draw(st.one_of(st.none(), st.text(max_size=5)))
                ops.append((k, kind, key, None, new))
                live[key] = new
            else:
                key = draw(st.sampled_from(sorted(live)))
                old = live[key]
                new = draw(st.one_of(st.none(), st.text(max_size=5)))
                ops.append((k, kind, key, old, new if kind == "update" else None))
                if kind == "update":
                    live[key] = new
                else:
                    del live[key]
        lsn += draw(st.integers(1, 500))
        txns.append((lsn, ops, [dict(s) for s in state]))
    top = lsn + 10
    cut = st.integers(1000, top)
    if txns:  # a binding exactly at a commit LSN: that transaction is not in it (it committed at, not below)
        cut = st.one_of(cut, st.sampled_from([c for c, _, _ in txns]))
    cuts = sorted(set(draw(st.lists(cut, min_size=1, max_size=5))))
    return txns, cuts


def _messages(txns) -> list[bytes]:
    out = []
    sent = set()
    for commit, ops, _ in txns:
        out.append(encode(po.Begin(commit, 0, commit)))
        for k, kind, key, old, new in ops:
            info = TABLES[k]
            if info.relid not in sent:
                out.append(encode(_relation(info)))
                sent.add(info.relid)
            if kind == "insert":
                out.append(encode(po.Insert(info.relid, _row(key, new))))
            elif kind == "update":
                out.append(encode(po.Update(info.relid, "O", _row(key, old), _row(key, new))))
            else:
                out.append(encode(po.Delete(info.relid, "O", _row(key, old))))
        out.append(encode(po.Commit(0, commit, commit + 1, 0)))
    return out


def _state_at(txns, lsn: int) -> list[dict]:
    state: list[dict] = [{}, {}]
    for commit, _, after in txns:
        if commit < lsn:
            state = after
    return state


def _contents(blob, prefix: str, t: int) -> list[Counter]:
    """Per table, ``(id, v) -> multiplicity`` of the updates at ``ts <= t``."""
    out = [Counter(), Counter()]
    for info in blob.list(prefix):
        k = int(info.path.split("/")[-2][-1])
        with blob.open(info.path) as f:
            for r in pq.read_table(f).to_pylist():
                if r["ts"] <= t:
                    out[k][(r["id"], r["v"])] += r["diff"]
    return [Counter({k: v for k, v in c.items() if v}) for c in out]


def _as_counter(state: dict) -> Counter:
    return Counter({(k, v): 1 for k, v in state.items()})


@settings(max_examples=60, deadline=None)
@given(histories(), st.integers(1, 4), st.data())
def test_updates_are_the_tables_as_of_every_binding(history, chunk, data):
    txns, cuts = history
    bindings = [(1_000 * (i + 1), lsn) for i, lsn in enumerate(cuts)]
    with tempfile.TemporaryDirectory() as tmp:
        blob = LocalBlobStore(tmp)
        writer = cdc.PartWriter(blob, "w", OUTPUTS, chunk)
        snapshot = data.draw(st.booleans())
        rewind, start = None, 0
        if snapshot:  # the first binding's contents come from a snapshot at S, rewound to L1
            t1, l1 = bindings[0]
            s = data.draw(st.integers(1000, cuts[-1] + 10))
            for k, table in enumerate(_state_at(txns, s)):
                for key, value in table.items():
                    writer.add(TABLES[k].relid, (str(key), value), t1, 1)
            if s != l1:
                rewind = cdc.Rewind(t1, min(s, l1), max(s, l1), -1 if s > l1 else 1)
            start = l1
        decoder = cdc.ChangeDecoder("s", OUTPUTS, writer, bindings, start, cuts[-1], rewind, strict_tables=False)
        decoder.feed(po.decode(m) for m in _messages(txns))
        emitted = writer.close()
        parts = cdc.collect(blob, "s", "w", emitted)
        assert all(p.rows <= chunk for ps in parts.values() for p in ps)
        assert sum(p.rows for ps in parts.values() for p in ps) == sum(emitted.values())
        for ts, lsn in bindings:
            want = [_as_counter(t) for t in _state_at(txns, lsn)]
            assert _contents(blob, "w", ts) == want, (ts, lsn)
        # one timestamp per transaction: its +1 rows after the first binding sit at the binding covering it
        for info in blob.list("w"):
            with blob.open(info.path) as f:
                table = pq.read_table(f)
            for r in table.to_pylist():
                if not snapshot or r["ts"] != bindings[0][0]:
                    assert r["ts"] in {ts for ts, _ in bindings}


def test_truncate_and_a_changed_relation_stall_naming_the_table():
    with tempfile.TemporaryDirectory() as tmp:
        writer = cdc.PartWriter(LocalBlobStore(tmp), "w", OUTPUTS, 10)
        dec = cdc.ChangeDecoder("s", OUTPUTS, writer, [(1000, 10_000)], 0, 10_000, None, strict_tables=False)
        msgs = [po.Begin(2000, 0, 1), _relation(TABLES[0]), po.Truncate(0, (TABLES[0].relid,)), po.Commit(0, 2000, 2001, 0)]
        with pytest.raises(TableTruncated, match=r"table public\.t0: TRUNCATE"):
            dec.feed(msgs)
        # with a way to retract: each truncated output once, at the transaction's ts; in the seam, a stall
        calls = []
        dec = cdc.ChangeDecoder("s", OUTPUTS, writer, [(1000, 10_000)], 0, 10_000, None, strict_tables=False,
                                truncated=lambda out, ts: calls.append((out.info.table, ts)) or 2)
        assert dec.feed(msgs).changes == 2 and calls == [("public.t0", 1000)]
        dec = cdc.ChangeDecoder("s", OUTPUTS, writer, [(1000, 10_000)], 0, 10_000, cdc.Rewind(1000, 1500, 3000, -1),
                                strict_tables=False, truncated=lambda out, ts: 0)
        with pytest.raises(TableTruncated, match=r"table public\.t0: TRUNCATE between the first binding and its "
                           "snapshot"):
            dec.feed(msgs)
        changed = po.Relation(100, "public", "t0", "f", (po.Column(0, "id", po.INT8, -1), po.Column(0, "w", po.TEXT, -1)))
        dec = cdc.ChangeDecoder("s", OUTPUTS, writer, [(1000, 10_000)], 0, 10_000, None, strict_tables=False)
        with pytest.raises(TableSchemaChanged, match=r"column v \(text\) was renamed to w \(text\)"):
            dec.feed([po.Begin(2000, 0, 1), changed, po.Insert(100, (b"1", b"x")), po.Commit(0, 2000, 2001, 0)])
        # a change outside the description's range is not looked at
        dec = cdc.ChangeDecoder("s", OUTPUTS, writer, [(1000, 10_000)], 0, 1500, None, strict_tables=False)
        dec.feed([po.Begin(2000, 0, 1), changed, po.Insert(100, (b"1", b"x")), po.Commit(0, 2000, 2001, 0)])
