"""A Postgres source's config: the publication, where its DSN comes from, its tables and their collections."""

from __future__ import annotations

import pytest

from reclock.config import parse_config, parse_source
from reclock.errors import ConfigError
from reclock.sources.postgres.spec import PostgresSpec

PG = {"postgres": {"connection": "shop_db", "publication": "shop_pub"}}


def test_tables_become_collections_named_after_the_source():
    spec = parse_source("shop", {**PG, "tables": ["public.orders", "items", "sales.orders"]})
    assert spec.kind == "postgres" and isinstance(spec.upstream, PostgresSpec)
    assert spec.upstream.tables == ("public.orders", "public.items", "sales.orders")
    assert spec.shards == ("shop__orders", "shop__items", "shop__sales__orders", "shop_errors")
    assert parse_source("shop", PG).shards == ("shop_errors",)  # learned at the first cycle
    env = parse_source("shop", {"postgres": {"dsn_env": "SHOP_DSN", "publication": "p"}})
    assert env.upstream.dsn_env == "SHOP_DSN" and env.upstream.connection is None


def test_a_postgres_source_runs_on_an_interval_when_upstream_has_news_or_continuously():
    assert (parse_source("shop", PG).schedule, parse_source("shop", PG).interval_s) == ("interval", 60)
    spec = parse_source("shop", {**PG, "schedule": "upstream", "poll": "500ms"})
    assert (spec.schedule, spec.poll_s) == ("upstream", 0.5)
    assert parse_source("shop", {**PG, "schedule": "upstream"}).poll_s == 1
    spec = parse_source("shop", {**PG, "schedule": "continuous", "lease": "5m", "resume": "2s", "group": "cdc"})
    assert (spec.schedule, spec.poll_s, spec.lease_s, spec.resume_s, spec.group) == ("continuous", 0.2, 300, 2, "cdc")


@pytest.mark.parametrize("raw,match", [
    ({"postgres": {"publication": "p"}}, "exactly one of `connection:`"),
    ({"postgres": {"connection": "c", "dsn_env": "E", "publication": "p"}}, "exactly one of"),
    ({"postgres": {"dsn": "postgresql://u:secret@h/db", "publication": "p"}}, "credentials"),
    ({"postgres": {"connection": "c"}}, "`publication` is required"),
    ({"postgres": {"connection": "c", "publication": "Bad-Name"}}, "publication"),
    ({**PG, "tables": []}, "non-empty list"),
    ({**PG, "tables": ["public.Orders"]}, "lower-case unquoted"),
    ({**PG, "tables": ["orders", "public.orders"]}, "listed twice: shop__orders"),
    ({**PG, "tables": ["a." + "x" * 60]}, "collection name"),
    ({**PG, "kafka": {"topic": "t"}}, "not both"),
    ({**PG, "envelope": "upsert"}, "unknown key"),
    ({"kafka": {"topic": "t"}, "tables": ["a"]}, "belongs to a Postgres source"),
    ({**PG, "budget": {"max_records": 0}}, "positive"),
    ({**PG, "schedule": "hourly"}, "not one of interval, upstream, continuous"),
    ({**PG, "schedule": "upstream", "interval": "1s"}, "`interval:` is for `schedule: interval`"),
    ({**PG, "poll": "1s"}, "`poll:` is for"),
    ({**PG, "schedule": "upstream", "lease": "1m"}, "`lease:` is for `schedule: continuous`"),
])
def test_bad_postgres_config_is_refused_saying_why(raw, match):
    with pytest.raises(ConfigError, match=match):
        parse_source("shop", raw)


def test_a_sink_may_read_a_table_collection():
    cfg = parse_config({"sources": {"shop": {**PG, "tables": ["orders"]}},
                        "sinks": {"out": {"from": "shop__orders", "kafka": {"topic": "o", "bootstrap": "x:1"}}}})
    assert cfg.sink("out").collection == "shop__orders"


def test_the_upstream_dsn_comes_from_the_named_environment_variable(monkeypatch):
    from reclock.errors import SettingError
    from reclock.sources.postgres.spec import find_upstream_dsn

    spec = parse_source("shop", {"postgres": {"dsn_env": "SHOP_DSN", "publication": "p"}})
    monkeypatch.setenv("SHOP_DSN", "postgresql://u@h/db")
    assert find_upstream_dsn(spec.upstream, "source shop") == "postgresql://u@h/db"
    monkeypatch.delenv("SHOP_DSN")
    with pytest.raises(SettingError, match="SHOP_DSN"):
        find_upstream_dsn(spec.upstream, "source shop")
