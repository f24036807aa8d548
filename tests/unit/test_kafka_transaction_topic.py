"""``transaction_topic`` of a Kafka source over several topics (``reclock.sources.kafka.transactions``): its
config and every mistake in it named; Debezium's transaction records and change events as the choice of a
binding's upper sees them, and every record it cannot place named."""

from __future__ import annotations

import json

import pytest

from reclock.config import parse_source
from reclock.debezium_tx import Event, TxRecord
from reclock.errors import ConfigError, TransactionMetadataInvalid
from reclock.sources.kafka.transactions import RecordInvalid, data_collection, tx_event, tx_id, tx_record

ITEMS = {"topic": "dbz.public.items", "schema": "id INT, v STRING"}
ORDERS = {"topic": "dbz.public.orders", "collection": "orders", "schema": "id INT, item INT"}


def source(**extra):
    d = {"kafka": {"bootstrap": "b:1"}, "envelope": "debezium", "topics": [ITEMS, ORDERS], **extra}
    return parse_source("shop", d)


def test_the_transaction_topic_is_the_last_topic():
    s = source(transaction_topic="dbz.transaction")
    assert s.upstream.transaction_topic == "dbz.transaction"
    assert s.upstream.topics == ("dbz.public.items", "dbz.public.orders", "dbz.transaction")
    assert s.shards == ("shop__items", "shop__items_errors", "shop__orders", "shop__orders_errors")  # no rows
    assert source().upstream.transaction_topic is None and len(source().upstream.topics) == 2


@pytest.mark.parametrize("extra, words", [
    ({"transaction_topic": "a b"}, "source shop.transaction_topic: a Kafka topic name"),
    ({"transaction_topic": 7}, "source shop.transaction_topic: a Kafka topic name"),
    ({"transaction_topic": "dbz.public.orders"}, "'dbz.public.orders' is also one of `topics:`"),
])
def test_mistakes_are_named(extra, words):
    with pytest.raises(ConfigError) as e:
        source(**extra)
    assert words in str(e.value), str(e.value)


def test_a_source_over_one_topic_has_no_transaction_topic():
    with pytest.raises(ConfigError, match="source one: `transaction_topic` is Debezium's transaction topic of a "
                                          "source over several topics"):
        parse_source("one", {"kafka": {"bootstrap": "b:1", "topic": "t"}, "envelope": "debezium",
                             "format": {"type": "json", "schema": "id INT"}, "transaction_topic": "dbz.transaction"})


def end(tid="571:53195832", wrap=False, **counts):
    d = {"status": "END", "id": tid, "event_count": sum(counts.values()), "ts_ms": 1,
         "data_collections": [{"data_collection": c, "event_count": n} for c, n in counts.items()]}
    return json.dumps({"schema": {}, "payload": d} if wrap else d).encode()


def test_a_postgres_transaction_is_its_txid():
    """Debezium 3.6.1's Postgres connector: ``<txId>:<lsn>`` with each record's own LSN (as written by the real
    connector in tests/integration/test_debezium_source.py: BEGIN 757:44807824, END 757:44808368)."""
    assert tx_id("757:44807824") == tx_id("757:44808368") == "757"
    for other in ("3E11FA47-71CA-11E1-9E33-C80AA9429562:23", "00000025:00000d10:0025", "0-1-23", "abc"):
        assert tx_id(other) == other


def test_transaction_records():
    begin = json.dumps({"status": "BEGIN", "id": "571:53195000", "event_count": None}).encode()
    assert tx_record(begin, 3) == TxRecord(3, "BEGIN", "571")
    counts = {"public.items": 2, "public.orders": 1}
    want = TxRecord(4, "END", "571", (("public.items", 2), ("public.orders", 1)))
    assert tx_record(end(**counts), 4) == want
    assert tx_record(end(wrap=True, **counts), 4) == want  # JSON with Connect's schemas


@pytest.mark.parametrize("value, words", [
    (None, "a null value"),
    (b"not json", "not a Debezium transaction record"),
    (b'{"status": "COMMIT", "id": "1"}', "status BEGIN or END and an id, got status 'COMMIT'"),
    (b'{"status": "END"}', "got status 'END', id None"),
    (b'{"status": "END", "id": "1", "data_collections": [{"data_collection": "a"}]}', "data_collections entry"),
    (b'{"status": "END", "id": "1", "event_count": 2, "data_collections": []}', "names no data_collections"),
    (b'{"status": "END", "id": "1", "data_collections": 5}', "data_collections 5, not a list"),
    (b'{"status": "END", "id": "1", "data_collections": {"a": 1}}', "not a list"),
])
def test_a_transaction_record_it_cannot_read_is_named(value, words):
    with pytest.raises(RecordInvalid, match=words):
        tx_record(value, 0)


def change(op="u", tx=("571:53195832", 2), wrap=False, table="items"):
    d = {"before": None, "after": {"id": 1}, "op": op, "source": {"schema": "public", "table": table},
         "transaction": None if tx is None else {"id": tx[0], "total_order": 5, "data_collection_order": tx[1]}}
    return json.dumps({"schema": {}, "payload": d} if wrap else d).encode()


def test_change_events():
    assert tx_event(change(), 9) == (Event(9, "571", 2), "public.items")
    assert tx_event(change(wrap=True, table="orders"), 9) == (Event(9, "571", 2), "public.orders")
    assert tx_event(None, 10) == (Event(10), None)  # a tombstone: outside any transaction
    assert tx_event(change("r", None), 1) == (Event(1), "public.items")  # a snapshot read
    assert tx_event(b"garbage", 2) == (Event(2), None)  # the write's decoding routes it (on_decode_error)
    assert data_collection("dbz.public.items") == "public.items"


@pytest.mark.parametrize("value, words", [
    (change("c", None), "a change event \\(op 'c'\\) without a `transaction` block"),
    (change("d", None), "op 'd'"),
    (change(tx=("x", 0)), "lacks its id or its data_collection_order"),
    (change(tx=(None, 1)), "lacks its id"),
])
def test_a_change_event_it_cannot_place_is_named(value, words):
    with pytest.raises(RecordInvalid, match=words):
        tx_event(value, 0)


def test_the_stall_names_the_record_and_the_remedy():
    e = TransactionMetadataInvalid("shop", "dbz.public.items", 0, 41, "a change event (op 'c') without a "
                                   "`transaction` block", "give the connector provide.transaction.metadata=true")
    assert str(e) == ("source shop: topic dbz.public.items partition 0 offset 41: a change event (op 'c') without "
                      "a `transaction` block; nothing is bound past it and the source is stalled (give the "
                      "connector provide.transaction.metadata=true)")
