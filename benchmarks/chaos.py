"""The fault campaign (issue 15): sources and a sink under random faults, checked by an oracle that reads the
upstream itself.

    python -m benchmarks.chaos --faults 200 --seed 7

It starts its own services in a temporary folder (``reclock.dev``, all on 127.0.0.1), in a deployment's
shape: Reclock's Postgres (its consensus) with a synchronous streaming standby; an upstream Postgres (the
CDC source's database and Airflow's metadata); a Kafka cluster of three KRaft nodes (replication factor 3,
``min.insync.replicas`` 2, the transaction state log replicated: ``LocalKafkaCluster``); Spark as a
standalone cluster of two 1-core workers, each its own executor JVM, and a Spark Connect server whose jobs
run on them (``--spark-connects 2``: two that stand in for each other, ``reclock.spark.connect``); Toxiproxy
between Reclock's processes and Postgres and each Kafka node. It starts on the PREVIOUS RELEASE
(``benchmarks.release``: its wheel, built from the repository's history), which makes Reclock's database and
runs cycles and the sink until the ``upgrade`` fault moves the deployment to this checkout. It runs, with
producers writing throughout at bounded rates:

- ``app``: an append-only JSON source over a 2-partition topic;
- ``ups``: an upsert source over a 3-partition topic (12 keys, some deletes);
- ``txn``: an append-only JSON source over a 3-partition topic fed by a transactional producer that aborts
  one transaction in four;
- ``pgs``: a Postgres CDC source over a publication of two tables (``orders``, ``items``: inserts, updates,
  deletes, transactions over both, unchanged TOASTed values, a 700-row transaction now and then) in a
  database of the same Postgres, whose first cycle snapshots the tables while the writer runs;
- ``afl``: an append-only JSON source over a 2-partition topic whose cycles run under Airflow: the real
  scheduler, api-server and dag-processor (metadata in the same Postgres) run ``ingest__afl`` every 2 s,
  with Airflow's task retries (``[core] default_task_retries`` 5, 1 s apart);
- ``out``: the exactly-once Kafka sink of ``ups`` (debezium), ``reclock sink run out --follow``;
- with ``--kinesis``, also ``clicks``: a Kinesis source over a stream of the local Kinesis endpoint
  (kinesalite, ``reclock.dev.kinesis``), a producer putting records throughout and the stream split and
  merged every 20-40 s (``benchmarks.kinesis_chaos``'s ``Resharder``); its cycles run in a runner process
  like the others' (cycle kills and fail points pick it too; Postgres restarts and the network faults to
  Postgres meet it; the Kinesis endpoint itself is not faulted here: ``benchmarks.kinesis_chaos`` throttles
  it and expires iterators). Off by default: the short campaign in the suite stays as long as it was.

Each source's cycles run in a process of their own (``--runner SOURCE``: ``run_cycle`` in a loop, Spark over
Spark Connect), so cycles of different sources run concurrently. At moments the seed chooses it injects:

==================  =======================================================================================
fault               what happens
==================  =======================================================================================
cycle_sigkill       SIGKILL of a source's cycle process, wherever it is (mint, a Spark job, the slot's peek,
                    append, the slot's advance)
cycle_failpoint     a cycle process relaunched with ``RECLOCK_FAILPOINTS=<point>=exit``: it dies exactly there
                    (``append:in_transaction`` among them)
airflow_task_kill   SIGKILL of the process running a task of ``ingest__afl`` (``mint_write`` or ``append``,
                    wherever it is); Airflow retries it
sink_sigkill        SIGKILL of the sink process (often inside its open transaction)
sink_failpoint      the sink relaunched with ``sink:in_transaction=exit``
pg_restart          ``pg_ctl restart -m immediate`` of Reclock's primary and of the upstream Postgres (every open
                    transaction is lost; Airflow's metadata goes away too)
kafka_restart       every Kafka node SIGKILLed and started again
spark_restart       the Spark Connect server (the driver; of two, the one the seed picks) SIGKILLed and started
                    again
spark_worker_kill   a cluster worker SIGKILLed with its executor (often mid-job: its tasks are retried on the
                    other), started again 0-10 s later
scheduler_kill      one of Airflow's two schedulers (highly available, ``HA_SETTINGS``) SIGKILLed with its
                    executor's task processes; a service manager starts it again
net_latency         the network between Reclock and Postgres or Kafka (a Toxiproxy proxy, ``reclock.dev.toxiproxy``,
                    on every path from cycles, the sink, Airflow's tasks and Spark's Kafka reader) delays each
                    chunk 300 +- 200 ms, for 5-20 s
net_reset           every connection through one of those proxies reset (TCP RST), new ones too, for 1-3 s
net_blackhole       one of those proxies accepts data and delivers none for 3-12 s (only clients' own
                    timeouts end the wait: ``RECLOCK_PG_TIMEOUT_S`` is 30 s here); connections that lived
                    through it lost data and are unusable after
broker_kill         one Kafka node SIGKILLed: the leader of a partition a source reads, the transaction
                    coordinator of the sink's (or the transactional producer's) ``transactional.id``, or the
                    active controller (the seed picks the role); started again 0-5 s later, the fault ends
                    once its replicas are in sync again (``kafka_restart`` kills every node: an outage)
standby_promotion   a consensus failover: Reclock's primary crashed (``pg_ctl stop -m immediate``), its
                    synchronous standby promoted and the proxy every Reclock process reaches it through
                    pointed at the new primary; a new synchronous standby of it is made (a base backup) for
                    the next one. The campaign goes on on the new primary; nothing acknowledged may be lost
upgrade             once, first: the previous release's processes (cycles of every runner source and the
                    sink, ``reclock cycle`` / ``reclock sink run`` in loops, started on the database it
                    migrated; one whose step wrote waits for the others') SIGKILLed wherever they are
                    in the round of steps begun once each has written (a cycle bound offsets), this
                    checkout's ``reclock migrate``, and the campaign's own processes carry on from that state
==================  =======================================================================================

After each fault the system catches up as an operator's rerun would: a dead cycle or sink process is
started again, an Airflow component that died (Postgres restarts take the scheduler's database away) is
started again, and Airflow retries a killed task or runs the next interval. At the end the producers stop, every source runs cycles until nothing is left, the sink runs
to the shard's upper, and the ORACLE checks, from a ``read_committed`` reading of every topic:

- append sources: every committed record in the shard exactly once (aborted ones never), with ``diff`` 1,
  each at the timestamp of the binding that covers its offset (``remap.reclock`` over the bindings);
- upsert: the collection AS OF every binding equals the latest value per key computed from the topic;
- Postgres: each table's collection AS OF every binding equals the writer's committed transactions (its
  ``chaos_log`` table, written in each transaction) replayed in commit-LSN order below the binding's LSN,
  the commit LSNs read by the oracle's own slot (``chaos_observer``, Begin messages); every row a
  transaction wrote carries the timestamp of the binding that covers its commit LSN; the last binding's
  contents equal the tables themselves; the source's slot is never ahead of the last binding;
- sink: the target topic (read_committed) equals the shard's updates exactly once, in timestamp order;
- Kinesis (``--kinesis``): ``benchmarks.kinesis_chaos.check``, an oracle that reads every shard of the stream
  itself from ``TRIM_HORIZON``: every record once, at the timestamp of the first binding beyond it, children
  after their parents, AS OF bindings equal to what they cover, and every record the producer had
  acknowledged bound.

The faults begin once every source has finished a cycle and a run of ``ingest__afl`` succeeded (the warm-up,
at most ``WARMUP_S``). It prints faults by kind, records checked, lost, duplicated, wrong timestamps, the seed,
the wall time and Airflow's longest stall (no run of ``ingest__afl`` succeeded) and longest idle stretch (no
try of it running either) while the faults ran, and exits 1 on any discrepancy, or when Airflow stayed idle for
more than ``AIRFLOW_STALL_S`` (the catch-up lands ``afl`` without Airflow, so the oracle alone would not see
it). :func:`campaign` is what ``tests/chaos/test_chaos_short.py`` runs.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import faulthandler
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from benchmarks import stop

FAULT_KINDS = ("cycle_sigkill", "cycle_failpoint", "airflow_task_kill", "sink_sigkill", "sink_failpoint",
               "pg_restart", "kafka_restart", "spark_restart", "spark_worker_kill", "scheduler_kill",
               "net_latency", "net_reset", "net_blackhole", "broker_kill", "standby_promotion", "upgrade")
WEIGHTS = {"cycle_sigkill": 25, "cycle_failpoint": 15, "airflow_task_kill": 15, "sink_sigkill": 15,
           "sink_failpoint": 8, "pg_restart": 10, "kafka_restart": 5, "spark_restart": 8, "spark_worker_kill": 10,
           "scheduler_kill": 8, "net_latency": 8, "net_reset": 8, "net_blackhole": 8, "broker_kill": 12,
           "standby_promotion": 5, "upgrade": 0}
ONCE_KINDS = ("upgrade",)
"""Kinds that happen once, before the other faults: ``upgrade`` (the campaign starts on the previous release,
:func:`upgrade`); never drawn in the fault loop."""
NET_TARGETS = ("postgres", "kafka")  # the services behind proxies (Postgres: Reclock's and the upstream's)
BROKER_ROLES = ("leader", "coordinator", "controller")  # broker_kill's target: which node's role the seed picks
KAFKA_NODES = 3  # the campaign's Kafka cluster (replication factor 3, min.insync.replicas 2)
UPGRADE_S = 600.0
"""The previous release's phase ends once each of its sources has cycled and its sink has run, or after this
long (it is the warm-up too: its first jobs meet cold executors; like :data:`WARMUP_S`)."""
PG_TIMEOUT_S = 30  # RECLOCK_PG_TIMEOUT_S of the campaign's processes: a black hole to Postgres ends a step in 30 s
CYCLE_FAILPOINTS = ("mint:after_binding", "write_batches:before_job", "write_batches:after_slice",
                    "append:in_transaction", "resume:after_commit")
SOURCES = {"app": 2, "ups": 3, "txn": 3, "afl": 2}  # the Kafka sources: name -> partitions
PG_SOURCE = "pgs"  # the Postgres CDC source over PG_TABLES of the database UPSTREAM_DB
PG_TABLES = ("orders", "items")
UPSTREAM_DB = "chaos_up"
OBSERVER_SLOT = "chaos_observer"  # the oracle's own slot: every commit's LSN, read from the WAL
RUNNERS = ("app", "ups", "txn", PG_SOURCE)  # the sources whose cycles run in runner processes; afl's under Airflow
S3_WRITER_PAUSE = (0.5, 2.0)
"""--s3: seconds between the writer's objects (one per prefix): ~30 records an object, ~20 records/s a source, the
Kafka producers' ``rate``. ``benchmarks.s3_chaos``'s own pace (an object every ~0.2 s) is for a machine that runs
nothing else: beside the whole campaign at load 25-30, moto took ~7 s a receive of 10 messages, the queue grew by
~3 a second and a notifications source could never drain it."""
S3_BUCKET = "landing"  # --s3: benchmarks.s3_chaos's two sources (its SOURCES: listing and notifications), writer, oracle
ICEBERG_SINK = "lake"  # --iceberg: an Iceberg export of ``app``
KINESIS_SOURCE = "clicks"  # --kinesis: benchmarks.kinesis_chaos's source and stream (its Resharder and oracle)
KINESIS_RESHARD_S = (20.0, 40.0)
AIRFLOW_SOURCE = "afl"
AIRFLOW_STALL_S = 300
"""The longest Airflow may leave ``ingest__afl`` with no try running and no run succeeding while the faults run
(its *idle* stretch; the campaign fails beyond it): Airflow's own default recovery time of a task whose process
died (``task_instance_heartbeat_timeout``, 300 s) or that a dead scheduler left behind (``orphaned_tasks_check_
interval``, 300 s). The dev stack's ``reclock.dev.airflow.HA_SETTINGS`` bring both under 100 s. The *stall*
(no run succeeded, tries running or not) is reported beside it, not checked: a try's own length is the
machine's speed (a Spark Connect server killed mid-try comes back with cold executors; on a loaded 2-core
machine its first jobs take minutes). Until issue 37 a run's write grew with every failed try and, under a
fault every ~45 s, no try finished for 52-56 minutes; a run now writes for about one interval
(``cycle.mint_and_write``)."""
GC_GRACE_S = 20.0
"""The campaign's default ``RECLOCK_GC_GRACE_S`` (an hour in production): short, so that garbage collection
deletes what killed writes left while the faults run, even in the suite's few-minute campaigns. A retried write
takes an earlier write's slices only while they are younger than half of it (``reclock.persist.staged.
reusable_age_s``): 10 s here, so retries write every slice again. ``--gc-grace`` sets it (issue 37's runs of the
Airflow stall: 600, slices reusable for 5 minutes, orphans still collected ten minutes after their write)."""
FIRST_TRIES = 3  # how often a kind that missed (its process never got there) is tried before the others go on
WARMUP_S = 600.0
"""The faults start once every source has finished a cycle and a run of ``ingest__afl`` succeeded (cold Spark
executors on a loaded machine take minutes over the first jobs), or after this long."""
BIG_EVERY = 150  # every this many writer transactions, a large one (700 rows of items: above the budget)
UPSERT_KEYS = 12
REPO = Path(__file__).resolve().parents[1]
WATCHDOG_S = 300.0  # a cycle or sink process silent for this long is stuck (or starved): killed and reported
STEP_TIMEOUT = "2m"
"""Every source's ``step_timeout``: a write's Spark work interrupted past it fails the try (and Airflow's
``execution_timeout`` of ``mint_write`` follows from it), well inside :data:`WATCHDOG_S`. The seed-101 run had
none: one try sat 12.5 minutes in a Spark job queued behind a single executor at load ~60."""


def _echo(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- the runner

def run_cycles(source: str, *, once: bool = False, until_idle: bool = False, catch_up_cycles: int = 30,
               idle_cycles: int = 1, pause: float = 0.3, idle_pause: float | None = None,
               busy: Callable[[Any], bool] | None = None) -> int:
    """A campaign's cycle process (``--runner SOURCE``): ``run_cycle`` of ``source`` in a loop, settings from
    the environment; a line ``ready``, then one JSON line per cycle (its result and ``s``, its seconds),
    ``pause`` seconds between cycles. ``once``: one cycle (exit 0 if it found nothing new, else 3);
    ``until_idle`` (the catch-up after the faults): until ``idle_cycles`` cycles in a row found nothing new
    while ``busy(ctx)`` (upstream holds what no cycle could see yet) is false, ``idle_pause`` between cycles;
    exit 3 after ``catch_up_cycles`` cycles that did not get there. A watchdog's SIGUSR1 prints where it is."""
    from reclock.config import load_config
    from reclock.cycle import run_cycle
    from reclock.orchestration.contexts import cycle_context

    faulthandler.register(signal.SIGUSR1)  # the watchdog asks where a silent runner is stuck
    ctx = cycle_context(load_config(None).source(source))
    print("ready", flush=True)
    idle = 0
    for _ in range(catch_up_cycles if until_idle else 1 if once else sys.maxsize):
        t0 = time.monotonic()
        out = run_cycle(ctx)
        print(json.dumps({**out, "s": round(time.monotonic() - t0, 2)}, default=str), flush=True)
        found_nothing = out["minted"] is None and out["descriptions"] == 0
        if once:
            return 0 if found_nothing else 3
        idle = idle + 1 if found_nothing else 0
        if until_idle and idle and busy is not None and busy(ctx):
            idle = 0
        if until_idle and idle >= idle_cycles:
            return 0
        time.sleep(idle_pause if until_idle and idle_pause is not None else pause)
    return 3


def catch_up(module: str, source: str, env: dict[str, str], log: Path, timeout: float = 1800) -> list[dict] | None:
    """Run ``python -m <module> --runner <source> --until-idle`` (its :func:`run_cycles`) to the end, its output
    in ``log``: the cycles' results, or None (said, with the log's end) if the process failed."""
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", module, "--runner", source, "--until-idle"], env=env, cwd=REPO,
                           stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text()
    if r.returncode != 0:
        _echo(f"catch-up of {source} failed (exit {r.returncode}):\n{text[-5000:]}")
        return None
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def runner(source: str, once: bool = False, until_idle: bool = False) -> int:
    """The sources' cycle process (:func:`run_cycles`): the catch-up ends at the first cycle that finds
    nothing new (the Kinesis source's: the second in a row, ``benchmarks.kinesis_chaos.runner``)."""
    from benchmarks.s3_chaos import SOURCES as S3_SOURCES

    if source == KINESIS_SOURCE:
        from benchmarks.kinesis_chaos import runner as kinesis_runner

        return kinesis_runner(source, until_idle)
    if source in S3_SOURCES:
        from benchmarks.s3_chaos import runner as s3_runner

        return s3_runner(source, until_idle)
    return run_cycles(source, once=once, until_idle=until_idle)


# ------------------------------------------------------------------------------------------- the services

@dataclass
class Services:
    root: Path
    state: object
    postgres: object
    kafka: object
    spark: object
    toxiproxy: object
    upstream: object = None  # the upstream Postgres (the CDC source's database, Airflow's metadata)
    standby: object = None  # the synchronous standby of ``postgres`` (Reclock's consensus), promoted by a fault
    proxies: dict = field(default_factory=dict)  # proxy name -> reclock.dev.toxiproxy.Proxy
    kinesis: object = None  # --kinesis: reclock.dev.kinesis.LocalKinesis
    s3: object = None  # --s3: reclock.dev.s3.LocalS3 (moto: S3 and SQS)
    retired: list = field(default_factory=list)  # primaries that crashed for a promotion (stopped at the end)
    promotions: int = 0
    sink_transactional_id: str = ""  # the campaign sink's (broker_kill aims at its coordinator)
    gc_grace_s: float = GC_GRACE_S  # RECLOCK_GC_GRACE_S of every process

    def proxied_dsn(self, db: str = "reclock") -> str:
        """A DSN of database ``db`` through its proxy (what Reclock's processes use): ``UPSTREAM_DB`` on the
        upstream Postgres, any other on Reclock's (whichever server is its primary now)."""
        from psycopg.conninfo import make_conninfo

        if db == UPSTREAM_DB:
            return make_conninfo(self.upstream.dsn(db), port=str(self.state.port("upstream_proxy")))
        return make_conninfo(self.postgres.dsn(db), port=str(self.postgres_proxy_port))

    @property
    def postgres_proxy_port(self) -> int:
        """Where the proxy to Postgres listens (chosen before anything starts: Airflow's settings name it)."""
        return self.state.port("postgres_proxy")

    def target_proxies(self, target: str) -> list:
        """The proxies a network fault to ``target`` (one of :data:`NET_TARGETS`) acts on."""
        return [p for name, p in self.proxies.items()
                if name.split("-")[0] == target or (target == "postgres" and name == "upstream")]

    def env(self, config: Path) -> dict[str, str]:
        path = os.pathsep.join([str(REPO / "include"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        return {**os.environ, "PYTHONPATH": path, "RECLOCK_CONFIG": str(config), "RECLOCK_DSN": self.proxied_dsn(),
                "RECLOCK_BLOB_URL": str(self.root / "blobs"), "RECLOCK_SPARK_REMOTE": self.spark.remote,
                "RECLOCK_RETAIN_HISTORY_S": "1000000000",  # keep every time readable: the oracle checks each
                "RECLOCK_GC_GRACE_S": f"{self.gc_grace_s:g}", "RECLOCK_GC_INTERVAL_S": "5",  # GC beside the faults
                "RECLOCK_PG_TIMEOUT_S": str(PG_TIMEOUT_S),
                "RECLOCK_FAILPOINTS": "", "CHAOS_UPSTREAM_DSN": self.proxied_dsn(UPSTREAM_DB),
                **({} if self.kinesis is None and self.s3 is None else AWS_KEYS),
                **({} if self.kinesis is None else {"RECLOCK_KINESIS_ENDPOINT": self.kinesis.endpoint_url}),
                **({} if self.s3 is None else {"AWS_ENDPOINT_URL_S3": self.s3.endpoint_url,
                                               "RECLOCK_S3_PATH_STYLE": "true"})}


AWS_KEYS = {"AWS_ACCESS_KEY_ID": "reclock-dev", "AWS_SECRET_ACCESS_KEY": "reclock-dev", "AWS_REGION": "us-east-1"}
"""The keys of ``--kinesis`` and ``--s3`` (kinesalite and moto check none; boto3 needs some)."""


def make_services(root: Path, kinesis: bool = False, s3: bool = False, spark_connects: int = 1,
                  gc_grace_s: float = GC_GRACE_S) -> Services:
    """The campaign's services under ``root``, not started yet (their ports are chosen: the configuration and
    Airflow's settings can be written before they run); ``gc_grace_s``: garbage collection's grace period in
    every process the campaign starts."""
    from reclock.dev.cluster import LocalSparkCluster
    from reclock.dev.kafka import LocalKafkaCluster
    from reclock.dev.postgres import LocalPostgres, LocalStandby
    from reclock.dev.state import StackState
    from reclock.dev.toxiproxy import LocalToxiproxy

    state = StackState(root / "state")
    pg = LocalPostgres(state, fast=True)  # Reclock's consensus, with a synchronous standby
    # three KRaft nodes; clients of the config reach each through a proxy of its own
    kafka = LocalKafkaCluster(state, size=KAFKA_NODES, heap="384m", proxied=True)
    spark = LocalSparkCluster(state, workers=2, worker_cores=1, worker_memory="1g", executor_memory="768m",
                              driver_memory="1g", connects=spark_connects)
    svc = Services(root, state, pg, kafka, spark, LocalToxiproxy(state),
                   upstream=LocalPostgres(state, fast=True, name="postgres_upstream"),
                   standby=LocalStandby(state, pg, synchronous=True), gc_grace_s=gc_grace_s)
    if kinesis:
        from reclock.dev.kinesis import LocalKinesis

        svc.kinesis = LocalKinesis(state)
    if s3:
        from reclock.dev.s3 import LocalS3

        svc.s3 = LocalS3(state)
    if kinesis or s3:
        # the Spark workers' executors read a range from the stream when its capture is gone, and objects:
        # boto3 needs keys (the endpoints check none) in their environment, which they take from this process
        os.environ.update(AWS_KEYS)
        if s3:
            os.environ.update(AWS_ENDPOINT_URL_S3=svc.s3.endpoint_url, RECLOCK_S3_PATH_STYLE="true")
    return svc


def start_services(svc: Services, beside_postgres: Callable[[], object] | None = None,
                   migrate_with: Callable[[str], None] | None = None) -> Future | None:
    """Start ``svc`` (the Spark cluster, the Postgres servers, the Kafka nodes and the proxies side by side:
    their start-ups wait on ports and logs more than they compute). ``beside_postgres`` (Airflow's start: it
    needs its metadata database, on the upstream server, only) runs in a thread of its own once Postgres is
    up; its future is returned, still running: the caller waits for it (and for it before stopping what it
    starts). ``migrate_with(dsn)`` migrates Reclock's database (default: this checkout's ``migrate``)."""
    from reclock.persist.migrate import migrate

    pg, kafka, spark = svc.postgres, svc.kafka, svc.spark
    beside = None
    try:
        with ThreadPoolExecutor(3) as pool:
            cluster = pool.submit(spark.start)
            consensus = pool.submit(pg.start)
            svc.upstream.start()
            if beside_postgres is not None:
                beside_pool = ThreadPoolExecutor(1, thread_name_prefix="beside-postgres")
                beside = beside_pool.submit(beside_postgres)
                beside_pool.shutdown(wait=False)
            consensus.result()
            (migrate_with or migrate)(pg.dsn())
            standby = pool.submit(svc.standby.start)  # synchronous: a commit returns once the standby has it
            kafka.start()
            standby.result()
            svc.toxiproxy.start()
            svc.proxies = {"postgres": svc.toxiproxy.proxy("postgres", pg.port, listen_port=svc.postgres_proxy_port),
                           "upstream": svc.toxiproxy.proxy("upstream", svc.upstream.port,
                                                           listen_port=svc.state.port("upstream_proxy")),
                           **{f"kafka-{n}": svc.toxiproxy.proxy(f"kafka-{n}", node.external_port,
                                                               listen_port=node.proxy_port)
                              for n, node in kafka.nodes.items()}}
            cluster.result()
        if svc.kinesis is not None:
            svc.kinesis.start()
            svc.kinesis.create_stream(KINESIS_SOURCE, 2)
        if svc.s3 is not None:
            svc.s3.start()
    except BaseException:  # a failed start, or SIGTERM meanwhile: stop what did start
        if beside is not None:
            beside.exception()  # what it starts is stopped by the caller, once it is there
        stop_services(svc)
        raise
    return beside


def stop_services(svc: Services | None) -> None:
    """Stop every service, side by side (an error is said; the others stop anyway)."""
    from reclock.dev.procs import side_by_side

    if svc is None:
        return
    servers = (svc.spark, svc.toxiproxy, svc.kafka, svc.postgres, svc.standby, svc.upstream, svc.kinesis, svc.s3)
    _, errors = side_by_side({getattr(s, "name", type(s).__name__): s.stop for s in servers if s is not None})
    for name, e in errors.items():
        _echo(f"stopping {name}: {e}")


def restart_postgres(svc: Services) -> None:
    """``pg_ctl restart -m immediate`` of Reclock's primary and of the upstream Postgres, side by side (its
    synchronous standby reconnects by itself)."""
    from reclock.dev.postgres import _run_as, ensure_installed
    from reclock.dev.procs import run, side_by_side

    def restart(pg) -> None:
        run([str(ensure_installed() / "pg_ctl"), "-D", str(pg.data), "-l", str(pg.log), "-m", "immediate", "-w",
             "-t", "60", "-o", f"-p {pg.port}", "restart"], f"pg_ctl restart ({pg.name})", user=_run_as(), timeout=90)

    _, errors = side_by_side({pg.name: (lambda pg=pg: restart(pg)) for pg in (svc.postgres, svc.upstream)})
    if errors:
        raise RuntimeError(f"postgres restart: {errors}")


def promote_standby(svc: Services, echo: Callable[[str], None]) -> None:
    """A consensus failover: Reclock's primary crashed (``pg_ctl stop -m immediate``), its synchronous standby
    promoted, the proxy every Reclock process reaches Postgres through pointed at it (as a DNS name or a
    virtual IP would move), and a new synchronous standby of it made (a base backup), so the next promotion
    finds one. Nothing acknowledged may be lost: the campaign goes on on the new primary."""
    from reclock.dev.postgres import LocalStandby, crash

    old, standby = svc.postgres, svc.standby
    crash(old)
    svc.retired.append(old)
    standby.promote()
    svc.proxies["postgres"] = svc.toxiproxy.proxy("postgres", standby.port, listen_port=svc.postgres_proxy_port)
    svc.postgres = standby
    svc.promotions += 1
    echo(f"standby_promotion: {old.name} crashed, {standby.name} promoted; a new standby of it")
    svc.standby = LocalStandby(svc.state, standby, name=f"postgres_standby{svc.promotions}", synchronous=True)
    svc.standby.start(timeout=180)


def start_again(service, what: str, tries: int = 20, timeout: float = 180, **start) -> None:
    """Start ``service`` again (``start``: its start's options), waiting while its port is still held by the
    killed process (the kernel frees it a moment later): a restart that gave up would leave the service down
    for the rest of the campaign (and a test's restarted server down for the rest of its module)."""
    from reclock.errors import StackError

    for attempt in range(tries):
        try:
            service.start(timeout=timeout, **start)
            return
        except StackError as e:
            if "taken" not in str(e) or attempt == tries - 1:
                raise
            _echo(f"{what}: {e}; trying again in 3 s")
            time.sleep(3)


def kill_group(pidfile: Path) -> None:
    from reclock.dev import procs

    procs.kill_group(pidfile)


def restart_kafka(svc: Services, down_s: float) -> None:
    """The whole Kafka cluster SIGKILLed (an outage) and started again ``down_s`` later."""
    for node in svc.kafka.nodes.values():
        node.kill()
    time.sleep(down_s)
    start_again(svc.kafka, "kafka")


def kill_broker(svc: Services, rng: random.Random, echo: Callable[[str], None]) -> None:
    """One Kafka node SIGKILLed (the seed picks its role: the leader of a partition a source reads, the
    transaction coordinator of the sink's or the transactional producer's ``transactional.id``, or the active
    controller) and started again 0-5 s later; the fault ends once its replicas are back in sync (so the next
    one never finds fewer than two copies: ``min.insync.replicas`` 2)."""
    cluster = svc.kafka
    role = rng.choice(BROKER_ROLES)
    if role == "leader":
        source = rng.choice(sorted(SOURCES))
        what = f"chaos_{source}[{(p := rng.randrange(SOURCES[source]))}]"
        node = cluster.leader(f"chaos_{source}", p)
    elif role == "coordinator":
        what = rng.choice((svc.sink_transactional_id, "chaos-txn"))
        try:
            node = cluster.transaction_coordinator(what)
        except Exception:  # noqa: BLE001 - no transaction yet: the controller then
            role, what, node = "controller", "the quorum", cluster.active_controller()
    else:
        what, node = "the quorum", cluster.active_controller()
    if node not in cluster.nodes:  # no leader now (a node is still coming back): any node
        node = rng.choice(sorted(cluster.nodes))
    echo(f"broker_kill: kafka-{node} ({role} of {what})")
    cluster.kill(node)
    time.sleep(rng.uniform(0, 5))
    for attempt in range(20):
        try:
            cluster.start_node(node, timeout=240)
            return
        except Exception as e:  # noqa: BLE001 - its port still held by the killed process: again
            if "taken" not in str(e) or attempt == 19:
                raise
            time.sleep(3)


def restart_spark(svc: Services, down_s: float, which: int = 0) -> None:
    """Connect server ``which`` (a driver) SIGKILLed and started again ``down_s`` later; the campaign goes on
    once it serves (its executors come while the next fault does: its jobs wait for them)."""
    kill_group(svc.spark.connect_servers[which].pidfile)
    time.sleep(down_s)
    start_again(svc.spark, "spark connect", executors=False)  # the cluster's start: what is down


def kill_spark_worker(svc: Services, worker: int, down_s: float) -> None:
    """The worker and its executor SIGKILLed, the worker started again ``down_s`` later; the campaign goes on
    once it registered (its new executor comes while the next fault does)."""
    kill_group(svc.spark.worker_pidfile(worker))
    time.sleep(down_s)
    start_again(svc.spark, f"spark worker {worker}", executors=False)


def network_fault(svc: Services, kind: str, rng: random.Random, echo: Callable[[str], None]) -> None:
    """``kind`` (``net_latency``, ``net_reset``, ``net_blackhole``) on the proxy of a service the seed picks,
    for a while, then healed."""
    target = rng.choice(NET_TARGETS)
    fault, hold = {"net_latency": ("latency", rng.uniform(5, 20)), "net_reset": ("reset", rng.uniform(1, 3)),
                   "net_blackhole": ("blackhole", rng.uniform(3, 12))}[kind]
    proxies = svc.target_proxies(target)
    echo(f"{kind}: {fault} to {target} for {hold:.0f} s")
    try:
        for proxy in proxies:
            proxy.inject(fault)
        time.sleep(hold)
    finally:
        for proxy in proxies:
            proxy.heal()


# ------------------------------------------------------------------------------------------ the workload

def write_config(root: Path, bootstrap: str, kinesis: bool = False, name: str = "reclock.yaml",
                 s3_queue: str | None = None, iceberg: bool = False, step_timeout: str | None = STEP_TIMEOUT) -> Path:
    """The campaign's sources and sink; ``bootstrap``: where Reclock's processes (cycles, the sink, Spark's
    Kafka reader) reach the broker (its proxy); ``step_timeout``: every source's (None: the key left out, for
    a release that does not know it)."""
    import yaml

    schema = "id BIGINT, name STRING"
    raw = {"sources": {
        "app": {"kafka": {"topic": "chaos_app", "bootstrap": bootstrap}, "format": {"type": "json", "schema": schema},
                "include": ["partition", "offset", "key"], "budget": {"max_records": 300}},
        "ups": {"kafka": {"topic": "chaos_ups", "bootstrap": bootstrap}, "format": {"type": "json", "schema": schema},
                "envelope": "upsert", "include": ["key"], "budget": {"max_records": 100_000}},
        "txn": {"kafka": {"topic": "chaos_txn", "bootstrap": bootstrap}, "format": {"type": "json", "schema": schema},
                "include": ["partition", "offset"], "budget": {"max_records": 300}},
        "afl": {"kafka": {"topic": "chaos_afl", "bootstrap": bootstrap}, "format": {"type": "json", "schema": schema},
                "include": ["partition", "offset"], "budget": {"max_records": 300}, "interval": "2s"},
        PG_SOURCE: {"postgres": {"dsn_env": "CHAOS_UPSTREAM_DSN", "publication": "chaos_pub"},
                    "budget": {"max_records": 300}}},
        "sinks": {"out": {"from": "ups", "format": "debezium", "key": ["_key"],
                          "kafka": {"topic": "chaos_out", "bootstrap": bootstrap},
                          "progress_topic": "_progress_chaos", "budget": {"max_messages": 25},
                          "transaction_timeout": "15s"}}}
    if kinesis:  # benchmarks.kinesis_chaos's source (small counts and tasks: a range read by several tasks)
        raw["sources"][KINESIS_SOURCE] = {
            "kinesis": {"stream": KINESIS_SOURCE, "count_every": 20, "task_records": 60},
            "format": {"type": "json", "schema": "id BIGINT, key STRING"},
            "include": ["shard_id", "sequence_number"], "budget": {"max_records": 500}}
    if s3_queue is not None:  # benchmarks.s3_chaos's sources: one lists increasing keys, one takes notifications
        from benchmarks.s3_chaos import LOOKBACK
        from benchmarks.s3_chaos import SOURCES as S3_SOURCES

        s3_format = {"type": "json", "schema": "n BIGINT, s STRING"}
        raw["sources"]["evl"] = {"s3": {"url": f"s3://{S3_BUCKET}/{S3_SOURCES['evl']}", "keys": "increasing",
                                        "lookback": LOOKBACK}, "format": s3_format, "include": ["key"],
                                 "budget": {"max_bytes": "64KB"}}
        raw["sources"]["evn"] = {"s3": {"url": f"s3://{S3_BUCKET}/{S3_SOURCES['evn']}", "discovery": "notifications",
                                        "queue": s3_queue}, "format": s3_format, "include": ["key"],
                                 "budget": {"max_bytes": "64KB"}}
    if iceberg:
        raw["sinks"][ICEBERG_SINK] = {"from": "app", "iceberg": {"table": "lake.chaos_app"}}
    if step_timeout is not None:
        for source in raw["sources"].values():
            source["step_timeout"] = step_timeout
    path = root / name
    path.write_text(yaml.safe_dump(raw))
    return path


def create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(f"chaos_{s}", n, KAFKA_NODES) for s, n in SOURCES.items()]).values():
        fut.result(60)


class Producers:
    """One thread per source topic writing at a bounded rate until ``stop``; they ride out broker restarts
    (a transactional producer whose transaction fails is dropped and made anew: whether that transaction
    committed is for the oracle's read_committed reading to say, not for us)."""

    def __init__(self, bootstrap: str, seed: int, rate: float) -> None:
        self.bootstrap = bootstrap
        self.rate = rate
        self.stop_event = threading.Event()
        self.sent = collections.Counter()
        self.errors = collections.Counter()
        self.rng = random.Random(seed)
        self.threads = [threading.Thread(target=t, name=f"produce-{n}", daemon=True)
                        for n, t in (("app", self._app), ("ups", self._ups), ("txn", self._txn), ("afl", self._afl))]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(120)

    def _plain(self):
        from confluent_kafka import Producer

        return Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                         "message.timeout.ms": 300_000, "log_level": 0})

    def _plain_loop(self, source: str, record: Callable[[int], tuple[bytes, bytes | None, int]]) -> None:
        """Produce ``record(i)`` = (key, value, partition) for i = 0, 1, ... to ``chaos_<source>``."""
        p, i = self._plain(), 0
        while not self.stop_event.is_set():
            key, value, partition = record(i)
            p.produce(f"chaos_{source}", key=key, value=value, partition=partition)
            i += 1
            self.sent[source] += 1
            p.poll(0)
            time.sleep(1 / self.rate)
        p.flush(300)

    def _app(self) -> None:
        self._plain_loop("app", lambda i: (f"a{i % 50}".encode(), json.dumps({"id": i, "name": f"a{i}"}).encode(),
                                           i % SOURCES["app"]))

    def _afl(self) -> None:
        self._plain_loop("afl", lambda i: (None, json.dumps({"id": i, "name": f"f{i}"}).encode(),
                                           i % SOURCES["afl"]))

    def _ups(self) -> None:
        def record(i: int) -> tuple[bytes, bytes | None, int]:
            key = f"k{(i * 7) % UPSERT_KEYS}".encode()
            value = None if i % 11 == 5 else json.dumps({"id": i, "name": f"v{i}"}).encode()  # some deletes
            return key, value, zlib.crc32(key) % SOURCES["ups"]

        self._plain_loop("ups", record)

    def _txn(self) -> None:
        from confluent_kafka import KafkaException, Producer

        i, n, p = 0, 0, None
        rng = random.Random(self.rng.random())
        while not self.stop_event.is_set():
            try:
                if p is None:
                    p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "chaos-txn",
                                  "transaction.timeout.ms": 30_000, "log_level": 0})
                    p.init_transactions(60)
                p.begin_transaction()
                for _ in range(5):
                    p.produce("chaos_txn", value=json.dumps({"id": i, "name": f"t{i}"}).encode(),
                              partition=rng.randrange(SOURCES["txn"]))
                    i += 1
                p.flush(60)
                if rng.random() < 0.25:
                    p.abort_transaction(60)
                else:
                    p.commit_transaction(60)
                n += 1
                self.sent["txn"] += 5
            except KafkaException as e:
                self.errors["txn"] += 1
                p = None  # drop it and start over; its open transaction is aborted by the next init
                if self.errors["txn"] < 5 or self.errors["txn"] % 20 == 0:
                    _echo(f"txn producer: {e}")
                time.sleep(1)
            time.sleep(5 / self.rate)


# ------------------------------------------------------------------------------ the Postgres upstream

def setup_upstream(svc: Services) -> str:
    """The upstream database of ``pgs``: its two tables (``REPLICA IDENTITY FULL``; ``note`` stored out of
    line, so an update that leaves it alone sends it as an unchanged TOAST value), the publication, the
    writer's log (unpublished), the oracle's observer slot (made before any write), and initial rows that
    the first cycle's snapshot reads. Returns its DSN."""
    import psycopg

    with psycopg.connect(svc.upstream.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{UPSTREAM_DB}"')
    dsn = svc.upstream.dsn(UPSTREAM_DB)
    with psycopg.connect(dsn, autocommit=True, options="-c synchronous_commit=on") as conn:
        for t in PG_TABLES:
            conn.execute(f"CREATE TABLE {t} (id int8 PRIMARY KEY, v text, n int8, note text, txid int8)")
            conn.execute(f"ALTER TABLE {t} ALTER COLUMN note SET STORAGE EXTERNAL")
            conn.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE chaos_log (xid int8 PRIMARY KEY, ops jsonb NOT NULL)")
        conn.execute(f"CREATE PUBLICATION chaos_pub FOR TABLE {', '.join(PG_TABLES)}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (OBSERVER_SLOT,))
    writer = PgWriter(dsn, seed=0, rate=1.0)
    with psycopg.connect(dsn, autocommit=True) as conn:
        writer.load(conn)
        for _ in range(40):  # ~100 rows before the first cycle: its snapshot has something to read
            writer.transaction(conn, big=False, inserts_only=True)
    return dsn


def _note(rng: random.Random) -> str | None:
    """One value in five is 2,500 random characters (stored out of line: TOAST)."""
    if rng.random() < 0.2:
        return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=2500))
    return None


def _md5(text: str | None) -> str | None:
    import hashlib

    return None if text is None else hashlib.md5(text.encode()).hexdigest()


class PgWriter:
    """Transactions over both tables at ``rate`` transactions/s until ``stop``: inserts, updates (of ``v``
    and ``n`` only: ``note`` stays, unchanged TOAST), deletes, and every ``BIG_EVERY``-th transaction 700
    rows of ``items`` inserted (or the last such batch deleted). Each transaction logs what it did, as the
    rows its statements returned, in ``chaos_log`` in the same transaction: whatever a Postgres restart
    does to a commit in flight, the log holds exactly the transactions that committed. It rides out
    restarts (a failed transaction is simply not in the log)."""

    def __init__(self, dsn: str, seed: int, rate: float) -> None:
        self.dsn, self.rate = dsn, rate
        self.rng = random.Random(seed)
        self.live: dict[str, set[int]] = {t: set() for t in PG_TABLES}
        self.big: list[int] = []
        self.next_key = 1
        self.sent = 0
        self.errors = 0
        self.transactions = 0

    def load(self, conn) -> None:
        """The live keys as the tables hold them now (after a failed commit, whose outcome only they know)."""
        for t in PG_TABLES:
            self.live[t] = {k for (k,) in conn.execute(f"SELECT id FROM {t} WHERE id < 1000000000")}
        self.big = [k for (k,) in conn.execute("SELECT id FROM items WHERE id >= 1000000000")]
        self.next_key = 1 + max((max(ks) for ks in self.live.values() if ks), default=0)

    def transaction(self, conn, big: bool, inserts_only: bool = False) -> None:
        ops: list[list] = []
        with conn.transaction():
            xid = conn.execute("SELECT pg_current_xact_id()::text::int8").fetchone()[0]
            if big and self.big:
                for (k,) in conn.execute("DELETE FROM items WHERE id >= 1000000000 RETURNING id").fetchall():
                    ops.append(["d", "items", k])
            elif big:
                base = 1_000_000_000 + self.next_key * 1000
                rows = conn.execute("INSERT INTO items SELECT %s + g, 'big' || g, g, NULL, %s "
                                    "FROM generate_series(1, 700) g RETURNING id, v, n", (base, xid)).fetchall()
                ops += [["i", "items", k, v, n, None, xid] for k, v, n in rows]
            else:
                for _ in range(self.rng.randint(1, 6)):
                    table = self.rng.choice(PG_TABLES)
                    live = self.live[table]
                    kind = ("insert" if inserts_only or len(live) < 60
                            else self.rng.choices(["insert", "update", "delete"], [3, 4, 3])[0])
                    if kind == "insert":
                        key, self.next_key = self.next_key, self.next_key + 1
                        v, n, note = f"v{self.rng.randrange(10**6)}", self.rng.randrange(10**9), _note(self.rng)
                        conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s, %s)", (key, v, n, note, xid))
                        ops.append(["i", table, key, v, n, _md5(note), xid])
                        live.add(key)
                    elif kind == "update":
                        key = self.rng.choice(sorted(live))
                        row = conn.execute(f"UPDATE {table} SET v = %s, n = n + 1, txid = %s WHERE id = %s "
                                           "RETURNING v, n, md5(note)", (f"u{self.rng.randrange(10**6)}", xid, key)
                                           ).fetchone()
                        if row is not None:
                            ops.append(["i", table, key, *row, xid])
                    else:
                        key = self.rng.choice(sorted(live))
                        if conn.execute(f"DELETE FROM {table} WHERE id = %s RETURNING id", (key,)).fetchone():
                            ops.append(["d", table, key])
                        live.discard(key)
            conn.execute("INSERT INTO chaos_log VALUES (%s, %s)", (xid, json.dumps(ops)))
        self.transactions += 1
        self.sent += len(ops)
        if big:
            self.big = [] if self.big else [op[2] for op in ops]

    def run(self, stop: threading.Event) -> None:
        import psycopg

        conn = None
        while not stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
                    self.load(conn)
                self.transaction(conn, big=self.transactions % BIG_EVERY == BIG_EVERY - 1)
            except psycopg.Error as e:
                self.errors += 1
                if self.errors < 5 or self.errors % 20 == 0:
                    _echo(f"postgres writer: {type(e).__name__}: {str(e).strip()[:200]}")
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(1)
            time.sleep(1 / self.rate)
        if conn is not None:
            conn.close()


class Observer:
    """The oracle's reading of the WAL: every committed transaction's commit LSN (``xid -> final_lsn``),
    from the Begin messages of its own slot, consumed as it goes (so it pins little WAL). The Begin message
    is parsed here, by the pgoutput format's definition: ``'B'``, Int64 final LSN, Int64 commit time,
    Int32 xid."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.commits: dict[int, int] = {}

    def drain(self) -> None:
        import struct

        import psycopg

        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            rows = conn.execute("SELECT data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL, "
                                "'proto_version', '1', 'publication_names', 'chaos_pub') "
                                "WHERE get_byte(data, 0) = 66", (OBSERVER_SLOT,)).fetchall()
        for (data,) in rows:
            _, final_lsn, _, xid = struct.unpack(">cQqI", bytes(data)[:21])
            self.commits[xid] = final_lsn

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(10):
            try:
                self.drain()
            except Exception as e:  # noqa: BLE001 - a restart in between: the next drain reads it
                _echo(f"observer: {type(e).__name__}: {str(e).strip()[:200]}")


def check_postgres(verdict: Verdict, conn, blob, observer: Observer, source: str = PG_SOURCE) -> dict:
    """Each table's collection AS OF every binding equals the committed transactions replayed below the
    binding's LSN; each written row at its transaction's binding; the last binding equals the tables."""
    import bisect

    import psycopg

    from reclock.persist.remap_store import load_remap
    from reclock.read import read_updates
    from reclock.sources.postgres.pgoutput import lsn_to_int

    observer.drain()
    with psycopg.connect(observer.dsn, autocommit=True) as up:
        log = up.execute("SELECT xid, ops FROM chaos_log").fetchall()
        tables = {t: {k: (v, n, note, x) for k, v, n, note, x in
                      up.execute(f"SELECT id, v, n, md5(note), txid FROM {t}").fetchall()} for t in PG_TABLES}
        slot = up.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                          (f"reclock_{source}",)).fetchone()
    txns, commit_of = [], {}
    for xid, ops in log:
        lsn = observer.commits.get(xid & 0xFFFFFFFF)
        if lsn is None:
            if ops:
                raise RuntimeError(f"oracle: transaction {xid} committed (it is in chaos_log) but the observer "
                                   "slot has no Begin for it")
            continue
        txns.append((lsn, ops))
        commit_of[xid] = lsn
    txns.sort(key=lambda t: t[0])
    rc = load_remap(conn, source)
    bindings = [(b.ts, b.frontier.get(0)) for b in rc.bindings if b.ts >= rc.since]
    if not bindings:
        raise RuntimeError(f"oracle: {source} has no bindings")
    lsns = [lsn for _, lsn in bindings]
    updates = {}
    for t in PG_TABLES:
        ups = read_updates(conn, blob, f"{source}__{t}")
        rows = ups.to_pylist() if ups is not None else []
        updates[t] = sorted(rows, key=lambda r: r["ts"])
        for r in rows:  # each row a transaction wrote: at the binding that covers its commit LSN
            if r["diff"] == 1 and r["ts"] > bindings[0][0]:
                lsn = commit_of.get(r["txid"])
                at = None if lsn is None else bisect.bisect_right(lsns, lsn)  # the first binding past it
                want = bindings[at][0] if at is not None and at < len(bindings) else None
                if max(r["ts"], rc.since) != want:
                    verdict.wrong_ts[source] += 1
                    verdict.note(f"{source}__{t}: row {r['id']} of transaction {r['txid']} at {r['ts']}, want {want}")
    state: dict[str, dict[int, tuple]] = {t: {} for t in PG_TABLES}
    got: dict[str, collections.Counter] = {t: collections.Counter() for t in PG_TABLES}
    i, pos = 0, {t: 0 for t in PG_TABLES}
    for ts, lsn in bindings:
        while i < len(txns) and txns[i][0] < lsn:
            for op in txns[i][1]:
                if op[0] == "i":
                    state[op[1]][op[2]] = tuple(op[3:])
                else:
                    state[op[1]].pop(op[2], None)
            i += 1
        for t in PG_TABLES:
            ups = updates[t]
            while pos[t] < len(ups) and ups[pos[t]]["ts"] <= ts:
                r = ups[pos[t]]
                got[t][(r["id"], r["v"], r["n"], _md5(r["note"]), r["txid"])] += r["diff"]
                pos[t] += 1
            want = collections.Counter((k, *row) for k, row in state[t].items())
            have = +got[t]
            if have != want:
                missing, extra = want - have, have - want
                verdict.lost[source] += sum(missing.values())
                verdict.duplicated[source] += sum(extra.values())
                verdict.note(f"{source}__{t} AS OF {ts} (LSN {lsn:X}): missing {list(missing)[:3]}, "
                             f"extra {list(extra)[:3]}")
            verdict.checked[f"{source} (rows AS OF binding)"] += len(want)
    for t in PG_TABLES:  # the last binding covers every commit: its contents are the tables themselves
        if state[t] != tables[t]:
            raise RuntimeError(f"oracle: {t} replayed from chaos_log differs from the table (the writer's log "
                               "or the observer is wrong)")
    if i != len(txns):
        verdict.lost[source] += sum(len(ops) for _, ops in txns[i:])
        verdict.note(f"{source}: {len(txns) - i} committed transactions past the last binding")
    confirmed = None if slot is None else lsn_to_int(slot[0])
    if confirmed is None or confirmed > lsns[-1]:
        verdict.lost[source] += 1
        verdict.note(f"{source}: slot confirmed at {slot}, last binding at LSN {lsns[-1]:X}")
    verdict.checked[source] += sum(len(ops) for _, ops in txns)
    return {"transactions": len(txns), "bindings": len(bindings), "slot_at_last_binding": confirmed == lsns[-1]}


# --------------------------------------------------------------------------------------------- the procs

@dataclass
class Driver:
    """Keeps one process (a source's cycle runner, or the sink) running: starts it again when it dies, the
    way an operator reruns a failed cycle. ``kill()`` SIGKILLs it; ``arm(env)`` makes the next start carry
    extra environment (a fail point)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    logdir: Path
    proc: subprocess.Popen | None = None
    log: Path | None = None
    armed: dict[str, str] = field(default_factory=dict)
    armed_now: bool = False
    started_at: float = 0.0
    exits: collections.Counter = field(default_factory=collections.Counter)
    failpoint_exits: int = 0
    watchdog_kills: int = 0
    launches: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _start(self) -> None:
        self.launches += 1
        self.log = self.logdir / f"{self.name}-{self.launches:04d}.log"
        env = {**self.env, **self.armed}
        self.armed_now, self.armed = bool(self.armed), {}
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(self.argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.started_at = time.monotonic()

    def ready(self) -> bool:
        return (self.proc is not None and not isinstance(self.proc, _Delayed) and self.proc.poll() is None
                and self.log is not None
                and self.log.exists() and self.log.stat().st_size > 0)

    def kill(self) -> bool:
        """SIGKILL the running process if it is up and past start-up; True if it was."""
        with self.lock:
            if not self.ready():
                return False
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            return True

    def arm(self, extra: dict[str, str]) -> None:
        with self.lock:
            self.armed = dict(extra)
            if self.proc is not None and not isinstance(self.proc, _Delayed) and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # not counted: the fault is the fail point
                self.proc.wait(30)

    def tick(self) -> None:
        """Restart a dead process; kill one silent for ``WATCHDOG_S``."""
        with self.lock:
            if isinstance(self.proc, _Delayed) and self.proc.poll() is None:
                return  # a rerun waiting out its back-off
            if self.proc is not None and self.proc.poll() is None:
                silent = time.time() - self.log.stat().st_mtime
                if silent > WATCHDOG_S and time.monotonic() - self.started_at > WATCHDOG_S:
                    _echo(f"watchdog: {self.name} silent for {silent:.0f}s ({self.log}); killing it")
                    self.watchdog_kills += 1
                    if self.argv[-1] != "0.5":  # a runner: its threads' stacks into its log first
                        os.kill(self.proc.pid, signal.SIGUSR1)
                        time.sleep(1)
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(30)
                return
            if isinstance(self.proc, _Delayed):
                self.proc = None
            elif self.proc is not None:
                code = self.proc.returncode
                self.exits[code] += 1
                if code == 86 and self.armed_now:
                    self.failpoint_exits += 1
                self.proc = None
                if code not in (0, 86, -9):
                    return self._start_later(2.0)
            self._start()

    def _start_later(self, delay: float) -> None:
        self.started_at = time.monotonic() + delay
        self.proc = _Delayed(delay)

    def stop(self) -> None:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None and not isinstance(self.proc, _Delayed):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            self.proc = None


class PreviousRelease:
    """The ``upgrade`` fault: the campaign starts on the previous release (``benchmarks.release``: its wheel,
    built from the repository's history, in a venv of its own) and moves to this checkout mid-run. The
    previous release migrates Reclock's database and runs, through its own ``reclock`` command, cycles of
    every runner source and the sink, each in a loop of processes of its own, while the producers and the
    Postgres writer write. A loop whose step has written once (a cycle that bound offsets, a sink run) waits
    for the others' (its next steps would take the cores they need: the Postgres cycles and the sink's runs,
    one after the other, drew out the Kafka sources' first Spark jobs on cold executors); once each has (at
    most ``UPGRADE_S``), every loop starts its next step and :meth:`upgrade` SIGKILLs them ``LAST_ROUND_S``
    into it (a draw of the seed), wherever they are (a deployment replaced mid-cycle, mid-transaction), then
    runs this checkout's ``reclock migrate``; the campaign's runners, sink and Airflow carry on from the state
    it left, and the oracle checks every binding, the old ones too."""

    LAST_ROUND_S = (1.0, 8.0)
    """How long after the loops' last round began its processes are killed (uniform): through a process's
    start-up, a cycle's mint and write, or past the end of a short step (the sink with nothing new)."""

    def __init__(self, svc: Services, env: dict[str, str], root: Path, echo: Callable[[str], None],
                 seed: int = 0) -> None:
        from benchmarks.release import PREVIOUS_RELEASE, clean_env, previous_release

        self.echo = echo
        self.rng = random.Random(f"upgrade-{seed}")  # its own: the campaign's draws stay those of the seed
        self.commit = PREVIOUS_RELEASE[:7]
        # built (first use; then cached under .reclock/cache, which test_upgrade shares) while the services start
        pool = ThreadPoolExecutor(1, thread_name_prefix="previous-release")
        self.built = pool.submit(previous_release)
        pool.shutdown(wait=False)
        config = write_config(root, svc.kafka.proxied_bootstrap, name="reclock-previous.yaml",  # its sources only
                              step_timeout=None)
        self.cwd = root / "previous"  # neither release may find the checkout from its working directory
        self.cwd.mkdir()
        self.env = clean_env(**{**{k: v for k, v in env.items() if k.startswith(("RECLOCK_", "CHAOS_"))},
                                "RECLOCK_CONFIG": str(config),
                                # the previous release takes one Connect URL (several stand in since)
                                "RECLOCK_SPARK_REMOTE": env["RECLOCK_SPARK_REMOTE"].split(",")[0]})
        self.new_env = env
        self.logdir = root / "logs"
        self.stop_event = threading.Event()
        self.last_round = threading.Event()  # every loop has finished a step: each runs again, to be killed
        self.lock = threading.Lock()
        self.procs: dict[str, subprocess.Popen] = {}
        self.done: collections.Counter = collections.Counter()  # steps that wrote (cycles: bound offsets)
        self.empty: collections.Counter = collections.Counter()  # cycles that found nothing yet
        self.failed: collections.Counter = collections.Counter()
        self.threads: list[threading.Thread] = []

    @property
    def venv(self) -> Path:
        return self.built.result(timeout=900)

    def command(self, *args: str) -> list[str]:
        return [str(self.venv / "bin" / "reclock"), *args]

    def migrate(self, dsn: str) -> None:
        """The previous release's ``reclock migrate`` (Reclock's database is made by it)."""
        subprocess.run(self.command("migrate"), env={**self.env, "RECLOCK_DSN": dsn}, cwd=self.cwd, check=True,
                       capture_output=True, text=True, timeout=300)

    def start(self) -> None:
        steps = {s: self.command("cycle", s) for s in RUNNERS} | {"sink": self.command("sink", "run", "out")}
        self.logdir.mkdir(exist_ok=True)
        for name, argv in steps.items():
            t = threading.Thread(target=self._loop, args=(name, argv), name=f"previous-{name}", daemon=True)
            self.threads.append(t)
            t.start()

    def _loop(self, name: str, argv: list[str]) -> None:
        path = self.logdir / f"previous-{name}.log"
        with open(path, "a") as log:
            while not self.stop_event.is_set():
                if self.done[name] and not self.last_round.is_set():
                    self.last_round.wait(1)  # finished once: the others' first steps have the cores
                    continue
                with self.lock:
                    if self.stop_event.is_set():
                        return
                    start = path.stat().st_size
                    proc = subprocess.Popen(argv, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
                    self.procs[name] = proc
                code = proc.wait()
                if code == 0 and (name == "sink" or self.bound(path.read_bytes()[start:].decode(errors="replace"))):
                    self.done[name] += 1
                elif code == 0:
                    self.empty[name] += 1  # a cycle that found nothing yet: its loop goes on
                elif not self.stop_event.is_set():
                    self.failed[name] += 1
                    time.sleep(2)
                time.sleep(0.3)

    @staticmethod
    def bound(output: str) -> bool:
        """Whether a previous release's ``reclock cycle`` (its output) bound offsets: a step that wrote state."""
        return re.search(r"'offsets': \{\d", output) is not None

    def ran(self) -> bool:
        return all(self.done[name] for name in (*RUNNERS, "sink"))

    def upgrade(self, timeout: float = UPGRADE_S) -> bool:
        """Once every source has bound offsets and the sink has run on the previous release (or after ``timeout``):
        every loop's next step started, its processes SIGKILLed wherever they are ``LAST_ROUND_S`` later, then
        this checkout's ``reclock migrate``. Whether the previous release wrote what the upgrade continues
        (else the campaign's ``upgrade`` is not counted)."""
        _wait_for(self.ran, timeout)
        self.last_round.set()
        time.sleep(self.rng.uniform(*self.LAST_ROUND_S))
        with self.lock:
            self.stop_event.set()
            for proc in self.procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
        for t in self.threads:
            t.join(60)
        ran = self.ran()
        self.echo(f"upgrade: previous release {self.commit} ran {dict(self.done)} (found nothing "
                  f"{dict(self.empty)}, failed {dict(self.failed)}); "
                  "its processes killed; this checkout's reclock migrate")
        p = subprocess.run([sys.executable, "-m", "reclock.cli", "migrate"], env=self.new_env, cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"upgrade: reclock migrate failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
        self.echo(f"upgrade: {p.stdout.strip()[-300:]}")
        return ran

    def stop(self) -> None:
        with self.lock:
            self.stop_event.set()
            for proc in self.procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)


class AirflowSide:
    """The source whose cycles Airflow runs: Airflow's four processes (kept alive as a service manager would:
    one that died is started again), ``ingest__afl`` unpaused, its task processes the target of
    ``airflow_task_kill``. Tasks retry (``[core] default_task_retries``) after 2 s, up to 30 times: a broker restarted
    several times in a row on a loaded machine keeps a task failing with ``UpstreamUnavailable`` for a minute
    or more, which a deployment's retry policy rides out and the campaign must too (5 tries 1 s apart did not)."""

    DAG_ID = f"ingest__{AIRFLOW_SOURCE}"

    def __init__(self, svc: Services, env: dict[str, str], echo: Callable[[str], None]) -> None:
        from reclock.dev.airflow import LocalAirflow

        extra = {k: v for k, v in env.items() if k.startswith("RECLOCK_") or k == "PYTHONPATH"}
        extra.update(AIRFLOW__CORE__DEFAULT_TASK_RETRIES="30", AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY="2",
                     AIRFLOW__CORE__PARALLELISM="2")
        # two schedulers (highly available): scheduler_kill kills one; the metadata database (on the upstream
        # server: Reclock's own fails over) is reached directly (the network faults are between Reclock and
        # its services)
        self.af = LocalAirflow(svc.state, svc.upstream.dsn("airflow"), extra, schedulers=2)
        self.dsn = svc.upstream.dsn("airflow")
        self.echo = echo
        self.revived = 0
        self.lock = threading.Lock()
        self.unpaused_at: datetime.datetime | None = None
        self.warm_at: datetime.datetime | None = None  # report() measures stalls from here (the faults' start)
        self.faults_done_at: datetime.datetime | None = None  # ... to here
        self.alive_at: list[datetime.datetime] = []  # the samples (:meth:`sample`) that saw a task process

    def start(self) -> None:
        """Airflow's processes up and ``ingest__afl`` parsed (still paused: :meth:`unpause`)."""
        t = self.af.start(timeout=600)
        self.af.wait_for_dag(self.DAG_ID, timeout=300)
        self.echo(f"airflow up in {t:.0f}s, {self.DAG_ID} parsed")

    def unpause(self) -> None:
        self.af.unpause(self.DAG_ID)
        self.unpaused_at = datetime.datetime.now(datetime.timezone.utc)
        self.echo(f"{self.DAG_ID} unpaused")

    @staticmethod
    def task_pids() -> list[int]:
        """The processes running a task (the supervisor's child, titled ``airflow worker -- <ti id>``); only
        ``ingest__afl`` is unpaused, so every one of them runs one of its tasks."""
        pids = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                title = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if title.startswith("airflow worker -- ") and "LocalExecutor" not in title:
                pids.append(int(d.name))
        return pids

    def kill(self, rng: random.Random) -> bool:
        """SIGKILL a running task's process; False if no task runs now."""
        with self.lock:
            pids = self.task_pids()
            if not pids:
                return False
            try:
                os.kill(rng.choice(pids), signal.SIGKILL)
            except ProcessLookupError:
                return False
            return True

    def kill_scheduler(self, rng: random.Random) -> bool:
        """SIGKILL one of the two schedulers (its process group: its executor's task processes too); the next
        :meth:`tick` starts it again."""
        with self.lock:
            return self.af.kill(rng.choice(("scheduler", "scheduler-2")))

    def sample(self) -> None:
        """Note the moment if a task of ``ingest__afl`` has a process now (:meth:`report`'s idle stretches)."""
        if self.task_pids():
            self.alive_at.append(datetime.datetime.now(datetime.timezone.utc))

    def succeeded(self) -> bool:
        """Whether a run of ``ingest__afl`` has succeeded."""
        import psycopg

        with psycopg.connect(self.dsn, connect_timeout=10) as conn:
            return conn.execute("SELECT 1 FROM dag_run WHERE dag_id = %s AND state = 'success' LIMIT 1",
                                (self.DAG_ID,)).fetchone() is not None

    def tick(self) -> None:
        """Start again an Airflow process that died (as a service manager would: that process only; if it
        dies again, the next tick starts it again)."""
        with self.lock:
            for c in self.af.components:
                if not self.af.running(c):
                    self.echo(f"airflow {c} died; starting it again")
                    self.revived += 1
                    self.af.start_component(c)

    def stop(self) -> None:
        """Pause the DAG, let a running task finish (20 s at most: a try after a fault may take minutes),
        SIGKILL one still running (as ``airflow_task_kill`` does: the catch-up resumes its cycle), stop
        Airflow."""
        try:
            self.af.api("PATCH", f"dags/{self.DAG_ID}", {"is_paused": True})
            _wait_for(lambda: not self.task_pids(), 20)
        except Exception as e:  # noqa: BLE001 - stop it anyway
            self.echo(f"pausing {self.DAG_ID}: {e}")
        for pid in self.task_pids():  # a group of its own: Airflow's stop would leave it running
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.af.stop()

    def report(self) -> dict:
        """Runs by state, task tries that failed, task instances that succeeded after a retry, the longest
        try, and in the window of the faults (from the warm-up's end to the last fault): the longest *stall*,
        a stretch in which no run of ``ingest__afl`` succeeded, and the longest *idle* stretch, in which
        moreover no task of it had a process (sampled every 2 s): the time Airflow itself took to notice a
        dead try, start a retry or the next run, or to come back after its scheduler died. The catch-up lands
        ``afl`` without Airflow, so the oracle alone cannot tell an Airflow that stopped driving cycles from
        one that drove them."""
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            ends = [e for (e,) in conn.execute("SELECT end_date FROM dag_run WHERE dag_id = %s AND state = 'success' "
                                                "ORDER BY end_date", (self.DAG_ID,))]
            longest_try = conn.execute(
                "SELECT max(extract(epoch FROM end_date - start_date)) FROM (SELECT start_date, end_date FROM "
                "task_instance WHERE dag_id = %s UNION ALL SELECT start_date, end_date FROM task_instance_history "
                "WHERE dag_id = %s) t", (self.DAG_ID, self.DAG_ID)).fetchone()[0]
            runs = dict(conn.execute("SELECT state, count(*) FROM dag_run WHERE dag_id = %s GROUP BY state",
                                     (self.DAG_ID,)).fetchall())
            failed = conn.execute("SELECT count(*) FROM task_instance_history WHERE dag_id = %s AND state = 'failed'",
                                  (self.DAG_ID,)).fetchone()[0]
            retried = conn.execute("SELECT count(*) FROM task_instance WHERE dag_id = %s AND try_number > 1 "
                                   "AND state = 'success'", (self.DAG_ID,)).fetchone()[0]
        start = self.warm_at or self.unpaused_at
        stall = stall_from = idle = idle_from = None
        if start is not None and self.faults_done_at is not None:
            stall, stall_from = _longest_gap(start, self.faults_done_at, ends)
            idle, idle_from = _longest_gap(start, self.faults_done_at, [*ends, *self.alive_at])
        return {"runs": runs, "failed_tries": failed, "retried_to_success": retried, "revived": self.revived,
                "longest_stall_s": stall, "longest_stall_from": stall_from,
                "longest_idle_s": idle, "longest_idle_from": idle_from,
                "longest_try_s": None if longest_try is None else round(float(longest_try)),
                "failed_try_causes": dict(self.failure_causes().most_common())}

    def failure_causes(self) -> collections.Counter:
        """Why the tries of ``ingest__afl`` that failed did, from their task logs: the exception's type and the
        first words of its message, ``killed`` for a process that died by a signal (the campaign's kills), or
        ``no error logged`` (Airflow failed it from outside: a lost heartbeat, a queued task timed out)."""
        causes: collections.Counter = collections.Counter()
        for log in (self.af.home / "logs" / f"dag_id={self.DAG_ID}").glob("run_id=*/task_id=*/attempt=*.log"):
            cause, ended = None, False
            for line in log.read_text(errors="replace").splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                event = str(entry.get("event", ""))
                if event.startswith("Process terminated by signal"):
                    cause = "killed"
                elif event == "Task failed with exception":
                    detail = (entry.get("error_detail") or [{}])[0]
                    words = " ".join(str(detail.get("exc_value", "")).split()[:8])
                    cause = f"{detail.get('exc_type', '?')}: {words}"
                elif "Marking task as SUCCESS" in event or event.startswith("Done. Returned value"):
                    ended = True
            if cause is not None:
                causes[cause] += 1
            elif not ended and log.stat().st_size and time.time() - log.stat().st_mtime > 60:
                causes["no error logged"] += 1
        return causes


REUSE_LINE = re.compile(r"source (\S+): \[\d+, \d+\): (\d+) of (\d+) slices taken from an earlier write")


def slices_reused(root: Path) -> dict[str, list[int]]:
    """Per source, the writes that took slices an earlier write had finished and how many they took, of how
    many (``[writes, taken, slices]``), from the warnings of ``write_batches`` in the runners' logs and in the
    task logs of ``ingest__afl`` under the campaign's state folder ``root``."""
    out: dict[str, list[int]] = {}
    logs = [*(root / "logs").glob("*.log"), *(root / "state" / "airflow" / "logs").rglob("attempt=*.log")]
    for log in logs:
        for m in REUSE_LINE.finditer(log.read_text(errors="replace")):
            seen = out.setdefault(m[1], [0, 0, 0])
            seen[0] += 1
            seen[1] += int(m[2])
            seen[2] += int(m[3])
    return out


def _longest_gap(start: datetime.datetime, end: datetime.datetime, marks) -> tuple[int, str]:
    """The longest stretch between ``start``, the ``marks`` between it and ``end``, and ``end``: its length in
    seconds and when it began."""
    points = [start, *sorted(m for m in marks if start < m < end), end]
    gap, began = max(((b - a).total_seconds(), a) for a, b in zip(points, points[1:]))
    return round(gap), began.strftime("%H:%M:%S")


class _Delayed:
    """A stand-in for a process that will be started after ``delay`` (a rerun after an error backs off)."""

    def __init__(self, delay: float) -> None:
        self.until = time.monotonic() + delay
        self.returncode = None
        self.pid = None

    def poll(self):
        if time.monotonic() >= self.until:
            self.returncode = "delayed"
            return self.returncode
        return None

    def wait(self, timeout=None):
        return self.returncode


# -------------------------------------------------------------------------------------------- the oracle

@dataclass
class Verdict:
    checked: collections.Counter = field(default_factory=collections.Counter)
    lost: collections.Counter = field(default_factory=collections.Counter)
    duplicated: collections.Counter = field(default_factory=collections.Counter)
    wrong_ts: collections.Counter = field(default_factory=collections.Counter)
    examples: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        if len(self.examples) < 30:
            self.examples.append(what)

    def compare(self, name: str, want: collections.Counter, got: collections.Counter, what: str) -> None:
        """``got`` against ``want`` (multisets of ``what``): what is missing is lost, what is extra duplicated."""
        missing, extra = want - got, got - want
        if missing:
            self.lost[name] += sum(missing.values())
            self.note(f"{name}: {sum(missing.values())} {what} missing, e.g. {next(iter(missing))}")
        if extra:
            self.duplicated[name] += sum(extra.values())
            self.note(f"{name}: {sum(extra.values())} {what} extra, e.g. {next(iter(extra))}")

    @property
    def ok(self) -> bool:
        return not (sum(self.lost.values()) or sum(self.duplicated.values()) or sum(self.wrong_ts.values()))


def read_topic(bootstrap: str, topic: str) -> list:
    """Every committed record of ``topic``, read_committed from the start to the end (the oracle's own
    reading: no Reclock code)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-oracle-{time.monotonic_ns()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True, "log_level": 0})
    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        pending, out = set(parts), []
        deadline = time.monotonic() + 300
        while pending and time.monotonic() < deadline:
            for m in c.consume(500, timeout=1.0):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                        continue
                    raise RuntimeError(f"oracle reading {topic}: {m.error()}")
                out.append(m)
        if pending:
            raise RuntimeError(f"oracle reading {topic}: partitions {sorted(pending)} did not reach their end")
        return out
    finally:
        c.close()


def check_append(verdict: Verdict, conn, blob, bootstrap: str, source: str) -> None:
    """Every committed record exactly once, at the timestamp of the binding that covers its offset."""
    from reclock import remap
    from reclock.persist.remap_store import load_remap
    from reclock.read import read_updates

    expected = {(m.partition(), m.offset()): json.loads(m.value())["id"] for m in read_topic(bootstrap, f"chaos_{source}")}
    rc = load_remap(conn, source)
    ups = read_updates(conn, blob, source)
    rows = ups.to_pylist() if ups is not None else []
    seen = collections.Counter()
    for r in rows:
        po = (r["_partition"], r["_offset"])
        seen[po] += r["diff"]
        if po not in expected or expected[po] != r["id"]:
            verdict.duplicated[source] += 1
            verdict.note(f"{source}: row {r} is no committed record (aborted or unknown)")
            continue
        want = remap.reclock(rc, *po)
        if max(r["ts"], rc.since) != want:
            verdict.wrong_ts[source] += 1
            verdict.note(f"{source}: record {po} at ts {r['ts']}, its binding says {want}")
    for po in expected:
        n = seen.get(po, 0)
        if n < 1:
            verdict.lost[source] += 1
            verdict.note(f"{source}: record {po} (id {expected[po]}) is missing")
        elif n > 1:
            verdict.duplicated[source] += n - 1
            verdict.note(f"{source}: record {po} is there {n} times")
    verdict.checked[source] += len(expected)


def check_upsert(verdict: Verdict, conn, blob, bootstrap: str, source: str = "ups") -> None:
    """The collection AS OF every binding equals the latest value per key, computed from the topic."""
    from reclock import remap
    from reclock.persist.remap_store import load_remap
    from reclock.read import read_as_of, read_updates

    rc = load_remap(conn, source)
    records = []  # (ts, partition, offset, key, row or None)
    for m in read_topic(bootstrap, f"chaos_{source}"):
        ts = remap.reclock(rc, m.partition(), m.offset())
        row = None if m.value() is None else json.loads(m.value())
        records.append((ts, m.partition(), m.offset(), m.key().decode(), row))
    ups = read_updates(conn, blob, source)
    updates = ups.to_pylist() if ups is not None else []
    times = sorted({b.ts for b in rc.bindings if b.ts >= rc.since})
    for t in times:
        latest: dict[str, tuple] = {}
        for ts, p, o, key, row in records:
            if ts is not None and ts <= t and (key not in latest or (p, o) > latest[key][0]):
                latest[key] = ((p, o), row)
        want = collections.Counter((k, r["id"], r["name"]) for k, (_, r) in latest.items() if r is not None)
        got = collections.Counter()
        for u in updates:
            if u["ts"] <= t:
                got[(_text(u["_key"]), u["id"], u["name"])] += u["diff"]
        got = +got  # drop zeros (and negatives, counted below)
        missing, extra = want - got, got - want
        if missing:
            verdict.lost[source] += sum(missing.values())
            verdict.note(f"{source}: AS OF {t} missing {dict(missing)}")
        if extra:
            verdict.duplicated[source] += sum(extra.values())
            verdict.note(f"{source}: AS OF {t} extra {dict(extra)}")
        verdict.checked[f"{source} (key AS OF binding)"] += len(want)
    if times:  # and once through the reader users call
        last = read_as_of(conn, blob, source, times[-1]).to_pylist()
        direct = collections.Counter({(_text(r["_key"]), r["id"], r["name"]): r["diff"] for r in last})
        if direct != got:
            verdict.lost[source] += sum((got - direct).values())
            verdict.duplicated[source] += sum((direct - got).values())
            verdict.note(f"{source}: read_as_of({times[-1]}) differs from its updates")
    verdict.checked[source] += len(records)


def _text(key) -> str:
    return key.decode() if isinstance(key, bytes) else key


def _sink_spec(config: Path, sink: str = "out"):
    import yaml

    from reclock.config import parse_config

    return parse_config(yaml.safe_load(config.read_text())).sinks[sink]


def check_sink(verdict: Verdict, conn, blob, bootstrap: str, config: Path, sink: str = "out") -> None:
    """The target topic equals the shard's updates exactly once, in timestamp order."""
    import pyarrow.compute as pc
    import yaml

    from reclock.config import parse_config
    from reclock.persist.shards import shard_info
    from reclock.read import read_updates
    from reclock.sinks.encode import encode_updates
    from reclock.sinks.kafka import TS_HEADER, consolidate, read_progress

    spec = parse_config(yaml.safe_load(config.read_text())).sinks[sink]
    got = [(int(dict(m.headers())[TS_HEADER]), m.key(), m.value()) for m in read_topic(bootstrap, spec.kafka.topic)]
    info = shard_info(conn, spec.collection)
    if not got:
        verdict.lost[sink] += 1
        verdict.note(f"{sink}: wrote nothing")
        return
    ups = read_updates(conn, blob, spec.collection)
    start = got[0][0]  # the sink's first frontier: its snapshot is AS OF it
    ups = ups.set_column(ups.schema.get_field_index("ts"), "ts", pc.max_element_wise(ups["ts"], start))
    expected = encode_updates(spec, consolidate(ups))
    verdict.compare(sink, collections.Counter(expected), collections.Counter(got), "messages")
    order = sum(1 for a, b in zip(got, got[1:]) if b[0] < a[0])
    if order:
        verdict.wrong_ts[sink] += order
        verdict.note(f"{sink}: {order} messages out of timestamp order")
    progress = read_progress(bootstrap, spec.progress_topic, sink)
    if progress is None or progress.frontier != info.upper:
        verdict.lost[sink] += 1
        verdict.note(f"{sink}: progress {progress} is not at the shard's upper {info.upper}")
    verdict.checked[sink] += len(got)


# ------------------------------------------------------------------------------------------ the campaign

@dataclass
class Result:
    seed: int
    faults: collections.Counter
    verdict: Verdict
    wall_s: float
    produced: collections.Counter
    extra: dict

    def lines(self) -> list[str]:
        v = self.verdict
        out = [f"seed {self.seed}: {sum(self.faults.values())} faults in {self.wall_s:.0f} s",
               "faults by kind: " + ", ".join(f"{k} {self.faults[k]}" for k in FAULT_KINDS),
               f"records checked: {sum(v.checked.values())} ({', '.join(f'{k} {n}' for k, n in sorted(v.checked.items()))})",
               f"lost {sum(v.lost.values())}, duplicated {sum(v.duplicated.values())}, "
               f"wrong timestamps {sum(v.wrong_ts.values())}",
               f"produced: {dict(self.produced)}; {json.dumps(self.extra)}"]
        out += [f"  discrepancy: {e}" for e in v.examples]
        reused = self.extra.get("slices_reused", {})
        out.append("slices a retry took from an earlier write: " + (", ".join(
            f"{name} {taken} of {total} in {writes} writes" for name, (writes, taken, total) in sorted(reused.items()))
            or "none"))
        af = self.extra.get("airflow", {})
        if af:
            out.append(f"airflow: longest stall {af.get('longest_stall_s')} s (no run of ingest__{AIRFLOW_SOURCE} "
                       f"succeeded, from {af.get('longest_stall_from')}), longest idle {af.get('longest_idle_s')} s "
                       f"(no try running either, from {af.get('longest_idle_from')}), longest try "
                       f"{af.get('longest_try_s')} s")
        if self.airflow_stalled:
            out.append(f"  airflow stalled: ingest__{AIRFLOW_SOURCE} had no try running and no run succeeding for "
                       f"{af['longest_idle_s']} s (more than {AIRFLOW_STALL_S} s)")
        return out

    @property
    def airflow_stalled(self) -> bool:
        idle = self.extra.get("airflow", {}).get("longest_idle_s")
        return idle is not None and idle > AIRFLOW_STALL_S

    @property
    def ok(self) -> bool:
        """Nothing lost, duplicated or at a wrong timestamp, and Airflow kept driving its source's cycles."""
        return self.verdict.ok and not self.airflow_stalled


SERVICE_GROUPS = {"spark_restart": "spark", "spark_worker_kill": "spark", "broker_kill": "kafka",
                  "kafka_restart": "kafka", "pg_restart": "postgres", "standby_promotion": "postgres",
                  "net_latency": "postgres", "net_reset": "postgres", "net_blackhole": "postgres"}
"""``--overlap``: the kinds that take a service down and wait for it to come back (a Spark Connect server or
worker, a broker or the cluster, Postgres or its standby's promotion, a proxy's fault held for a while), by the
service they hold. Under load these take 1-2 minutes each (a JVM's start, replicas catching up), most of a
campaign's time; overlapped, a service's fault runs in the background while faults of the other kinds and
services go on. Two faults of one service never overlap: a second broker down would leave a partition
below ``min.insync.replicas``, and a proxy healed by one fault would end another's. The network faults go with
Postgres's: one may act on the proxy that a promotion points at the new primary."""


class _Overlap:
    """The service faults running in the background (``--overlap``), at most one per :data:`SERVICE_GROUPS`
    group; ``record(kind, hit or the exception)`` is called in the campaign's thread, by :meth:`collect`
    (finished ones) and :meth:`submit` (a fault of the same service still running is waited for first)."""

    def __init__(self, record: Callable[[str, bool | BaseException], None]) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.record = record
        self.pool = ThreadPoolExecutor(max_workers=len(set(SERVICE_GROUPS.values())), thread_name_prefix="fault")
        self.by_group: dict[str, tuple[str, object]] = {}

    @property
    def running(self) -> int:
        return len(self.by_group)

    def _finish(self, group: str) -> None:
        kind, future = self.by_group.pop(group)
        try:
            hit: bool | BaseException = future.result()
        except Exception as e:  # noqa: BLE001 - reported by record
            hit = e
        self.record(kind, hit)

    def collect(self) -> None:
        for group in [g for g, (_, f) in self.by_group.items() if f.done()]:
            self._finish(group)

    def submit(self, kind: str, fn: Callable[[], bool]) -> None:
        group = SERVICE_GROUPS[kind]
        if group in self.by_group:
            self._finish(group)
        self.by_group[group] = (kind, self.pool.submit(fn))

    def close(self) -> None:
        """Wait for every fault still running (the catch-up starts with every service back)."""
        for group in list(self.by_group):
            self._finish(group)
        self.pool.shutdown(wait=True)


def campaign(faults: int, seed: int, rate: float = 20.0, gap: tuple[float, float] = (2.0, 7.0),
             max_seconds: float = 3600.0, kinds: tuple[str, ...] = FAULT_KINDS,
             echo: Callable[[str], None] = _echo, keep: bool = False, kinesis: bool = False, s3: bool = False,
             iceberg: bool = False, overlap: bool = False, spark_connects: int = 1,
             gc_grace_s: float = GC_GRACE_S) -> Result:
    """Run the campaign: ``faults`` faults (or until ``max_seconds``), then catch up and check; ``kinesis``,
    ``s3``, ``iceberg``: with the Kinesis source, the two S3 sources, the Iceberg export (see the module);
    ``overlap``: a service's fault (:data:`SERVICE_GROUPS`) runs in the background while the next faults are
    injected, one at a time per service (see :class:`_Overlap`); ``spark_connects``: how many Spark Connect
    servers stand in for each other (``spark_restart`` restarts one the seed picks); ``gc_grace_s``: the
    garbage grace period of every process (:data:`GC_GRACE_S`)."""
    import shutil

    from reclock.persist import connect
    from reclock.persist.blob import LocalBlobStore

    t0 = time.monotonic()
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix="reclock-chaos-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    svc = producers = airflow = airflow_started = stop_pg = kin_producer = resharder = previous = s3_writer = None
    stop_ticks = threading.Event()  # set first on the way out: a ticker would start stopped processes again
    tickers: list[threading.Thread] = []
    drivers: list[Driver] = []
    injected: collections.Counter = collections.Counter()
    harness_errors: list[str] = []
    try:
        echo(f"chaos: seed {seed}, {faults} faults{', service faults overlapped' if overlap else ''}, "
             f"state in {root}")
        svc = make_services(root, kinesis, s3, spark_connects, gc_grace_s)
        config = write_config(root, svc.kafka.proxied_bootstrap, kinesis, iceberg=iceberg)
        svc.sink_transactional_id = _sink_spec(config).transactional_id
        env = svc.env(config)
        # Airflow (its migration, four processes, the DAG parsed: a minute or more) starts as soon as its
        # metadata database is up, beside the broker and the Spark cluster; ingest__afl is unpaused below
        airflow = AirflowSide(svc, env, echo)
        # with the upgrade among the kinds, the previous release makes Reclock's database and runs first
        previous = PreviousRelease(svc, env, root, echo, seed) if "upgrade" in kinds else None
        airflow_started = start_services(svc, beside_postgres=airflow.start,
                                         migrate_with=previous.migrate if previous is not None else None)
        create_topics(svc.kafka.bootstrap)
        upstream = setup_upstream(svc)
        if s3:  # the bucket, the notifications' queue (its URL in the sources' config: written again)
            from benchmarks.s3_chaos import SOURCES as S3_SOURCES
            from benchmarks.s3_chaos import Writer as S3Writer

            svc.s3.create_bucket(S3_BUCKET)
            queue, arn = svc.s3.queue("landing-events")
            svc.s3.notify(S3_BUCKET, S3_SOURCES["evn"], arn)
            write_config(root, svc.kafka.proxied_bootstrap, kinesis, s3_queue=queue, iceberg=iceberg)
        logdir = root / "logs"
        logdir.mkdir(exist_ok=True)
        py = sys.executable
        runners = (*RUNNERS, *((KINESIS_SOURCE,) if kinesis else ()), *(S3_SOURCES if s3 else ()))
        cycles = {s: Driver(s, [py, "-m", "benchmarks.chaos", "--runner", s], env, logdir) for s in runners}
        sink = Driver("sink", [py, "-m", "reclock.cli", "sink", "run", "out", "--follow", "0.5"], env, logdir)
        sinks = [sink, *([Driver(ICEBERG_SINK, [py, "-m", "reclock.cli", "sink", "run", ICEBERG_SINK, "--follow",
                                               "0.5"], env, logdir)] if iceberg else [])]
        drivers = [*cycles.values(), *sinks]
        producers = Producers(svc.kafka.bootstrap, seed, rate)
        producers.start()
        pg_writer, observer = PgWriter(upstream, seed, rate / 5), Observer(upstream)
        stop_pg = threading.Event()
        pg_threads = [threading.Thread(target=pg_writer.run, args=(stop_pg,), name="pg-writer", daemon=True),
                      threading.Thread(target=observer.run, args=(stop_pg,), name="pg-observer", daemon=True)]
        for t in pg_threads:
            t.start()
        if kinesis:
            from benchmarks.kinesis_chaos import Resharder
            from reclock.dev.kinesis import BackgroundProducer

            kin_producer = BackgroundProducer(svc.kinesis.client(), KINESIS_SOURCE, batch=10, pause=10 / rate,
                                              keys=40).start()
            resharder = Resharder(svc.kinesis, rng, KINESIS_RESHARD_S)
            resharder.start()
        if s3:
            s3_writer = S3Writer(svc.s3.client(), S3_BUCKET, random.Random(seed + 1), pause=S3_WRITER_PAUSE)
            s3_writer.start()

        def airflow_ticker() -> None:
            while not stop_ticks.is_set():
                try:
                    airflow.sample()
                    airflow.tick()
                except Exception as e:  # noqa: BLE001 - try again at the next tick
                    echo(f"airflow: {e}")
                stop_ticks.wait(2)

        def ticker() -> None:
            while not stop_ticks.is_set():
                for d in drivers:
                    try:
                        d.tick()
                    except Exception as e:  # noqa: BLE001 - keep the others going
                        echo(f"driver {d.name}: {e}")
                stop_ticks.wait(0.5)

        if previous is not None:
            # the previous release runs while Airflow starts; ingest__afl (this checkout's DAG) is unpaused
            # already: its tries refuse the previous release's schema (SchemaVersionMismatch) and Airflow
            # retries them until the upgrade's migrate, as a deployment whose workers got the new release
            # before its `reclock migrate` would (and its first tries pay Airflow's start-up meanwhile)
            previous.start()
            airflow_started.result()
            airflow.unpause()
            if previous.upgrade():
                injected["upgrade"] += 1
                echo(f"fault {sum(injected.values())}/{faults}: upgrade")
            else:
                harness_errors.append("upgrade: the previous release did not finish a step of each source and "
                                      f"the sink in {UPGRADE_S:.0f}s ({dict(previous.done)})")
        ticks = threading.Thread(target=ticker, name="drivers", daemon=True)
        tickers.append(ticks)
        ticks.start()
        airflow_started.result()
        if airflow.unpaused_at is None:
            airflow.unpause()
        airflow_ticks = threading.Thread(target=airflow_ticker, name="airflow", daemon=True)
        tickers.append(airflow_ticks)
        airflow_ticks.start()
        warm_s = _warm_up(cycles, airflow, echo)
        t_faults = time.monotonic()
        total, attempts = sum(injected.values()), 0
        kind_list = [k for k in kinds if k not in ONCE_KINDS]
        # every kind once first, in an order the seed picks, whatever max_seconds says (each try of a kind is
        # bounded: a fail point waits 180 s for its process to get there, a kill 120 s for its target); a kind
        # that missed comes again later, up to FIRST_TRIES times in all. The fail points lead: they wait for a
        # cycle or the sink to get there, which a warm system does at once and one whose Spark Connect server
        # was just restarted (cold: minutes for its first jobs on a loaded machine) does not. The Spark faults
        # come next, so that their cold executors warm while the other kinds run (not in the catch-up). The
        # seed orders each group
        first = sorted(rng.sample(kind_list, len(kind_list)), key=_first_round_group)
        tries: collections.Counter = collections.Counter()

        def inject(kind: str, rng: random.Random) -> bool:
            """One fault of ``kind``: whether it hit (a kill or fail point whose target never got there did
            not)."""
            if kind == "cycle_sigkill":
                victim = cycles[rng.choice(runners)]
                return _wait_for(victim.kill, 120)
            if kind == "airflow_task_kill":
                return _wait_for(lambda: airflow.kill(rng), 120)  # a task runs every few seconds
            if kind == "cycle_failpoint":
                d = cycles[rng.choice(runners)]
                before = d.failpoint_exits
                d.arm({"RECLOCK_FAILPOINTS": f"{rng.choice(CYCLE_FAILPOINTS)}=exit"})
                return _wait_for(lambda: d.failpoint_exits > before, 180)
            if kind == "sink_sigkill":
                victim = rng.choice(sinks)
                return _wait_for(victim.kill, 120)
            if kind == "sink_failpoint":
                before = sink.failpoint_exits
                sink.arm({"RECLOCK_FAILPOINTS": "sink:in_transaction=exit"})
                return _wait_for(lambda: sink.failpoint_exits > before, 180)  # it needs new appends to write
            if kind == "scheduler_kill":
                return _wait_for(lambda: airflow.kill_scheduler(rng), 120)
            if kind == "pg_restart":
                restart_postgres(svc)
            elif kind == "kafka_restart":
                restart_kafka(svc, rng.uniform(0, 3))
            elif kind == "spark_restart":
                servers = len(svc.spark.connect_servers)  # drawn only with several: a seed's faults stay as before
                restart_spark(svc, rng.uniform(0, 3), rng.randrange(servers) if servers > 1 else 0)
            elif kind == "spark_worker_kill":
                kill_spark_worker(svc, rng.randrange(svc.spark.workers), rng.uniform(0, 10))
            elif kind == "broker_kill":
                kill_broker(svc, rng, echo)
            elif kind == "standby_promotion":
                promote_standby(svc, echo)
            elif kind in ("net_latency", "net_reset", "net_blackhole"):
                network_fault(svc, kind, rng, echo)
            else:
                raise ValueError(f"unknown fault kind {kind!r}")
            return True

        def record(kind: str, hit: bool | BaseException) -> None:
            nonlocal total
            if isinstance(hit, BaseException):  # a harness error is reported, the campaign goes on
                harness_errors.append(f"{kind}: {type(hit).__name__}: {hit}")
                echo(f"harness error injecting {kind}: {hit!r}")
                hit = False
            if hit:
                injected[kind] += 1
                total += 1
                echo(f"fault {total}/{faults}: {kind}")
            elif not injected[kind] and kind not in first and tries[kind] < FIRST_TRIES:
                first.append(kind)  # missed (its process was between runs): every kind still comes once

        background = _Overlap(record) if overlap else None
        try:
            while attempts < faults * 20 and (first or (total + (background.running if background else 0) < faults
                                                        and time.monotonic() - t_faults < max_seconds)):
                attempts += 1
                time.sleep(rng.uniform(*gap))
                if background is not None:
                    background.collect()
                if not first and total >= faults:
                    break
                kind = first.pop(0) if first else rng.choices(kind_list, [WEIGHTS[k] for k in kind_list])[0]
                tries[kind] += 1
                if background is not None and kind in SERVICE_GROUPS:
                    # its own draws (the thread's and this loop's would interleave by timing otherwise)
                    background.submit(kind, lambda kind=kind, r=random.Random(rng.getrandbits(64)): inject(kind, r))
                    continue
                try:
                    hit: bool | BaseException = inject(kind, rng)
                except Exception as e:  # noqa: BLE001 - reported by record
                    hit = e
                record(kind, hit)
        finally:
            if background is not None:
                background.close()
        echo(f"faults done: {dict(injected)}; catching up")
        airflow.faults_done_at = datetime.datetime.now(datetime.timezone.utc)
        producers.stop()
        kin_acked = kin_producer.stop() if kin_producer is not None else []
        if s3_writer is not None:
            from benchmarks.s3_chaos import LOOKBACK

            s3_writer.stop.set()
            s3_writer.join(60)
            time.sleep(float(LOOKBACK[:-1]) + 1)  # a late key within the lookback is listed by then
        if resharder is not None:
            resharder.stop.set()
            resharder.join(90)
        stop_pg.set()
        for t in pg_threads:
            t.join(120)
        stop_ticks.set()
        ticks.join(30)
        airflow_ticks.join(600)
        for d in drivers:
            d.stop()

        def airflow_stopped_then_caught_up() -> tuple[dict, bool]:
            """Airflow's last try finishes (or is killed: :meth:`AirflowSide.stop`) and Airflow stops; then its
            source catches up like the others (its task and the catch-up would otherwise run cycles of one
            source side by side)."""
            airflow.stop()
            report = airflow.report()
            echo(f"airflow: {report}")
            return report, _catch_up(py, AIRFLOW_SOURCE, env, echo)

        # catch up: every source (side by side, the runners' while Airflow stops) until a cycle finds nothing
        # new, then the sink to the upper
        caught = tuple(dict.fromkeys(s for s in (*SOURCES, *runners) if s not in (AIRFLOW_SOURCE, PG_SOURCE)))
        with ThreadPoolExecutor(len(caught) + 2) as pool:
            afl_done = pool.submit(airflow_stopped_then_caught_up)
            pg_done = pool.submit(_catch_up_postgres, py, env, upstream, echo)
            done = dict(zip(caught, pool.map(lambda s: _catch_up(py, s, env, echo), caught)))
            done[PG_SOURCE] = pg_done.result()
            airflow_report, done[AIRFLOW_SOURCE] = afl_done.result()
        lagging = [s for s, ok in done.items() if not ok]
        if lagging:
            raise RuntimeError(f"sources {lagging} did not catch up")
        for name in ("out", *([ICEBERG_SINK] if iceberg else [])):
            p = subprocess.run([py, "-m", "reclock.cli", "sink", "run", name], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"the sink {name} did not catch up: {p.stdout[-2000:]}{p.stderr[-2000:]}")
        verdict = Verdict()
        blob = LocalBlobStore(root / "blobs")
        with connect(svc.postgres.dsn()) as conn:
            check_append(verdict, conn, blob, svc.kafka.bootstrap, "app")
            check_append(verdict, conn, blob, svc.kafka.bootstrap, "txn")
            check_append(verdict, conn, blob, svc.kafka.bootstrap, AIRFLOW_SOURCE)
            check_upsert(verdict, conn, blob, svc.kafka.bootstrap, "ups")
            check_sink(verdict, conn, blob, svc.kafka.bootstrap, config, "out")
            pg_report = check_postgres(verdict, conn, blob, observer)
            if iceberg:
                check_iceberg(verdict, conn, blob, env, config, ICEBERG_SINK)
        if s3:
            check_s3(verdict, svc, blob)
        kin_report = check_kinesis(verdict, svc, blob, kin_acked, kin_producer, resharder) if kinesis else None
        extra = {"warm_up_s": round(warm_s), "launches": {d.name: d.launches for d in drivers},
                 "exits": {d.name: {str(k): v for k, v in d.exits.items()} for d in drivers},
                 "watchdog_kills": sum(d.watchdog_kills for d in drivers), "airflow": airflow_report,
                 "harness_errors": harness_errors, "slices_reused": slices_reused(root),
                 "txn_producer_errors": producers.errors["txn"],
                 "postgres": {**pg_report, "writer_errors": pg_writer.errors},
                 **({"kinesis": kin_report} if kin_report is not None else {})}
        produced = collections.Counter({**producers.sent, PG_SOURCE: pg_writer.sent,
                                        **({KINESIS_SOURCE: len(kin_acked)} if kinesis else {})})
        return Result(seed, injected, verdict, time.monotonic() - t0, produced, extra)
    finally:
        stop_ticks.set()
        for t in tickers:
            t.join(60)  # a tick under way finishes before the processes are stopped
        if previous is not None:
            previous.stop()
        if producers is not None:
            producers.stop_event.set()
        if kin_producer is not None:
            kin_producer.stop()
        if s3_writer is not None:
            s3_writer.stop.set()
        if resharder is not None:
            resharder.stop.set()
        if stop_pg is not None:
            stop_pg.set()
        for d in drivers:
            try:
                d.stop()
            except Exception:  # noqa: BLE001 - stop the services anyway
                pass
        if airflow_started is not None:
            airflow_started.exception()  # a start under way ends first: then all it started is stopped
        if airflow is not None:
            try:
                airflow.af.stop()
            except Exception:  # noqa: BLE001 - stop the services anyway
                pass
        stop_services(svc)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def check_kinesis(verdict: Verdict, svc: Services, blob, acked: list[int], producer, resharder) -> dict:
    """The Kinesis source against the stream read by itself (``benchmarks.kinesis_chaos.check``), into
    ``verdict``: a record the producer had acknowledged but no binding covers after the catch-up is lost too,
    and so is a producer's or the resharder's error (the stream did not get what the campaign says)."""
    from benchmarks.kinesis_chaos import check
    from reclock.sources.kinesis.client import StreamAddress

    address = StreamAddress(KINESIS_SOURCE, "us-east-1", svc.kinesis.endpoint_url)
    v = check(svc.postgres.dsn(), blob, address, svc.kinesis.client(), acked)
    verdict.checked[KINESIS_SOURCE] += v["bound"]
    verdict.lost[KINESIS_SOURCE] += v["lost"] + v["unbound"] + v["acked_not_in_stream"]
    verdict.duplicated[KINESIS_SOURCE] += v["duplicated"]
    verdict.wrong_ts[KINESIS_SOURCE] += v["wrong"]
    for what in ("lost_sample", "extra_sample", "dup_sample", "wrong_sample"):
        if v[what]:
            verdict.note(f"{KINESIS_SOURCE} {what}: {v[what]}")
    errors = [*producer.errors, *resharder.errors]
    if errors:
        verdict.lost[KINESIS_SOURCE] += len(errors)
        verdict.note(f"{KINESIS_SOURCE}: producer/resharder errors {errors[:3]}")
    return {k: v[k] for k in ("in_stream", "bound", "bindings", "as_of_checked", "shards", "frontier_rows",
                              "dropped_records")} | {"splits": resharder.splits, "merges": resharder.merges}


def check_s3(verdict: Verdict, svc: Services, blob) -> None:
    """Each S3 source against its prefix of the bucket read by itself (``benchmarks.s3_chaos``'s oracle and
    check: every record of every object once, one object at one bound timestamp)."""
    from benchmarks.s3_chaos import SOURCES as S3_SOURCES
    from benchmarks.s3_chaos import check, oracle

    client = svc.s3.client()
    for name, prefix in S3_SOURCES.items():
        v = check(svc.postgres.dsn(), blob, name, oracle(client, S3_BUCKET, prefix))
        verdict.checked[name] += v["expected"]
        verdict.lost[name] += v["lost"]
        verdict.duplicated[name] += v["duplicated"]
        verdict.wrong_ts[name] += v["wrong"]
        if v["lost"] or v["duplicated"] or v["wrong"]:
            verdict.note(f"{name}: {v}")


def check_iceberg(verdict: Verdict, conn, blob, env: dict[str, str], config: Path, sink: str = ICEBERG_SINK) -> None:
    """The Iceberg table holds the collection AS OF its frontier (each record once), and its frontier is the
    collection's upper (the export caught up)."""
    from reclock.orchestration.contexts import find_catalog_settings
    from reclock.persist.shards import shard_info
    from reclock.read import read_as_of
    from reclock.sinks.iceberg import IcebergSinkContext, load_catalog, table_frontier

    spec = _sink_spec(config, sink)
    ctx = IcebergSinkContext(spec=spec, dsn=env["RECLOCK_DSN"], blob=blob,
                             catalog=find_catalog_settings(env["RECLOCK_DSN"], env["RECLOCK_BLOB_URL"]))
    upper = shard_info(conn, spec.collection).upper
    frontier = table_frontier(ctx).frontier
    if frontier != upper:
        verdict.lost[sink] += 1
        verdict.note(f"{sink}: the table's frontier {frontier} is not the collection's upper {upper}")
    want = collections.Counter()
    for r in read_as_of(conn, blob, spec.collection, frontier - 1).to_pylist():
        want[(r["_partition"], r["_offset"], r["id"])] += r["diff"]
    table = load_catalog(ctx.catalog, spec.catalog).load_table(spec.table)
    got = collections.Counter((r["_partition"], r["_offset"], r["id"]) for r in table.scan().to_arrow().to_pylist())
    verdict.compare(sink, want, got, "rows")
    verdict.checked[sink] += sum(got.values())


def _first_round_group(kind: str) -> int:
    """Where a kind comes in the first round (each kind once): the fail points, the Spark faults, the rest."""
    return 0 if kind.endswith("_failpoint") else 1 if kind.startswith("spark_") else 2


def _warm_up(cycles: dict[str, Driver], airflow: AirflowSide, echo: Callable[[str], None]) -> float:
    """Wait until every runner has finished a cycle and a run of ``ingest__afl`` succeeded (at most
    :data:`WARMUP_S`), so the faults meet a system that ran; mark the start of Airflow's stall window. Returns
    the seconds it took."""
    t0 = time.monotonic()

    def cycled(d: Driver) -> bool:
        return any(line.startswith("{") for log in d.logdir.glob(f"{d.name}-*.log")
                   for line in log.read_text(errors="replace").splitlines())

    waiting = set(cycles)
    afl = False
    while time.monotonic() - t0 < WARMUP_S and (waiting or not afl):
        time.sleep(2)
        waiting = {s for s in waiting if not cycled(cycles[s])}
        if not afl:
            try:
                afl = airflow.succeeded()
            except Exception:  # noqa: BLE001 - the metadata database was busy: ask again
                pass
    took = time.monotonic() - t0
    left = [*sorted(waiting), *([] if afl else [AirflowSide.DAG_ID])]
    echo(f"warm in {took:.0f}s" + (f" (still no cycle of {', '.join(left)}: faults start anyway)" if left else ""))
    airflow.warm_at = datetime.datetime.now(datetime.timezone.utc)
    return took


def _catch_up(py: str, source: str, env: dict[str, str], echo: Callable[[str], None]) -> bool:
    """Cycles of ``source`` until one finds nothing new, in one process; a failed process, or one still
    cycling after 900 s, is run again (5 times in all): each description a cycle appended stays appended, so
    a rerun goes on from there (a Kinesis source's backlog at ~20 s a description on a loaded machine)."""
    for _ in range(5):
        try:
            p = subprocess.run([py, "-m", "benchmarks.chaos", "--runner", source, "--until-idle"], env=env,
                               cwd=REPO, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as e:
            echo(f"catch-up {source}: still cycling after {e.timeout:.0f} s; again")
            continue
        if p.returncode == 0:
            return True
        echo(f"catch-up {source}: exit {p.returncode}: {p.stdout[-1500:]}{p.stderr[-1500:]}")
    return False


def _catch_up_postgres(py: str, env: dict[str, str], upstream: str, echo: Callable[[str], None]) -> bool:
    """Cycles of ``pgs`` until a binding covers the upstream's flush LSN as it was when the writer stopped
    (any WAL moves the flush LSN, so a Postgres source never finds "nothing new": it binds again)."""
    import psycopg

    from reclock.persist import connect
    from reclock.persist.remap_store import load_remap
    from reclock.sources.postgres.pgoutput import lsn_to_int

    with psycopg.connect(upstream, autocommit=True) as conn:
        target = lsn_to_int(conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()[0])
    for _ in range(30):
        p = subprocess.run([py, "-m", "benchmarks.chaos", "--runner", PG_SOURCE, "--once"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=900)
        if p.returncode not in (0, 3):
            echo(f"catch-up {PG_SOURCE}: exit {p.returncode}: {p.stdout[-1500:]}{p.stderr[-1500:]}")
            continue
        with connect(env["RECLOCK_DSN"]) as conn:
            rc = load_remap(conn, PG_SOURCE)
        if rc.bindings and rc.bindings[-1].frontier.get(0) >= target:
            return True
    return False


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None, help="default: one from the clock (printed)")
    ap.add_argument("--rate", type=float, default=20.0, help="records/s per producer")
    ap.add_argument("--gap", type=float, nargs=2, default=(2.0, 7.0), metavar=("MIN", "MAX"),
                    help="seconds between faults (uniform)")
    ap.add_argument("--max-seconds", type=float, default=3600.0,
                    help="stop injecting this long after the faults began (after the warm-up)")
    ap.add_argument("--keep", action="store_true", help="keep the state folder (logs) afterwards")
    ap.add_argument("--kinesis", action="store_true",
                    help="add the Kinesis source (a stream split and merged while it runs; see the module)")
    ap.add_argument("--s3", action="store_true", help="add the two S3 sources (benchmarks.s3_chaos's, objects "
                    "written throughout)")
    ap.add_argument("--iceberg", action="store_true", help="add an Iceberg export of `app`")
    ap.add_argument("--full", action="store_true",
                    help="every source kind and both sinks: --kinesis --s3 --iceberg (issue 37's large campaign)")
    ap.add_argument("--overlap", action="store_true",
                    help="a service's fault (a restart, a broker or worker killed, a network fault) runs in the "
                    "background while faults of the other services go on; one at a time per service")
    ap.add_argument("--spark-connects", type=int, default=1,
                    help="Spark Connect servers that stand in for each other (default 1)")
    ap.add_argument("--gc-grace", type=float, default=GC_GRACE_S, metavar="S",
                    help=f"RECLOCK_GC_GRACE_S of every process (default {GC_GRACE_S:g}; a retry takes an earlier "
                    "write's slices younger than half of it)")
    ap.add_argument("--blob-bound", action="store_true", help="the blob-bound figure instead (1,000 cycles)")
    ap.add_argument("--cycles", type=int, default=1000, help="--blob-bound: cycles")
    ap.add_argument("--runner", metavar="SOURCE", help=argparse.SUPPRESS)
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--until-idle", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.runner:
        return runner(args.runner, args.once, args.until_idle)
    if args.blob_bound:
        from benchmarks.blob_bound import blob_bound

        return blob_bound(args.cycles, echo=_echo)
    stop.install()  # SIGTERM (a test's timeout) or Ctrl-C ends the run through its finally: services stopped
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    print(f"seed {seed}", flush=True)
    result = campaign(args.faults, seed, rate=args.rate, gap=tuple(args.gap), max_seconds=args.max_seconds, keep=args.keep,
                      kinesis=args.kinesis or args.full, s3=args.s3 or args.full, iceberg=args.iceberg or args.full,
                      overlap=args.overlap, spark_connects=args.spark_connects, gc_grace_s=args.gc_grace)
    for line in result.lines():
        print(line, flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
