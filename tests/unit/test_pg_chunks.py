"""The chunk-vs-log reconciliation of an online chunked snapshot (``reclock.sources.postgres.chunks``): for any
history of transactions, chunk reads under snapshots that may miss transactions still leaving the process array,
and bindings, the log's changes ``ChunkedTable.fate`` keeps plus the chunks' rows equal, AS OF every binding,
the table restricted to the chunks appended by then; or a write's stream misses a raced transaction, which the
write refuses (``ChunkRaced``)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.sources.postgres.chunks import Chunk, ChunkedTable, XidSnapshot


def test_xid_snapshot_visibility_and_wraparound():
    s = XidSnapshot.parse("100:110:103,107")
    assert s.visible(99) and s.visible(100) and s.visible(105)
    assert not s.visible(103) and not s.visible(107) and not s.visible(110) and not s.visible(200)
    epoch = XidSnapshot((5 << 32) + 10, (5 << 32) + 20, ((5 << 32) + 12,))
    assert epoch.visible(0xFFFFFFF0)  # the epoch before: older than xmin
    assert epoch.visible(11) and not epoch.visible(12) and not epoch.visible(25)
    assert XidSnapshot.parse(epoch.to_json()) == epoch


@st.composite
def histories(draw):
    """Steps: ("txn", [(key, value or None)]) committed at their own LSN, or ("chunk", rows) read under a
    snapshot missing some of the latest commits (``lag``), then ("bind",) a binding."""
    keys = draw(st.integers(3, 12))
    steps = []
    for _ in range(draw(st.integers(1, 6))):  # cycles: transactions, a mint that reads chunks, a binding
        for _ in range(draw(st.integers(0, 6))):
            ops = draw(st.lists(st.tuples(st.integers(1, keys), st.one_of(st.none(), st.integers(0, 9))),
                                min_size=1, max_size=3))
            steps.append(("txn", ops))
        for _ in range(draw(st.integers(0, 2))):
            steps.append(("chunk", draw(st.integers(1, 4)), draw(st.integers(0, 2))))
            steps.extend(("txn", [(draw(st.integers(1, keys)), draw(st.integers(0, 9)))])
                         for _ in range(draw(st.integers(0, 2))))  # commits between the read and the high mark
            steps.append(("high",))
        steps.append(("bind",))
    return keys, steps


@settings(max_examples=60, deadline=None)
@given(histories())
def test_fate_gives_the_table_restricted_to_the_chunks_at_every_binding(history):
    nkeys, steps = history
    lsn, xid = 0, 1000
    table: dict[int, int] = {}
    txns = []  # (commit lsn, xid, [(key, old, new)])
    done_last: tuple | None = None
    complete = False
    writes = []  # per binding: (ts, lsn, [(chunk, its rows)] read at its mint, done before, complete before)
    landed: list = []  # this cycle's chunks read, with their rows
    reading = None  # the chunk read whose high watermark is still to come
    ts = 0
    for step in steps:
        lsn += 10
        if step[0] == "txn":
            xid += 1
            ops = []
            for k, v in step[1]:
                ops.append((k, table.get(k), v))
                if v is None:
                    table.pop(k, None)
                else:
                    table[k] = v
            txns.append((lsn, xid, ops))
        elif step[0] == "chunk":
            after = landed[-1][0].last if landed else done_last
            if complete or (landed and after is None):
                continue
            _, limit, lag = step
            # the snapshot misses the last `lag` commits (committed, still in the process array)
            missed = [x for _, x, _ in txns[max(0, len(txns) - lag):]]
            state: dict[int, int] = {}
            for _, x, ops in txns:
                if x not in missed:
                    for k, _, new in ops:
                        if new is None:
                            state.pop(k, None)
                        else:
                            state[k] = new
            ks = sorted(k for k in state if after is None or k > after[0])
            got = ks[:limit]
            last = None if len(ks) <= limit else (got[-1],)
            snap = XidSnapshot(min([*missed, xid + 1]), xid + 1, tuple(missed))
            reading = (Chunk(after, last, len(got), lsn - 5, 0, snap, tuple(missed)), {k: state[k] for k in got})
        elif step[0] == "high":
            if reading is not None:
                c, rows = reading
                landed.append((Chunk(c.after, c.last, c.rows, c.low, lsn, c.snapshot, c.raced), rows))
                reading = None
        else:
            ts += 1
            writes.append((ts, lsn, list(landed), done_last, complete))
            if landed:
                done_last = landed[-1][0].last
                complete = complete or done_last is None
            landed.clear()
    # each write: the transactions committed between the previous binding and its own
    collection: Counter = Counter()
    prev_lsn = 0
    read_keys: list[tuple] = []  # the chunks appended so far
    for ts, blsn, landed, done, comp in writes:  # noqa: B007
        chunked = ChunkedTable(done, comp, tuple(c for c, _ in landed), ts)
        stream = [(c, x, ops) for c, x, ops in txns if prev_lsn <= c < blsn]
        in_stream = {x for _, x, _ in stream}
        if any(x not in in_stream for c, _ in landed for x in c.raced):
            return  # ChunkRaced: the write appends nothing (the model stops here)
        updates: Counter = Counter()
        for c, rows in landed:
            for k, v in rows.items():
                updates[(k, v, ts)] += 1
        for commit, x, ops in stream:
            for k, old, new in ops:
                at = chunked.fate((k,), commit, x, ts)
                if at is None:
                    continue
                assert at == ts  # one binding per write here: everything lands at it
                if old is not None:
                    updates[(k, old, at)] -= 1
                if new is not None:
                    updates[(k, new, at)] += 1
        for (k, v, _), d in updates.items():
            collection[(k, v)] += d
        read_keys.extend(c for c, _ in landed)
        upstream: dict[int, int] = {}
        for c, _, ops in txns:
            if c < blsn:
                for k, _, new in ops:
                    if new is None:
                        upstream.pop(k, None)
                    else:
                        upstream[k] = new
        want = Counter({(k, v): 1 for k, v in upstream.items() if any(c.holds((k,)) for c in read_keys)})
        assert +collection == want and not -collection, (ts, dict(collection), want)
        prev_lsn = blsn
