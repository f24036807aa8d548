"""``reclock.sources.postgres.cdc`` for a table of key identity (``REPLICA IDENTITY DEFAULT`` with a primary
key), over generated histories (hypothesis), against a model of the table.

The messages are what ``pgoutput`` sends under that identity: an update that keeps its key carries no old
row, one that changes it only the old key (``K``, the other columns NULL), a delete only the key; a TOASTed
value an update leaves alone comes as ``u``. Laws: the updates the decoder writes, with the collection's
contents before the write (``prior``), consolidated AS OF each binding, are the table as of that binding's
LSN, every value as the table holds it (unchanged TOASTed ones too); with a snapshot at ``S`` before the
first binding's LSN the same; with one past it, the bindings below ``S`` hold the table as of ``S``
(the seam's old rows are not in the WAL) and the later ones are exact; a key the collection has no row of
stalls the source (``KeyedRowMissing``).
"""

from __future__ import annotations

import tempfile
from collections import Counter

from pgoutput_encode import encode

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

from reclock.errors import KeyedRowMissing
from reclock.persist.blob import LocalBlobStore
from reclock.sources.postgres import cdc
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import TableInfo

INFO = TableInfo("public.t", 100, (("id", po.INT8, -1), ("v", po.TEXT, -1), ("big", po.TEXT, -1)),
                 identity="default", key=("id",))
OUT = cdc.Output(INFO, "s__t")
RELATION = po.Relation(100, "public", "t", "d", (po.Column(1, "id", po.INT8, -1), po.Column(0, "v", po.TEXT, -1),
                                                 po.Column(0, "big", po.TEXT, -1)))
texts = st.one_of(st.none(), st.text(max_size=5))


def _t(v) -> bytes | None:
    return None if v is None else str(v).encode()


@st.composite
def histories(draw):
    """The table's rows before the write, then transactions ``(commit_lsn, [message], state after)``."""
    live = {k: (draw(texts), draw(texts)) for k in draw(st.sets(st.integers(0, 20), max_size=6))}
    prior = dict(live)
    txns, lsn = [], 1000
    for _ in range(draw(st.integers(0, 10))):
        msgs = []
        for _ in range(draw(st.integers(1, 5))):
            op = draw(st.sampled_from(["insert", "update", "rekey", "delete"] if live else ["insert"]))
            free = st.integers(0, 30).filter(lambda x: x not in live)
            if op == "insert":
                key, row = draw(free), (draw(texts), draw(texts))
                msgs.append(po.Insert(100, (_t(key), _t(row[0]), _t(row[1]))))
                live[key] = row
                continue
            key = draw(st.sampled_from(sorted(live)))
            if op == "delete":
                msgs.append(po.Delete(100, "K", (_t(key), None, None)))
                del live[key]
                continue
            v, big = draw(texts), live[key][1]
            toast = draw(st.booleans())  # big unchanged, sent as 'u'
            if not toast and draw(st.booleans()):
                big = draw(texts)
            new_key = draw(free) if op == "rekey" else key
            new = (_t(new_key), _t(v), po.UNCHANGED_TOAST if toast else _t(big))
            msgs.append(po.Update(100, None, None, new) if op == "update" else
                        po.Update(100, "K", (_t(key), None, None), new))
            del live[key]
            live[new_key] = (v, big)
        lsn += draw(st.integers(1, 300))
        txns.append((lsn, msgs, dict(live)))
    cuts = sorted(set(draw(st.lists(st.integers(1000, lsn + 10), min_size=1, max_size=4))))
    return prior, txns, cuts


def _stream(txns) -> list[po.Message]:
    out = [RELATION]
    for commit, msgs, _ in txns:
        out += [po.Begin(commit, 0, commit), *msgs, po.Commit(0, commit, commit + 1, 0)]
    return out


def _state_at(prior, txns, lsn: int) -> dict:
    state = prior
    for commit, _, after in txns:
        if commit < lsn:
            state = after
    return state


def _contents(blob, t: int) -> Counter:
    out = Counter()
    for info in blob.list("w"):
        with blob.open(info.path) as f:
            for r in pq.read_table(f).to_pylist():
                if r["ts"] <= t:
                    out[(r["id"], r["v"], r["big"])] += r["diff"]
    return Counter({k: v for k, v in out.items() if v})


def _held(rows: dict) -> pa.Table:
    keys = sorted(rows)
    return pa.table({"id": pa.array(keys, pa.int64()), "v": [rows[k][0] for k in keys],
                     "big": [rows[k][1] for k in keys], "diff": pa.array([1] * len(keys), pa.int64())})


@settings(max_examples=80, deadline=None)
@given(histories(), st.integers(1, 4), st.sampled_from(["before", "snapshot"]), st.data(), st.booleans(),
       st.booleans())
def test_old_rows_come_from_the_collection_and_every_binding_is_the_table(history, chunk, start_from, data, blocks,
                                                                          via_prior):
    prior, txns, cuts = history
    bindings = [(1_000 * (i + 1), lsn) for i, lsn in enumerate(cuts)]
    with tempfile.TemporaryDirectory() as tmp:
        blob = LocalBlobStore(tmp)
        writer = cdc.PartWriter(blob, "w", [OUT], chunk)
        rewind, start, s, held = None, 0, None, None
        if start_from == "snapshot":  # the first binding's contents come from a snapshot at S
            t1, l1 = bindings[0]
            s = data.draw(st.integers(1000, cuts[-1] + 10))
            for key, (v, big) in _state_at(prior, txns, s).items():
                writer.add(100, (_t(key), _t(v), _t(big)), t1, 1)
            if s != l1:
                rewind = cdc.Rewind(t1, min(s, l1), max(s, l1), -1 if s > l1 else 1)
            start = l1
        elif via_prior:  # the collection holds the rows before the write
            held = _held(prior)
        else:  # this write wrote them before its first change (at ts 1)
            for key, (v, big) in prior.items():
                writer.add(100, (_t(key), _t(v), _t(big)), 1, 1)
        decoder = cdc.ChangeDecoder("s", [OUT], writer, bindings, start, cuts[-1], rewind, strict_tables=False,
                                    prior=lambda out: held, key_from=s or 0)
        if blocks:
            decoder.feed_blocks([[encode(m) for m in _stream(txns)]])
        else:
            decoder.feed(_stream(txns))
        emitted = writer.close()
        cdc.collect(blob, "s", "w", emitted)
        for ts, lsn in bindings:
            at = max(lsn, s) if s is not None and s > bindings[0][1] else lsn
            want = Counter({(k, v, big): 1 for k, (v, big) in _state_at(prior, txns, at).items()})
            base = Counter({(k, v, big): 1 for k, (v, big) in prior.items()}) if held is not None else Counter()
            got = _contents(blob, ts)
            got.update(base)
            assert Counter({k: n for k, n in got.items() if n}) == want, (ts, lsn, s)


def test_an_update_of_a_key_the_collection_has_no_row_of_stalls_naming_it():
    with tempfile.TemporaryDirectory() as tmp:
        writer = cdc.PartWriter(LocalBlobStore(tmp), "w", [OUT], 10)
        held = _held({1: ("a", "x" * 10)})
        dec = cdc.ChangeDecoder("s", [OUT], writer, [(1000, 10_000)], 0, 10_000, None, strict_tables=False,
                                prior=lambda out: held)
        dec.feed([RELATION, po.Begin(2000, 0, 1), po.Update(100, None, None, (b"1", b"b", po.UNCHANGED_TOAST)),
                  po.Commit(0, 2000, 2001, 0)])
        with pytest.raises(KeyedRowMissing, match=r"table public\.t: a delete of key \(2,\) \(id\) found no row"):
            dec.feed([po.Begin(3000, 0, 2), po.Delete(100, "K", (b"2", None, None)), po.Commit(0, 3000, 3001, 0)])
        writer.close()
        rows = []
        for info in writer.blob.list("w"):
            with writer.blob.open(info.path) as f:
                rows += [(r["id"], r["v"], r["big"], r["diff"]) for r in pq.read_table(f).to_pylist()]
        rows.sort()
        assert rows == [(1, "a", "x" * 10, -1), (1, "b", "x" * 10, 1)]
