"""The status report against the test Postgres: recorded cycles (statistics and status rows as the cycle
writes them, at chosen times), bindings, shards, read holds and an error collection, read back as the
overview, one source's detail and ``reclock status``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.types.json import Jsonb

from reclock import status_report as sr
from reclock.batch import BatchDescription, Part
from reclock.cli import main
from reclock.config import parse_config
from reclock.persist.remap_store import append_binding, register_source
from reclock.persist.shards import Append, acquire_read_hold, compare_and_append, register_shard
from reclock.persist.status import record_status
from reclock.remap import Binding
from reclock.time import PartitionedFrontier

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
MS0 = int(T0.timestamp() * 1000)
CONFIG = {
    "sources": {"orders": {"kafka": {"bootstrap": "127.0.0.1:1", "topic": "orders"}, "format": {"type": "text"},
                           "on_decode_error": "stall"}},
    "sinks": {"orders_out": {"from": "orders", "kafka": {"bootstrap": "127.0.0.1:1", "topic": "out"}}},
}


def _stat(conn, name: str, step: str, at: datetime, **metrics) -> None:
    conn.execute("INSERT INTO reclock.statistics (name, step, metrics, at) VALUES (%s, %s, %s, %s)",
                 (name, step, Jsonb(metrics), at))


def _cycle(conn, name: str, start: datetime, records: int, known: int, committed: int, gap: float = 0.5) -> None:
    """One cycle's rows as ``reclock.cycle`` writes them: mint 0.2 s and write 3 s in one task, then
    ``gap`` seconds of scheduling, then append 0.1 s and resume 0.3 s in the next."""
    t = start + timedelta(seconds=0.2)
    _stat(conn, name, "mint", t, seconds=0.2, offsets_known=known, descriptions=1)
    t += timedelta(seconds=3.0)
    _stat(conn, name, "write_batches", t, seconds=3.0, records={name: records - 1, f"{name}_errors": 1},
          bytes={name: 100 * records, f"{name}_errors": 10})
    t += timedelta(seconds=gap + 0.1)
    _stat(conn, name, "append", t, seconds=0.1)
    t += timedelta(seconds=0.3)
    _stat(conn, name, "resume", t, seconds=0.3, offsets_committed={"0": committed})


@pytest.fixture
def recorded(conn):
    register_source(conn, "orders")
    register_shard(conn, "orders", source="orders", output=0, kind="data")
    register_shard(conn, "orders_errors", source="orders", output=1, kind="errors")
    upper = 0
    for i, offset in enumerate((10, 25, 40)):
        upper = append_binding(conn, "orders", upper, Binding(MS0 + 1000 * (i + 1),
                                                              PartitionedFrontier.of({0: offset}))).upper
    desc = BatchDescription(0, MS0 + 3001)
    compare_and_append(conn, [Append("orders", desc, [Part("orders/a.parquet", 37, 3700, MS0, MS0 + 3000)]),
                              Append("orders_errors", desc, [Part("orders/b.parquet", 3, 30, MS0, MS0 + 3000)])])
    acquire_read_hold(conn, "orders", "sink:orders_out", MS0 + 2000)
    _cycle(conn, "orders", T0, records=10, known=10, committed=10)
    _cycle(conn, "orders", T0 + timedelta(seconds=60), records=15, known=25, committed=25)
    _cycle(conn, "orders", T0 + timedelta(seconds=120), records=15, known=40, committed=40, gap=1.5)
    record_status(conn, "orders", "running")
    record_status(conn, "orders", "stalled", error="write_batches: source orders: partition 0 offset 40 does not decode")
    _stat(conn, "orders_out", "sink", T0 + timedelta(seconds=130), transactions=1, messages=37, bytes=999,
          frontier=MS0 + 2001, lag_ms=1000, seconds=0.4)
    record_status(conn, "orders_out", "running")
    return conn


def test_overview_reads_status_uppers_split_errors_and_holds(recorded, db):
    cfg = parse_config(CONFIG)
    with sr.open_readonly(db) as ro:
        ov = sr.overview(ro, cfg, lambda n: sr.Lag(7, "stub"), paused={"ingest__orders": False},
                         now_ms=MS0 + 10_000)
    (s,) = ov.sources
    assert (s.name, s.status, s.paused) == ("orders", "stalled", False)
    assert "offset 40 does not decode" in s.error
    assert (s.upper, s.since) == (MS0 + 3001, 0)
    assert s.upper_age_s == pytest.approx(6.999)
    c = s.last_cycle
    assert (c.mint, c.write_batches, c.append, c.resume) == (0.2, 3.0, 0.1, 0.3)
    assert c.total == pytest.approx(0.2 + 3.0 + 1.5 + 0.1 + 0.3)
    assert c.scheduler_gap == pytest.approx(1.5)
    assert (c.records, c.bytes) == (15, 1510)
    assert s.lag == sr.Lag(7, "stub")
    assert [(h.shard, h.holder, h.ts) for h in s.read_holds] == [("orders", "sink:orders_out", MS0 + 2000)]
    assert s.errors_count == 3
    (k,) = ov.sinks
    assert (k.name, k.collection, k.status, k.frontier, k.messages, k.read_hold) == (
        "orders_out", "orders", "running", MS0 + 2001, 37, MS0 + 2000)
    assert k.lag_ms == 1000  # the shard's upper now minus the frontier


def test_detail_has_bindings_history_and_series(recorded, db):
    with sr.open_readonly(db) as ro:
        d = sr.source_detail(ro, "orders", parse_config(CONFIG))
        assert sr.source_detail(ro, "nope") is None
    assert [(b.ts, b.offset) for b in d.bindings] == [(MS0 + 3000, 40), (MS0 + 2000, 25), (MS0 + 1000, 10)]
    assert [h.status for h in d.history][:2] == ["stalled", "running"]
    assert [p.lag for p in d.series] == [None, 15, 15]
    assert [round(p.cycle_s, 3) for p in d.series] == [4.1, 4.1, 5.1]
    assert d.series[1].throughput == pytest.approx(15 / 4.1)
    assert json.loads(json.dumps(sr.to_json(d)))["source"]["last_cycle"]["scheduler_gap"] == pytest.approx(1.5)


def test_a_viewer_sees_only_the_sources_and_sinks_of_dags_they_may_read(recorded, db):
    """Airflow's per-DAG permissions (``readable``: the DAG ids the viewer may read): a hidden source is not
    listed, not probed, and its page is as absent as one that does not exist; a sink likewise."""
    cfg = parse_config(CONFIG)
    probed = []

    def lag(name):
        probed.append(name)
        return sr.Lag(0, "stub")

    with sr.open_readonly(db) as ro:
        none = sr.overview(ro, cfg, lag, readable=frozenset())
        sink_only = sr.overview(ro, cfg, lag, readable=frozenset({"sink__orders_out"}))
        source_only = sr.overview(ro, cfg, lag, readable=frozenset({"ingest__orders", "rebuild__orders"}))
        assert sr.source_detail(ro, "orders", cfg, readable=frozenset({"sink__orders_out"})) is None
        assert sr.source_detail(ro, "orders", cfg, readable=frozenset({"ingest__orders"})) is not None
    assert (none.sources, none.sinks) == ((), ())
    assert sink_only.sources == () and [k.name for k in sink_only.sinks] == ["orders_out"]
    assert sink_only.sinks[0].read_hold == MS0 + 2000  # its own hold on the collection it reads
    assert [s.name for s in source_only.sources] == ["orders"] and source_only.sinks == ()
    assert probed == ["orders"]  # only the readable source's lag was probed


def test_the_reading_connection_cannot_write_nor_wait(db):
    with sr.open_readonly(db) as ro:
        assert ro.execute("SHOW statement_timeout").fetchone()[0] == "2s"
        assert ro.execute("SHOW lock_timeout").fetchone()[0] == "1s"
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            ro.execute("INSERT INTO reclock.statistics (name, step, metrics) VALUES ('x', 'y', '{}')")


def test_unreachable_brokers_are_an_unknown_lag_not_an_error():
    probe = sr.lag_probe(parse_config(CONFIG), timeout=1.0)
    lag = probe("orders")
    assert lag.records is None and lag.detail.startswith("unknown")
    assert probe("missing") == sr.Lag(None, "not in the config")


def test_reclock_status_prints_the_figures(recorded, db, tmp_path):
    import yaml

    path = tmp_path / "reclock.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    args = ["--dsn", db, "--config", str(path), "--probe-timeout", "1"]
    out = CliRunner().invoke(main, ["status", *args], catch_exceptions=False).output
    assert "source orders (kafka): stalled" in out
    assert "error: write_batches: source orders: partition 0 offset 40 does not decode" in out
    assert f"upper {MS0 + 3001} (2026-01-02 03:04:08.001Z" in out
    assert ("= mint 0.20s + write_batches 3.00s + append 0.10s + resume 0.30s + scheduler gap 1.50s; "
            "15 records, 1510 bytes") in out
    assert "lag: unknown records" in out
    assert f"read holds: sink:orders_out on orders at {MS0 + 2000}" in out
    assert "errors: 3" in out
    assert "sink orders_out (orders): running" in out
    as_json = json.loads(CliRunner().invoke(main, ["status", "--json", *args], catch_exceptions=False).output)
    assert as_json["sources"][0]["upper"] == MS0 + 3001
    detail = CliRunner().invoke(main, ["status", "orders", *args], catch_exceptions=False).output
    assert f"  {MS0 + 3000} (2026-01-02 03:04:08.000Z)  0  40" in detail
    assert "status history (newest first):" in detail


def test_a_recorded_error_keeps_no_credential(db):
    """An error may quote a DSN, a token or a password: status_history keeps it masked, so neither the page,
    the JSON nor ``reclock status`` can show it."""
    from reclock.persist.status import latest_status

    with psycopg.connect(db, autocommit=True) as conn:
        record_status(conn, "leaky", "stalled", "connect postgresql://app:Pa55w0rd@db:5432/r failed; "
                                                "sc://spark:15002/;token=T0k3n; sasl.password=S3cr3t")
        kept = conn.execute("SELECT error FROM reclock.status_history WHERE name = 'leaky'").fetchone()[0]
        assert latest_status(conn, "leaky").error == kept
    assert not [w for w in ("Pa55w0rd", "T0k3n", "S3cr3t") if w in kept], kept
    assert "postgresql://app:***@db:5432/r" in kept
