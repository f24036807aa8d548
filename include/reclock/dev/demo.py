"""The demo: the stack up, a sample topic filled in waves, ``ingest__demo_orders`` cycles run by the real
Airflow scheduler, and what landed printed (rows, bindings, the progress relation, consumer-group lag); then
the same for a Postgres source, ``demo_shop``: transactions over two tables of the stack Postgres's
``demo_shop`` database, ``ingest__demo_shop`` runs, each table's collection beside the table itself, the
``(ts, lsn)`` progress relation and the WAL the slot retains; then an S3 source, ``demo_events``: JSON lines
(some gzip'd) uploaded to the stack's S3 (moto) in waves, found through the bucket's event notifications in
an SQS queue, ``ingest__demo_events`` runs, the collection beside the records the bucket holds (read from S3
itself), and the ``(ts, key, byte_offset)`` progress relation."""

from __future__ import annotations

import json
import random
import time
from typing import Callable

from reclock.kafka_client import client_config
from reclock.persist import connect

from reclock.dev.stack import Stack

DEMO_SOURCE = "demo_orders"
DEMO_SINK = "demo_orders_out"
DEMO_PG_SOURCE = "demo_shop"
DEMO_PG_DB = "demo_shop"  # a database of the stack's Postgres (wal_level=logical), the upstream of demo_shop
DEMO_S3_SOURCE = "demo_events"


def fill(bootstrap: str, topic: str, start: int, count: int, partitions: int = 4) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(client_config(bootstrap).librdkafka())
    if topic not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    rng = random.Random(start)
    producer = Producer(client_config(bootstrap).librdkafka({"linger.ms": 20, "enable.idempotence": True}))
    for i in range(start, start + count):
        order = {"order_id": i, "customer": f"c{rng.randrange(1000):03d}",
                 "amount": round(rng.uniform(1, 500), 2), "placed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
        producer.produce(topic, key=str(order["customer"]).encode(), value=json.dumps(order).encode())
        if i % 10_000 == 0:
            producer.poll(0)
    unsent = producer.flush(60)
    if unsent:
        raise RuntimeError(f"{unsent} demo records were not acknowledged by Kafka at {bootstrap} within 60 s")


def topic_size(bootstrap: str, topic: str) -> int:
    """Records in the topic (the demo writes no transactions, so offsets count records)."""
    from confluent_kafka.admin import AdminClient

    from reclock.sources.kafka.upstream import KafkaUpstream

    if topic not in AdminClient(client_config(bootstrap).librdkafka()).list_topics(timeout=10).topics:
        return 0
    return sum(o for _, o in KafkaUpstream(DEMO_SOURCE, bootstrap, topic).probe_upper())


def consumer_lag(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    from reclock.sources.kafka.upstream import KafkaUpstream

    up = KafkaUpstream(DEMO_SOURCE, bootstrap, topic)
    ends = up.probe_upper()
    committed = up.committed(group)
    return {p: ends.get(p) - committed.get(p) for p in up.partitions()}


def run_demo(stack: Stack, waves: int = 2, per_wave: int = 20_000, echo: Callable[[str], None] = print) -> None:
    from reclock.config import load_config
    from reclock.persist.blob import blob_store_from_url

    config = load_config(stack.config_file)
    spec = config.source(DEMO_SOURCE)
    dag_id = f"ingest__{DEMO_SOURCE}"
    stack.airflow.wait_for_dag(dag_id)
    sink = config.sinks.get(DEMO_SINK)
    if sink is not None:
        stack.airflow.wait_for_dag(f"sink__{DEMO_SINK}")
        stack.airflow.unpause(f"sink__{DEMO_SINK}")  # runs on the asset events of the ingest appends
    start = topic_size(stack.kafka.admin_config(), spec.upstream.topic)  # a rerun of the demo adds to the topic

    def wave(i: int) -> str:
        fill(stack.kafka.admin_config(), spec.upstream.topic, start + i * per_wave, per_wave)
        return f"produced {per_wave} records"

    _run_waves(stack, dag_id, waves, wave, echo)
    produced = waves * per_wave

    blob = blob_store_from_url(stack.blob_url, stack.s3.settings() if stack.s3 else None)
    with connect(stack.postgres.dsn()) as conn:
        rows = _rows(conn, blob, spec.data_shard)
        progress = conn.execute(
            f'SELECT ts, partition, "offset" FROM reclock."{DEMO_SOURCE}_progress" ORDER BY ts, partition'
        ).fetchall()
        upper, since = conn.execute("SELECT upper, since FROM reclock.shards WHERE id = %s",
                                    (spec.data_shard,)).fetchone()
    total = topic_size(stack.kafka.admin_config(), spec.upstream.topic)
    echo(f"\n{spec.data_shard}: {rows} rows; the topic holds {total} records ({produced} produced by this run); "
         f"upper {upper}, since {since}")
    echo(f"SELECT * FROM reclock.{DEMO_SOURCE}_progress  -- the bindings (ts, partition, offset):")
    for ts, p, o in progress[-12:]:
        echo(f"  {ts}  {p}  {o}")
    lag = consumer_lag(stack.kafka.admin_config(), spec.upstream.topic, spec.consumer_group)
    echo(f"consumer group {spec.consumer_group} lag per partition: {lag} (total {sum(lag.values())})")
    if sink is not None:
        _show_sink(stack, sink, upper, echo)
    if DEMO_PG_SOURCE in config.sources:
        _run_postgres_demo(stack, config.sources[DEMO_PG_SOURCE], waves, max(1, per_wave // 20), echo)
    if DEMO_S3_SOURCE in config.sources:
        _run_s3_demo(stack, config.sources[DEMO_S3_SOURCE], waves, max(1, per_wave // 1000), echo)
    echo(f"\nAirflow UI: {stack.airflow.url}  (login admin, password in {stack.state.file})")
    echo(f'read it yourself: eval "$(.venv/bin/reclock dev env)"; .venv/bin/reclock read {spec.data_shard} --limit 5')


def _run_waves(stack: Stack, dag_id: str, waves: int, write: Callable[[int], str],
               echo: Callable[[str], None]) -> None:
    """``waves`` times: ``write(i)`` fills the upstream (it says what it wrote), then one run of ``dag_id``
    is triggered through the REST API and waited for under the scheduler."""
    for i in range(waves):
        wrote = write(i)
        t0 = time.monotonic()
        run_id = stack.airflow.trigger(dag_id)
        stack.airflow.wait_run(dag_id, run_id, timeout=600)
        echo(f"wave {i + 1}: {wrote}; {dag_id} run {run_id} succeeded in {time.monotonic() - t0:.1f}s")


def _rows(conn, blob, shard: str, as_of: int | None = None) -> int:
    """The rows of ``shard`` AS OF ``as_of`` (default its latest time): the sum of the consolidated diffs."""
    from reclock.read import read_as_of

    contents = read_as_of(conn, blob, shard, as_of)
    return int(sum(contents.column("diff").to_pylist())) if contents.num_rows else 0


def _show_sink(stack: Stack, sink, upper: int, echo: Callable[[str], None]) -> None:
    """Wait for the asset-triggered ``sink__`` runs to reach the shard's upper; print the sink's progress."""
    from reclock.sinks.kafka import read_progress

    t0 = time.monotonic()
    progress = None
    while time.monotonic() - t0 < 180:
        progress = read_progress(stack.kafka.admin_config(), sink.progress_topic, sink.name)
        if progress is not None and progress.frontier >= upper:
            break
        time.sleep(1)
    if progress is None or progress.frontier < upper:
        echo(f"sink {sink.name}: not caught up after 180 s (see the sink__{sink.name} runs in the UI)")
        return
    runs = stack.airflow.api("GET", f"dags/sink__{sink.name}/dagRuns").get("total_entries", "?")
    echo(f"sink {sink.name}: {sink.collection} -> topic {sink.kafka.topic} exactly once; progress record "
         f"frontier {progress.frontier} = the shard's upper ({runs} asset-triggered runs of sink__{sink.name})")


def shop_upstream(stack: Stack, publication: str, tables: list[str], prefix: str = "") -> str:
    """The ``demo_shop`` database (created if missing): ``<prefix>orders`` and ``<prefix>items`` with
    ``REPLICA IDENTITY FULL`` and the publication over ``tables`` of them (a prefix gives each of several
    sources on one stack tables of its own). Returns its DSN."""
    import psycopg

    with psycopg.connect(stack.postgres.dsn("postgres"), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DEMO_PG_DB,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DEMO_PG_DB}"')
    dsn = stack.postgres.dsn(DEMO_PG_DB)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {prefix}orders (order_id int8 PRIMARY KEY, customer text NOT NULL, "
                     "status text NOT NULL, amount numeric(10,2) NOT NULL, placed_at timestamptz NOT NULL)")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {prefix}items (item_id int8 PRIMARY KEY, order_id int8 NOT NULL, "
                     "sku text NOT NULL, quantity int4 NOT NULL)")
        for t in ("orders", "items"):
            conn.execute(f"ALTER TABLE {prefix}{t} REPLICA IDENTITY FULL")
        if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is None:
            conn.execute(f'CREATE PUBLICATION "{publication}" FOR TABLE {", ".join(tables)}')
        if stack.secure:  # the source's role: REPLICATION and SELECT on the published tables
            from reclock.dev.stack import CDC_ROLE
            from reclock.grants import cdc_grants

            for sql in cdc_grants(CDC_ROLE, tables, DEMO_PG_DB):
                conn.execute(sql)
    return dsn


def shop_wave(dsn: str, orders: int, seed: int) -> int:
    """``orders`` transactions, each an order with 1-3 items; then one transaction that ships a tenth of the
    open orders and drops an item of each, across both tables. Returns the transactions committed."""
    import psycopg

    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        next_order = conn.execute("SELECT coalesce(max(order_id), 0) + 1 FROM orders").fetchone()[0]
        next_item = conn.execute("SELECT coalesce(max(item_id), 0) + 1 FROM items").fetchone()[0]
        for o in range(next_order, next_order + orders):
            with conn.transaction():
                conn.execute("INSERT INTO orders VALUES (%s, %s, 'open', %s, now())",
                             (o, f"c{rng.randrange(1000):03d}", round(rng.uniform(1, 500), 2)))
                for _ in range(rng.randint(1, 3)):
                    conn.execute("INSERT INTO items VALUES (%s, %s, %s, %s)",
                                 (next_item, o, f"sku-{rng.randrange(200)}", rng.randint(1, 5)))
                    next_item += 1
        with conn.transaction():
            shipped = [r[0] for r in conn.execute(
                "UPDATE orders SET status = 'shipped' WHERE order_id IN (SELECT order_id FROM orders "
                "WHERE status = 'open' ORDER BY order_id LIMIT %s) RETURNING order_id", (max(1, orders // 10),))]
            conn.execute("DELETE FROM items WHERE item_id IN (SELECT min(item_id) FROM items "
                         "WHERE order_id = ANY(%s) GROUP BY order_id)", (shipped,))
    return orders + 1


def _run_postgres_demo(stack: Stack, spec, waves: int, per_wave: int, echo: Callable[[str], None]) -> None:
    """Transactions into ``demo_shop``'s tables, one ``ingest__demo_shop`` run per wave, and what landed:
    each table's collection AS OF the upper beside the table itself, the progress relation, the slot."""
    import psycopg

    from reclock.persist.blob import blob_store_from_url
    from reclock.sources.postgres.upstream import slot_name

    tables = list(spec.upstream.tables) or ["public.orders", "public.items"]
    dsn = shop_upstream(stack, spec.upstream.publication, tables)
    dag_id = f"ingest__{DEMO_PG_SOURCE}"
    stack.airflow.wait_for_dag(dag_id)
    echo(f"\n{DEMO_PG_SOURCE}: a Postgres source over publication {spec.upstream.publication} "
         f"({', '.join(tables)}) in the database {DEMO_PG_DB}")
    seed = int(time.time())
    _run_waves(stack, dag_id, waves,
               lambda i: f"{shop_wave(dsn, per_wave, seed=seed + i)} upstream transactions", echo)
    blob = blob_store_from_url(stack.blob_url, stack.s3.settings() if stack.s3 else None)
    with psycopg.connect(dsn, autocommit=True) as up, connect(stack.postgres.dsn()) as conn:
        progress = conn.execute(f'SELECT ts, lsn::text FROM reclock."{DEMO_PG_SOURCE}_progress" ORDER BY ts'
                                ).fetchall()
        last_lsn = progress[-1][1] if progress else None
        for table in tables:
            shard = f"{DEMO_PG_SOURCE}__{table.split('.')[-1]}"
            upper = conn.execute("SELECT upper FROM reclock.shards WHERE id = %s", (shard,)).fetchone()[0]
            rows = _rows(conn, blob, shard, upper - 1) if upper > 0 else 0
            # the table as of the last binding is what the collection holds; the writers have stopped, so
            # that is the table now unless a transaction came after the binding
            now = up.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            echo(f"  {shard}: {rows} rows AS OF {upper - 1}; {table} holds {now} rows")
        slot = up.execute("SELECT confirmed_flush_lsn::text, pg_size_pretty(pg_wal_lsn_diff("
                          "pg_current_wal_lsn(), restart_lsn)) FROM pg_replication_slots WHERE slot_name = %s",
                          (slot_name(DEMO_PG_SOURCE),)).fetchone()
    echo(f"SELECT * FROM reclock.{DEMO_PG_SOURCE}_progress  -- the bindings (ts, lsn):")
    for ts, lsn in progress[-6:]:
        echo(f"  {ts}  {lsn}")
    if slot is not None:
        echo(f"slot {slot_name(DEMO_PG_SOURCE)}: confirmed at {slot[0]} (the last binding's LSN {last_lsn}); "
             f"it retains {slot[1]} of WAL")


def events_wave(client, bucket: str, prefix: str, objects: int, lines: int, seed: int) -> int:
    """``objects`` objects of ``lines`` JSON lines each under ``prefix``, keyed by time (one gzip'd, one with a
    space and a non-ASCII letter in its key); the records written."""
    import gzip

    rng = random.Random(seed)
    stamp = time.strftime("%Y/%m/%d/%H%M%S", time.gmtime())
    for k in range(objects):
        body = b"".join(json.dumps({"event_id": seed * 1_000_000 + k * lines + i, "user": f"u{rng.randrange(500)}",
                                    "action": rng.choice(["view", "click", "buy"]),
                                    "at": time.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode() + b"\n" for i in range(lines))
        name = f"{prefix}{stamp}-{k:03d}" + (" café" if k == 1 else "")
        if k == 0:
            client.put_object(Bucket=bucket, Key=name + ".json.gz", Body=gzip.compress(body))
        else:
            client.put_object(Bucket=bucket, Key=name + ".json", Body=body)
    return objects * lines


def bucket_records(client, bucket: str, prefix: str) -> tuple[int, int]:
    """Objects and records under ``prefix``, read from S3 itself."""
    import gzip

    objects = records = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", ()):
            data = client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            if o["Key"].endswith(".gz"):
                data = gzip.decompress(data)
            objects += 1
            records += sum(1 for line in data.splitlines() if line.strip())
    return objects, records


def _run_s3_demo(stack: Stack, spec, waves: int, objects: int, echo: Callable[[str], None]) -> None:
    """Objects uploaded to the stack's S3 in waves, one ``ingest__demo_events`` run per wave (the objects are
    found through the bucket's notifications in the SQS queue), and what landed beside the bucket itself."""
    from reclock.persist.blob import blob_store_from_url

    bucket, _, prefix = spec.upstream.url[len("s3://"):].partition("/")
    stack.s3.create_bucket(bucket)
    _, arn = stack.s3.queue(spec.upstream.queue)
    stack.s3.notify(bucket, prefix, arn)
    client = stack.s3.client()
    dag_id = f"ingest__{DEMO_S3_SOURCE}"
    stack.airflow.wait_for_dag(dag_id)
    echo(f"\n{DEMO_S3_SOURCE}: an S3 source over {spec.upstream.url}, its objects named by S3 event notifications in the "
         f"SQS queue {spec.upstream.queue}")
    seed = int(time.time())
    _run_waves(stack, dag_id, waves,
               lambda i: f"uploaded {objects} objects, {events_wave(client, bucket, prefix, objects, 500, seed + i)} "
                         "records", echo)
    blob = blob_store_from_url(stack.blob_url)
    in_bucket, records = bucket_records(client, bucket, prefix)
    with connect(stack.postgres.dsn()) as conn:
        upper = conn.execute("SELECT upper FROM reclock.shards WHERE id = %s", (spec.data_shard,)).fetchone()[0]
        rows = _rows(conn, blob, spec.data_shard, upper - 1) if upper > 0 else 0
        errors = _rows(conn, blob, spec.errors_shard, upper - 1) if upper > 0 else 0
        progress = conn.execute(f'SELECT ts, key, byte_offset FROM reclock."{DEMO_S3_SOURCE}_progress" ORDER BY ts'
                                ).fetchall()
    echo(f"  {spec.data_shard}: {rows} rows AS OF {upper - 1} ({errors} in {spec.errors_shard}); the bucket holds "
         f"{in_bucket} objects, {records} records under {prefix} (read from S3 itself)")
    echo(f"SELECT * FROM reclock.{DEMO_S3_SOURCE}_progress  -- the bindings (ts, key, byte_offset):")
    for ts, key, off in progress[-4:]:
        echo(f"  {ts}  {key}  {off}")
