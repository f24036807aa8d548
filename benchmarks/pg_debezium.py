"""The Postgres CDC source beside Debezium (issue 33): change throughput end to end against Debezium's
embedded engine and Debezium in Kafka Connect, each reading the same backlog from its own replication slot.

    .venv/bin/python -m benchmarks.pg_debezium --changes 200000 --reps 3
    .venv/bin/python -m benchmarks.pg_debezium --freshness --txns 20

One run starts its own Postgres (wal_level=logical, fsync off) and, unless ``--no-connect``, its own Kafka
broker, in a temporary folder, and stops everything it started at the end, also on SIGINT or SIGTERM. The
tables, the publication and the backlog are :mod:`benchmarks.pg_cdc`'s (three tables, ``REPLICA IDENTITY
FULL``, ``--changes`` inserts, updates and deletes in transactions of 1 to 200 changes, one of 20,000). Every
contender's slot (``pgoutput``, the same publication) is created before the first change, so each reads the
same backlog from the same position:

The backlog's row changes (Insert, Update and Delete messages in a slot, counted by a peek before the
clock) are what each contender must deliver.

* **Reclock**: ``--reps`` sources, each snapshotted (the tables are empty then) before the changes; timed, the
  one cycle that ingests the backlog, mint to resume (all changes delivered = the cycle's append committed;
  checked: the rows it wrote are the rows of change the backlog emits, an update two), in this process.
* **Debezium's embedded engine** (``io.debezium:debezium-embedded`` 3.6.1.Final with the Postgres connector,
  ``jvm/dbzembedded``, built by Maven): one JVM runs an engine over ``--reps + 1`` slots one after the other and
  counts the records each delivers (Connect ``SourceRecord``s handed to a batch consumer, nothing serialized:
  the cheapest way to use the engine) until every change has come (checked: exactly one record per change).
  **Cold**: the JVM's first engine, from the JVM's start (its start-up included, as a fresh process of Reclock's
  would pay its imports); **warm**: the later engines in the same JVM (JIT compiled, classes loaded), from the
  engine's build. Offsets in memory, ``snapshot.mode=no_data`` (no snapshot: the slot's changes only), no tombstones.
* **Debezium in Kafka Connect** (``reclock.dev.connect.LocalConnect``: Kafka Connect 4.1.1 standalone with the
  same connector, JSON values without schemas, the JVM's default flags): from the worker's start until every
  change is in the tables' topics (their end offsets, polled every 50 ms; checked: exactly one record per change).

``--freshness`` measures instead how fresh one small transaction is: the full local stack (Postgres, Kafka,
Airflow's scheduler, API server, DAG processor and triggerer; :func:`benchmarks.freshness.bench_stack`) with two
Postgres sources on a table ``f``, each through its own slot (``schedule: upstream``, probed every 200 ms, and
``schedule: continuous``, pausing 200 ms when idle), and Debezium in Kafka Connect on the same table through its
own slot. Every ``--gap`` seconds (jittered) one transaction inserts one row; its freshness is commit returned ->
the row visible in each Reclock collection (the shard's upper past it and the row read back from it) and commit
returned -> Debezium's record in its topic (the topic's end offset moved), all polled every 20 ms in one loop, so
all see the same transactions under the same load. p50 and p95 of ``--txns`` transactions, after two untimed.

Figures are upstream changes per second (an update is one change); the ratios are Reclock's median against
each peer in the same run. The three kinds of run take turns (a Reclock cycle, the embedded JVM, a Reclock cycle,
Connect, ...), so all see about the same load. On a shared machine only the ratios within one run mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from benchmarks import stop
from benchmarks.pg_cdc import TABLES, _fill_changes, make_databases
from reclock import cycle
from reclock.config import parse_source
from reclock.dev.jars import dbz_embedded_jars
from reclock.dev.postgres import LocalPostgres
from reclock.dev.state import StackState
from reclock.persist.blob import LocalBlobStore

TARGET_VS_WARM_EMBEDDED = 2.0
"""Issue 33: Reclock keeps at least 2x a warm embedded engine."""
PUBLICATION = "pub"
EMBEDDED_MAIN = "dev.reclock.bench.EmbeddedCount"


def debezium_props(dsn: str, prefix: str) -> dict[str, str]:
    """The connector's settings both Debezium contenders share (the slot is named per run)."""
    from urllib.parse import urlsplit

    url = urlsplit(dsn)
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": url.hostname or "127.0.0.1", "database.port": str(url.port or 5432),
        "database.user": url.username or "", "database.password": url.password or "",
        "database.dbname": url.path.lstrip("/"),
        "topic.prefix": prefix,
        "plugin.name": "pgoutput",
        "publication.name": PUBLICATION,
        "publication.autocreate.mode": "disabled",
        "table.include.list": ",".join(f"public.{t}" for t in TABLES),
        "snapshot.mode": "no_data",  # no offsets stored: no snapshot, stream from the slot
        "tombstones.on.delete": "false",
        "provide.transaction.metadata": "false",
        "decimal.handling.mode": "string",
        "time.precision.mode": "connect",
    }


def count_changes(dsn: str, slot: str) -> int:
    """The row changes (pgoutput Insert, Update and Delete messages) in ``slot``, peeked (the slot stays):
    what each Debezium contender must deliver, one record each. (Fewer than the backlog's statements: one
    that updates or deletes a row its transaction inserts later changes nothing.)"""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                            "'proto_version', '1', 'publication_names', %s) WHERE get_byte(data, 0) IN (73, 85, 68)",
                            (slot, PUBLICATION)).fetchone()[0]


def create_slots(dsn: str, slots: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (s,))


class Embedded:
    """Debezium's embedded engine in one JVM over ``slots``, one engine after the other (``jvm/dbzembedded``)."""

    def __init__(self, state: StackState, root: Path, dsn: str, slots: list[str], expected: int,
                 timeout_s: float) -> None:
        self.jars = dbz_embedded_jars(state)
        self.props = root / "engine.properties"
        props = {**debezium_props(dsn, "emb"),
                 "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
                 "offset.flush.interval.ms": "60000"}
        self.props.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self.props.chmod(0o600)  # the database password
        (root / "log4j2.properties").write_text(
            "rootLogger.level=WARN\nrootLogger.appenderRef.out.ref=out\nappender.out.type=Console\n"
            "appender.out.name=out\nappender.out.target=SYSTEM_ERR\nappender.out.layout.type=PatternLayout\n"
            "appender.out.layout.pattern=%d{HH:mm:ss.SSS} %-5p %c{1} - %m%n\n"
            "logger.dbz.name=io.debezium\nlogger.dbz.level=INFO\n")
        self.log4j = root / "log4j2.properties"
        self.log = root / "embedded.log"
        self.slots, self.expected, self.timeout_s = slots, expected, timeout_s
        self.proc: subprocess.Popen | None = None

    def run(self) -> list[dict]:
        """Each slot's line (``seconds``: engine built -> last record; ``jvm_uptime_s``: JVM start -> built)."""
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("Java 17+ is needed for Debezium's embedded engine")
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [java, "-Xmx1g", f"-Dlog4j2.configurationFile={self.log4j}", "-cp", f"{self.jars}/*",
                 EMBEDDED_MAIN, str(self.props), str(self.expected), str(int(self.timeout_s)), *self.slots],
                stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
            try:
                out, _ = self.proc.communicate(timeout=self.timeout_s * len(self.slots) + 120)
            except subprocess.TimeoutExpired:
                self.stop()
                raise RuntimeError("the embedded engine did not end: "
                                   + self.log.read_text(errors="replace")[-3000:]) from None
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        bad = [x for x in lines if not x["ok"]]
        if self.proc.returncode != 0 or bad or len(lines) != len(self.slots):
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the embedded engine failed (rc {self.proc.returncode}): {bad or lines}\n{tail}")
        return lines

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _end_offsets(bootstrap: str, topics: list[str]) -> int:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reclock-pgdbz-probe", "enable.auto.commit": False})
    try:
        n = 0
        for t in topics:
            try:
                n += c.get_watermark_offsets(TopicPartition(t, 0), timeout=5)[1]
            except KafkaException:  # the topic comes with the connector's first record of its table
                pass
        return n
    finally:
        c.close()


def connect_run(state: StackState, bootstrap: str, dsn: str, slot_prefix: str, expected: int,
                timeout_s: float) -> dict:
    """Debezium in Kafka Connect over slot ``<slot_prefix>_slot``: worker start -> every change in the topics."""
    from reclock.dev.connect import LocalConnect

    props = debezium_props(dsn, slot_prefix)
    extra = {k: props[k] for k in ("publication.name", "publication.autocreate.mode", "snapshot.mode",
                                   "tombstones.on.delete", "provide.transaction.metadata")}
    worker = LocalConnect(state, bootstrap, dsn, tuple(f"public.{t}" for t in TABLES), prefix=slot_prefix,
                          schemas=False, transactions=False, heap="1g", jvm_flags=(), extra=extra)
    topics = [worker.topic(f"public.{t}") for t in TABLES]
    try:
        t0 = time.perf_counter()
        worker.start(timeout=max(180.0, timeout_s))  # a JVM's start on a loaded machine
        running = time.perf_counter() - t0
        deadline = time.perf_counter() + timeout_s
        while (n := _end_offsets(bootstrap, topics)) < expected:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"Kafka Connect wrote {n} of {expected} records in {timeout_s:.0f} s")
            time.sleep(0.05)
        secs = time.perf_counter() - t0
        time.sleep(0.5)  # a record past the expected count would show here
        n = _end_offsets(bootstrap, topics)
        if n != expected:
            raise RuntimeError(f"Kafka Connect wrote {n} records for {expected} changes")
        return {"seconds": secs, "running_s": running, "records": n}
    finally:
        worker.stop()


def reclock_run(ctx: cycle.CycleContext, db: str, emitted: int) -> float:
    """The one cycle that ingests the backlog, timed; checked that it wrote every row of change."""
    t0 = time.perf_counter()
    out = cycle.run_cycle(ctx)
    secs = time.perf_counter() - t0
    assert out["descriptions"] == 1, out
    with psycopg.connect(db, autocommit=True) as conn:
        rows = conn.execute("SELECT metrics->'records' FROM reclock.statistics WHERE name = %s AND step = "
                            "'write_batches' ORDER BY id DESC LIMIT 1", (ctx.spec.name,)).fetchone()[0]
    written = sum(rows.values()) if isinstance(rows, dict) else rows
    if written != emitted:
        raise RuntimeError(f"Reclock's cycle wrote {written} rows of change, the backlog emits {emitted}")
    return secs


FRESH_SOURCES = {"upstream": "pgfresh", "continuous": "pgcont"}
"""The freshness run's Reclock sources on table ``f``, by schedule: each its own slot."""
POLL_S = 0.02


def _percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def freshness(txns: int, gap_s: float, echo=print) -> dict[str, dict]:
    """One small transaction committed -> visible in the collection of each Reclock source under the real
    scheduler (``schedule: upstream`` and ``continuous``, poll 200 ms), beside -> in Debezium's topic (Kafka
    Connect); seconds per transaction for each, p50 and p95."""
    import random

    from confluent_kafka import Consumer, TopicPartition

    from benchmarks.freshness import _wait_first_cycle, bench_stack
    from reclock.dev.connect import LocalConnect
    from reclock.persist import connect as consensus
    from reclock.persist.blob import LocalBlobStore
    from reclock.persist.shards import shard_info
    from reclock.read import read_updates

    sources = {name: {"postgres": {"dsn_env": "PGDBZ_UPSTREAM_DSN", "publication": "fresh_pub"},
                      "tables": ["public.f"], "schedule": schedule, "poll": "200ms",
                      "budget": {"max_records": 100_000}} for schedule, name in FRESH_SOURCES.items()}
    shards = {schedule: f"{name}__f" for schedule, name in FRESH_SOURCES.items()}
    with bench_stack("reclock-pgdbz-fresh-", "pg freshness", sources, echo) as (root, stack):
        up = stack.postgres.dsn("upstream")
        os.environ["PGDBZ_UPSTREAM_DSN"] = up  # the scheduler's task processes inherit it
        echo("pg freshness: bringing the stack up (Postgres, Kafka, Airflow) ...")
        stack.up(services=("postgres", "kafka", "airflow"), echo=lambda line: echo(f"  {line}"))
        with psycopg.connect(stack.postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE upstream")
        with psycopg.connect(up, autocommit=True) as conn:
            conn.execute("CREATE TABLE f (id int8 PRIMARY KEY, v text)")
            conn.execute("ALTER TABLE f REPLICA IDENTITY FULL")
            conn.execute("INSERT INTO f VALUES (0, 'snapshot')")
            conn.execute("CREATE PUBLICATION fresh_pub FOR TABLE f")
        worker = LocalConnect(stack.state, stack.kafka.bootstrap, up, ("public.f",), prefix="fresh",
                              transactions=False, heap="512m", jvm_flags=(),
                              extra={"publication.name": "fresh_pub", "publication.autocreate.mode": "disabled",
                                     "tombstones.on.delete": "false"})
        probe = Consumer({"bootstrap.servers": stack.kafka.bootstrap, "group.id": "reclock-pgdbz-fresh"})
        try:
            worker.start()
            for name in FRESH_SOURCES.values():
                stack.airflow.wait_for_dag(f"ingest__{name}", timeout=180)
                stack.airflow.unpause(f"ingest__{name}")
            for shard in shards.values():
                _wait_first_cycle(stack.postgres.dsn(), source=shard)
            tp = TopicPartition(worker.topic("public.f"), 0)
            deadline = time.monotonic() + 120
            while True:  # the connector's snapshot of the one row
                try:
                    if probe.get_watermark_offsets(tp, timeout=5)[1] >= 1:
                        break
                except Exception:  # noqa: BLE001 - the topic comes with the first record
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("Debezium wrote no snapshot record in 120 s")
                time.sleep(0.2)
            cons = consensus(stack.postgres.dsn())
            blob = LocalBlobStore(stack.state.root / "blobs")
            rng = random.Random(33)
            lat: dict[str, list[float]] = {k: [] for k in (*shards, "debezium")}
            uppers = {k: shard_info(cons, shard).upper for k, shard in shards.items()}
            offset = probe.get_watermark_offsets(tp, timeout=5)[1]
            with psycopg.connect(up, autocommit=True) as conn:
                for i in range(1, txns + 3):
                    time.sleep(gap_s * rng.uniform(0.5, 1.5))
                    conn.execute("INSERT INTO f VALUES (%s, 'fresh')", (i,))  # one transaction (autocommit)
                    t0 = time.perf_counter()
                    seen: dict[str, float] = {}
                    while len(seen) < len(lat):
                        if time.perf_counter() - t0 > 120:
                            raise TimeoutError(f"transaction {i}: only {sorted(seen)} saw it in 120 s")
                        for k, shard in shards.items():
                            if k in seen:
                                continue
                            new = shard_info(cons, shard).upper
                            if new > uppers[k]:
                                t = read_updates(cons, blob, shard, uppers[k], new)
                                uppers[k] = new
                                if t is not None and i in t.column("id").to_pylist():
                                    seen[k] = time.perf_counter() - t0
                        if "debezium" not in seen:
                            end = probe.get_watermark_offsets(tp, timeout=5)[1]
                            if end > offset:
                                if end != offset + 1:
                                    raise RuntimeError(f"transaction {i}: Debezium wrote {end - offset} records")
                                offset = end
                                seen["debezium"] = time.perf_counter() - t0
                        time.sleep(POLL_S)
                    if i > 2:  # the first two untimed
                        for k, v in seen.items():
                            lat[k].append(v)
                    echo(f"  transaction {i}: " + ", ".join(f"{k} {seen[k]:.2f} s" for k in lat)
                         + f" (load {os.getloadavg()[0]:.1f})")
            cons.close()
        finally:
            probe.close()
            worker.stop()
    figures = {}
    labels = {k: f"Reclock under the scheduler (schedule: {k}, poll 200ms)" for k in shards}
    labels["debezium"] = "Debezium in Kafka Connect (poll.interval.ms 100)"
    for k, label in labels.items():
        figures[f"freshness p50 s: {label}"] = {"value": _percentile(lat[k], 0.5)}
        figures[f"freshness p95 s: {label}"] = {"value": _percentile(lat[k], 0.95)}
    for k in shards:
        figures[f"ratio: freshness p50, Reclock {k} / Debezium"] = {
            "value": _percentile(lat[k], 0.5) / _percentile(lat["debezium"], 0.5)}
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=3, help="Reclock cycles, and warm embedded engines")
    ap.add_argument("--budget", type=int, default=100_000, help="rows per Parquet part")
    ap.add_argument("--no-connect", action="store_true", help="leave out Kafka Connect (and the broker)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a peer may take to deliver the backlog")
    ap.add_argument("--freshness", action="store_true",
                    help="freshness of one small transaction under the scheduler beside Debezium's, instead")
    ap.add_argument("--txns", type=int, default=20, help="--freshness: timed transactions")
    ap.add_argument("--gap", type=float, default=3.0, help="--freshness: seconds between transactions (jittered)")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    stop.install()  # SIGTERM or Ctrl-C: the finally blocks stop what this run started
    if args.freshness:
        load0 = os.getloadavg()
        figures = freshness(args.txns, args.gap)
        print(f"\n{args.txns} transactions of one row, load average at start {load0[0]:.1f}, at end "
              f"{os.getloadavg()[0]:.1f} (a shared machine: only the ratio means anything)")
        for name, f in figures.items():
            print(f"{name:<80} {f['value']:>8.3f}")
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2))
        return 0
    root = Path(tempfile.mkdtemp(prefix="reclock-pgdbz-"))
    root.chmod(0o755)
    state = StackState(root)
    pg = LocalPostgres(state, fast=True)
    kafka = None
    embedded: Embedded | None = None
    figures: dict[str, dict] = {}
    try:
        pg.start()
        up, db = make_databases(pg, PUBLICATION)
        ctxs = []
        for i in range(args.reps):  # each source's slot comes with its first cycle (an empty snapshot)
            spec = parse_source(f"bench{i}", {"postgres": {"dsn_env": "UNUSED", "publication": PUBLICATION},
                                              "tables": list(TABLES), "budget": {"max_records": args.budget}})
            ctx = cycle.CycleContext(spec=spec, dsn=db, blob=LocalBlobStore(root / "blobs"), upstream=up,
                                     gc_grace_s=0)
            cycle.run_cycle(ctx)
            ctxs.append(ctx)
        emb_slots = [f"emb_{i}" for i in range(args.reps + 1)]
        create_slots(up, emb_slots + ([] if args.no_connect else ["dbz_slot"]))
        embedded = None
        if not args.no_connect:
            from reclock.dev.kafka import LocalKafka

            kafka = LocalKafka(state, heap="512m")
            kafka.start()
        load0 = os.getloadavg()
        emitted = _fill_changes(up, args.changes, base=0)
        changes = count_changes(up, emb_slots[0])
        print(f"backlog: {args.changes} statements, {changes} row changes ({emitted} rows of change in Reclock's "
              f"collections, an update two) committed; load {load0[0]:.1f}", flush=True)
        embedded = Embedded(state, root, up, emb_slots, changes, args.timeout)  # built before the clock

        reclock_s: list[float] = []
        emb: list[dict] = []
        conn_run: dict | None = None
        turns = ["reclock", "embedded"] + (["reclock", "connect"] if not args.no_connect else [])
        turns += ["reclock"] * (args.reps - turns.count("reclock"))
        for turn in turns:
            if turn == "reclock" and len(reclock_s) < args.reps:
                reclock_s.append(reclock_run(ctxs[len(reclock_s)], db, emitted))
                print(f"reclock cycle {len(reclock_s)}: {reclock_s[-1]:.2f} s (load {os.getloadavg()[0]:.1f})",
                      flush=True)
            elif turn == "embedded":
                emb = embedded.run()
                print("embedded engine: " + ", ".join(
                    f"{x['slot']} {x['seconds']:.2f} s (first record {x['first_s']:.2f} s, JVM up {x['jvm_uptime_s']:.2f} s)"
                    for x in emb) + f" (load {os.getloadavg()[0]:.1f})", flush=True)
            elif turn == "connect":
                conn_run = connect_run(state, kafka.bootstrap, up, "dbz", changes, args.timeout)
                print(f"kafka connect: {conn_run['seconds']:.2f} s (task running after {conn_run['running_s']:.2f} s) "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)

        r = statistics.median(reclock_s)
        cold = emb[0]["jvm_uptime_s"] + emb[0]["seconds"]
        warm = statistics.median(x["seconds"] for x in emb[1:])
        figures["changes/s: Reclock's cycle, end to end (median)"] = {"value": changes / r, "seconds": r}
        figures["changes/s: Debezium embedded engine, cold (JVM start to last record)"] = {
            "value": changes / cold, "seconds": cold}
        figures["changes/s: Debezium embedded engine, warm (engine build to last record, median)"] = {
            "value": changes / warm, "seconds": warm}
        figures["ratio: Reclock / embedded engine, cold"] = {"value": cold / r}
        figures["ratio: Reclock / embedded engine, warm (target >= 2)"] = {"value": warm / r}
        if conn_run is not None:
            c = conn_run["seconds"]
            figures["changes/s: Debezium in Kafka Connect (worker start to all in the topics)"] = {
                "value": changes / c, "seconds": c}
            figures["ratio: Reclock / Kafka Connect"] = {"value": c / r}
        met = figures["ratio: Reclock / embedded engine, warm (target >= 2)"]["value"] >= TARGET_VS_WARM_EMBEDDED
        print(f"\n{changes} row changes ({emitted} rows in Reclock's collections), {args.reps} reps, load average at start "
              f"{load0[0]:.1f}, at end {os.getloadavg()[0]:.1f} (a shared machine: only the ratios mean anything)")
        for name, f in figures.items():
            extra = f" ({f['seconds']:.2f} s)" if "seconds" in f else ""
            print(f"{name:<80} {f['value']:>12,.2f}{extra}")
        per_emb = " / ".join(f"{x['seconds']:.2f}" for x in emb)
        print(f"per rep (s): Reclock {' / '.join(f'{s:.2f}' for s in reclock_s)}; embedded {per_emb} (the first "
              f"cold, after {emb[0]['jvm_uptime_s']:.2f} s of JVM start)"
              + (f"; Connect {conn_run['seconds']:.2f}" if conn_run else ""))
        print(f"target (Reclock >= {TARGET_VS_WARM_EMBEDDED:.0f}x a warm embedded engine): {'met' if met else 'MISSED'}")
        if args.out:
            Path(args.out).write_text(json.dumps(figures, indent=2))
        return 0
    finally:
        if embedded is not None:
            embedded.stop()
        if kafka is not None:
            kafka.stop(grace=10)
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
