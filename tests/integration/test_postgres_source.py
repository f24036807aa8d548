"""The Postgres CDC source against a real upstream Postgres (wal_level=logical): snapshot, stream, one
timestamp per transaction, the slot following the resumption frontier, and every bad case stalling."""

from __future__ import annotations

import pytest
from pg_support import bindings, contents, make_ctx, slot_confirmed, source_name, upstream_database, writer

from reclock import cycle


@pytest.fixture
def upstream(postgres):
    with upstream_database(postgres) as dsn:
        yield dsn


def _setup(dsn: str, tables=("a", "b", "c")) -> None:
    with writer(dsn) as conn:
        for t in tables:
            conn.execute(f"CREATE TABLE {t} (id int8 PRIMARY KEY, v text, n numeric(10,2), txid int8)")
            conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        conn.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(tables)}")


def test_snapshot_then_stream(db, upstream, tmp_path):
    _setup(upstream)
    with writer(upstream) as up:
        up.execute("INSERT INTO a SELECT g, 'a' || g, g / 4.0, 0 FROM generate_series(1, 50) g")
        up.execute("INSERT INTO b VALUES (1, 'b1', 1, 0)")
    name = source_name()
    ctx = make_ctx(db, upstream, tmp_path, name, ["a", "public.b", "c"], max_records=7)
    out = cycle.run_cycle(ctx)
    assert out["descriptions"] == 1
    (t1, l1), = bindings(ctx)
    assert set(contents(ctx, f"{name}__a", t1)) == set(range(1, 51))
    assert contents(ctx, f"{name}__b", t1)[1]["v"] == "b1"
    assert contents(ctx, f"{name}__c", t1) == {}
    assert slot_confirmed(upstream, name) == l1

    with writer(upstream) as up:
        with up.transaction():
            up.execute("UPDATE a SET v = 'changed' WHERE id <= 10")
            up.execute("DELETE FROM b WHERE id = 1")
            up.execute("INSERT INTO c VALUES (5, 'c5', 2.5, 0)")
        up.execute("DELETE FROM a WHERE id > 40")
    cycle.run_cycle(ctx)
    bs = bindings(ctx)
    t2 = bs[-1][0]
    a = contents(ctx, f"{name}__a", t2)
    assert set(a) == set(range(1, 41)) and all(a[i]["v"] == "changed" for i in range(1, 11))
    assert contents(ctx, f"{name}__b", t2) == {}
    assert contents(ctx, f"{name}__c", t2)[5]["v"] == "c5"
    assert set(contents(ctx, f"{name}__a", t1)) == set(range(1, 51))  # AS OF the first binding: unchanged
    assert slot_confirmed(upstream, name) == bs[-1][1]
