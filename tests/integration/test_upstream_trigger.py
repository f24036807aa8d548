"""The event-driven schedule's trigger (issue 19): ``UpstreamMoved`` fires when the topic holds records beyond
the source's newest binding and stays quiet otherwise; the triggers of one cluster share one probe; the probe
never touches a consumer group. Real Kafka and Postgres, the trigger's own poll loop (``run``)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from confluent_kafka.admin import AdminClient
from ingest_support import make_ctx, produce, rec

from reclock import cycle
from reclock.config import parse_source
from reclock.errors import ConfigError
from reclock.orchestration.triggers import UpstreamMoved, admin_client, cluster_offsets


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
    assert not [g for g in groups if "watched" in g and g not in ("reclock-watched", "reclock-watched-read")], groups


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
