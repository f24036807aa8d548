"""Kafka with SASL/SCRAM-SHA-512 over TLS, mutual TLS and ACLs (KRaft's StandardAuthorizer): a Kafka
source's cycles (mint's probe, Spark's reader, the offset commit), the lag probe and the exactly-once sink
run with exactly the ACLs ``reclock.grants.kafka_acls`` derives, every client taking its settings from the
Airflow connection. Each refusal has a test: a wrong password, an unknown CA, a plaintext client, and each
ACL taken away in turn, which fails with the operation and the resource named (each test runs under a
timeout: a refusal must not hang)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from reclock.config import parse_config
from reclock.cycle import run_cycle
from reclock.errors import KafkaAccessDenied, KafkaAuthenticationFailed
from reclock.grants import kafka_acls
from reclock import settings
from reclock.orchestration import contexts
from reclock.persist import connect
from reclock.persist.migrate import migrate
from reclock.read import read_as_of
from reclock.sinks.kafka import read_all, run_once
from reclock.sources.kafka.upstream import KafkaUpstream, UpstreamUnavailable
from reclock.status_report import lag_probe

_n = itertools.count()


@dataclass
class World:
    secured: object
    config: object
    source: str
    sink: str
    topic: str
    out: str
    progress: str
    dsn: str
    blob: str
    spark: object
    produced: int = 0

    def produce(self, count: int) -> None:
        """``count`` records into the source's topic, as the admin (the producer is not Reclock)."""
        from confluent_kafka import Producer

        p = Producer(self.secured.kafka.admin_config().librdkafka({"enable.idempotence": True}))
        for i in range(self.produced, self.produced + count):
            p.produce(self.topic, json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=i % 2)
        assert p.flush(30) == 0, "records left unsent"
        self.produced += count

    def ctx(self):
        ctx = contexts.cycle_context(self.config.source(self.source), dsn=self.dsn, blob_url=self.blob,
                                     spark=settings.SparkTarget(master="local[2]"))
        ctx.spark_factory = lambda: self.spark
        return ctx

    def sink_ctx(self):
        return contexts.sink_context(self.config.sink(self.sink), dsn=self.dsn, blob_url=self.blob)

    def rows(self) -> int:
        with connect(self.dsn) as conn:
            upper = conn.execute("SELECT upper FROM reclock.shards WHERE id = %s", (self.source,)).fetchone()[0]
            return read_as_of(conn, self.ctx().blob, self.source, upper - 1).num_rows

    def acls(self):
        return kafka_acls(self.config)

    def grant_all(self) -> None:
        for a in self.acls():
            self.secured.kafka.grant("reclock", a.operation, a.resource_type, a.name)


def _admin_topics(secured, *specs: tuple[str, int, dict]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(secured.kafka.admin_config().librdkafka())
    for fut in admin.create_topics([NewTopic(t, n, 1, config=c) for t, n, c in specs]).values():
        fut.result(30)


def _world(secured, spark, connection: str) -> World:
    n = f"{os.getpid() % 10000}_{next(_n)}"
    source, sink = f"ks{n}", f"ko{n}"
    topic, out, progress = f"ks_{n}", f"ko_{n}", f"_progress_{n}"
    config = parse_config({
        "sources": {source: {"kafka": {"topic": topic, "connection": connection},
                             "format": {"type": "json", "schema": "id BIGINT, name STRING"}}},
        "sinks": {sink: {"from": source, "kafka": {"topic": out, "connection": connection},
                         "progress_topic": progress, "format": "debezium"}}})
    _admin_topics(secured, (topic, 2, {}), (out, 1, {}), (progress, 1, {"cleanup.policy": "compact"}))
    dsn = secured.consensus_db()
    migrate(dsn)
    w = World(secured, config, source, sink, topic, out, progress, dsn, tempfile.mkdtemp(prefix="reclock-sec-blob-"),
              spark)
    w.grant_all()
    return w


@pytest.fixture(scope="module")
def world(secured, spark):
    """A Kafka source and its sink on connection ``reclock_kafka`` (SCRAM over TLS), the principal granted
    exactly their ACLs; the tests below take one ACL away at a time and give it back."""
    w = _world(secured, spark, "reclock_kafka")
    yield w
    shutil.rmtree(w.blob, ignore_errors=True)


@pytest.fixture(autouse=True)
def connection(secured, monkeypatch):
    monkeypatch.delenv("RECLOCK_BOOTSTRAP", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA", secured.kafka_connection())
    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA_MTLS", secured.mtls_connection())


def _sink_messages(w: World, timeout: float = 60.0) -> list:
    """The sink's topic, read_committed, as the admin (the oracle is not Reclock), once the transaction markers
    are in: the coordinator writes them after the sink's commit returns, and until then the last stable offset
    hides the committed messages from a read_committed reader."""
    from confluent_kafka import IsolationLevel, TopicCollection, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient(w.secured.kafka.admin_config().librdkafka())
    parts = admin.describe_topics(TopicCollection([w.out]))[w.out].result().partitions
    deadline = time.monotonic() + timeout
    while True:
        ends = [{tp.partition: f.result().offset for tp, f in admin.list_offsets(
                    {TopicPartition(w.out, p.id): OffsetSpec.latest() for p in parts}, isolation_level=level,
                    request_timeout=10).items()}
                for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)]
        if ends[0] == ends[1]:
            break
        assert time.monotonic() < deadline, f"{w.out}: transaction markers not written after {timeout}s: {ends}"
        time.sleep(0.1)
    return [json.loads(m.value()) for m in read_all(w.secured.kafka.admin_config(), w.out, "oracle")]


@pytest.mark.timeout(600)
def test_source_lag_and_sink_with_exactly_their_acls(world):
    world.produce(200)
    run_cycle(world.ctx())
    world.produce(100)
    run_cycle(world.ctx())
    assert world.rows() == world.produced
    lag = lag_probe(world.config, timeout=10)(world.source)  # the kind finds the cluster as its cycles do
    assert lag.value == 0, lag  # the group's committed offsets, read back as the principal
    result = run_once(world.sink_ctx())
    assert result.messages == world.produced
    assert sorted(m["after"]["id"] for m in _sink_messages(world)) == list(range(world.produced))


@pytest.mark.timeout(120)
def test_the_upstream_trigger_probes_through_the_connection(world):
    """``schedule: upstream``'s probe (what the triggerer runs) finds the cluster through the connection and
    reads the topic's offsets with the source's ACLs (DESCRIBE on the topic)."""
    import asyncio

    from reclock.sources.kafka.trigger import UpstreamMoved

    world.produce(10)

    async def first_probe() -> dict:
        stream = UpstreamMoved.open_shared_stream({"source": world.source, "topic": world.topic,
                                                   "connection": "reclock_kafka", "bootstrap": None, "poll": 1.0})
        try:
            return await asyncio.wait_for(stream.__anext__(), 60)
        finally:
            await stream.aclose()

    offsets = asyncio.run(first_probe())
    assert sum(offsets[world.topic].values()) == world.produced, offsets


@pytest.mark.timeout(600)
def test_mutual_tls_principal_with_the_same_acls(secured, spark):
    """The client certificate's CN ``reclock`` maps to the principal ``User:reclock`` (the broker's
    ``ssl.principal.mapping.rules``): the same ACLs serve it."""
    w = _world(secured, spark, "reclock_kafka_mtls")
    try:
        assert settings.find_kafka(w.config.source(w.source).upstream, "t").protocol == "SSL"
        w.produce(50)
        run_cycle(w.ctx())
        assert w.rows() == 50
        assert run_once(w.sink_ctx()).messages == 50
    finally:
        shutil.rmtree(w.blob, ignore_errors=True)


@pytest.mark.timeout(120)
def test_wrong_password_is_refused_with_the_reason(world, secured, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA", secured.kafka_connection(password="not-the-password"))
    with pytest.raises(KafkaAuthenticationFailed, match="invalid credentials") as e:
        world.ctx().source().probe_upper()
    assert "not-the-password" not in str(e.value)


@pytest.mark.timeout(120)
def test_unknown_ca_is_refused_with_the_reason(world, secured, monkeypatch):
    from reclock.dev.state import StackState
    from reclock.dev.tls import LocalCA

    other = tempfile.mkdtemp(prefix="reclock-other-ca-")
    try:
        ca = LocalCA(StackState(Path(other))).cert
        monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA", secured.kafka_connection(**{"ssl.ca.location": str(ca)}))
        with pytest.raises(KafkaAuthenticationFailed, match="certificate verify failed"):
            world.ctx().source().probe_upper()
    finally:
        shutil.rmtree(other, ignore_errors=True)


@pytest.mark.timeout(120)
def test_plaintext_client_gets_nothing(world, secured):
    up = KafkaUpstream(world.source, secured.kafka.bootstrap, world.topic, timeout=5)
    with pytest.raises(UpstreamUnavailable, match="unreachable"):
        up.probe_upper()


def _without(world: World, operation: str, resource_type: str, name: str):
    """Context: the principal without that ACL (given back afterwards)."""
    import contextlib
    import time

    @contextlib.contextmanager
    def revoked():
        world.secured.kafka.revoke("reclock", operation, resource_type, name)
        time.sleep(1)  # the broker's authorizer applies the change from the metadata log
        try:
            yield
        finally:
            world.secured.kafka.grant("reclock", operation, resource_type, name)
            time.sleep(1)
    return revoked()


def _denied(e: KafkaAccessDenied, operation: str, resource_type: str, resource: str) -> None:
    assert (e.operation, e.resource_type) == (operation, resource_type), str(e)
    assert resource in e.resource, str(e)
    assert f"denied {operation} on {resource_type}" in str(e) and "User:reclock" in str(e)


@pytest.mark.timeout(300)
def test_no_describe_on_the_topic_refuses_mint(world):
    world.produce(10)
    with _without(world, "DESCRIBE", "TOPIC", world.topic), _without(world, "READ", "TOPIC", world.topic):
        with pytest.raises(KafkaAccessDenied) as e:
            run_cycle(world.ctx())  # READ implies DESCRIBE: both taken away
    _denied(e.value, "DESCRIBE", "topic", world.topic)
    run_cycle(world.ctx())
    assert world.rows() == world.produced


@pytest.mark.timeout(300)
def test_no_read_on_the_topic_refuses_sparks_reader(world):
    world.produce(10)
    with _without(world, "READ", "TOPIC", world.topic):
        with pytest.raises(KafkaAccessDenied) as e:
            run_cycle(world.ctx())  # mint may describe it; Spark's executors may not fetch
    _denied(e.value, "READ", "topic", world.topic)
    run_cycle(world.ctx())
    assert world.rows() == world.produced


@pytest.mark.timeout(300)
def test_no_read_on_the_group_refuses_the_offset_commit(world):
    """READ on a group implies DESCRIBE: without it, mint's read of what the group acknowledged (before any
    binding) is refused; with DESCRIBE alone, the cycle's offset commit is, naming READ."""
    group = world.config.source(world.source).consumer_group
    world.produce(10)
    with _without(world, "READ", "GROUP", group):
        with pytest.raises(KafkaAccessDenied) as e:
            run_cycle(world.ctx())
        _denied(e.value, "DESCRIBE", "group", group)
        world.secured.kafka.grant("reclock", "DESCRIBE", "GROUP", group)
        time.sleep(1)  # the authorizer applies the change from the metadata log
        try:
            with pytest.raises(KafkaAccessDenied) as e:
                run_cycle(world.ctx())
            _denied(e.value, "READ", "group", group)
        finally:
            world.secured.kafka.revoke("reclock", "DESCRIBE", "GROUP", group)
    run_cycle(world.ctx())
    assert world.rows() == world.produced


@pytest.mark.timeout(300)
@pytest.mark.parametrize("operation, resource_type, which", [
    ("WRITE", "TRANSACTIONAL_ID", "txn"), ("WRITE", "TOPIC", "out"), ("READ", "TOPIC", "progress")])
def test_sink_without_an_acl_is_refused(world, operation, resource_type, which):
    name = {"txn": world.config.sink(world.sink).transactional_id, "out": world.out, "progress": world.progress}[which]
    world.produce(5)
    run_cycle(world.ctx())
    with _without(world, operation, resource_type, name):
        with pytest.raises(KafkaAccessDenied) as e:
            run_once(world.sink_ctx())
    _denied(e.value, operation, "transactional id" if which == "txn" else "topic", name)
    assert run_once(world.sink_ctx()).frontier > 0
    assert sorted(m["after"]["id"] for m in _sink_messages(world) if m.get("after")) == list(range(world.produced))


def _everything_kept(w: World) -> dict[str, str]:
    """Every row of every table of the consensus database's ``reclock`` schema, every file of the blob store,
    every message of the sink's and progress topics: what a run leaves behind, as text by where it is."""
    out = {}
    with connect(w.dsn) as conn:
        for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'reclock'").fetchall():
            out[f"table reclock.{t}"] = "\n".join(r[0] for r in conn.execute(f'SELECT t::text FROM reclock."{t}" t'))
    for p in Path(w.blob).rglob("*"):
        if p.is_file():
            out[f"blob {p.relative_to(w.blob)}"] = p.read_bytes().decode(errors="replace")
    for topic in (w.out, w.progress):
        out[f"topic {topic}"] = "\n".join(m.value().decode(errors="replace") for m in read_all(
            w.secured.kafka.admin_config(), topic, "oracle") if m.value() is not None)
    return out


@pytest.mark.timeout(600)
def test_no_secret_in_logs_errors_status_or_anything_a_run_leaves(world, secured, monkeypatch, caplog, capfd,
                                                                   tmp_path):
    """A cycle, a sink step and a refused login (a wrong password) with every logger at DEBUG; then
    ``reclock status`` (text, JSON, a source's detail). Nothing of it (log records, the process's output,
    the errors, the status, the consensus tables, the parts, the topics) holds a password, key or token."""
    import logging

    import yaml
    from click.testing import CliRunner

    from reclock.cli import main

    wrong = "wrong-" + secured.kafka_password[::-1]
    secrets = {**secured.secrets(), "the wrong password tried": wrong}
    places: dict[str, str] = {}
    with caplog.at_level(logging.DEBUG):
        world.produce(20)
        run_cycle(world.ctx())
        run_once(world.sink_ctx())
        monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA", secured.kafka_connection(password=wrong))
        with pytest.raises(KafkaAuthenticationFailed) as refused:
            run_cycle(world.ctx())
        places["the refusal"] = f"{refused.value!r} {refused.value}"
        monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA", secured.kafka_connection())
        config = tmp_path / "reclock.yaml"
        config.write_text(yaml.safe_dump({
            "sources": {world.source: {"kafka": {"topic": world.topic, "connection": "reclock_kafka"},
                                       "format": {"type": "json", "schema": "id BIGINT, name STRING"}}},
            "sinks": {world.sink: {"from": world.source, "kafka": {"topic": world.out, "connection": "reclock_kafka"},
                                   "progress_topic": world.progress, "format": "debezium"}}}))
        args = ["--dsn", world.dsn, "--config", str(config), "--probe-timeout", "10"]
        for extra in ([], ["--json"], [world.source]):
            res = CliRunner().invoke(main, ["status", *extra, *args], catch_exceptions=False)
            assert res.exit_code == 0, res.output
            places[f"reclock status {' '.join(extra)}"] = res.output
    assert world.source in places["reclock status "] and "stalled" in places["reclock status "]
    places["log records"] = caplog.text + "\n".join(repr(r.args) for r in caplog.records)
    captured = capfd.readouterr()
    places["stdout and stderr"] = captured.out + captured.err
    places.update(_everything_kept(world))
    leaks = [f"{what} in {where}" for where, text in places.items() for what, s in secrets.items() if s in text]
    assert not leaks, leaks
