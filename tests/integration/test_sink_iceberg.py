"""The exactly-once Iceberg export (issue 18, part 3) against a real SQL catalog in Postgres and real files
(a local warehouse, and one on an S3 API): the table, read by pyiceberg and by Spark, equals the collection
AS OF the sink's frontier for an append-only and an upsert collection; no data file is added twice; sink
processes SIGKILLed at random moments and just before and after the commit; two instances racing; the
read hold; refusals."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from confluent_kafka import Producer
from ingest_support import make_ctx

from reclock import cycle
from reclock.batch import BatchDescription, Part
from reclock.config import IcebergBudget, IcebergSinkSpec, parse_config
from reclock.errors import SinkRefused
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.parquet import dictionary_columns
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import (Append, advance_since, compare_and_append, read_holds, register_shard,
                                    shard_info)
from reclock.read import read_as_of
from reclock.sinks.iceberg import (DIFF_COLUMN, FRONTIER, SINK, TS_COLUMN, CatalogSettings, IcebergSink,
                                   IcebergSinkContext, RetractionInAppendTable, catalog_uri, drop, load_catalog,
                                   read_frontier, run_once)

KEYS = 12


class Source:
    """A Kafka source over a 3-partition topic whose cycles run in this process (Spark in-process):
    ``upsert`` (keyed updates and deletes) or append-only with repeated records (multiplicities above 1)."""

    def __init__(self, db, kafka, topic, spark, tmp_path, name: str, upsert: bool, retain_ms: int = 10**12) -> None:
        self.topic = topic(partitions=3)
        self.kafka = kafka
        self.upsert = upsert
        self.producer = Producer({"bootstrap.servers": kafka.bootstrap})
        self.n = 0
        self.now = [1_800_000_000_000]
        extra = {"envelope": "upsert", "include": ["key"]} if upsert else {"include": []}
        ctx = make_ctx(db, kafka, spark, tmp_path, self.topic, name=name, budget={"max_records": 10_000}, **extra)
        self.ctx = replace(ctx, clock=self.tick, retain_history_ms=retain_ms)

    def tick(self) -> int:
        self.now[0] += 1000
        return self.now[0]

    def cycles(self, count: int, per: int = 40) -> None:
        for _ in range(count):
            for _ in range(per):
                i, self.n = self.n, self.n + 1
                key = f"k{(i * 7) % KEYS}".encode()
                if self.upsert:
                    value = None if i % 11 == 5 else json.dumps({"id": i, "name": f"v{i}"}).encode()
                else:  # repeated records: the collection holds rows of multiplicity above 1
                    value = json.dumps({"id": i % 9, "name": "same"}).encode()
                self.producer.produce(self.topic, key=key, value=value, partition=zlib.crc32(key) % 3)
            assert self.producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
            cycle.run_cycle(self.ctx)

    def raw_config(self) -> dict:
        src = {"kafka": {"topic": self.topic, "bootstrap": self.kafka.bootstrap},
               "format": {"type": "json", "schema": "id BIGINT, name STRING"}}
        src.update({"envelope": "upsert", "include": ["key"]} if self.upsert else {"include": []})
        return {"sources": {self.ctx.spec.name: src}}


def sink_config(tmp_path: Path, source: Source, name: str, **sink) -> Path:
    raw = source.raw_config()
    raw["sinks"] = {name: {"from": source.ctx.spec.name, "iceberg": {"table": f"lake.{name}"},
                           "budget": {"max_rows": 30}, **sink}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def spec_of(config: Path, name: str) -> IcebergSinkSpec:
    return parse_config(yaml.safe_load(config.read_text())).sinks[name]


def default_catalog(dsn: str, blob: LocalBlobStore) -> CatalogSettings:
    """What the settings give without RECLOCK_ICEBERG_*: the consensus database, ``<blob>/_iceberg``."""
    return CatalogSettings(uri=catalog_uri(dsn), warehouse=str(blob.root) + "/_iceberg")


def sink_ctx(source: Source, config: Path, name: str) -> IcebergSinkContext:
    return IcebergSinkContext(spec=spec_of(config, name), dsn=source.ctx.dsn, blob=source.ctx.blob,
                              catalog=default_catalog(source.ctx.dsn, source.ctx.blob))


def load_table(ctx: IcebergSinkContext):
    return load_catalog(ctx.catalog, ctx.spec.catalog).load_table(ctx.spec.table)


# -- checks ----------------------------------------------------------------------------------------------


def expected_bag(ctx: IcebergSinkContext, t: int) -> tuple[collections.Counter, list[str]]:
    """``read_as_of(t)`` as a bag of rows (each row ``diff`` times)."""
    with connect(ctx.dsn) as conn:
        table = read_as_of(conn, ctx.blob, ctx.spec.collection, t)
    cols = [c for c in table.column_names if c != "diff"]
    bag: collections.Counter = collections.Counter()
    for r in table.to_pylist():
        bag[tuple(r[c] for c in cols)] += r["diff"]
    return bag, cols


def bag_of(rows: list[dict], cols: list[str], layout: str, as_of: int) -> collections.Counter:
    """The collection AS OF ``as_of`` that the table's rows say (a changelog summed by row)."""
    bag: collections.Counter = collections.Counter()
    for r in rows:
        if r[TS_COLUMN] <= as_of:
            bag[tuple(r[c] for c in cols)] += r[DIFF_COLUMN] if layout == "changelog" else 1
    return +bag  # drops rows that sum to zero


def spark_rows(spark, table) -> list[dict]:
    """The table read by Spark: the data files pyiceberg's scan plans, read with ``spark.read.parquet``."""
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert not any(task.delete_files for task in table.scan().plan_files())
    if not files:
        return []
    return [r.asDict() for r in spark.read.parquet(*files).collect()]


def added_files(table) -> list[str]:
    """Every data file each snapshot added, over the whole lineage (a file added twice shows twice)."""
    from pyiceberg.manifest import ManifestEntryStatus

    out = []
    for snap in table.snapshots():
        for manifest in snap.manifests(table.io):
            for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id:
                    out.append(e.data_file.file_path)
    return out


def check_table(ctx: IcebergSinkContext, spark=None) -> int:
    """The table equals the collection AS OF the sink's frontier (by pyiceberg, and by Spark if given), it
    reaches the shard's upper, no data file was added twice, and the frontiers along the lineage grow."""
    table = load_table(ctx)
    found = read_frontier(table, ctx.spec.name)
    with connect(ctx.dsn) as conn:
        info = shard_info(conn, ctx.spec.collection)
    assert found.frontier == info.upper, "the sink exported every complete timestamp"
    want, cols = expected_bag(ctx, found.frontier - 1)
    assert want, "the collection is not empty"
    rows = table.scan().to_arrow().to_pylist()
    assert bag_of(rows, cols, ctx.spec.layout, found.frontier - 1) == want, "pyiceberg reads the collection"
    if spark is not None:
        assert bag_of(spark_rows(spark, table), cols, ctx.spec.layout, found.frontier - 1) == want, "Spark too"
    files = added_files(table)
    assert len(files) == len(set(files)), "no data file added twice"
    frontiers = [int(s.summary[FRONTIER]) for s in table.snapshots() if s.summary.get(SINK) == ctx.spec.name]
    assert frontiers == sorted(frontiers) and len(set(frontiers)) == len(frontiers)
    if ctx.spec.layout == "changelog":  # consolidated: no (row, ts) twice, no zero diff
        keys = [(tuple(r[c] for c in cols), r[TS_COLUMN]) for r in rows if r[TS_COLUMN] > info.since]
        assert len(keys) == len(set(keys)) and all(r[DIFF_COLUMN] != 0 for r in rows)
    return len(rows)


# -- tests -----------------------------------------------------------------------------------------------


def copied_files(table) -> list[str]:
    """The table's data files that are copies of Spark-written parts (their footer still names parquet-mr as
    the writer; the files the sink writes itself are written by Arrow)."""
    files = [task.file.file_path for task in table.scan().plan_files()]
    return [f for f in files if pq.read_metadata(f.removeprefix("file://")).created_by.startswith("parquet-mr")]


@pytest.mark.parametrize("upsert,copies", [(False, False), (False, True), (True, False)],
                         ids=["append_only", "append_only_copies", "upsert"])
def test_table_equals_the_collection_as_of_the_frontier_after_cycles_and_exports(db, kafka, topic, spark,
                                                                                 tmp_path, upsert, copies):
    name = "ups" if upsert else "apc" if copies else "app"
    source = Source(db, kafka, topic, spark, tmp_path, name, upsert, retain_ms=3000)
    source.cycles(2)
    extra = {"copy_min_bytes": 0} if copies else {}  # every part whose rows are the table's is copied
    config = sink_config(tmp_path, source, f"{name}_lake", budget={"max_rows": 10}, **extra)
    ctx = sink_ctx(source, config, f"{name}_lake")
    assert ctx.spec.layout == ("changelog" if upsert else "append")
    assert run_once(ctx).commits >= 1  # a new sink: the snapshot AS OF since first, then what follows it
    check_table(ctx, spark)
    for _ in range(3):
        source.cycles(2)
        r = run_once(ctx)
        if copies:  # a copied part is never split by the budget: both cycles' parts in one commit
            assert r.commits == 1
        else:
            assert r.commits == 2, "two cycles, each over the budget (10 rows): one commit per cycle"
        with connect(db) as conn:
            assert {h.holder: h.ts for h in read_holds(conn, name)}["sink:" + ctx.spec.name] == r.frontier - 1
        check_table(ctx, spark)
    idle = run_once(ctx)
    assert (idle.commits, idle.rows) == (0, 0), "nothing new: no commit"
    table = load_table(ctx)
    assert bool(copied_files(table)) == copies
    assert [f.name for f in table.schema().fields][-2 if upsert else -1:] == \
        ([TS_COLUMN, DIFF_COLUMN] if upsert else [TS_COLUMN])
    assert table.metadata.properties["commit.retry.num-retries"] == "0"


def sink_process(source: Source, config: Path, name: str, *args: str, failpoints: str = "") -> subprocess.Popen:
    """``reclock sink run NAME ...`` in a process of its own, on the default catalog settings (the
    consensus database, the warehouse under the blob store); output to ``p.log``."""
    env = {**os.environ, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": source.ctx.dsn,
           "RECLOCK_BLOB_URL": str(source.ctx.blob.root), "RECLOCK_FAILPOINTS": failpoints}
    env.pop("RECLOCK_ICEBERG_CATALOG_URI", None)
    env.pop("RECLOCK_ICEBERG_WAREHOUSE", None)
    log = config.parent / f"{name}-{time.monotonic_ns()}.log"
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "reclock.cli", "sink", "run", name, *args], env=env,
                             stdout=f, stderr=subprocess.STDOUT, text=True)
    p.log = log
    return p


def output(p: subprocess.Popen) -> str:
    return p.log.read_text()


@pytest.mark.parametrize("rounds", [pytest.param(6, id="short"),
                                    pytest.param(10, id="long", marks=pytest.mark.deployment)])
@pytest.mark.parametrize("upsert,copies", [(False, False), (False, True), (True, False)],
                         ids=["append_only", "append_only_copies", "upsert"])
def test_sigkill_at_random_moments_and_around_the_commit_is_exactly_once(db, kafka, topic, spark, tmp_path, upsert,
                                                                         copies, rounds):
    """``rounds`` sink processes: every third ends at a fail point (before, then after the Iceberg commit),
    the others are SIGKILLed at a random moment; the suite runs 6 (both fail points, 4 kills), ``--deployment``
    10."""
    name = "kup" if upsert else "kac" if copies else "kap"
    source = Source(db, kafka, topic, spark, tmp_path, name, upsert)
    source.cycles(6)
    extra = {"copy_min_bytes": 0} if copies else {}
    config = sink_config(tmp_path, source, "out", budget={"max_rows": 25}, **extra)
    ctx = sink_ctx(source, config, "out")
    rng = random.Random(11)
    points = ["iceberg:before_commit=exit", "iceberg:after_commit=exit"]
    crashed = killed = 0
    for i in range(rounds):
        if i % 3 == 0:
            source.cycles(1)
            p = sink_process(source, config, "out", "--follow", "0.1", failpoints=points[(i // 3) % 2])
            assert p.wait(120) == 86, output(p)
            crashed += 1
        else:
            p = sink_process(source, config, "out", "--follow", "0.1")
            time.sleep(rng.uniform(0.5, 4.0))
            p.send_signal(signal.SIGKILL)
            p.wait(30)
            killed += 1
        if i % 4 == 1:
            source.cycles(2)  # the collection grows while the sink is down
    final = sink_process(source, config, "out")
    assert final.wait(180) == 0, output(final)
    assert (crashed, killed) == ((rounds + 2) // 3, rounds - (rounds + 2) // 3)
    check_table(ctx, spark)
    table = load_table(ctx)
    assert len([s for s in table.snapshots() if s.summary.get(SINK) == "out"]) >= 2
    assert bool(copied_files(table)) == copies


def hand_made(db: str, tmp_path: Path, shard: str, waves: list[list[tuple[int, int, int]]]) -> LocalBlobStore:
    """A shard whose appends are ``waves`` of ``(id, ts, diff)`` updates, appended with descriptions
    ``[previous upper, max ts + 1)``; a wave is one part, or a list of parts (lists of updates) appended
    together. No Kafka, no Spark."""
    blob = LocalBlobStore(tmp_path / "blobs")
    (blob.root / shard).mkdir(parents=True, exist_ok=True)
    with connect(db) as conn:
        register_shard(conn, shard)
        lower = 0
        for n, wave in enumerate(waves):
            parts_updates = wave if isinstance(wave[0], list) else [wave]
            parts = []
            for k, ups in enumerate(parts_updates):
                path = f"{shard}/p{n}_{k}.parquet"
                pq.write_table(pa.table({"id": pa.array([u[0] for u in ups], pa.int64()),
                                         "ts": pa.array([u[1] for u in ups], pa.int64()),
                                         "diff": pa.array([u[2] for u in ups], pa.int64())}), blob.url(path))
                parts.append(Part(path, len(ups), (blob.root / path).stat().st_size, min(u[1] for u in ups),
                                  max(u[1] for u in ups)))
            upper = max(p.max_ts for p in parts) + 1
            compare_and_append(conn, [Append(shard, BatchDescription(lower, upper), tuple(parts))])
            lower = upper
    return blob


def copied_parts(table, blob: LocalBlobStore, shard: str) -> set[str]:
    """The parts of ``shard`` that some data file of ``table`` is a copy of (it begins with the part's bytes
    up to the part's footer)."""
    from reclock.parquet_footer import read_footer

    out = set()
    files = []
    for task in table.scan().plan_files():
        with table.io.new_input(task.file.file_path).open() as f:
            files.append(f.read())
    for part in (blob.root / shard).glob("*.parquet"):
        raw = part.read_bytes()
        start = read_footer(raw, len(raw)).start
        if any(f[:start] == raw[:start] for f in files):
            out.add(part.name)
    return out


def test_parts_whose_rows_are_the_tables_are_copied_and_no_commit_cuts_one(db, tmp_path):
    """With ``copy_min_bytes: 0``, a part whose footer proves its rows are exactly the table's (ts in range,
    every diff 1) is copied; one with a diff of 2 is written anew (its row twice); a commit never ends
    inside a copied part's ts range, though the budget would end it there."""
    blob = hand_made(db, tmp_path, "cp", [
        [(i, 5, 1) for i in range(20)],
        [[(100 + i, 7 + i % 3, 1) for i in range(30)],  # a part over ts 7..9: copied whole
         [(200 + i, 7, 2) for i in range(6)], [(300 + i, 8, 2) for i in range(6)],  # rewritten, 12 rows a ts
         [(400 + i, 9, 2) for i in range(6)]],
        [(700 + i, 12, 2) for i in range(3)],  # rewritten: where the budget may end the commit before
        [[(500 + i, 14, 1) for i in range(8)], [(600 + i, 14, 1) for i in range(8)]],
    ])
    spec = IcebergSinkSpec(name="cp", collection="cp", table="lake.cp", budget=IcebergBudget(max_rows=10),
                           copy_min_bytes=0)
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=default_catalog(db, blob))
    run_once(ctx)
    check_table(ctx)
    table = load_table(ctx)
    assert copied_parts(table, blob, "cp") == {"p0_0.parquet", "p1_0.parquet", "p3_0.parquet", "p3_1.parquet"}
    frontiers = {int(snap.summary[FRONTIER]) for snap in table.snapshots() if snap.summary.get(SINK) == "cp"}
    assert frontiers == {12, 15}, ("the budget (10 rows) would end a commit at 8 and 9, inside the copied part's "
                                   f"range 7..9, and ends one at 12 where it cuts none: {sorted(frontiers)}")
    rows = table.scan().to_arrow()
    assert rows.num_rows == 20 + 30 + 36 + 6 + 16 and rows["id"].to_pylist().count(200) == 2


def test_two_instances_race_the_loser_rereads_the_frontier_and_nothing_is_written_twice(db, tmp_path):
    blob = hand_made(db, tmp_path, "race", [[(i, 5, 1) for i in range(10)]])
    spec = IcebergSinkSpec(name="racer", collection="race", table="lake.race")
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=default_catalog(db, blob))
    a, b = IcebergSink(ctx), IcebergSink(ctx)
    a.start()
    a.step()
    b.start()  # both now at frontier 6, on the same snapshot
    with connect(db) as conn:  # more data: both will try to commit ts 7..8 on that snapshot
        part_path = "race/p_more.parquet"
        pq.write_table(pa.table({"id": pa.array([20, 21], pa.int64()), "ts": pa.array([7, 8], pa.int64()),
                                 "diff": pa.array([1, 1], pa.int64())}), blob.url(part_path))
        compare_and_append(conn, [Append("race", BatchDescription(6, 9), (
            Part(part_path, 2, (blob.root / part_path).stat().st_size, 7, 8),))])
    ra = a.step()
    assert (ra.frontier, ra.rows) == (9, 2)
    rb = b.step()  # its commit fails on the stale snapshot; it re-reads frontier 9 and has nothing left
    assert (rb.frontier, rb.rows, rb.commits) == (9, 0, 0)
    table = load_table(ctx)
    ids = sorted(table.scan().to_arrow()["id"].to_pylist())
    assert ids == list(range(10)) + [20, 21]
    files = added_files(table)
    assert len(files) == len(set(files))


def test_a_stale_commit_fails_instead_of_being_reapplied(db, tmp_path):
    """What the sink relies on: with ``commit.retry.num-retries`` 0 (set by the sink), pyiceberg refuses an
    append on a snapshot that is no longer current; with its default (4) it would re-apply it on top."""
    from pyiceberg.exceptions import CommitFailedException

    blob = LocalBlobStore(tmp_path / "blobs")
    catalog = load_catalog(default_catalog(db, blob), "reclock")
    catalog.create_namespace_if_not_exists("lake")
    data = pa.table({"id": pa.array([1], pa.int64())})
    for retries, duplicates in (("0", False), ("4", True)):
        t = catalog.create_table(f"lake.stale_{retries}", schema=data.schema,
                                 properties={"commit.retry.num-retries": retries, "commit.retry.min-wait-ms": "1"})
        stale = catalog.load_table(f"lake.stale_{retries}")
        t.append(data)
        if duplicates:
            stale.append(data)  # re-applied on the new snapshot: the row twice
            assert catalog.load_table(f"lake.stale_{retries}").scan().to_arrow().num_rows == 2
        else:
            with pytest.raises(CommitFailedException):
                stale.append(data)
            assert catalog.load_table(f"lake.stale_{retries}").scan().to_arrow().num_rows == 1


def test_a_new_sink_starts_with_the_snapshot_as_of_since_and_keeps_a_ts_whole(db, tmp_path):
    # updates at ts 1..3 (compaction may have left them below since 3), then ts 5 (in two parts), then 7
    blob = hand_made(db, tmp_path, "snap", [[(1, 1, 1), (2, 2, 1), (3, 3, 1), (1, 3, 1)],
                                             [[(10, 5, 1), (11, 5, 1)], [(12, 5, 1)]], [(13, 7, 1)]])
    with connect(db) as conn:
        assert advance_since(conn, "snap", 3) == 3
    spec = IcebergSinkSpec(name="late", collection="snap", table="lake.snap", budget=IcebergBudget(max_rows=1))
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=default_catalog(db, blob))
    r = run_once(ctx)
    assert r.frontier == 8
    table = load_table(ctx)
    rows = sorted((x["id"], x[TS_COLUMN]) for x in table.scan().to_arrow().to_pylist())
    assert rows == [(1, 3), (1, 3), (2, 3), (3, 3), (10, 5), (11, 5), (12, 5), (13, 7)]
    frontiers = [int(s.summary[FRONTIER]) for s in table.snapshots()]
    # one commit per ts at a budget of one row: the snapshot (ts <= 3) whole, ts 5 whole (two parts), ts 7
    assert frontiers == [5, 7, 8]
    check_table(ctx)
    with connect(db) as conn:  # times pass without updates: the frontier moves in a commit without files
        compare_and_append(conn, [Append("snap", BatchDescription(8, 10), ())])
    assert (run_once(ctx).frontier, run_once(ctx).commits) == (10, 0)
    table = load_table(ctx)
    assert [int(s.summary[FRONTIER]) for s in table.snapshots()] == [5, 7, 8, 10]
    assert table.current_snapshot().summary.get("added-data-files") is None
    check_table(ctx)


def test_columns_read_as_dictionaries_are_written_as_the_tables_types(db, spark, tmp_path):
    """A part whose string column is a small dictionary's indices is exported from dictionary arrays (not
    decoded): beside parts that keep the column plain (in the same and in other timestamps) and a part
    that lacks it, over several commits, the table read by pyiceberg and by Spark still equals the
    collection, with the table's string type in every file."""
    blob = LocalBlobStore(tmp_path / "blobs")
    (blob.root / "dict").mkdir(parents=True)
    n = 3000

    def part(name: str, ts0: int, tags: list | None) -> Part:
        cols = {"id": pa.array([f"{name}-{i}" for i in range(n)])}
        if tags is not None:
            cols["tag"] = pa.array(tags, pa.string())
        ts = [ts0 + i // 1000 for i in range(n)]
        pq.write_table(pa.table({**cols, "ts": pa.array(ts, pa.int64()), "diff": pa.array([1] * n, pa.int64())}),
                       blob.url(f"dict/{name}.parquet"), row_group_size=1000)
        return Part(f"dict/{name}.parquet", n, (blob.root / f"dict/{name}.parquet").stat().st_size, ts[0], ts[-1])

    repeated = ["x" * 200 if i % 7 else None for i in range(n)]
    with connect(db) as conn:
        register_shard(conn, "dict")
        compare_and_append(conn, [Append("dict", BatchDescription(0, 5), (
            part("small", 1, repeated), part("unique", 2, [f"t{i}" for i in range(n)]), part("bare", 1, None)))])
        compare_and_append(conn, [Append("dict", BatchDescription(5, 9), (part("later", 5, repeated),))])
    md = pq.read_metadata(blob.url("dict/small.parquet"))
    assert dictionary_columns(md, range(md.num_row_groups)) == {"tag"}  # not the unique ids
    spec = IcebergSinkSpec(name="dict_lake", collection="dict", table="lake.dict",
                           budget=IcebergBudget(max_rows=2500))
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=default_catalog(db, blob))
    r = run_once(ctx)
    assert (r.frontier, r.rows) == (9, 4 * n) and r.commits > 1
    table = load_table(ctx)
    for task in table.scan().plan_files():
        assert pq.read_schema(task.file.file_path.removeprefix("file://")).field("tag").type == pa.string()
    assert check_table(ctx, spark) == 4 * n


def test_a_partitioned_table_made_beforehand_is_written_through_pyiceberg(db, tmp_path):
    """An empty table someone created partitioned (the sink creates unpartitioned ones) gets its files from
    pyiceberg's own writer, split by partition, and still equals the collection."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import LongType, NestedField

    blob = hand_made(db, tmp_path, "parted", [[(i, 1 + i % 3, 1) for i in range(30)], [(30, 4, 1), (31, 5, 1)]])
    spec = IcebergSinkSpec(name="parted_lake", collection="parted", table="lake.parted")
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=default_catalog(db, blob))
    catalog = load_catalog(ctx.catalog, spec.catalog)
    catalog.create_namespace_if_not_exists("lake")
    catalog.create_table("lake.parted", schema=Schema(
        NestedField(1, "id", LongType(), required=False), NestedField(2, TS_COLUMN, LongType(), required=True)),
        partition_spec=PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "ts")))
    r = run_once(ctx)
    assert (r.frontier, r.rows) == (6, 32)
    table = load_table(ctx)
    assert sorted(task.file.partition[0] for task in table.scan().plan_files()) == [1, 2, 3, 4, 5]
    assert check_table(ctx) == 32


def test_retraction_in_an_append_layout_fails_and_commits_nothing(db, tmp_path):
    blob = hand_made(db, tmp_path, "retr", [[(1, 1, 1)], [(1, 2, -1)]])
    spec = IcebergSinkSpec(name="retr_lake", collection="retr", table="lake.retr", budget=IcebergBudget(max_rows=1))
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=default_catalog(db, blob))
    with pytest.raises(RetractionInAppendTable, match="retracts a row at ts 2"):
        run_once(ctx)
    table = load_table(ctx)
    assert [int(s.summary[FRONTIER]) for s in table.snapshots()] == [2], "ts 1 committed, ts 2 not"


def test_refuses_foreign_data_unless_fresh_and_fresh_replaces_it(db, tmp_path):
    blob = hand_made(db, tmp_path, "guard", [[(1, 1, 1), (2, 1, 1)]])
    spec = IcebergSinkSpec(name="guard_lake", collection="guard", table="lake.guard")
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=default_catalog(db, blob))
    catalog = load_catalog(ctx.catalog, "reclock")
    catalog.create_namespace_if_not_exists("lake")
    foreign = pa.table({"id": pa.array([99], pa.int64()), TS_COLUMN: pa.array([0], pa.int64())})
    catalog.create_table("lake.guard", schema=foreign.schema).append(foreign)
    with pytest.raises(SinkRefused, match="already holds data"):
        run_once(ctx)
    assert run_once(ctx, fresh=True).rows == 2
    assert sorted(load_table(ctx).scan().to_arrow()["id"].to_pylist()) == [1, 2]
    other = IcebergSinkContext(spec=replace(spec, name="other"), dsn=db, blob=blob, catalog=ctx.catalog)
    with pytest.raises(SinkRefused, match="written by sink guard_lake"):
        run_once(other)
    # the same sink pointed at another collection whose upper is behind the table's frontier (2)
    hand_made(db, tmp_path, "behind", [[(1, 0, 1)]])
    moved = IcebergSinkContext(spec=replace(spec, collection="behind"), dsn=db, blob=blob, catalog=ctx.catalog)
    with pytest.raises(SinkRefused, match="frontier 2, beyond behind's upper 1"):
        run_once(moved)


def test_read_hold_stops_compaction_and_drop_releases_it(db, kafka, topic, spark, tmp_path):
    source = Source(db, kafka, topic, spark, tmp_path, "held", upsert=True, retain_ms=0)
    source.cycles(3)
    config = sink_config(tmp_path, source, "holder")
    ctx = sink_ctx(source, config, "holder")
    result = run_once(ctx)
    source.cycles(3)  # the sink does not run: its hold stops compaction at its frontier - 1
    with connect(db) as conn:
        assert {h.holder: h.ts for h in read_holds(conn, "held")} == {"sink:holder": result.frontier - 1}
        assert shard_info(conn, "held").since <= result.frontier - 1
        assert load_remap(conn, "held").since <= result.frontier - 1
    run_once(ctx)
    check_table(ctx)
    assert drop(ctx)
    source.cycles(2)
    with pytest.raises(SinkRefused, match="compacted past it"):
        run_once(ctx)


@pytest.mark.parametrize("copies", [False, True], ids=["rewritten", "copied"])
def test_warehouse_on_s3(db, s3, tmp_path, copies):
    blob = hand_made(db, tmp_path, "ons3", [[(i, 2, 1) for i in range(5)], [(i, 4, 1) for i in range(5, 8)]])
    spec = IcebergSinkSpec(name="s3_lake", collection="ons3", table=f"lake.ons3_{int(copies)}",
                           budget=IcebergBudget(max_rows=4), copy_min_bytes=0 if copies else None)
    catalog = CatalogSettings(uri=catalog_uri(db), warehouse=s3.url("warehouse"), s3=s3.settings())
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob, catalog=catalog)
    assert run_once(ctx).frontier == 5
    table = load_table(ctx)
    assert table.location().startswith(f"s3://{s3.bucket}/warehouse")
    assert all(t.file.file_path.startswith("s3://") for t in table.scan().plan_files())
    check_table(ctx)
    assert copied_parts(table, blob, "ons3") == ({"p0_0.parquet", "p1_0.parquet"} if copies else set())


def test_reclock_sink_run_status_and_drop_commands(db, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from reclock.cli import main

    blob = hand_made(db, tmp_path, "clisrc", [[(1, 1, 1), (2, 1, 1)]])
    config = tmp_path / "cli.yaml"
    config.write_text(yaml.safe_dump({
        "sources": {"clisrc": {"kafka": {"topic": "t", "bootstrap": "127.0.0.1:9"}, "format": {"type": "bytes"}}},
        "sinks": {"cli_lake": {"from": "clisrc", "iceberg": {"table": "lake.cli"}}}}))
    for var in ("RECLOCK_ICEBERG_CATALOG_URI", "RECLOCK_ICEBERG_WAREHOUSE"):
        monkeypatch.delenv(var, raising=False)
    opts = ["--config", str(config), "--dsn", db, "--blob-url", str(blob.root)]
    runner = CliRunner()
    before = runner.invoke(main, ["sink", "status", "cli_lake", *opts])
    assert before.exit_code == 0 and "progress: table not created yet" in before.output, before.output
    run = runner.invoke(main, ["sink", "run", "cli_lake", *opts])
    assert run.exit_code == 0 and "frontier 2: 2 rows" in run.output, run.output
    after = runner.invoke(main, ["sink", "status", "cli_lake", *opts])
    assert "Iceberg table lake.cli (append)" in after.output and "progress: frontier 2" in after.output
    assert "read hold 1; lag 0 ms" in after.output, after.output
    dropped = runner.invoke(main, ["sink", "drop", "cli_lake", *opts])
    assert dropped.exit_code == 0 and "read hold released" in dropped.output, dropped.output
