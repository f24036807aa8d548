"""Cycles on a Spark standalone cluster (two workers, each its own JVMs) through Spark Connect, with the
blob store on a real S3 API endpoint (moto's server): parts written by the executors through S3A, read,
listed and collected by Python through s3fs.

The oracle reads the topic itself (a read_committed consumer) and the bindings: every committed record,
exactly once, at the least binding ts whose frontier covers its offset; an upsert collection AS OF each
binding is the latest value per key the topic held below that binding's frontier. The Kafka sink reads
the upsert collection's parts from S3 and writes each update exactly once.
"""

from __future__ import annotations

import hashlib
import json
import uuid
import zlib

import duckdb
import psutil
from ingest_support import Clock, produce

from reclock import cycle
from reclock.config import KafkaSpec, SinkBudget, SinkSpec, parse_source
from reclock.persist import connect
from reclock.persist.blob import blob_store_from_url
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import batches
from reclock.read import read_as_of, read_updates
from reclock.sinks.encode import encode_updates
from reclock.sinks.kafka import TS_HEADER, SinkContext, consolidate, read_all, run_once
from reclock.tables import duckdb_as_of, spark_as_of

SCHEMA = "id BIGINT, name STRING"


def cluster_ctx(db, kafka, cluster, s3, topic: str, name: str, **extra) -> cycle.CycleContext:
    """A source whose Spark is the cluster's Connect server and whose parts go to ``s3://bucket/<name>-...``."""
    raw = {"kafka": {"topic": topic, "bootstrap": kafka.bootstrap}, "format": {"type": "json", "schema": SCHEMA},
           "include": ["partition", "offset", "key"], **extra}
    return cycle.CycleContext(spec=parse_source(name, raw), dsn=db, upstream=kafka.bootstrap,
                              blob=blob_store_from_url(s3.url(f"{name}-{uuid.uuid4().hex[:8]}"), s3.settings()),
                              spark_factory=lambda: cluster.connect.session(scope=name), clock=Clock(),
                              retain_history_ms=10**12)


def topic_records(kafka, topic: str) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
    """``(partition, offset) -> (key, value)`` of every record a read_committed consumer sees."""
    return {(m.partition(), m.offset()): (m.key(), m.value()) for m in read_all(kafka.bootstrap, topic, "oracle")}


def oracle_ts(rc, partition: int, offset: int) -> int | None:
    """The least binding ts whose frontier is beyond the offset (None: not bound yet)."""
    return min((b.ts for b in rc.bindings if offset < b.frontier.get(partition)), default=None)


def decoded(value: bytes | None) -> dict | None:
    try:
        v = json.loads(value)
    except (TypeError, ValueError):
        return None
    return v if isinstance(v, dict) else None


def test_cluster_listens_on_loopback_only(cluster):
    pids = set()
    for pidfile in cluster.home.glob("*.pid"):
        pids.add(int(pidfile.read_text()))
    pids.add(int(cluster.connect.pidfile.read_text()))
    procs = [psutil.Process(p) for p in pids]
    procs += [c for p in procs for c in p.children(recursive=True)]  # the executors, spawned by the workers
    listening = [(p.pid, c.laddr) for p in procs for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert len(procs) >= 6 and listening  # master, 2 workers, Connect server, 2 executors
    assert all(addr.ip in ("127.0.0.1", "::ffff:127.0.0.1") for _, addr in listening), listening


def test_append_only_cycles_and_rebuild_on_the_cluster_with_parts_on_s3(db, kafka, topic, cluster, s3):
    name = topic(partitions=4)
    ctx = cluster_ctx(db, kafka, cluster, s3, name, "cl_orders", budget={"max_records": 150})
    # wave 1: 400 records over 4 partitions (3 slices); wave 2: a committed and an aborted transaction and a
    # record that does not decode
    produce(kafka, name, [(i % 4, f"k{i}".encode(), json.dumps({"id": i, "name": f"n{i}"}).encode())
                          for i in range(400)])
    assert cycle.run_cycle(ctx)["descriptions"] == 1
    produce(kafka, name, [(i % 4, None, json.dumps({"id": i, "name": "tx"}).encode()) for i in range(500, 560)],
            transactional=f"tx-{name}")
    produce(kafka, name, [(i % 4, None, json.dumps({"id": i}).encode()) for i in range(600, 640)],
            transactional=f"tx-{name}", abort=True)
    produce(kafka, name, [(3, b"bad", b"{not json")])
    cycle.run_cycle(ctx)

    records = topic_records(kafka, name)
    with connect(db) as conn:
        rc = load_remap(conn, ctx.spec.name)
        rows = read_updates(conn, ctx.blob, ctx.spec.data_shard).to_pylist()
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
    want = sorted((v["id"], v.get("name"), p, o, oracle_ts(rc, p, o)) for (p, o), (_, raw) in records.items()
                  if (v := decoded(raw)) is not None)
    assert len(want) == 460 and len(rc.bindings) == 2
    assert sorted((r["id"], r["name"], r["_partition"], r["_offset"], r["ts"]) for r in rows) == want
    assert all(r["diff"] == 1 for r in rows)
    assert [(e["partition"], e["raw"]) for e in errors] == [(3, b"{not json")]

    # the executors of both workers wrote parts of this source (the write jobs' task commits in their logs)
    outputs = cluster.saved_task_outputs()
    ours = {w: [a for a, path in found if f"/{ctx.blob.base.split('/')[-1]}/" in path] for w, found in outputs.items()}
    assert all(ours[w] for w in (0, 1)), {w: len(a) for w, a in ours.items()}
    # every slice's job left Spark's _SUCCESS marker beside its parts
    blobs = [b.path for b in ctx.blob.list(ctx.spec.name)]
    slices = {p.rsplit("/", 1)[0] for p in blobs if p.endswith(".parquet")}
    assert len(slices) >= 4 and all(f"{s}/_SUCCESS" in blobs for s in slices)

    # a rebuild replays the bindings on the cluster: the same updates at the same timestamps
    before = sorted(map(str, rows))
    assert cycle.rebuild(ctx)["upper"] == rc.bindings[-1].ts + 1
    with connect(db) as conn:
        assert sorted(map(str, read_updates(conn, ctx.blob, ctx.spec.data_shard).to_pylist())) == before


def keyed(key: str, value: dict | None) -> tuple[int, bytes, bytes | None]:
    return zlib.crc32(key.encode()) % 3, key.encode(), None if value is None else json.dumps(value).encode()


def test_upsert_cycles_and_the_kafka_sink_read_parts_from_s3(db, kafka, topic, cluster, s3):
    name = topic(partitions=3)
    ctx = cluster_ctx(db, kafka, cluster, s3, name, "cl_upserts", envelope="upsert", include=["key"])
    out = topic(partitions=1)
    sink = SinkContext(spec=SinkSpec(name="cl_out", collection=ctx.spec.data_shard, format="debezium", key=("_key",),
                                     kafka=KafkaSpec(topic=out, bootstrap=kafka.bootstrap),
                                     progress_topic=f"_progress_{out}", budget=SinkBudget(max_messages=40)),
                       dsn=db, kafka=kafka.bootstrap, blob=ctx.blob)
    for wave in range(3):
        produce(kafka, name, [keyed(f"k{(i * 7 + wave) % 15}", {"id": 100 * wave + i, "name": f"w{wave}"})
                              for i in range(60)] + [keyed(f"k{wave}", None)])
        cycle.run_cycle(ctx)
        if wave != 1:
            run_once(sink)  # the sink runs after cycles 1 and 3 (it catches up on two bindings)

    records = topic_records(kafka, name)
    with connect(db) as conn:
        rc = load_remap(conn, ctx.spec.name)
        assert len(rc.bindings) == 3
        for b in rc.bindings:
            latest: dict[bytes, tuple] = {}
            for (p, o), (k, v) in sorted(records.items(), key=lambda r: r[0][1]):
                if o < b.frontier.get(p):
                    latest[k] = (p, v)
            want = sorted((json.loads(v)["id"], json.loads(v)["name"], k) for k, (p, v) in latest.items() if v)
            got = read_as_of(conn, ctx.blob, ctx.spec.data_shard, b.ts).to_pylist()
            assert sorted((r["id"], r["name"], r["_key"]) for r in got) == want, f"AS OF binding {b.ts}"
            assert all(r["diff"] == 1 for r in got)
            # the same AS OF read as a table: Spark (over Connect, on the cluster) and DuckDB read the parts on S3
            df = spark_as_of(cluster.connect.session(scope="cl_upserts"), ctx.spec.data_shard, b.ts, dsn=db,
                             blob=ctx.blob)
            assert sorted((r["id"], r["name"], bytes(r["_key"])) for r in df.collect()) == want, f"Spark {b.ts}"
            rel = duckdb_as_of(duckdb.connect(), ctx.spec.data_shard, b.ts, dsn=db, blob=ctx.blob)
            assert sorted((i, n, bytes(k)) for i, n, k in rel.select("id, name, _key").fetchall()) == want
        updates = read_updates(conn, ctx.blob, ctx.spec.data_shard)
    assert {r["ts"] for r in updates.to_pylist()} == {b.ts for b in rc.bindings}

    # the sink: every update of the collection exactly once, in ts order, stamped with its binding's ts
    messages = [(int(dict(m.headers())[TS_HEADER]), m.key(), m.value()) for m in read_all(kafka.bootstrap, out, "v")]
    assert messages == encode_updates(sink.spec, consolidate(updates))
    assert {ts for ts, _, _ in messages} == {b.ts for b in rc.bindings}
    state: dict = {}
    for _, key, value in messages:
        after = json.loads(value)["after"]
        state.pop(key, None) if after is None else state.__setitem__(key, after)
    assert len(state) == len(want)


def test_s3a_multipart_upload_rename_and_read_back_on_the_cluster(cluster, s3):
    """A file over S3A's multipart size goes up in parts, and the committer's renames copy it through the
    transfer manager (its asynchronous client: netty-nio-client on the wheel's netty); it reads back whole.
    (Last in the module: the first job on a cold cluster pays the executors' start-up.)"""
    import s3fs

    from reclock.persist.objectstore import fsspec_options

    bucket = f"multipart-{uuid.uuid4().hex[:8]}"  # a bucket of its own: a new S3A instance, these settings
    fs = s3fs.S3FileSystem(**fsspec_options(s3.settings()))
    fs.mkdir(bucket)
    spark = cluster.connect.session()
    rows = 120_000
    df = spark.range(0, rows, 1, 1).selectExpr("id", "sha2(CAST(id AS STRING), 256) AS h")  # ~64 bytes a row
    df.write.option("fs.s3a.multipart.size", "5M").option("fs.s3a.multipart.threshold", "5M") \
        .parquet(f"s3a://{bucket}/big")
    files = {p.rsplit("/", 1)[-1]: info["size"] for p, info in fs.find(f"{bucket}/big", detail=True).items()}
    assert files.pop("_SUCCESS") == 0 and len(files) == 1 and min(files.values()) > 5 << 20
    requests = s3.log.read_text()
    assert f"POST /{bucket}/big/_temporary/" in requests and "uploadId=" in requests  # multipart upload
    back = spark.read.parquet(f"s3a://{bucket}/big").selectExpr("count(*)", "sum(id)", "max(h)").first()
    assert tuple(back) == (rows, rows * (rows - 1) // 2, max(hashlib.sha256(str(i).encode()).hexdigest()
                                                             for i in range(rows)))


def test_a_postgres_snapshot_read_by_the_cluster_into_s3_equals_the_table(db, postgres, cluster, s3, monkeypatch):
    """A Postgres source's snapshot on Spark: JDBC sessions on both workers' executors join the exported
    snapshot, in page ranges; parts on S3; then the stream goes on from it."""
    from pg_support import upstream_database, writer

    from reclock.sources.postgres import spark_snapshot as spark_snapshot

    monkeypatch.setattr(spark_snapshot, "SPLIT_BYTES", 256 << 10)
    name = f"cl_pg{uuid.uuid4().hex[:6]}"
    with upstream_database(postgres) as up:
        with writer(up) as conn:
            conn.execute("CREATE TABLE big (id int8 PRIMARY KEY, v text, n numeric(12,2), at timestamptz, ch char(4))")
            conn.execute("ALTER TABLE big REPLICA IDENTITY FULL")
            conn.execute("CREATE PUBLICATION pub FOR TABLE big")
            conn.execute("INSERT INTO big SELECT g, md5(g::text), g / 7.0, now() - g * interval '1 s', "
                         "CASE WHEN g % 3 = 0 THEN NULL ELSE 'ab' END FROM generate_series(1, 20000) g")
        raw = {"postgres": {"dsn_env": "UNUSED", "publication": "pub", "spark_snapshot_min_bytes": 0},
               "tables": ["big"]}
        ctx = cycle.CycleContext(spec=parse_source(name, raw), dsn=db,
                                 blob=blob_store_from_url(s3.url(f"{name}-parts"), s3.settings()),
                                 spark_factory=lambda: cluster.connect.session(scope=name), clock=Clock(),
                                 upstream=up, retain_history_ms=10**12)
        cycle.run_cycle(ctx)
        with writer(up) as conn:
            conn.execute("UPDATE big SET v = 'changed' WHERE id % 1000 = 0")
            conn.execute("DELETE FROM big WHERE id > 19990")
        cycle.run_cycle(ctx)
        with writer(up) as conn:
            want = {r[0]: r for r in conn.execute("SELECT id, v, n, at, ch FROM big").fetchall()}
        with connect(db) as conn:
            stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = %s AND step = 'write_batches' "
                                 "AND metrics ? 'snapshot_rows'", (name,)).fetchone()[0]
            got = read_as_of(conn, ctx.blob, f"{name}__big").to_pylist()
            parts = [b.path for b in batches(conn, f"{name}__big") if b.rows]
    assert stats["snapshot_on_spark"] == [f"{name}__big"] and stats["snapshot_rows"] == 20000
    assert sum("/snapshot/" in p for p in parts) > 2, "several page ranges, each its own part"
    assert all(r["diff"] == 1 for r in got) and len(got) == len(want) == 19990
    assert {r["id"]: (r["id"], r["v"], r["n"], r["at"], r["ch"]) for r in got} == want



def test_parts_written_in_place_on_s3_read_back_bit_for_bit(db, kafka, topic, cluster, s3):
    """The cluster's parts go to S3 through Reclock's direct committer (jvm/committer): each file PUT once at
    its final name, no ``_temporary/`` copies; what the collection reads back from them is every value of
    the topic bit for bit (-0.0, NaN, infinities, subnormals, Unicode), and every part recorded in
    Postgres is the object on S3, byte count for byte count."""
    import math
    import struct

    name = topic(partitions=2)
    doubles = ["-0.0", "0.0", "NaN", "Infinity", "-Infinity", "5e-324", "1.7976931348623157e308",
               "0.30000000000000004", "-2.2250738585072014e-308"]
    texts = ["", "ü", "日本語 \u2028", "a\\u0000b", "emoji \U0001F600"]
    values = [(i, doubles[i % len(doubles)], texts[i % len(texts)]) for i in range(300)]
    produce(kafka, name, [(i % 2, None, ('{"id": %d, "x": %s, "name": %s}' % (i, d, json.dumps(t))).encode())
                          for i, d, t in values])
    raw = {"kafka": {"topic": name, "bootstrap": kafka.bootstrap},
           "format": {"type": "json", "schema": "id BIGINT, x DOUBLE, name STRING"}}
    ctx = cycle.CycleContext(spec=parse_source("cl_bits", raw), dsn=db, upstream=kafka.bootstrap,
                             blob=blob_store_from_url(s3.url(f"cl_bits-{uuid.uuid4().hex[:8]}"), s3.settings()),
                             spark_factory=lambda: cluster.connect.session(scope="cl_bits"), clock=Clock())
    session = cluster.connect.session(scope="cl_bits")
    assert session.conf.get("spark.reclock.parts.committer") == "direct"
    cycle.run_cycle(ctx)

    with connect(db) as conn:
        rows = read_updates(conn, ctx.blob, ctx.spec.data_shard).to_pylist()
        recorded = {b.path: b.bytes for b in batches(conn, ctx.spec.data_shard)}
    bits = lambda x: struct.pack(">d", x)  # noqa: E731 - NaN != NaN; its bits are equal
    want = sorted((i, bits(float(d.replace("Infinity", "inf"))), json.loads(json.dumps(t))) for i, d, t in values)
    got = sorted((r["id"], bits(r["x"]), r["name"]) for r in rows)
    assert got == want and any(math.copysign(1, r["x"]) < 0 and r["x"] == 0 for r in rows)
    blobs = {b.path: b.size for b in ctx.blob.list(ctx.spec.name)}
    assert recorded and all(blobs.get(p) == n for p, n in recorded.items()), (recorded, blobs)
    assert not [p for p in blobs if "_temporary" in p]  # written in place: nothing staged, nothing left over
    ours = [a for found in cluster.saved_task_outputs().values() for a, path in found
            if f"/{ctx.blob.base.split('/')[-1]}/" in path]
    assert ours  # the executors' logs name the direct committer's task outputs


def test_a_task_attempt_that_fails_part_way_leaves_no_counted_part_on_s3(cluster, s3, tmp_path):
    """A task attempt failing part-way through its file: Spark's abort closes its writer, so the Parquet file
    of the rows it wrote so far is completed on S3. Through the direct committer that file bears the
    attempt's own name, and the attempt's abort deletes it before the retry runs; the retry writes the
    partition whole under its name. The folder then holds exactly the rows the job reported, each once: the
    accounted write (``reclock.persist.staged.collect_parts``) takes it. (Under Spark's shared file names a
    killed speculative twin could have replaced the committed file after the job ended.)"""
    import pyarrow.parquet as pq
    from pyspark.sql.functions import col, count, udf

    from reclock.spark.jobs import observation, observed, parts_writer

    blob = blob_store_from_url(s3.url(f"retry-{uuid.uuid4().hex[:8]}"), s3.settings())
    url = blob.url("slice-0000")
    failed = tmp_path / "failed"  # the executors run on this host: the first attempt leaves this mark

    @udf("bigint")
    def fail_first_attempt(i):
        from pyspark import TaskContext

        task = TaskContext.get()
        if task.partitionId() == 0 and task.attemptNumber() == 0 and i == 3000:
            open(failed, "w").close()
            raise RuntimeError("the first attempt fails after writing 3000 rows")
        return i

    spark = cluster.connect.session(scope="retry")
    assert spark.conf.get("spark.reclock.parts.committer") == "direct"
    obs = observation(spark)
    df = spark.range(0, 8000, 1, 2).select(fail_first_attempt(col("id")).alias("id"))
    df = df.observe(obs, count("*").alias("rows"))
    parts_writer(df, url).parquet(url)
    assert failed.exists()  # the first attempt did fail
    logs = "".join(p.read_text(errors="replace") for i in range(cluster.workers)
                   for p in cluster.worker_dir(i).glob("*/*/stderr"))
    assert "deleted 1 file(s) it wrote under " + url in logs  # its abort found the partial file and deleted it
    files = [b for b in blob.list("slice-0000") if b.path.endswith(".parquet")]
    assert len(files) == 2 and all(b.path.rsplit("/", 1)[-1].startswith("part-a") for b in files), files
    ids = []
    for b in files:
        with blob.open(b.path) as f:
            ids += pq.read_table(f)["id"].to_pylist()
    assert observed(obs, "retry", url, ["rows"]) == {"rows": 8000}
    assert sorted(ids) == list(range(8000))
