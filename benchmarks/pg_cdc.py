"""The Postgres CDC source: change throughput end to end beside a bare read of the same slot, and the
snapshot beside a bare read of the same table.

    .venv/bin/python -m benchmarks.pg_cdc --changes 200000 --snapshot-rows 500000

One run starts its own Postgres (wal_level=logical, fsync off) in a temporary folder and stops it at the
end. Three tables (id, text, numeric(12,2), int8, timestamptz), REPLICA IDENTITY FULL, one publication.

* **snapshot**: ``--snapshot-rows`` rows in table ``a`` before the source's first cycle; Reclock's first
  cycle (the snapshot under an exported snapshot, read with COPY as CSV and parsed by Arrow, written as
  parts and appended) beside a bare read of the same rows as text on a server-side cursor in this process.
  Then on Spark (``local[2]``, unless ``--no-spark``): Reclock's first cycle with table ``a`` read by Spark
  (``reclock.sources.postgres.spark_snapshot``: partitioned JDBC reads under the snapshot, converted, written as
  Parquet, proved, appended) beside a bare Spark JDBC read of the same table, same page ranges and settings, into
  Spark's ``noop`` sink, each warmed up once, then alternating. ``--spark-only`` runs only these, with two more
  contenders (Spark's own JDBC copy of the table into Parquet; the snapshot's read with its conversions into
  ``noop``), the CPU seconds of each (this process, Spark's JVM and workers, Postgres), the load and the peak RSS
  of this process and of Spark's JVM.
* **changes**: ``--changes`` row changes (inserts, updates, deletes over the three tables, in transactions
  of 1 to 200 changes, one of 20,000), committed after the snapshot; then, timed, Reclock's cycle that
  ingests them (mint to resume, everything appended) beside bare reads of the same slot with the same
  function up to the same LSN (``pg_logical_slot_peek_binary_changes``, nothing decoded in Python): fetched
  on a server-side cursor, as the cycle reads it, and streamed without a cursor (psycopg's ``stream``, in
  chunks of 10,000 rows: no round trip per block, so faster as a bare read; the cycle fetches ahead of its
  decoding on a helper thread, where the two measured the same). The limit is the faster of the two. Also:
  the same peek counted on the server (nothing sent: a peek returns no row before the server has decoded
  every change, so no reader can start sooner); the same slot read over the streaming replication protocol
  instead (``START_REPLICATION`` on a replication connection, each message kept as bytes, nothing decoded,
  the slot left where it was); the peeked messages decoded too (``reclock.sources.postgres.pgoutput``) without
  writing anything; and the ratio the cycle would reach if decoding and writing took no time at all (the
  limit beside the limit plus the cycle's other steps, mint, append and resume).

Figures are changes (rows) per second; each timed run is repeated ``--reps`` times (median). The end to
end runs take ``--reps`` sources, each with its own slot and its own snapshot cycle before the changes, and
alternate with the bare reads (the bare reads of a source's slot, then its cycle), so all see the same
load.
Run it on a quiet machine: on 2 shared cores the figures move by ±20%.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Sequence

import psycopg
from psycopg import pq
from psycopg.rows import scalar_row

from benchmarks import stop
from benchmarks.memory import cpu_seconds
from reclock import cycle
from reclock.config import parse_source
from reclock.dev.postgres import LocalPostgres
from reclock.dev.state import StackState
from reclock.persist.blob import LocalBlobStore
from reclock.persist.migrate import migrate
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import SESSION, PostgresUpstream, TableInfo, slot_name

TABLES = ("a", "b", "c")
_REPLY = b"r" + struct.pack(">QQQQB", 0, 0, 0, 0, 0)  # standby status update: written, flushed, applied 0
_LSN = struct.Struct(">Q").unpack_from


def make_databases(pg, publication: str = "pub") -> tuple[str, str]:
    """On the started ``pg``: the upstream database (:data:`TABLES`, ``REPLICA IDENTITY FULL``, one publication
    of them) and the consensus database (migrated); their DSNs."""
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as conn:
        conn.execute("CREATE DATABASE upstream")
        conn.execute("CREATE DATABASE consensus")
    up, db = pg.dsn("upstream"), pg.dsn("consensus")
    migrate(db)
    with psycopg.connect(up, autocommit=True) as conn:
        for t in TABLES:
            conn.execute(f"CREATE TABLE {t} (id int8 PRIMARY KEY, v text, n numeric(12,2), x int8, at timestamptz)")
            conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        conn.execute(f"CREATE PUBLICATION {publication} FOR TABLE {', '.join(TABLES)}")
    return up, db


def _fill_snapshot(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO a SELECT g, md5(g::text), g / 100.0, g, now() FROM generate_series(1, %s) g",
                     (rows,))
        conn.execute("ANALYZE a")  # its statistics, as autovacuum gives a table of its size in time


def _fill_changes(dsn: str, changes: int, base: int, seed: int = 7) -> int:
    """``changes`` row changes in transactions; returns the rows of change the source will emit (an
    update is two: -1 old, +1 new)."""
    rng = random.Random(seed)
    live = {t: [] for t in TABLES}
    key = base
    emitted = 0
    done = 0
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        big_done = False
        while done < changes:
            size = 20_000 if not big_done and done > changes // 2 else rng.randint(1, 200)
            big_done = big_done or size == 20_000
            with conn.transaction(), conn.cursor() as cur:
                inserts: dict[str, list] = {t: [] for t in TABLES}
                for _ in range(min(size, changes - done)):
                    t = rng.choice(TABLES)
                    op = "insert" if len(live[t]) < 100 else rng.choice(("insert", "insert", "update", "delete"))
                    if op == "insert":
                        key += 1
                        inserts[t].append((key, f"v{key}", key / 100, key))
                        live[t].append(key)
                        emitted += 1
                    elif op == "update":
                        k = live[t][rng.randrange(len(live[t]))]
                        cur.execute(f"UPDATE {t} SET v = %s, x = x + 1 WHERE id = %s", (f"u{done}", k))
                        emitted += 2 * cur.rowcount
                    else:
                        k = live[t].pop(rng.randrange(len(live[t])))
                        cur.execute(f"DELETE FROM {t} WHERE id = %s", (k,))
                        emitted += cur.rowcount
                    done += 1
                for t, rows in inserts.items():
                    if rows:
                        cur.executemany(f"INSERT INTO {t} (id, v, n, x, at) VALUES (%s, %s, %s, %s, now())", rows)
    return emitted


_PEEK = ("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', '1', "
         "'publication_names', 'pub')")


def _bare_peek(dsn: str, slot: str, upto: str, decode: bool) -> tuple[float, int]:
    with psycopg.connect(dsn) as conn:
        for s in SESSION:
            conn.execute(s)
        t0 = time.perf_counter()
        n = 0
        with conn.cursor(name="bare", binary=True) as cur:
            cur.itersize = 10_000
            cur.execute("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, NULL, 'proto_version', "
                        "'1', 'publication_names', 'pub')", (slot, upto))
            for (data,) in cur:
                if decode:
                    m = po.decode(data)
                    if isinstance(m, (po.Insert, po.Update, po.Delete)):
                        for v in getattr(m, "new", None) or m.old:
                            po.convert(po.TEXT, -1, v) if isinstance(v, bytes) else v
                n += 1
        conn.rollback()
        return time.perf_counter() - t0, n


def _bare_peek_streamed(dsn: str, slot: str, upto: str) -> tuple[float, int]:
    """The same peek without a server-side cursor: psycopg's ``stream`` in chunks of 10,000 rows (libpq's
    chunked rows mode, libpq 17 and later), so the server sends the rows as fast as the client takes them
    instead of a FETCH round trip per block; nothing decoded, memory bounded the same."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in SESSION:
            conn.execute(s)
        t0 = time.perf_counter()
        n = 0
        with conn.cursor(binary=True, row_factory=scalar_row) as cur:
            for _ in cur.stream(_PEEK, (slot, upto), size=10_000):
                n += 1
        return time.perf_counter() - t0, n


def _server_peek(dsn: str, slot: str, upto: str) -> tuple[float, int]:
    """The same peek counted on the server (``count(*)``): the server's part alone, nothing sent. A peek
    returns no row before its function has decoded every change, so no reader of it can start sooner."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        n = conn.execute(f"SELECT count(*) FROM ({_PEEK}) p", (slot, upto)).fetchone()[0]
        return time.perf_counter() - t0, n


def _bare_stream(dsn: str, slot: str, upto: str) -> tuple[float, int]:
    """The slot read over the streaming replication protocol, nothing decoded: each XLogData's pgoutput
    message kept as bytes (in blocks of 10,000, as the peek fetches), up to the first keepalive at or past
    ``upto`` (it carries the walsender's position: every transaction whose commit record starts below it
    has been sent) or the first XLogData past it (a Commit's carries its record's end, which can equal
    ``upto``). Replies report position 0, so the slot does not move; closing the connection releases it."""
    end = po.lsn_to_int(upto)
    conn = psycopg.connect(dsn, autocommit=True, replication="database")
    try:
        pg = conn.pgconn
        t0 = time.perf_counter()
        res = pg.exec_(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 (proto_version '1', "
                       "publication_names 'pub')".encode())
        assert res.status == pq.ExecStatus.COPY_BOTH, res.error_message
        block: list[bytes] = []
        n = 0
        while True:
            nbytes, data = pg.get_copy_data(1)
            if nbytes == 0:
                # Data, then a moment more: the walsender writes each message on its own while the socket has
                # room, in bulk once it is full. 1.3-2x faster here than waiting in get_copy_data(0) or in
                # select alone.
                select.select([pg.socket], [], [])
                time.sleep(0.0003)
                pg.consume_input()
            elif nbytes < 0:
                raise RuntimeError(f"the stream ended: {pg.error_message.decode()}")
            elif data[0] == 0x77:  # b"w", XLogData: kind, walStart, walEnd, sendTime, the pgoutput message
                if _LSN(data, 9)[0] > end:
                    break
                block.append(bytes(data[25:]))
                if len(block) == 10_000:
                    n += len(block)
                    block = []
            elif data[0] == 0x6B:  # b"k", keepalive: kind, walEnd, sendTime, reply requested
                if _LSN(data, 1)[0] >= end:
                    break
                if data[17]:
                    pg.put_copy_data(_REPLY)
                    pg.flush()
        return time.perf_counter() - t0, n + len(block)
    finally:
        conn.close()


def _slot_at_rest(dsn: str, slot: str) -> str:
    """The slot's confirmed_flush_lsn once no walsender holds it (one exits after its client has gone)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(1000):
            active, confirmed = conn.execute("SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots "
                                             "WHERE slot_name = %s", (slot,)).fetchone()
            if not active:
                return confirmed
            time.sleep(0.01)
    raise TimeoutError(f"slot {slot} still active after 10 s")


def _bare_table_read(dsn: str) -> tuple[float, int]:
    with psycopg.connect(dsn) as conn:
        for s in SESSION:
            conn.execute(s)
        t0 = time.perf_counter()
        n = 0
        with conn.cursor(name="bare_table") as cur:
            cur.itersize = 10_000
            cur.execute("SELECT id::text, v::text, n::text, x::text, at::text FROM a")
            for _ in cur:
                n += 1
        conn.rollback()
        return time.perf_counter() - t0, n


BARE, RECLOCK, COPY, CONVERTED = ("bare Spark read", "snapshot on Spark", "Spark's copy into Parquet",
                                  "the snapshot's read, converted, into noop")


def _spark_snapshots(spark, up: str, db: str, root: Path, reps: int, budget: int, more: bool = False,
                     cpu: dict[str, list[float]] | None = None,
                     cpu_roots: Sequence[int] = ()) -> dict[str, list[float]]:
    """Reclock's first cycle with table ``a``'s snapshot on Spark (``reclock.sources.postgres.spark_snapshot``),
    beside a bare Spark read of the same table over the same page ranges and JDBC settings into Spark's ``noop``
    sink (and, with ``more``, Spark's own JDBC copy of the table into Parquet, and the snapshot's read with its
    conversions into ``noop``: its write left out), each once as a warm-up, then alternating which goes first
    (``benchmarks.env.alternating``); each source's slot is dropped after its cycle. Seconds per timed run of
    each contender (:data:`BARE`, :data:`RECLOCK`, :data:`COPY`, :data:`CONVERTED`); given ``cpu``, also the CPU
    seconds of each (``benchmarks.memory.cpu_seconds`` of ``cpu_roots``: this process, Spark's JVM and its
    Python workers, Postgres and its backends; wall seconds stretch with the load, these do not)."""
    from benchmarks.env import alternating
    from reclock.sources.postgres import spark_snapshot as ss

    target = ss.jdbc_target(up)
    info = TableInfo("public.a", 0, (("id", po.INT8, -1), ("v", po.TEXT, -1), ("n", po.NUMERIC, 786438),
                                     ("x", po.INT8, -1), ("at", po.TIMESTAMPTZ, -1)))

    def under_snapshot(read) -> float:
        with psycopg.connect(up, autocommit=True) as conn:
            _, pages, block = PostgresUpstream.table_size(conn, conn.execute("SELECT 'a'::regclass::oid").fetchone()[0])
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            name = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
            props = {**target.properties, "sessionInitStatement": ss.session_init(name), "fetchsize": "10000"}
            preds = ss.partition_predicates(pages, ss.SPLIT_BYTES // block, ss.task_slots(spark))
            t0 = time.perf_counter()
            read(name, props, preds)
            secs = time.perf_counter() - t0
            conn.execute("ROLLBACK")
        return secs

    def bare(i: int) -> float:
        return under_snapshot(lambda name, props, preds: spark.read.jdbc(
            target.url, ss.snapshot_query(info), predicates=preds, properties=props
        ).write.format("noop").mode("overwrite").save())

    def copy(i: int) -> float:  # Spark's own copy of the table (its types, no conversion) into Parquet
        secs = under_snapshot(lambda name, props, preds: spark.read.jdbc(
            target.url, f"(SELECT ctid AS {ss.CTID}, id, v, n, x, at FROM ONLY public.a) a", predicates=preds,
            properties=props).drop(ss.CTID).write.parquet(str(root / f"copy{i}")))
        shutil.rmtree(root / f"copy{i}", ignore_errors=True)
        return secs

    def converted(i: int) -> float:  # the snapshot's query and conversions as the cycle runs them, nothing written
        return under_snapshot(lambda name, props, preds: ss.snapshot_frame(
            spark, target, name, info, 1, preds).write.format("noop").mode("overwrite").save())

    def reclock(i: int) -> float:
        spec = parse_source(f"spk{i}", {"postgres": {"dsn_env": "UNUSED", "publication": "pub",
                                                     "spark_snapshot_min_bytes": 1 << 20},
                                        "tables": list(TABLES), "budget": {"max_records": budget}})
        ctx = cycle.CycleContext(spec=spec, dsn=db, blob=LocalBlobStore(root / "blobs"),
                                 upstream=up, gc_grace_s=0, spark_factory=lambda: spark)
        t0 = time.perf_counter()
        cycle.run_cycle(ctx)
        secs = time.perf_counter() - t0
        with psycopg.connect(db, autocommit=True) as conn:
            on_spark = conn.execute("SELECT metrics->'snapshot_on_spark' FROM reclock.statistics WHERE name = %s "
                                    "AND metrics ? 'snapshot_rows'", (spec.name,)).fetchone()[0]
        assert on_spark == [f"spk{i}__a"], on_spark
        with psycopg.connect(up, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot_name(spec.name),))
        return secs

    def counted(name: str, job):
        def run(i: int) -> float:
            c0 = cpu_seconds(cpu_roots)
            secs = job(i)
            if i > 0:  # a timed run, not the warm-up
                cpu.setdefault(name, []).append(cpu_seconds(cpu_roots) - c0)
            return secs
        return run

    jobs = {RECLOCK: reclock, BARE: bare}
    if more:
        jobs.update({COPY: copy, CONVERTED: converted})
    if cpu is not None:
        jobs = {name: counted(name, job) for name, job in jobs.items()}
    return alternating(jobs, reps, lambda line: print(f"{line} (load {os.getloadavg()[0]:.1f})", flush=True))


def _peak_rss_mib(pid: int) -> float:
    """A process's peak resident set (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _spark_only(args, up: str, db: str, root: Path, figures: dict, load0: tuple, postmaster: int) -> None:
    """``--spark-only``: the snapshot on Spark beside the bare Spark read, Spark's own copy into Parquet and the
    snapshot's read converted into ``noop``, in wall seconds and in CPU seconds (of this process, Spark's JVM
    and its workers, and Postgres: the ratios of the work done, which the load on a shared machine does not
    move as it moves the wall clock), and the peak memory of this process (the cycle's task, Spark's driver) and
    of Spark's JVM (``local[2]``: its driver and executors are one)."""
    import resource

    from reclock.dev.spark import local_session

    spark = local_session(StackState(root), app="reclock-pgbench")
    cpu: dict[str, list[float]] = {}
    try:
        jvm = int(spark.sparkContext._jvm.ProcessHandle.current().pid())
        times = _spark_snapshots(spark, up, db, root, args.reps, args.budget, more=True, cpu=cpu,
                                 cpu_roots=(os.getpid(), postmaster))
        jvm_peak = _peak_rss_mib(jvm)
    finally:
        spark.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    for name, what in ((RECLOCK, "Reclock's first cycle, table on Spark"), (BARE, "bare Spark JDBC read of the table"),
                       (COPY, "Spark's JDBC copy of the table into Parquet"),
                       (CONVERTED, "the snapshot's read, converted, into noop")):
        figures[f"snapshot rows/s: {what}"] = {"value": args.snapshot_rows / med[name], "seconds": med[name]}
        figures[f"CPU seconds: {what}"] = {"value": cmed[name]}
    figures["ratio: snapshot on Spark / bare Spark read (medians)"] = {"value": med[BARE] / med[RECLOCK]}
    figures["ratio: snapshot on Spark / Spark's copy into Parquet (medians)"] = {"value": med[COPY] / med[RECLOCK]}
    figures["ratio: per rep, median"] = {"value": statistics.median(b / r for r, b in zip(times[RECLOCK], times[BARE]))}
    figures["ratio of CPU seconds: snapshot on Spark / bare Spark read"] = {"value": cmed[BARE] / cmed[RECLOCK]}
    figures["ratio of CPU seconds: Spark's copy into Parquet / bare Spark read"] = {"value": cmed[BARE] / cmed[COPY]}
    figures["ratio of CPU seconds: the read converted into noop / bare Spark read"] = {
        "value": cmed[BARE] / cmed[CONVERTED]}
    figures["peak RSS MiB: the cycle's process (Python)"] = {
        "value": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    figures["peak RSS MiB: Spark's JVM (driver and executors, local[2])"] = {"value": jvm_peak}
    print(f"{args.snapshot_rows} snapshot rows, {args.reps} reps, load average at start {load0[0]:.1f} "
          f"{load0[1]:.1f} {load0[2]:.1f}, at end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name, f in figures.items():
        extra = f" ({f['seconds']:.2f} s)" if "seconds" in f else ""
        print(f"{name:<72} {f['value']:>12,.2f}{extra}")
    for name in times:
        print(f"per rep, {name}: " + ", ".join(f"{w:.2f} s wall / {c:.2f} s CPU"
                                               for w, c in zip(times[name], cpu[name])))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--snapshot-rows", type=int, default=500_000)
    ap.add_argument("--budget", type=int, default=100_000, help="rows per Parquet part")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-spark", action="store_true", help="leave out the snapshot on Spark (local[2])")
    ap.add_argument("--spark-only", action="store_true",
                    help="only the snapshot on Spark beside the bare Spark read (no in-task snapshot, no changes)")
    ap.add_argument("--profile", action="store_true", help="print where the ingesting cycle spends its time")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    root = Path(tempfile.mkdtemp(prefix="reclock-pgbench-"))
    root.chmod(0o755)
    pg = LocalPostgres(StackState(root), fast=True)
    figures: dict[str, dict] = {}
    try:
        pg.start()
        up, db = make_databases(pg)
        _fill_snapshot(up, args.snapshot_rows)
        load0 = os.getloadavg()
        if args.spark_only:
            _spark_only(args, up, db, root, figures, load0,
                        postmaster=int(pg.pidfile.read_text().split()[0]))
            return
        snap_bare = [_bare_table_read(up) for _ in range(args.reps)]

        ctxs = []  # one source per timed end-to-end run: each has its own slot, all created before the changes
        snap_cycles = []
        for i in range(args.reps):
            name = "bench" if i == 0 else f"bench{i + 1}"
            spec = parse_source(name, {"postgres": {"dsn_env": "UNUSED", "publication": "pub"},
                                       "tables": list(TABLES), "budget": {"max_records": args.budget}})
            ctx = cycle.CycleContext(spec=spec, dsn=db, blob=LocalBlobStore(root / "blobs"),
                                     upstream=up, gc_grace_s=0)
            t0 = time.perf_counter()
            cycle.run_cycle(ctx)
            snap_cycles.append(time.perf_counter() - t0)
            ctxs.append(ctx)
        snap_reclock = statistics.median(snap_cycles)
        figures["snapshot rows/s: Reclock's first cycle"] = {"value": args.snapshot_rows / snap_reclock,
                                                             "seconds": snap_reclock}
        secs = statistics.median(s for s, _ in snap_bare)
        figures["snapshot rows/s: bare read of the table (psycopg, as text)"] = {"value": args.snapshot_rows / secs,
                                                                                "seconds": secs}

        if not args.no_spark:
            from reclock.dev.spark import local_session

            spark = local_session(StackState(root), app="reclock-pgbench")
            try:
                times = _spark_snapshots(spark, up, db, root, args.reps, args.budget)
            finally:
                spark.stop()
            sr, sb = statistics.median(times[RECLOCK]), statistics.median(times[BARE])
            figures["snapshot rows/s: Reclock's first cycle, table on Spark"] = {"value": args.snapshot_rows / sr,
                                                                                "seconds": sr}
            figures["snapshot rows/s: bare Spark JDBC read of the table"] = {"value": args.snapshot_rows / sb,
                                                                            "seconds": sb}
            figures["ratio: snapshot on Spark / bare Spark read"] = {"value": sb / sr}

        emitted = _fill_changes(up, args.changes, base=args.snapshot_rows)
        with psycopg.connect(up, autocommit=True) as conn:
            flush = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0]
        decoded = [_bare_peek(up, slot_name("bench"), flush, decode=True) for _ in range(args.reps)]
        bare, peek_streamed, server, streamed, e2es, steps = [], [], [], [], [], []
        profile = None
        for i, ctx in enumerate(ctxs):  # interleaved: the bare reads of a slot, then the cycle that ingests
            slot = slot_name(ctx.spec.name)
            bare.append(_bare_peek(up, slot, flush, decode=False))
            peek_streamed.append(_bare_peek_streamed(up, slot, flush))
            server.append(_server_peek(up, slot, flush))
            assert peek_streamed[-1][1] == server[-1][1] == bare[-1][1], (peek_streamed[-1], server[-1], bare[-1])
            confirmed = _slot_at_rest(up, slot)
            streamed.append(_bare_stream(up, slot, flush))
            assert _slot_at_rest(up, slot) == confirmed, "the stream moved the slot"
            assert streamed[-1][1] == bare[-1][1], (streamed[-1], bare[-1])
            if args.profile and i == 0:
                import cProfile

                profile = cProfile.Profile()
                profile.enable()
            t0 = time.perf_counter()
            out = cycle.run_cycle(ctx)  # the one cycle that ingests every change (a second would find none)
            e2es.append(time.perf_counter() - t0)
            if profile is not None and i == 0:
                import pstats

                profile.disable()
                pstats.Stats(profile).sort_stats("tottime").print_stats(15)
            assert out["descriptions"] == 1
            with psycopg.connect(db, autocommit=True) as conn:
                steps.append(conn.execute("SELECT DISTINCT ON (step) step, metrics->>'seconds' FROM "
                                          "reclock.statistics WHERE name = %s ORDER BY step, id DESC",
                                          (ctx.spec.name,)).fetchall())
        messages = bare[0][1]
        e2e = statistics.median(e2es)
        bare_s = statistics.median(s for s, _ in bare)
        peek_streamed_s = statistics.median(s for s, _ in peek_streamed)
        server_s = statistics.median(s for s, _ in server)
        limit_s = min(bare_s, peek_streamed_s)  # the faster way to read the slot with the same function
        stream_s = statistics.median(s for s, _ in streamed)
        dec_s = statistics.median(s for s, _ in decoded)
        fixed_s = statistics.median(sum(float(v) for k, v in st if k != "write_batches") for st in steps)
        figures["changes/s: Reclock's cycle, end to end"] = {"value": emitted / e2e, "seconds": e2e}
        figures["changes/s: bare peek on a server-side cursor"] = {"value": emitted / bare_s, "seconds": bare_s}
        figures["changes/s: bare peek, streamed (no cursor)"] = {"value": emitted / peek_streamed_s,
                                                                 "seconds": peek_streamed_s}
        figures["changes/s: the limit (the faster bare peek)"] = {"value": emitted / limit_s, "seconds": limit_s}
        figures["changes/s: the peek on the server alone (count(*))"] = {"value": emitted / server_s,
                                                                        "seconds": server_s}
        figures["changes/s: bare START_REPLICATION stream of the same slot"] = {"value": emitted / stream_s,
                                                                                "seconds": stream_s}
        figures["changes/s: bare peek + pgoutput decode in Python"] = {"value": emitted / dec_s, "seconds": dec_s}
        figures["seconds: the cycle's other steps (mint + append + resume)"] = {"value": fixed_s}
        figures["ratio: end to end / the limit (target >= 0.8)"] = {"value": limit_s / e2e}
        figures["ratio: end to end / bare peek on a cursor"] = {"value": bare_s / e2e}
        figures["ratio: the limit / (the limit + the other steps)"] = {"value": limit_s / (limit_s + fixed_s)}
        figures["ratio: bare stream / bare peek"] = {"value": bare_s / stream_s}
        figures["ratio: snapshot / bare table read"] = {"value": secs / snap_reclock}
        print(f"{args.changes} changes ({emitted} rows of change, {messages} messages), "
              f"{args.snapshot_rows} snapshot rows, budget {args.budget}")
        for name, f in figures.items():
            extra = f" ({f['seconds']:.2f} s)" if "seconds" in f else ""
            print(f"{name:<64} {f['value']:>12,.2f}{extra}")
        reps = zip(bare, peek_streamed, server, streamed, e2es)
        print("per rep, bare peek on a cursor / streamed / on the server alone / bare START_REPLICATION stream / "
              "end to end (s): " + ", ".join(f"{b:.2f} / {p:.2f} / {v:.2f} / {s:.2f} / {e:.2f}"
                                             for (b, _), (p, _), (v, _), (s, _), e in reps))
        for st in steps:
            print("an ingesting cycle's steps (s): " + ", ".join(f"{k} {v}" for k, v in st))
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2))
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
