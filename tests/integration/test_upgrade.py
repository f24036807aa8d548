"""Upgrades: state the previous release wrote is continued by this checkout after ``reclock migrate``.

The previous release (``benchmarks.release.PREVIOUS_RELEASE``, its wheel built from the repository's history and
installed alone in a venv of its own) runs through its own ``reclock`` command: migrate, cycles of an
append-only and an upsert Kafka source and of a Postgres source (its replication slot), an exactly-once Kafka
sink of the upsert collection and an Iceberg export of the append-only one, and last a cycle killed after its
write (its binding durable, its parts not appended: an upgrade in the middle of a cycle). Then this checkout
(whatever main is now: the test never pins the new side) refuses to run before ``reclock migrate`` if it
ships migrations the database lacks, migrates, reads exactly what the previous release read (the progress
relations, every shard's updates), and carries on: more records, cycles, both sinks. The oracle reads the
upstreams itself: every Kafka record once at the timestamp of the binding that covers it (the old bindings
keep theirs), the upsert collection AS OF every binding equal to the latest value per key, the Postgres
collection equal to the table and the slot at the last binding, the sink's topic equal to the collection's
updates once in timestamp order, the Iceberg table equal to the collection at its frontier. A rollback is
refused: the previous release's ``reclock migrate`` on the migrated database (when there is a new migration),
and this release on a schema newer than its own (``test_persist_migrate``); docs/operations.md, Upgrades.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pyarrow.compute as pc
import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from benchmarks.release import REPO, clean_env, previous_release

from reclock import remap
from reclock.config import parse_config
from reclock.persist import connect
from reclock.persist import migrate as migrations
from reclock.persist.blob import LocalBlobStore
from reclock.persist.remap_store import load_remap
from reclock.read import read_as_of, read_updates
from reclock.sinks.encode import encode_updates
from reclock.sinks.kafka import TS_HEADER, consolidate, read_all, read_progress

KEYS = 12

# What a release sees of a database, printed as JSON by that release's own code: every source's progress
# relation (the public view of its bindings) and every shard's upper and updates (rows as sorted JSON).
CAPTURE = r"""
import base64, json, sys
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.read import read_updates

def enc(v):
    return "b64:" + base64.b64encode(v).decode() if isinstance(v, (bytes, bytearray)) else v

dsn, root = sys.argv[1], sys.argv[2]
blob, out = LocalBlobStore(root), {"progress": {}, "shards": {}}
with connect(dsn) as conn:
    for (src,) in conn.execute("SELECT name FROM reclock.sources ORDER BY name").fetchall():
        rows = conn.execute(f'SELECT * FROM reclock."{src}_progress"').fetchall()
        out["progress"][src] = sorted([str(v) for v in r] for r in rows)
    for shard, upper in conn.execute("SELECT id, upper FROM reclock.shards ORDER BY id").fetchall():
        t = read_updates(conn, blob, shard)
        rows = [] if t is None else t.to_pylist()
        out["shards"][shard] = {"upper": upper, "updates": sorted(
            json.dumps({k: enc(v) for k, v in r.items()}, sort_keys=True, default=str) for r in rows)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def old_release() -> Path:
    return previous_release()


@pytest.fixture(scope="module")
def spark_connect(stack_state):
    """A Spark Connect server both releases' cycles use (a command's own local session would start a JVM
    per cycle)."""
    from reclock.dev.spark import LocalSparkConnect

    server = LocalSparkConnect(stack_state, master="local[2]", driver_memory="1g", name="upgrade_spark")
    server.start(timeout=600)
    yield server
    server.stop()


class Upstreams:
    """The two topics and the Postgres table the sources read, with writers that remember what they wrote."""

    def __init__(self, kafka, postgres, tag: str, records: int = 90) -> None:
        self.bootstrap, self.records = kafka.bootstrap, records
        self.app, self.ups = f"{tag}_app", f"{tag}_ups"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for fut in admin.create_topics([NewTopic(self.app, 3, 1), NewTopic(self.ups, 2, 1)]).values():
            fut.result(30)
        self.db = f"{tag}_up"
        with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db}"')
        self.dsn = postgres.dsn(self.db)
        self.postgres = postgres
        with self.session() as conn:
            conn.execute("CREATE TABLE orders (id int8 PRIMARY KEY, v text, n int8)")
            conn.execute("ALTER TABLE orders REPLICA IDENTITY FULL")
            conn.execute("CREATE PUBLICATION up_pub FOR TABLE orders")
        self.n = 0

    def session(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True, options="-c synchronous_commit=on")

    def wave(self) -> None:
        """``self.records`` append-only records, as many upserts over :data:`KEYS` keys (every 11th a delete), and
        a few upstream transactions (inserts, updates, deletes)."""
        p = Producer({"bootstrap.servers": self.bootstrap, "log_level": 0})
        for _ in range(self.records):
            i, self.n = self.n, self.n + 1
            p.produce(self.app, value=json.dumps({"id": i, "name": f"a{i}"}).encode(), partition=i % 3)
            key = f"k{(i * 7) % KEYS}".encode()
            value = None if i % 11 == 5 else json.dumps({"id": i, "name": f"u{i}"}).encode()
            p.produce(self.ups, key=key, value=value, partition=zlib.crc32(key) % 2)
        assert p.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
        with self.session() as conn:
            for j in range(4):
                with conn.transaction():
                    k = self.n * 10 + j
                    conn.execute("INSERT INTO orders VALUES (%s, %s, %s), (%s, 'x', 0)", (k, f"o{k}", j, k + 5))
                    conn.execute("UPDATE orders SET n = n + 1 WHERE id < %s AND id %% 3 = 0", (k,))
                    conn.execute("DELETE FROM orders WHERE id = %s", (k + 5,))

    def drop(self) -> None:
        with psycopg.connect(self.postgres.dsn("postgres"), autocommit=True) as conn:
            for (slot,) in conn.execute("SELECT slot_name FROM pg_replication_slots WHERE database = %s",
                                        (self.db,)).fetchall():
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f'DROP DATABASE "{self.db}" WITH (FORCE)')


def write_config(path: Path, up: Upstreams) -> Path:
    schema = {"type": "json", "schema": "id BIGINT, name STRING"}
    raw = {"sources": {
        "up_app": {"kafka": {"topic": up.app, "bootstrap": up.bootstrap}, "format": schema,
                   "include": ["partition", "offset"], "budget": {"max_records": 1000}},
        "up_ups": {"kafka": {"topic": up.ups, "bootstrap": up.bootstrap}, "format": schema, "envelope": "upsert",
                   "include": ["key"]},
        "up_pgs": {"postgres": {"dsn_env": "UP_PG_DSN", "publication": "up_pub"}}},
        "sinks": {
            "up_out": {"from": "up_ups", "format": "debezium", "key": ["_key"],
                       "kafka": {"topic": f"{up.ups}_out", "bootstrap": up.bootstrap},
                       "progress_topic": f"_progress_{up.ups}", "transaction_timeout": "20s"},
            "up_ice": {"from": "up_app", "iceberg": {"table": "lake.up_app"}}}}
    path.write_text(yaml.safe_dump(raw))
    return path


class Release:
    """One release's ``reclock`` command (``argv``: how to run it) with the test's settings."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name, self.argv, self.env = name, argv, env

    def run(self, *args: str, ok: bool = True, **extra: str) -> subprocess.CompletedProcess:
        p = subprocess.run([*self.argv, *args], env={**self.env, **extra}, cwd=self.env["UPGRADE_CWD"],
                           capture_output=True, text=True, timeout=600)
        if ok:
            assert p.returncode == 0, f"{self.name} release: reclock {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
        return p

    def everything(self) -> None:
        """A cycle of each source, then both sinks to their collection's upper: the three sources' cycles side
        by side (each its own process, as a deployment runs them), then the two sinks side by side."""
        self.side_by_side(["cycle", source] for source in ("up_app", "up_ups", "up_pgs"))
        self.side_by_side(["sink", "run", sink] for sink in ("up_out", "up_ice"))

    def side_by_side(self, commands) -> None:
        """Every one of ``commands`` at once, each a ``reclock`` process; each must succeed (:meth:`run`)."""
        commands = list(commands)
        with ThreadPoolExecutor(len(commands)) as pool:
            for done in [pool.submit(self.run, *args) for args in commands]:
                done.result()


def capture(python: str, env: dict[str, str], dsn: str, blobs: Path) -> dict:
    p = subprocess.run([python, "-c", CAPTURE, dsn, str(blobs)], env=env, cwd=env["UPGRADE_CWD"],
                       capture_output=True, text=True, timeout=300, check=True)
    return json.loads(p.stdout)


@pytest.mark.parametrize("waves", [(1, 1, 30), pytest.param((2, 2, 90), marks=pytest.mark.deployment)],
                         ids=["short", "long"])
def test_the_previous_releases_state_is_continued_exactly_once_at_the_same_timestamps(
        old_release, spark_connect, fresh_db, kafka, postgres, tmp_path, waves):
    """``waves``: (waves through the previous release, waves through this one, records a wave); ``make test``
    runs the short one, ``make test-deployment`` the long one."""
    up = Upstreams(kafka, postgres, f"upg{tmp_path.name[-6:].lower().replace('-', '_')}", records=waves[2])
    try:
        _upgrade(old_release, spark_connect, fresh_db, up, tmp_path, *waves[:2])
    finally:
        up.drop()


def shipped_migrations(venv: Path) -> set[int]:
    """The migration versions a release's installed package ships (its files, not its code's answer)."""
    python = venv / "bin" / "python"
    folder = subprocess.run([str(python), "-c", "import reclock.persist, pathlib; "
                             "print(pathlib.Path(reclock.persist.__file__).parent / 'migrations')"],
                            env=clean_env(), capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    return {int(f.name.split("_", 1)[0]) for f in Path(folder).glob("[0-9]*_*.sql")}


def _upgrade(old_release: Path, spark_connect, dsn: str, up: Upstreams, tmp_path: Path, waves_before: int,
             waves_after: int) -> None:
    blobs = tmp_path / "blobs"
    cwd = tmp_path / "elsewhere"  # neither release may find the checkout from its working directory
    cwd.mkdir()
    config = write_config(tmp_path / "reclock.yaml", up)
    env = clean_env(RECLOCK_CONFIG=str(config), RECLOCK_DSN=dsn, RECLOCK_BLOB_URL=str(blobs),
                    RECLOCK_SPARK_REMOTE=spark_connect.url, RECLOCK_RETAIN_HISTORY_S="1000000000",
                    UP_PG_DSN=up.dsn, UPGRADE_CWD=str(cwd))
    old = Release("previous", [str(old_release / "bin" / "reclock")], env)
    new = Release("new", [sys.executable, "-m", "reclock.cli"], {**env, "PYTHONPATH": str(REPO / "include")})

    # the previous release: its schema, two waves through every source and both sinks, then a cycle killed
    # after its write (a binding minted, its parts never appended)
    old.run("migrate")
    for _ in range(waves_before):
        up.wave()
        old.everything()
    up.wave()
    killed = old.run("cycle", "up_app", ok=False, RECLOCK_FAILPOINTS="write_batches:after_slice=exit")
    assert killed.returncode == 86, f"the fail point did not end the cycle: {killed.stdout}{killed.stderr}"
    before = capture(str(old_release / "bin" / "python"), env, dsn, blobs)

    # this release: refuses to run on the old schema if it has migrations to apply, then migrates
    with connect(dsn) as conn:
        pending = sorted(set(m.version for m in migrations.available()) - set(migrations.applied(conn)))
    # what this checkout ships beyond the previous release's files: the migrations `reclock migrate` applies
    # (0009 and later while the previous release is round 2's: the refusal below is then tested)
    assert pending == sorted({m.version for m in migrations.available()} - shipped_migrations(old_release)), pending
    if pending:
        refused = new.run("cycle", "up_app", ok=False)
        assert refused.returncode == 1 and "run `reclock migrate`" in refused.stderr, refused.stderr
    migrated = new.run("migrate")
    assert (f"applied {pending}" if pending else "schema is up to date") in migrated.stdout
    if pending:  # a rollback to the previous release is refused by that release's own migrate
        back = old.run("migrate", ok=False)
        assert back.returncode == 1 and "newer than the code" in back.stderr, back.stderr

    # it reads exactly what the previous release read: the same bindings, the same updates at the same times
    after = capture(sys.executable, {**env, "PYTHONPATH": str(REPO / "include")}, dsn, blobs)
    assert after == before

    # and carries on: the killed cycle's binding, then new records, every source and both sinks
    for _ in range(waves_after):
        up.wave()
        new.everything()
    new.everything()  # caught up: the oracle compares against the upstreams
    final = capture(sys.executable, {**env, "PYTHONPATH": str(REPO / "include")}, dsn, blobs)
    for src, rows in before["progress"].items():
        assert final["progress"][src][:len(rows)] == rows, f"{src}: the previous release's bindings changed"
    for shard, old_shard in before["shards"].items():
        kept = [u for u in final["shards"][shard]["updates"] if json.loads(u)["ts"] < old_shard["upper"]]
        assert kept == old_shard["updates"], f"{shard}: updates below the old upper changed"

    spec = parse_config(yaml.safe_load(config.read_text()))
    store = LocalBlobStore(blobs)
    with connect(dsn) as conn:
        _check_append(conn, store, up)
        _check_upsert(conn, store, up)
        _check_postgres(conn, store, up)
        _check_kafka_sink(conn, store, up, spec.sinks["up_out"])
        _check_iceberg(conn, store, dsn, blobs, spec.sinks["up_ice"], waves_before + waves_after)


def _topic(bootstrap: str, topic: str) -> list:
    return list(read_all(bootstrap, topic, f"upgrade-oracle-{topic}"))


def _check_append(conn, blob, up: Upstreams) -> None:
    """Every record of the topic once, at the timestamp of the binding that covers its offset."""
    rc = load_remap(conn, "up_app")
    expected = {(m.partition(), m.offset()): json.loads(m.value())["id"] for m in _topic(up.bootstrap, up.app)}
    rows = read_updates(conn, blob, "up_app").to_pylist()
    got = collections.Counter((r["_partition"], r["_offset"]) for r in rows)
    assert got == collections.Counter(expected.keys()), "up_app: a record lost or duplicated"
    for r in rows:
        assert r["id"] == expected[(r["_partition"], r["_offset"])] and r["diff"] == 1
        assert max(r["ts"], rc.since) == remap.reclock(rc, r["_partition"], r["_offset"]), f"up_app: {r} wrong ts"


def _check_upsert(conn, blob, up: Upstreams) -> None:
    """AS OF every binding: the latest value of each key among the records bound by then."""
    rc = load_remap(conn, "up_ups")
    records = [(remap.reclock(rc, m.partition(), m.offset()), m.offset(), m.key().decode(),
                None if m.value() is None else json.loads(m.value())) for m in _topic(up.bootstrap, up.ups)]
    for b in rc.bindings:
        latest: dict = {}
        for ts, offset, key, row in sorted(records, key=lambda r: (r[0] or 0, r[1])):
            if ts is not None and ts <= b.ts:
                latest[key] = row
        want = collections.Counter((k, r["id"], r["name"]) for k, r in latest.items() if r is not None)
        got = collections.Counter()
        for r in read_as_of(conn, blob, "up_ups", b.ts).to_pylist():
            got[(r["_key"].decode(), r["id"], r["name"])] += r["diff"]
        assert +got == want, f"up_ups AS OF {b.ts}"


def _check_postgres(conn, blob, up: Upstreams) -> None:
    """The collection AS OF the last binding is the table; the slot is confirmed at that binding's LSN."""
    rc = load_remap(conn, "up_pgs")
    last = rc.bindings[-1]
    with up.session() as uconn:
        table = sorted(uconn.execute("SELECT id, v, n FROM orders").fetchall())
        (confirmed,) = uconn.execute("SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots "
                                     "WHERE database = %s", (up.db,)).fetchone()
    shard = next(s for (s,) in conn.execute("SELECT id FROM reclock.shards WHERE source = 'up_pgs' AND id <> "
                                             "'up_pgs_errors'").fetchall())
    rows = read_as_of(conn, blob, shard, last.ts).to_pylist()
    assert all(r["diff"] == 1 for r in rows)
    assert sorted((r["id"], r["v"], r["n"]) for r in rows) == table
    assert int(confirmed) == max(last.frontier.as_dict().values()), "the slot is not at the last binding"


def _check_kafka_sink(conn, blob, up: Upstreams, spec) -> None:
    """The target topic holds the collection's updates once, in timestamp order; progress at the upper."""
    got = [(int(dict(m.headers())[TS_HEADER]), m.key(), m.value(), m.partition())
           for m in _topic(up.bootstrap, spec.kafka.topic)]
    ups = read_updates(conn, blob, spec.collection)
    first = min(t for t, _, _, _ in got)  # the sink's first run wrote the snapshot AS OF its first frontier
    ups = ups.set_column(ups.schema.get_field_index("ts"), "ts", pc.max_element_wise(ups["ts"], first))
    assert collections.Counter((t, k, v) for t, k, v, _ in got) == collections.Counter(
        encode_updates(spec, consolidate(ups))), "up_out: a message lost or duplicated"
    for p in {q for *_, q in got}:
        ts = [t for t, _, _, q in got if q == p]
        assert ts == sorted(ts), f"up_out partition {p} out of timestamp order"
    (upper,) = conn.execute("SELECT upper FROM reclock.shards WHERE id = %s", (spec.collection,)).fetchone()
    assert read_progress(up.bootstrap, spec.progress_topic, spec.name).frontier == upper


def _check_iceberg(conn, blob, dsn: str, blobs: Path, spec, exports: int) -> None:
    """The table holds the collection AS OF its frontier, and the previous release's snapshots are its
    history."""
    from reclock.sinks.iceberg import CatalogSettings, IcebergSinkContext, catalog_uri, load_catalog, table_frontier

    ctx = IcebergSinkContext(spec=spec, dsn=dsn, blob=blob,
                             catalog=CatalogSettings(uri=catalog_uri(dsn), warehouse=str(blobs) + "/_iceberg"))
    (upper,) = conn.execute("SELECT upper FROM reclock.shards WHERE id = %s", (spec.collection,)).fetchone()
    assert table_frontier(ctx).frontier == upper
    table = load_catalog(ctx.catalog, spec.catalog).load_table(spec.table)
    assert len(table.snapshots()) >= exports  # one a wave, before the upgrade and after
    want = collections.Counter()
    for r in read_as_of(conn, blob, spec.collection, upper - 1).to_pylist():
        want[(r["_partition"], r["_offset"], r["id"])] += r["diff"]
    got = collections.Counter((r["_partition"], r["_offset"], r["id"]) for r in table.scan().to_arrow().to_pylist())
    assert got == want, "up_ice: the table is not the collection at its frontier"
