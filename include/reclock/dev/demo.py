"""The demo: the stack up, a sample topic filled in waves, ``ingest__demo_orders`` cycles run by the real
Airflow scheduler, and what landed printed (rows, bindings, the progress relation, consumer-group lag)."""

from __future__ import annotations

import json
import random
import time
from typing import Callable

from reclock.persist import connect

from reclock.dev.stack import Stack

DEMO_SOURCE = "demo_orders"
DEMO_SINK = "demo_orders_out"


def fill(bootstrap: str, topic: str, start: int, count: int, partitions: int = 4) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    rng = random.Random(start)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(start, start + count):
        order = {"order_id": i, "customer": f"c{rng.randrange(1000):03d}",
                 "amount": round(rng.uniform(1, 500), 2), "placed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
        producer.produce(topic, key=str(order["customer"]).encode(), value=json.dumps(order).encode())
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)


def topic_size(bootstrap: str, topic: str) -> int:
    """Records in the topic (the demo writes no transactions, so offsets count records)."""
    from confluent_kafka.admin import AdminClient

    from reclock.sources.kafka import KafkaUpstream

    if topic not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics:
        return 0
    return sum(o for _, o in KafkaUpstream(DEMO_SOURCE, bootstrap, topic).probe_upper())


def consumer_lag(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    from reclock.sources.kafka import KafkaUpstream

    up = KafkaUpstream(DEMO_SOURCE, bootstrap, topic)
    ends = up.probe_upper()
    committed = up.committed(group)
    return {p: ends.get(p) - committed.get(p) for p in up.partitions()}


def run_demo(stack: Stack, waves: int = 2, per_wave: int = 20_000, echo: Callable[[str], None] = print) -> None:
    from reclock.config import load_config
    from reclock.persist.blob import blob_store_from_url
    from reclock.read import read_as_of

    config = load_config(stack.config_file)
    spec = config.source(DEMO_SOURCE)
    dag_id = f"ingest__{DEMO_SOURCE}"
    stack.airflow.wait_for_dag(dag_id)
    sink = config.sinks.get(DEMO_SINK)
    if sink is not None:
        stack.airflow.wait_for_dag(f"sink__{DEMO_SINK}")
        stack.airflow.unpause(f"sink__{DEMO_SINK}")  # runs on the asset events of the ingest appends
    produced = 0
    start = topic_size(stack.kafka.bootstrap, spec.kafka.topic)  # a rerun of the demo adds to the topic
    for wave in range(waves):
        fill(stack.kafka.bootstrap, spec.kafka.topic, start + produced, per_wave)
        produced += per_wave
        t0 = time.monotonic()
        run_id = stack.airflow.trigger(dag_id)
        stack.airflow.wait_run(dag_id, run_id, timeout=600)
        echo(f"wave {wave + 1}: produced {per_wave} records; {dag_id} run {run_id} succeeded in "
             f"{time.monotonic() - t0:.1f}s")

    blob = blob_store_from_url(stack.blob_url)
    with connect(stack.postgres.dsn()) as conn:
        contents = read_as_of(conn, blob, spec.data_shard)
        rows = int(sum(contents.column("diff").to_pylist())) if contents.num_rows else 0
        progress = conn.execute(
            f'SELECT ts, partition, "offset" FROM reclock."{DEMO_SOURCE}_progress" ORDER BY ts, partition'
        ).fetchall()
        upper, since = conn.execute("SELECT upper, since FROM reclock.shards WHERE id = %s",
                                    (spec.data_shard,)).fetchone()
    total = topic_size(stack.kafka.bootstrap, spec.kafka.topic)
    echo(f"\n{spec.data_shard}: {rows} rows; the topic holds {total} records ({produced} produced by this run); "
         f"upper {upper}, since {since}")
    echo(f"SELECT * FROM reclock.{DEMO_SOURCE}_progress  -- the bindings (ts, partition, offset):")
    for ts, p, o in progress[-12:]:
        echo(f"  {ts}  {p}  {o}")
    lag = consumer_lag(stack.kafka.bootstrap, spec.kafka.topic, spec.consumer_group)
    echo(f"consumer group {spec.consumer_group} lag per partition: {lag} (total {sum(lag.values())})")
    if sink is not None:
        _show_sink(stack, sink, upper, echo)
    echo(f"\nAirflow UI: {stack.airflow.url}  (login admin, password in {stack.state.file})")
    echo(f'read it yourself: eval "$(.venv/bin/reclock dev env)"; .venv/bin/reclock read {spec.data_shard} --limit 5')


def _show_sink(stack: Stack, sink, upper: int, echo: Callable[[str], None]) -> None:
    """Wait for the asset-triggered ``sink__`` runs to reach the shard's upper; print the sink's progress."""
    from reclock.sinks.kafka import read_progress

    t0 = time.monotonic()
    progress = None
    while time.monotonic() - t0 < 180:
        progress = read_progress(stack.kafka.bootstrap, sink.progress_topic, sink.name)
        if progress is not None and progress.frontier >= upper:
            break
        time.sleep(1)
    if progress is None or progress.frontier < upper:
        echo(f"sink {sink.name}: not caught up after 180 s (see the sink__{sink.name} runs in the UI)")
        return
    runs = stack.airflow.api("GET", f"dags/sink__{sink.name}/dagRuns").get("total_entries", "?")
    echo(f"sink {sink.name}: {sink.collection} -> topic {sink.kafka.topic} exactly once; progress record "
         f"frontier {progress.frontier} = the shard's upper ({runs} asset-triggered runs of sink__{sink.name})")
