"""The event-driven schedule's triggers (issue 19): ``UpstreamMoved`` fires when the topic holds records beyond
the source's newest binding and stays quiet otherwise; the triggers of one cluster share one probe; the probe
never touches a consumer group. ``PublicationChanged`` fires for a Postgres source's published changes, idle
WAL and errors, never for other tables' changes. Real Kafka and Postgres, the triggers' own poll loops
(``run``)."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace

import pytest
from confluent_kafka.admin import AdminClient
from ingest_support import make_ctx, produce, rec

from reclock import cycle
from reclock.config import parse_source
from reclock.errors import ConfigError
from reclock.sources.registry import kind_of
from reclock.sources.kafka.trigger import UpstreamMoved, admin_client, cluster_offsets


async def _events(trigger: UpstreamMoved, seconds: float) -> list:
    """The events ``trigger`` yields within ``seconds``."""
    out: list = []

    async def collect() -> None:
        async for ev in trigger.run():
            out.append(ev.payload)

    try:
        await asyncio.wait_for(collect(), seconds)
    except asyncio.TimeoutError:
        pass
    return out


def test_fires_on_upstream_movement_only(db, kafka, topic, spark, tmp_path, monkeypatch):
    monkeypatch.setenv("RECLOCK_DSN", db)
    name = topic(partitions=2)
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, name, name="watched"), retain_history_ms=10**12)
    trigger = UpstreamMoved(source="watched", topic=name, bootstrap=kafka.bootstrap, poll=0.2)
    assert asyncio.run(_events(trigger, 2.0)) == [], "an empty topic and no binding: nothing to do"
    produce(kafka, name, [rec(i, i % 2) for i in range(10)])
    (first, *_) = asyncio.run(_events(trigger, 5.0))
    assert first["source"] == "watched" and sum(first["upper"].values()) == 10 and first["bound"] == {}
    cycle.run_cycle(ctx)  # binds every offset: upstream is no longer ahead
    assert asyncio.run(_events(trigger, 2.0)) == [], "everything is bound: no runs"
    produce(kafka, name, [rec(i, 1) for i in range(10, 13)])
    (moved, *_) = asyncio.run(_events(trigger, 5.0))
    assert moved["upper"]["1"] == moved["bound"]["1"] + 3 and moved["upper"]["0"] == moved["bound"]["0"]
    # the probe is an admin client: no consumer group appears for it
    groups = {g.group_id for g in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_consumer_groups()
              .result(30).valid}
    assert not [g for g in groups if "watched" in g and g != "reclock-watched"
                and not g.startswith("reclock-watched-read-")], groups


def test_triggers_of_one_cluster_share_one_probe(kafka, topic):
    a = UpstreamMoved(source="a", topic="ta", bootstrap=kafka.bootstrap, poll=1)
    b = UpstreamMoved(source="b", topic="tb", bootstrap=kafka.bootstrap, poll=1)
    c = UpstreamMoved(source="c", topic="tc", connection="other_kafka", poll=1)
    assert a.shared_stream_key() == b.shared_stream_key() != c.shared_stream_key()
    assert UpstreamMoved(**a.serialize()[1]).serialize() == a.serialize()
    assert "dsn" not in json.dumps(a.serialize()[1]).lower()  # no secret in what Airflow stores
    name = topic(partitions=3)
    produce(kafka, name, [rec(i, i % 3) for i in range(7)])
    snapshot = cluster_offsets(admin_client(kafka.bootstrap))
    assert snapshot[name] == {0: 3, 1: 2, 2: 2}


def _read_event(i: int) -> tuple[int, bytes, bytes]:
    """A Debezium snapshot read (``op: r``) of row ``i``, as a connector writes it (key without schema)."""
    return (0, json.dumps({"id": i}).encode(),
            json.dumps({"before": None, "after": {"id": i, "v": f"v{i}"}, "op": "r",
                        "source": {"lsn": 100 + i, "snapshot": "true"}}).encode())


def test_a_source_over_several_topics_fires_on_any_topic(db, kafka, topic, spark, tmp_path, monkeypatch):
    """``schedule: upstream`` with ``topics:``: records in either topic beyond the binding fire (in the
    frontier's partitions: the second topic's partition 1 is 100001); bound, it is quiet."""
    monkeypatch.setenv("RECLOCK_DSN", db)
    a, b = topic(partitions=1), topic(partitions=2)
    spec = parse_source("dbzw", {"kafka": {"bootstrap": kafka.bootstrap}, "envelope": "debezium",
                                 "schedule": "upstream", "poll": "200ms",
                                 "topics": [{"topic": a, "collection": "a", "schema": "id INT, v STRING"},
                                            {"topic": b, "collection": "b", "schema": "id INT, v STRING"}]})
    ctx = replace(make_ctx(db, kafka, spark, tmp_path, a, name="dbzw"), spec=spec, retain_history_ms=10**12)
    trigger = kind_of(spec).upstream_trigger(spec)
    produce(kafka, a, [_read_event(i) for i in range(3)])
    (first, *_) = asyncio.run(_events(trigger, 3.0))
    assert first["upper"] == {"0": 3} and first["bound"] == {}  # a frontier omits empty partitions
    cycle.run_cycle(ctx)
    assert asyncio.run(_events(trigger, 1.5)) == [], "everything is bound: no runs"
    produce(kafka, b, [(1, k, v) for _, k, v in map(_read_event, range(2))])
    (moved, *_) = asyncio.run(_events(trigger, 3.0))
    assert moved["upper"]["100001"] == 2 and moved["bound"].get("100001", 0) == 0, moved
    assert moved["upper"]["0"] == moved["bound"]["0"] == 3


@pytest.mark.parametrize("raw, message", [
    ({"schedule": "hourly"}, "schedule .hourly. is not one of interval, upstream, continuous"),
    ({"schedule": "upstream", "interval": "5s"}, "`interval:` is for `schedule: interval`"),
    ({"poll": "1s"}, "`poll:` is for `schedule: upstream`"),
    ({"schedule": "upstream", "poll": "0s"}, "is not a duration"),
])
def test_schedule_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_source("s", {"kafka": {"topic": "t"}, "format": {"type": "bytes"}, **raw})
    spec = parse_source("s", {"kafka": {"topic": "t"}, "format": {"type": "bytes"}, "schedule": "upstream",
                              "poll": "250ms"})
    assert (spec.schedule, spec.poll_s) == ("upstream", 0.25)


# -- Postgres: PublicationChanged --------------------------------------------------------------------------


@pytest.fixture
def upstream(postgres):
    from pg_support import upstream_database

    with upstream_database(postgres) as dsn:
        yield dsn


def _slots(dsn: str) -> dict[str, str]:
    """Every replication slot of the upstream database: name -> confirmed_flush_lsn."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return dict(conn.execute("SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots "
                                 "WHERE database = current_database()").fetchall())


def test_a_postgres_source_fires_on_published_changes_idle_wal_and_errors_only(db, upstream, tmp_path, monkeypatch):
    """The Postgres trigger fires for the first cycle (the snapshot), for a change to a published table, for WAL
    an idle source should release, and once for an error a run would report; it stays quiet on changes to an
    unpublished table, never moves the slot, leaves no copy of it behind, and works while a replication
    connection holds the slot."""
    import time

    import psycopg
    from pg_support import make_ctx as pg_ctx
    from pg_support import slot_confirmed, source_name, writer

    from reclock.sources.postgres.trigger import PublicationChanged
    from reclock.sources.postgres.upstream import slot_name

    with writer(upstream) as conn:
        conn.execute("CREATE TABLE orders (id int8 PRIMARY KEY, v text)")
        conn.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE other (id int8)")  # not published
        conn.execute("CREATE PUBLICATION pub FOR TABLE orders")
        conn.execute("INSERT INTO orders VALUES (1, 'a')")
    monkeypatch.setenv("RECLOCK_DSN", db)
    monkeypatch.setenv("UP_DSN", upstream)
    name = source_name("trg")
    ctx = replace(pg_ctx(db, upstream, tmp_path, name, ["orders"]), clock=lambda: int(time.time() * 1000))

    def trigger(idle: float = 3600) -> PublicationChanged:
        return PublicationChanged(source=name, publication="pub", dsn_env="UP_DSN", poll=0.2, idle=idle)

    def reasons(seconds: float = 2.0, idle: float = 3600) -> list[str]:
        return [e["reason"] for e in asyncio.run(_events(trigger(idle), seconds))]

    (first,) = reasons()  # fired once, not at every probe
    assert first.startswith("no binding yet")
    cycle.run_cycle(ctx)  # the snapshot: the slot at the first binding
    assert reasons() == [], "nothing committed since: no run"
    with writer(upstream) as conn:
        conn.execute("INSERT INTO other SELECT generate_series(1, 1000)")
    assert reasons() == [], "a change to an unpublished table is no reason to run"
    with writer(upstream) as conn:
        conn.execute("INSERT INTO orders VALUES (2, 'b')")
    before = _slots(upstream)
    assert reasons() == ["the publication has changes"]
    assert _slots(upstream) == before, "the probe moved no slot and left no copy behind"

    # the probe reads a copy of the slot, so it works while something else holds the slot itself
    rep = psycopg.connect(upstream, autocommit=True, replication="database")
    try:
        rep.pgconn.send_query(f"START_REPLICATION SLOT {slot_name(name)} LOGICAL 0/0 "
                              "(proto_version '1', publication_names 'pub')".encode())
        deadline = time.monotonic() + 10
        while not any(a for (a,) in psycopg.connect(upstream, autocommit=True).execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot_name(name),))):
            assert time.monotonic() < deadline, "the replication connection never took the slot"
            time.sleep(0.1)
        assert reasons() == ["the publication has changes"]
    finally:
        rep.close()
    cycle.run_cycle(ctx)
    assert reasons() == []

    # no replication slot left for the probe's copy: the source still runs, every REFIRE_S
    fillers = [f"fill_{os.getpid()}_{i}" for i in range(1000)]
    with writer(upstream) as conn:
        try:
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
                for slot in fillers:  # physical slots reserving no WAL, until the server has none left
                    conn.execute("SELECT pg_create_physical_replication_slot(%s)", (slot,))
            conn.execute("INSERT INTO orders VALUES (10, 'x')")
            assert reasons() == ["no replication slot free for the probe's copy of the slot"]
        finally:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = ANY(%s)", (fillers,))
    cycle.run_cycle(ctx)
    assert reasons() == []

    # idle: WAL was written (no published change) and the newest binding is older than `idle`
    with writer(upstream) as conn:
        conn.execute("INSERT INTO other SELECT generate_series(1, 1000)")
    time.sleep(1.0)
    (idle,) = reasons(idle=0.5)
    assert idle.startswith("idle: ") and "bytes of WAL behind the slot" in idle
    confirmed = slot_confirmed(upstream, name)
    cycle.run_cycle(ctx)
    assert slot_confirmed(upstream, name) > confirmed, "the idle cycle moved the slot: the WAL is released"
    assert reasons(idle=3600) == []

    # an error a run would report fires once (then every REFIRE_S), not at every probe
    with writer(upstream) as conn:
        conn.execute("DROP PUBLICATION pub")
        conn.execute("INSERT INTO orders VALUES (3, 'c')")
    (err,) = reasons()
    assert err.startswith("error: ") and "pub" in err
    with writer(upstream) as conn:
        conn.execute(f"SELECT pg_drop_replication_slot('{slot_name(name)}')")
    (err,) = reasons()
    assert err.startswith("error: ") and "was dropped" in err
