"""A Postgres source's table collections through the exactly-once Kafka sink: a transaction over two
tables reaches both topics at one timestamp, a snapshot row, an update and a delete as Debezium pairs."""

from __future__ import annotations

import json

import pytest
from pg_support import bindings, make_ctx, source_name, upstream_database, writer

from reclock import cycle
from reclock.config import KafkaSpec, SinkSpec
from reclock.sinks.kafka import TS_HEADER, SinkContext, read_all, run_once


@pytest.fixture
def upstream(postgres):
    with upstream_database(postgres) as dsn:
        yield dsn


def test_two_tables_of_one_transaction_reach_their_topics_at_one_timestamp(db, upstream, kafka, topic, tmp_path):
    with writer(upstream) as conn:
        for t in ("orders", "items"):
            conn.execute(f"CREATE TABLE {t} (id int8 PRIMARY KEY, amount numeric(10,2), at timestamptz, note text)")
            conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION pub FOR TABLE orders, items")
        conn.execute("INSERT INTO orders VALUES (1, 10.50, '2024-01-02 03:04:05+00', 'first')")
    name = source_name("pgsink")
    ctx = make_ctx(db, upstream, tmp_path, name, ["orders", "items"])
    cycle.run_cycle(ctx)
    with writer(upstream) as conn, conn.transaction():
        conn.execute("UPDATE orders SET amount = 11.00 WHERE id = 1")
        conn.execute("INSERT INTO items VALUES (7, 1.25, NULL, 'for order 1')")
    cycle.run_cycle(ctx)
    with writer(upstream) as conn:
        conn.execute("DELETE FROM orders WHERE id = 1")
    cycle.run_cycle(ctx)
    (t1, _), (t2, _), (t3, _) = bindings(ctx)[:3]

    got = {}
    for table in ("orders", "items"):
        out = topic(partitions=1)
        spec = SinkSpec(name=f"{name}_{table}", collection=f"{name}__{table}",
                        kafka=KafkaSpec(topic=out, bootstrap=kafka.bootstrap), key=("id",),
                        progress_topic=f"_progress_{out}")
        run_once(SinkContext(spec=spec, dsn=db, kafka=kafka.bootstrap, blob=ctx.blob))
        got[table] = [(int(dict(m.headers())[TS_HEADER]), json.loads(m.value()))
                      for m in read_all(kafka.bootstrap, out, "v")]
    orders = [(ts, (m["before"] or {}).get("amount"), (m["after"] or {}).get("amount")) for ts, m in got["orders"]]
    assert [ts for ts, _, _ in orders] == [t1, t2, t3]
    assert orders[0][2] is not None and orders[1][1] is not None and orders[2][2] is None  # insert, update, delete
    assert [ts for ts, _ in got["items"]] == [t2], "one transaction, one timestamp, in both topics"
    assert got["items"][0][1]["after"]["note"] == "for order 1"
