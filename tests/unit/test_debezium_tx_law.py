"""Laws of choosing a binding's upper at Debezium transaction boundaries (``reclock.debezium_tx``), over
Debezium's output modelled as it is written: snapshot reads outside any transaction, then per upstream
transaction a BEGIN, its change events (a delete followed by its tombstone) in its tables' topics, an END
with the counts; a connector killed and restarted re-sends everything from an earlier point (a whole
transaction or from its middle, BEGIN/END records too); each topic is seen up to a prefix of its own (the
producer writes topics independently)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from reclock.debezium_tx import Event, Stream, TxRecord, choose_upper

TABLES = ("public.a", "public.b")


@st.composite
def debezium_output(draw):
    """``(writes, txs)``: the writes in the order the connector made them (``("tx", status, id, counts)`` or
    ``(table, tx, order)``), with a kill and restart re-sending from an earlier write; ``txs``: each
    transaction's events ``{(table, order)}``."""
    writes: list[tuple] = [(draw(st.sampled_from(TABLES)), None, None) for _ in range(draw(st.integers(0, 3)))]
    txs: dict[str, set] = {}
    for t in range(draw(st.integers(0, 5))):
        tid = f"{500 + t}:{1000 * t}"
        tables = draw(st.lists(st.sampled_from(TABLES), min_size=1, max_size=5))
        writes.append(("tx", "BEGIN", tid, ()))
        order: dict[str, int] = defaultdict(int)
        for table in tables:
            order[table] += 1
            writes.append((table, tid, order[table]))
            if draw(st.booleans()) and draw(st.booleans()):
                writes.append((table, None, None))  # a delete's tombstone
        txs[tid] = {(table, o) for table, n in order.items() for o in range(1, n + 1)}
        writes.append(("tx", "END", tid, tuple(sorted(order.items()))))
    if writes and draw(st.booleans()):  # killed after write k, restarted from write r <= k
        k = draw(st.integers(0, len(writes)))
        r = draw(st.integers(0, k))
        writes = writes[:k] + writes[r:]
    return writes, txs


def topics(writes):
    """The transaction topic's records and each table's events, offsets given in write order."""
    records: list[TxRecord] = []
    events: dict[str, list[Event]] = {t: [] for t in TABLES}
    for w in writes:
        if w[0] == "tx":
            records.append(TxRecord(len(records), w[1], w[2], w[3]))
        else:
            table, tx, order = w
            events[table].append(Event(len(events[table]), tx, order))
    return records, events


def upper_of(records, events, seen_tx, seen, start_tx=0, starts=None, known=frozenset()):
    starts = starts or {t: 0 for t in TABLES}
    streams = [Stream(t, starts[t], seen[t], tuple(e for e in events[t] if starts[t] <= e.offset < seen[t]))
               for t in TABLES]
    recs = [r for r in records if start_tx <= r.offset < seen_tx]
    return choose_upper(start_tx, seen_tx, recs, streams, known)


def check_whole(up, events, txs, known=frozenset()):
    """Every event below the upper is outside any transaction or of a covered (or known) one, and every
    event of a covered transaction has a copy below the upper: never a partial transaction."""
    ok = set(up.covered) | known
    for j, t in enumerate(TABLES):
        below = [e for e in events[t] if e.offset < up.offsets[j]]
        assert all(e.tx is None or e.tx in ok for e in below), (t, below, up)
    for tid in up.covered:
        for table, order in txs[tid]:
            j = TABLES.index(table)
            assert any(e.tx == tid and e.order == order and e.offset < up.offsets[j] for e in events[table]), \
                (tid, table, order, up)


@given(debezium_output(), st.data())
def test_a_binding_covers_whole_transactions_only(output, data):
    writes, txs = output
    records, events = topics(writes)
    seen_tx = data.draw(st.integers(0, len(records)))
    seen = {t: data.draw(st.integers(0, len(events[t]))) for t in TABLES}
    up = upper_of(records, events, seen_tx, seen)
    check_whole(up, events, txs)
    assert all(0 <= o <= seen[t] for o, t in zip(up.offsets, TABLES)) and 0 <= up.tx_offset <= seen_tx
    # in the transaction topic's order: the covered transactions are the first ENDs' (no gap)
    ends = list(dict.fromkeys(r.id for r in records if r.status == "END"))
    assert list(up.covered) == ends[:len(up.covered)]


@given(debezium_output())
def test_everything_written_is_covered(output):
    writes, txs = output
    records, events = topics(writes)
    up = upper_of(records, events, len(records), {t: len(events[t]) for t in TABLES})
    assert up.waiting is None, up
    assert set(up.covered) == set(txs)
    assert up.offsets == tuple(len(events[t]) for t in TABLES) and up.tx_offset == len(records)


@given(debezium_output(), st.data())
def test_the_next_binding_goes_on_from_the_upper(output, data):
    """A mint on part of the topics, then one on all of them from its upper (``known``: the transactions the
    first covered, whose redelivered copies may follow): together whole transactions, and everything."""
    writes, txs = output
    records, events = topics(writes)
    seen_tx = data.draw(st.integers(0, len(records)))
    seen = {t: data.draw(st.integers(0, len(events[t]))) for t in TABLES}
    first = upper_of(records, events, seen_tx, seen)
    known = frozenset(first.covered)
    second = upper_of(records, events, len(records), {t: len(events[t]) for t in TABLES}, first.tx_offset,
                      dict(zip(TABLES, first.offsets)), known)
    assert second.waiting is None, (first, second)
    check_whole(second, events, txs, known)
    assert set(first.covered) | set(second.covered) == set(txs)
    assert all(a <= b for a, b in zip(first.offsets, second.offsets))


def test_a_transaction_whose_end_never_comes_waits():
    records = [TxRecord(0, "BEGIN", "1:1"), TxRecord(1, "END", "1:1", (("public.a", 1),)),
               TxRecord(2, "BEGIN", "2:2")]
    a = Stream("public.a", 0, 3, (Event(0, "1:1", 1), Event(1, "2:2", 1), Event(2, "2:2", 2)))
    up = choose_upper(0, 3, records, [a])
    assert (up.offsets, up.covered, up.tx_offset) == ((1,), ("1:1",), 2)
    assert up.waiting == "transaction 2:2 began (offset 2) and its END is not in the transaction topic yet"


def test_an_end_whose_events_are_not_all_there_waits():
    records = [TxRecord(0, "BEGIN", "1:1"), TxRecord(1, "END", "1:1", (("public.a", 1), ("public.b", 2)))]
    a = Stream("public.a", 0, 1, (Event(0, "1:1", 1),))
    b = Stream("public.b", 0, 1, (Event(0, "1:1", 1),))
    up = choose_upper(0, 2, records, [a, b])
    assert (up.offsets, up.covered, up.tx_offset) == ((0, 0), (), 0)
    assert up.waiting == "transaction 1:1 (END at offset 1): its events are not all there yet (public.b 1 of 2)"


def test_an_event_of_a_transaction_the_topic_does_not_name_stops_its_partition():
    a = Stream("public.a", 0, 3, (Event(0), Event(1, "9:9", 1), Event(2)))
    up = choose_upper(0, 0, [], [a])
    assert up.offsets == (1,) and up.covered == ()
    assert up.waiting == ("an event of transaction 9:9 (public.a, offset 1) that the transaction topic does not "
                          "name up to offset 0")
