"""Debezium's transaction metadata: choosing a binding's upper at upstream transaction boundaries (pure).

With ``provide.transaction.metadata=true`` Debezium writes a BEGIN and an END record per upstream transaction
to ``<prefix>.transaction`` (END: ``id``, ``event_count`` and ``data_collections``: per table its
``event_count``), and each change event carries ``transaction: {id, total_order, data_collection_order}``. A
source over a connector's topics then binds whole upstream transactions only, in the transaction topic's
order: every change of one transaction, in every table's topic, gets one timestamp; a transaction whose END
or whose events are not all there yet waits for the next binding.

:func:`choose_upper` is that choice, from what a mint reads: the transaction topic's records from the bound
offset on, and each data topic partition's events from its bound offset to its last stable offset (offset,
transaction id, ``data_collection_order``). It walks the ENDs in order; a transaction is covered when every
table's topic it touched (of the tables the source reads) holds all of its events (distinct
``data_collection_order`` values ``1..event_count``) at the partitions' cursors, which move only over that
transaction's events, events outside any transaction (snapshot reads, tombstones) and events of
transactions already covered (``known``: bound earlier; or covered earlier in the walk). Redelivery after a
connector restart (copies of events and of BEGIN/END records, a transaction re-sent whole or from the middle)
moves over those copies; the envelope applies each event once by its source position
(``reclock.debezium``). An event of a transaction the walk does not know stops its partition: the binding
ends before it and :attr:`TxUpper.waiting` says which transaction is missing and where.

The Kafka kind's mint chooses with it for a source with ``transaction_topic``
(``reclock.sources.kafka.transactions``, which reads the records and knows a transaction by its id); the laws
are in ``tests/unit/test_debezium_tx_law.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Sequence


@dataclass(frozen=True)
class TxRecord:
    """One record of the transaction topic: BEGIN or END of transaction ``id`` (END: per data collection
    ``schema.table`` the number of change events the transaction wrote to it)."""

    offset: int
    status: Literal["BEGIN", "END"]
    id: str
    counts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Event:
    """A data topic record as the mint sees it: its offset, its ``transaction.id`` (None: outside any
    transaction: a snapshot read, a tombstone) and ``transaction.data_collection_order``."""

    offset: int
    tx: str | None = None
    order: int | None = None


@dataclass(frozen=True)
class Stream:
    """One data topic partition of table ``collection`` (Debezium's ``schema.table``) from the bound offset
    ``start`` to its last stable offset ``end``: its events in offset order (compaction or transaction
    markers may leave gaps)."""

    collection: str
    start: int
    end: int
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class TxUpper:
    """The chosen upper: the transaction topic's next offset and each stream's, the transactions covered (in
    the transaction topic's order), and why the binding stops where it does (None: it covers everything
    that was there)."""

    tx_offset: int
    offsets: tuple[int, ...]
    covered: tuple[str, ...]
    waiting: str | None = None


def _advance(stream: Stream, k: int, passable, current: str | None, seen: set[int]) -> int:
    """Index of the first event at or after ``k`` the cursor cannot pass (``passable`` or ``current``'s,
    whose ``data_collection_order`` values go into ``seen``)."""
    while k < len(stream.events):
        e = stream.events[k]
        if e.tx is not None and e.tx != current and not passable(e.tx):
            break
        if e.tx is not None and e.tx == current and e.order is not None:
            seen.add(e.order)
        k += 1
    return k


def _offset(stream: Stream, k: int) -> int:
    """The stream's next offset when its first ``k`` events are covered."""
    return stream.events[k].offset if k < len(stream.events) else stream.end


def choose_upper(tx_start: int, tx_end: int, records: Sequence[TxRecord], streams: Sequence[Stream],
                 known: frozenset[str] = frozenset()) -> TxUpper:
    """The upper a binding of a source with Debezium's transaction topic may take (see the module): the
    transaction topic read ``[tx_start, tx_end)`` (``records``, in offset order), the data streams, and the
    ids of transactions bound before (``known``: their redelivered copies may be passed)."""
    done = set(known)
    cursors = [0] * len(streams)
    tx_offset = tx_start
    covered: list[str] = []
    waiting = None
    begun: dict[str, int] = {}
    for r in records:
        if r.status == "BEGIN":
            begun.setdefault(r.id, r.offset)
            continue
        if r.id in done:  # a redelivered END of a covered transaction
            tx_offset = r.offset + 1
            continue
        needed: Mapping[str, int] = {c: n for c, n in r.counts if n > 0}
        seen: dict[str, set[int]] = {c: set() for c in needed}
        moved = list(cursors)
        for j, s in enumerate(streams):
            moved[j] = _advance(s, cursors[j], done.__contains__, r.id, seen.setdefault(s.collection, set()))
        short = {c: (len(seen[c]), n) for c, n in needed.items()
                 if c in {s.collection for s in streams} and not set(range(1, n + 1)) <= seen[c]}
        if short:
            have = ", ".join(f"{c} {got} of {n}" for c, (got, n) in sorted(short.items()))
            waiting = f"transaction {r.id} (END at offset {r.offset}): its events are not all there yet ({have})"
            break
        cursors = moved
        done.add(r.id)
        covered.append(r.id)
        tx_offset = r.offset + 1
        begun.pop(r.id, None)
    if waiting is None:
        # what follows the last covered transaction and belongs to none (or to a covered one) is covered too
        cursors = [_advance(s, cursors[j], done.__contains__, None, set()) for j, s in enumerate(streams)]
        open_tx = sorted((o, t) for t, o in begun.items() if t not in done)
        if open_tx:
            o, t = open_tx[0]
            waiting = f"transaction {t} began (offset {o}) and its END is not in the transaction topic yet"
        else:
            for j, s in enumerate(streams):
                if cursors[j] < len(s.events):
                    e = s.events[cursors[j]]
                    waiting = (f"an event of transaction {e.tx} ({s.collection}, offset {e.offset}) that the "
                               f"transaction topic does not name up to offset {tx_end}")
                    break
    return TxUpper(tx_offset, tuple(_offset(s, k) for s, k in zip(streams, cursors)), tuple(covered), waiting)
