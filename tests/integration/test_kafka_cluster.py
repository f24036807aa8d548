"""A source and its exactly-once sink on a three-node Kafka cluster (replication factor 3,
``min.insync.replicas`` 2, the transaction state log replicated: ``reclock.dev.kafka.LocalKafkaCluster``)
while its nodes are SIGKILLed and started again: the leader of a partition the source reads, the
transaction coordinator of the sink's ``transactional.id``, and the active controller. Records keep
arriving (an idempotent producer, ``acks=all``), cycles keep minting and sinks keep committing; each step
completes or fails within its bound (none waits forever), and at the end every record is in the collection
once at its binding's timestamp and in the sink's topic once, in timestamp order.

``make test`` runs the short version (one kill: the node that is the sink's coordinator and leads a source
partition); ``make test-deployment`` the long one (each role's node in turn)."""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import replace

import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from ingest_support import check_invariants, make_ctx

from reclock import cycle
from reclock.config import parse_sink
from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.read import read_updates
from reclock.sinks.encode import encode_updates
from reclock.sinks.kafka import TS_HEADER, KafkaSink, SinkContext, consolidate, read_all, read_progress

STEP_BOUND_S = 240.0
"""Longer than any step may take here with a node down (a retry policy or a timeout ends it before): a step
still running after it is waiting forever, which the test reports as a failure."""


class Steps(threading.Thread):
    """Cycles and sink steps back to back until stopped, each in a thread of its own watched against
    :data:`STEP_BOUND_S`; a step that fails is run again (the operator's rerun: a new sink instance)."""

    def __init__(self, ctx, sink_ctx) -> None:
        super().__init__(daemon=True)
        self.ctx, self.sink_ctx = ctx, sink_ctx
        self.stop = threading.Event()
        self.done = {"cycle": 0, "sink": 0}
        self.failed: list[str] = []
        self.hung: list[str] = []
        self.sink: KafkaSink | None = None

    def _bounded(self, what: str, fn) -> None:
        box: dict = {}

        def call() -> None:
            try:
                fn()
                box["ok"] = True
            except Exception as e:  # noqa: BLE001 - a failed step is rerun; the oracle judges the end
                box["error"] = f"{type(e).__name__}: {str(e)[:200]}"

        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(STEP_BOUND_S)
        if t.is_alive():
            self.hung.append(what)
            self.stop.set()
        elif "ok" in box:
            self.done[what] += 1
        else:
            self.failed.append(f"{what}: {box['error']}")
            if what == "sink":
                self.sink = None

    def _sink_step(self) -> None:
        if self.sink is None:
            sink = KafkaSink(self.sink_ctx)
            sink.start()
            self.sink = sink
        self.sink.step()

    def run(self) -> None:
        while not self.stop.is_set():
            self._bounded("cycle", lambda: cycle.run_cycle(self.ctx))
            self._bounded("sink", self._sink_step)
            time.sleep(0.2)


@pytest.mark.deployment
def test_exactly_once_while_leaders_the_coordinator_and_the_controller_are_killed(
        kafka_cluster, db, spark, tmp_path):
    """The long version (``make test-deployment``): each role's node killed in turn."""
    def plan(spec, src):
        return [("leader of %s/0" % src, lambda: kafka_cluster.leader(src, 0)),
                ("transaction coordinator", lambda: kafka_cluster.transaction_coordinator(spec.transactional_id)),
                ("active controller", kafka_cluster.active_controller)]

    killed = _exactly_once_while_killed(kafka_cluster, db, spark, tmp_path, "kcl", plan)
    assert {r for r, _ in killed} == {"leader of kcl_src/0", "transaction coordinator", "active controller"}


def test_exactly_once_while_the_coordinators_node_which_leads_a_source_partition_is_killed(
        kafka_cluster, db, spark, tmp_path):
    """The short version (in ``make test``): one kill, of the node that is the sink's transaction coordinator
    and (three partitions led by three nodes) the leader of a partition the source reads; the active
    controller too if it is that node."""
    def plan(spec, src):
        def node() -> int:
            n = kafka_cluster.transaction_coordinator(spec.transactional_id)
            led = [p for p in range(3) if kafka_cluster.leader(src, p) == n]
            assert led, f"node {n} leads no partition of {src}: the kill would not hit a source's leader"
            return n
        return [("transaction coordinator and a source partition's leader", node)]

    killed = _exactly_once_while_killed(kafka_cluster, db, spark, tmp_path, "kcs", plan)
    assert len(killed) == 1


def _exactly_once_while_killed(kafka_cluster, db, spark, tmp_path, tag: str, plan) -> list[tuple[str, int]]:
    """A source over ``<tag>_src`` and its sink to ``<tag>_out`` run back to back while ``plan(sink spec,
    source topic)``'s nodes are killed in turn, each started again after 3 s; then the oracle. Returns what
    was killed (role, node)."""
    bootstrap = kafka_cluster.bootstrap
    src, out = f"{tag}_src", f"{tag}_out"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for fut in admin.create_topics([NewTopic(src, 3), NewTopic(out, 3)]).values():
        fut.result(60)  # replication factor: the cluster's default, 3
    assert all(len(p.replicas) == 3 for p in admin.list_topics(src, timeout=10).topics[src].partitions.values())

    ctx = make_ctx(db, kafka_cluster, spark, tmp_path, src, name=tag, budget={"max_records": 400})
    ctx = replace(ctx, retain_history_ms=10**12)
    spec = parse_sink(out, {"from": tag, "format": "debezium", "key": ["_partition", "_offset"],
                            "kafka": {"topic": out, "bootstrap": bootstrap},
                            "progress_topic": f"_progress_{tag}", "budget": {"max_messages": 100},
                            "transaction_timeout": "20s"}, {tag: ctx.spec})
    sink_ctx = SinkContext(spec=spec, dsn=db, kafka=bootstrap, blob=ctx.blob)

    stop_producing = threading.Event()
    acked: list[int] = []

    def produce() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                      "message.timeout.ms": 300_000, "log_level": 0})
        i = 0
        while not stop_producing.is_set():
            p.produce(src, value=json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=i % 3,
                      on_delivery=lambda err, m, i=i: err is None and acked.append(i))
            p.poll(0)
            i += 1
            time.sleep(0.02)
        assert p.flush(300) == 0, "records left unsent after the faults"

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    steps = Steps(ctx, sink_ctx)
    steps.start()
    killed = []
    try:
        deadline = time.monotonic() + STEP_BOUND_S  # under way: a cycle and a sink transaction (its coordinator) done
        while (not steps.done["cycle"] or not steps.done["sink"]) and time.monotonic() < deadline and not steps.hung:
            time.sleep(0.5)
        assert steps.done["cycle"] and steps.done["sink"], f"no cycle and sink step before the kills: {steps.failed[-5:]}"
        for role, node_of in plan(spec, src):
            before = dict(steps.done)
            node = node_of()
            assert kafka_cluster.kill(node), f"{role}: node {node} was not running"
            killed.append((role, node))
            time.sleep(3)  # cycles and sink steps run against the two left
            kafka_cluster.start_node(node)
            deadline = time.monotonic() + STEP_BOUND_S
            while (steps.done["cycle"] <= before["cycle"] or steps.done["sink"] <= before["sink"]) \
                    and time.monotonic() < deadline and not steps.hung:
                time.sleep(0.5)
            assert steps.done["cycle"] > before["cycle"] and steps.done["sink"] > before["sink"], \
                f"after killing the {role} (node {node}) no cycle or sink step completed: {steps.failed[-5:]}"
    finally:
        stop_producing.set()
        producer.join(300)
        steps.stop.set()
        steps.join(2 * STEP_BOUND_S)
    assert not steps.hung, f"steps that waited more than {STEP_BOUND_S} s: {steps.hung}; failures {steps.failed}"

    # catch up: cycles until one finds nothing new, the sink up to the shard's upper
    while cycle.run_cycle(ctx)["minted"] is not None:
        pass
    sink = KafkaSink(sink_ctx)
    sink.start()
    sink.step()
    state = check_invariants(ctx, set(acked))  # every acknowledged record once, at its binding's timestamp

    with connect(db) as conn:
        upper = shard_info(conn, tag).upper
        ups = read_updates(conn, ctx.blob, tag)
    got = [(m.partition(), int(dict(m.headers())[TS_HEADER]), m.key(), m.value())
           for m in read_all(bootstrap, out, f"{tag}-oracle")]
    first = min(t for _, t, _, _ in got)  # a sink's snapshot, if it took one, is at its first frontier
    ups = ups.set_column(ups.schema.get_field_index("ts"), "ts", pc.max_element_wise(ups["ts"], first))
    want = collections.Counter(encode_updates(spec, consolidate(ups)))
    assert collections.Counter((t, k, v) for _, t, k, v in got) == want, "the sink wrote each update once"
    assert len(want) == len(state["rows"])
    for p in {p for p, _, _, _ in got}:
        ts = [t for q, t, _, _ in got if q == p]
        assert ts == sorted(ts), f"{out} partition {p} out of timestamp order"
    assert read_progress(bootstrap, f"_progress_{tag}", out).frontier == upper
    return killed
