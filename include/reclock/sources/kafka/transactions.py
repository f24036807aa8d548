"""Debezium's transaction topic in a Kafka source over several topics (``transaction_topic``): mint binds
whole upstream transactions only, in the transaction topic's order.

The transaction topic is the source's last topic (``KafkaSpec.topics``): its one partition's next offset is
in every binding's frontier beside the table topics' (``reclock.sources.kafka.topics.slot``), so a binding
says how far the transaction topic was read as well as each table topic. A mint (:func:`probe`):

1. reads the transaction topic from the newest binding's offset to its last stable offset (BEGIN and END
   records, :func:`tx_record`), and each table topic partition from the binding's offset to its last stable
   offset, keeping of each record only its offset, its ``transaction.id`` and ``data_collection_order``
   (:func:`tx_event`); a transaction is known by :func:`tx_id` (Postgres: its ``txId``);
2. chooses the upper with :func:`reclock.debezium_tx.choose_upper`: the transactions whose END is read and
   whose events are all read, in the transaction topic's order, stopping at the first that is not; each
   table topic partition's offset stops before the first event of a transaction not covered;
3. gives that frontier to the cycle to bind (the write reads exactly the bound ranges, as for any Kafka
   source: every change of one upstream transaction gets the binding's one timestamp in every table).

A transaction bound before whose records Debezium writes again after a restart (its END and some or all of
its events) is passed over, not waited for: the ENDs of the :data:`LOOKBACK` transaction topic records before
the binding's offset name the transactions bound before (the envelope applies a redelivered event once, by
its source position: ``reclock.debezium``).

Outside any transaction: tombstones (a delete's), snapshot reads (``op: r``; bound as they are written, so a
binding during the connector's initial snapshot may hold part of it, as without the transaction topic), and
records that are not change events (the write routes them as ``on_decode_error`` says). Debezium's Avro
(``format: avro`` through the registry): every record, the transaction topic's too, is read as the JSON text
its writer schema decodes it to (``reclock.debezium_avro``), the registry asked in the driver. A streamed
change event (``op`` c, u, d, t) without a ``transaction`` block, an event whose ``source`` names another
table than its topic's, or a transaction topic record that is not a BEGIN or END is
:class:`~reclock.errors.TransactionMetadataInvalid`: mint binds nothing and names the record.

What is not bound yet is said by :attr:`TxProbe.waiting` (mint's statistics, ``tx_waiting``): a transaction
whose END is not written yet, or whose events are not all in its tables' topics yet.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from confluent_kafka import KafkaError, TopicPartition

from reclock import kafka_client
from reclock.debezium import EventInvalid, json_object
from reclock.debezium_tx import Event, Stream, TxRecord, TxUpper, choose_upper
from reclock.errors import ReclockError, TransactionMetadataInvalid
from reclock.sources.kafka.topics import slot, topic_partition
from reclock.time import PartitionedFrontier

LOOKBACK = 10_000
"""Transaction topic records read before the newest binding's offset to learn which transactions were bound
before (a connector restart redelivers what it wrote since its last offset flush). A redelivery from the
middle of a transaction whose END is further back waits with a ``tx_waiting`` naming it."""


_PG_ID = re.compile(r"^([0-9]+):[0-9]+$")


def tx_id(raw: str) -> str:
    """A transaction's identity from a record's ``id``. Debezium's Postgres connector writes ``<txId>:<lsn>``
    where the LSN is the record's own (3.6.1: a transaction's BEGIN, END and each event carry different
    LSNs), so an id of two decimal numbers is the transaction's ``txId`` (Postgres's xid). Other connectors'
    ids (a MySQL GTID ``<uuid>:<n>``, a SQL Server ``<lsn>:<lsn>:<n>``) are their own."""
    m = _PG_ID.match(raw)
    return m.group(1) if m else raw


class RecordInvalid(ValueError):
    """A record a source with a transaction topic cannot place; ``reason`` says why."""


def tx_record(value: bytes | None, offset: int) -> TxRecord:
    """A transaction topic record: BEGIN or END of a transaction (END: its event count per data collection).
    Anything else is :class:`RecordInvalid`."""
    d = json_object(value) if value is not None else None
    if d is None:
        raise RecordInvalid("not a Debezium transaction record (a JSON object with status, id, "
                            "data_collections)" + (" (a null value)" if value is None else ""))
    status, tid = d.get("status"), d.get("id")
    if status not in ("BEGIN", "END") or not isinstance(tid, str) or not tid:
        raise RecordInvalid(f"a transaction record needs status BEGIN or END and an id, got status {status!r}, "
                            f"id {tid!r}")
    tid = tx_id(tid)
    if status == "BEGIN":
        return TxRecord(offset, "BEGIN", tid)
    counts = []
    collections = d.get("data_collections") or []
    if not isinstance(collections, list):
        raise RecordInvalid(f"the END of transaction {tid} has data_collections {collections!r}, not a list")
    for c in collections:
        name, n = (c.get("data_collection"), c.get("event_count")) if isinstance(c, dict) else (None, None)
        if not isinstance(name, str) or not isinstance(n, int) or n < 0:
            raise RecordInvalid(f"the END of transaction {tid} has a data_collections entry {c!r} (a "
                                "data_collection and its event_count expected)")
        counts.append((name, n))
    if not counts and d.get("event_count"):
        raise RecordInvalid(f"the END of transaction {tid} counts {d['event_count']} events but names no "
                            "data_collections")
    return TxRecord(offset, "END", tid, tuple(counts))


def tx_event(value: bytes | None, offset: int) -> tuple[Event, str | None]:
    """A table topic record as the choice sees it, and the table (``schema.table``) its ``source`` names
    (None where it names none). Outside any transaction: a tombstone, a snapshot read, a value that is not
    a change event (the write's decoding routes it). A streamed change without ``transaction`` is
    :class:`RecordInvalid`."""
    if value is None:
        return Event(offset), None
    d = json_object(value)
    if d is None or "op" not in d:
        return Event(offset), None
    src = d.get("source") if isinstance(d.get("source"), dict) else {}
    table = f"{src['schema']}.{src['table']}" if src.get("schema") and src.get("table") else None
    tx = d.get("transaction")
    if tx is None:
        if d["op"] == "r":
            return Event(offset), table
        raise RecordInvalid(f"a change event (op {d['op']!r}) without a `transaction` block")
    tid, order = (tx.get("id"), tx.get("data_collection_order")) if isinstance(tx, dict) else (None, None)
    if not isinstance(tid, str) or not tid or not isinstance(order, int) or order < 1:
        raise RecordInvalid(f"a change event whose `transaction` block {tx!r} lacks its id or its "
                            "data_collection_order")
    return Event(offset, tx_id(tid), order), table


def data_collection(topic: str) -> str:
    """The table Debezium writes to ``topic`` (``<topic.prefix>.<schema>.<table>``): ``schema.table``."""
    parts = topic.split(".")
    return ".".join(parts[-2:])


@dataclass(frozen=True)
class TxProbe:
    """A mint's choice: the frontier to bind (every partition of the source's topics) and the choice itself."""

    frontier: PartitionedFrontier
    upper: TxUpper
    read: int  # records read (the transaction topic's lookback too)

    @property
    def waiting(self) -> str | None:
        return self.upper.waiting


def _read(client, wanted: Sequence[tuple[str, int, int, int]], what: str, timeout: float
          ) -> Iterator[tuple[int, int, bytes | None]]:
    """Every record of each ``(topic, partition, start, end)`` in ``wanted`` (``read_committed``: compaction
    and transaction markers may leave gaps): ``(index in wanted, offset, value)``, each partition's in
    offset order. Not all read within ``timeout`` seconds: ``ReclockError``."""
    handle = client.handle
    todo = {i: w for i, w in enumerate(wanted) if w[3] > w[2]}
    if not todo:
        return
    index = {(w[0], w[1]): i for i, w in todo.items()}
    handle.assign([TopicPartition(w[0], w[1], w[2]) for w in todo.values()])
    deadline = time.monotonic() + timeout
    while todo:
        if time.monotonic() > deadline:
            names = ", ".join(f"{t}[{p}] {s}..{e}" for t, p, s, e in todo.values())
            raise ReclockError(f"{what}: reading {names} did not reach the last stable offsets within {timeout:.0f} s")
        for m in handle.consume(1000, 0.5):
            i = index.get((m.topic(), m.partition()))
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise client.refused(m.error(), "reading the transaction topic and the table topics",
                                     {"topic": ("READ", m.topic())}) or ReclockError(f"{what}: {m.error()}")
            if i is None or i not in todo:
                continue
            end = todo[i][3]
            if m.offset() < end:
                yield i, m.offset(), m.value()
            if m.offset() >= end - 1:
                del todo[i]
        for i, (t, p, _s, e) in list(todo.items()):
            [pos] = handle.position([TopicPartition(t, p)])
            if pos.offset >= e:  # past markers or compacted records up to the end
                del todo[i]


def probe(source: str, kafka, tables: Sequence[str], tx_topic: str, bound: PartitionedFrontier,
          upper: PartitionedFrontier, tx_earliest: int = 0, timeout: float = 60.0,
          decode: Callable[[bytes], bytes] | None = None) -> TxProbe:
    """The frontier mint binds for source ``source`` over table topics ``tables`` and ``tx_topic`` (its
    frontier's topic ``len(tables)``), from the newest binding's ``bound`` up to at most ``upper`` (the last
    stable offsets); ``tx_earliest``: the transaction topic's earliest offset (the lookback starts there at the
    earliest). ``decode``: each non-null value to its JSON text first (Debezium's Avro through the registry:
    ``reclock.debezium_avro.AvroJson``, in the driver; a registry that does not answer raises what it
    raises); a table record it cannot decode is outside any transaction (the write routes it as
    ``on_decode_error`` says), a transaction topic record is :class:`~reclock.errors.TransactionMetadataInvalid`.
    See the module."""
    n = len(tables)
    tx_parts = sorted(p for i, p in (topic_partition(q) for q, _ in upper) if i == n)
    if tx_parts != [0]:
        raise ReclockError(f"source {source}: transaction topic {tx_topic} has partitions {tx_parts}; Debezium "
                           "writes it with one (its order is the transactions' order): recreate it with one")
    tx_slot = slot(n, 0)
    tx_start, tx_end = bound.get(tx_slot), upper.get(tx_slot)
    data = [(q, o) for q, o in upper if q != tx_slot]
    wanted = [(tx_topic, 0, min(tx_start, max(tx_earliest, tx_start - LOOKBACK)), tx_end)]
    for q, end in data:
        i, p = topic_partition(q)
        wanted.append((tables[i], p, bound.get(q), end))
    client = kafka_client.consumer(kafka_client.client_config(kafka), f"source {source}", {
        "group.id": f"reclock-{source}-tx-probe", "enable.auto.commit": False, "isolation.level": "read_committed",
        "enable.partition.eof": True, "auto.offset.reset": "error"})
    records: list[TxRecord] = []
    known: set[str] = set()
    events: list[list[Event]] = [[] for _ in data]
    read = 0
    try:
        for i, offset, value in _read(client, wanted, f"source {source}", timeout):
            read += 1
            topic, partition = wanted[i][0], wanted[i][1]
            try:
                if decode is not None and value is not None:
                    try:
                        value = decode(value)
                    except EventInvalid as err:
                        if i == 0:
                            raise RecordInvalid(err.reason) from None
                        events[i - 1].append(Event(offset))
                        continue
                if i == 0:
                    r = tx_record(value, offset)
                    if offset < tx_start:
                        if r.status == "END":
                            known.add(r.id)
                    else:
                        records.append(r)
                    continue
                e, table = tx_event(value, offset)
            except RecordInvalid as err:
                remedy = ("give the connector provide.transaction.metadata=true, or remove `transaction_topic`"
                          if i else f"check that {tx_topic} is the connector's transaction topic")
                raise TransactionMetadataInvalid(source, topic, partition, offset, str(err), remedy) from None
            if table is not None and table != data_collection(topic):
                raise TransactionMetadataInvalid(
                    source, topic, partition, offset, f"the event is of table {table}, the topic's name says "
                    f"{data_collection(topic)}", "a source with `transaction_topic` needs each table's own topic, "
                    "named <topic.prefix>.<schema>.<table> as Debezium names it")
            events[i - 1].append(e)
    finally:
        client.handle.close()
    streams = [Stream(data_collection(tables[topic_partition(q)[0]]), bound.get(q), end, tuple(ev))
               for (q, end), ev in zip(data, events)]
    chosen = choose_upper(tx_start, tx_end, records, streams, frozenset(known))
    frontier = PartitionedFrontier.of({**{q: o for (q, _), o in zip(data, chosen.offsets)}, tx_slot: chosen.tx_offset})
    return TxProbe(frontier, chosen, read)
