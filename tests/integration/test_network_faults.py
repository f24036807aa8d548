"""Network faults between Reclock and each service it talks to: Postgres (the consensus), Kafka (the
upstream, from the cycle and from Spark's Kafka reader), the S3 endpoint (parts, from the cycle and from
Spark's S3A) and Spark Connect. Each service is reached through a Toxiproxy proxy
(``reclock.dev.toxiproxy``), and while a cycle is under way a fault is put on that one proxy: latency, a
bandwidth limit, every connection reset, every connection black-holed (data accepted and never delivered:
only a client's own timeout ends the wait), the service gone.

What must hold: every step either completes or fails with an error, within its bound (:data:`STEP_BOUND_S`:
the longest timeout the step's clients have, plus a margin; a step still running then is reported as hung,
with the stacks of its thread); the next cycles, on a healed network, catch up; and at the end every record
is in the collection once, at the timestamp of the binding that covers it, with the consumer group at the
resumption frontier (``check_invariants``).

``make test`` runs one short test per service (:data:`SHORT_PLAN`): every service meets a fault, and every fault
that can break a step (reset and black hole, with latency for the slow path) meets a service; the black hole,
which only a client's timeout ends, goes to Postgres, whose bound the test lowers (:data:`SHORT_PG_TIMEOUT_S`:
the step still has to end by that bound, not by the fault healing). ``make test-deployment`` runs every fault
against every service, several times, with the deployment's bounds of docs/operations.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace

import pytest
from confluent_kafka import Producer
from psycopg.conninfo import make_conninfo
from ingest_support import Clock, check_invariants

from reclock import cycle, persist
from reclock.config import parse_source
from reclock.dev.procs import LOOPBACK
from reclock.dev.toxiproxy import NETWORK_FAULTS, Proxy
from reclock.errors import StepDeadlineExceeded
from reclock.persist.blob import blob_store_from_url
from reclock.persist.objectstore import S3Settings
from reclock.settings import SparkTarget

SERVICES = ("postgres", "kafka", "s3", "spark_connect")
SHORT_FAULTS = ("latency", "reset", "blackhole")
SHORT_PLAN: dict[str, tuple[str, ...]] = {"postgres": ("reset", "blackhole"), "kafka": ("latency",),
                                          "s3": ("reset",), "spark_connect": ("reset",)}
"""The suite's faults per service. A black hole lasts until a client's own timeout ends the step: against
Kafka, S3 or Spark Connect that is minutes (their bounds in docs/operations.md), against Postgres the answer
timeout, which the short test lowers to :data:`SHORT_PG_TIMEOUT_S`. The full matrix is the deployment test's."""
SHORT_PG_TIMEOUT_S = 6
"""The short test's Postgres bounds: ``RECLOCK_PG_TIMEOUT_S``, the DSN's ``connect_timeout`` and how long a new
connection is retried (``reclock.persist.CONNECT_RETRY_S``); a cycle's queries take well under a second on a
healthy connection. With them the step under the black hole must end within :data:`SHORT_PG_STEP_BOUND_S`."""
SHORT_PG_STEP_BOUND_S = 90.0
STEP_BOUND_S = 300.0
"""A step's bound under a fault: the longest time any of its clients may wait before it gives up (see
docs/failures.md, Network faults), with a margin for a loaded machine."""
PG_TIMEOUT_S = 30
"""The consensus connections' answer timeout here (``RECLOCK_PG_TIMEOUT_S``; 120 s by default), so a black
hole to Postgres ends a step in 30 s rather than two minutes."""
RECORDS = 120  # per round: with a budget of 40 records, three descriptions, so the fault lands mid-write


@dataclass
class Net:
    """The services behind proxies: ``proxies[service]`` and the endpoints through and around them."""

    proxies: dict[str, Proxy]
    direct_bootstrap: str
    proxied_bootstrap: str
    connect_url: str
    proxied_connect_url: str
    s3: S3Settings  # its endpoint is the S3 proxy's
    pg_port: int
    server: "object"  # the Spark Connect server (reclock.dev.spark.LocalSparkConnect)


@pytest.fixture(scope="module")
def net(toxiproxy, kafka, s3, postgres, stack_state):
    """Proxies to Postgres, the Kafka broker's proxied listener, the S3 endpoint and a Spark Connect server
    whose S3A endpoint is the S3 proxy (so its part writes cross the proxy too)."""
    from reclock.dev.spark import LocalSparkConnect

    saved = os.environ.get("RECLOCK_PG_TIMEOUT_S")
    os.environ["RECLOCK_PG_TIMEOUT_S"] = str(PG_TIMEOUT_S)
    proxies = {"postgres": toxiproxy.proxy("net_postgres", postgres.port),
               "kafka": toxiproxy.proxy("net_kafka", kafka.external_port, listen_port=kafka.proxy_port),
               "s3": toxiproxy.proxy("net_s3", s3.port)}
    direct = s3.settings()
    settings = replace(direct, endpoint_url=f"http://{LOOPBACK}:{proxies['s3'].port}")
    server = LocalSparkConnect(stack_state, master="local[2]", driver_memory="1g", name="net_spark", s3=settings)
    try:
        server.start(timeout=600)
        proxies["spark_connect"] = toxiproxy.proxy("net_connect", server.port)
        yield Net(proxies, kafka.bootstrap, kafka.proxied_bootstrap, server.url,
                  f"sc://{LOOPBACK}:{proxies['spark_connect'].port}", settings, proxies["postgres"].port, server)
    finally:
        _leave_connect_mode()
        server.stop()
        toxiproxy.heal()
        if saved is None:
            os.environ.pop("RECLOCK_PG_TIMEOUT_S", None)
        else:
            os.environ["RECLOCK_PG_TIMEOUT_S"] = saved


def _leave_connect_mode() -> None:
    """A Connect session made in this process switches PySpark into Connect mode for the whole process: stop
    it and switch back (as tests/cluster/conftest.py does), or a later test's local session would ask for a
    Connect URL."""
    from pyspark.sql.connect.session import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def _context(net: Net, db: str, service: str, topic: str, name: str) -> cycle.CycleContext:
    """A Kafka source's context whose connections to ``service`` cross its proxy (to the others they cross a
    healthy proxy or none)."""
    bootstrap = net.proxied_bootstrap if service == "kafka" else net.direct_bootstrap
    dsn = make_conninfo(db, port=str(net.pg_port)) if service == "postgres" else db
    url = net.proxied_connect_url if service == "spark_connect" else net.connect_url
    raw = {"kafka": {"topic": topic, "bootstrap": bootstrap},
           "format": {"type": "json", "schema": "id BIGINT, name STRING"},
           "include": ["partition", "offset", "key"], "budget": {"max_records": 40}}
    spec = parse_source(name, raw)
    return cycle.CycleContext(spec=spec, dsn=dsn, upstream=bootstrap,
                              blob=blob_store_from_url(f"s3://reclock/{name}", net.s3),
                              spark_factory=lambda: SparkTarget(remote=url).session(name), clock=Clock())


def _produce(bootstrap: str, topic: str, ids: range) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    for i in ids:
        p.produce(topic, value=json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=i % 2)
    assert p.flush(60) == 0


def _stacks(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(gone)"


def step_under_fault(ctx: cycle.CycleContext, proxy: Proxy, fault: str, rng: random.Random,
                     bound: float = STEP_BOUND_S) -> str:
    """One cycle with ``fault`` put on ``proxy`` a moment after it starts: latency and bandwidth held until
    the cycle ends, a reset or the service gone for 3 s, a black hole until the cycle ends (only a timeout
    ends it). Returns how the cycle ended ("completed" or the error); fails if it outlived ``bound``
    (:data:`STEP_BOUND_S`), or if the fault came after the cycle had already ended."""
    box: dict = {}

    def run() -> None:
        try:
            cycle.run_cycle(ctx)
            box["end"] = "completed"
        except Exception as e:  # noqa: BLE001 - a clean failure is an outcome; the oracle judges the end
            box["end"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"

    t = threading.Thread(target=run, daemon=True, name=f"cycle-under-{fault}")
    t0 = time.monotonic()
    t.start()
    time.sleep(rng.uniform(0.1, 0.6))  # within the cycle's first second: a warm cycle of a round takes ~2 s
    mid_step = t.is_alive()
    proxy.inject(fault)
    try:
        if fault in ("reset", "down"):
            t.join(3)
            proxy.heal()
        t.join(max(1.0, bound - (time.monotonic() - t0)))
        if t.is_alive():
            pytest.fail(f"a cycle under {fault} to {proxy.name} ran more than {bound:.0f} s:\n{_stacks(t)}")
    finally:
        proxy.heal()
    assert mid_step, f"the cycle ended before the {fault} came ({box}): make the round longer"
    return f"{box['end']} in {time.monotonic() - t0:.0f} s"


def catch_up(ctx: cycle.CycleContext, tries: int = 20) -> None:
    """Cycles until one finds nothing new (a cycle may still fail once on a connection the fault spoiled:
    the next one runs)."""
    errors = []
    for _ in range(tries):
        try:
            if cycle.run_cycle(ctx)["minted"] is None:
                return
        except Exception as e:  # noqa: BLE001 - counted; too many fail the test
            errors.append(f"{type(e).__name__}: {e}")
    pytest.fail(f"no quiet cycle after {tries} tries: {errors[-3:]}")


def _faults_against(net: Net, db: str, service: str, faults: tuple[str, ...], seed: int,
                    bound: float = STEP_BOUND_S) -> list[str]:
    rng = random.Random(seed)
    topic = f"net_{service}_{seed}"
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": net.direct_bootstrap})  # kept: its futures die with it
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    ctx = _context(net, db, service, topic, name=f"net_{service[:5]}_{seed}")
    _produce(net.direct_bootstrap, topic, range(0, RECORDS))
    cycle.run_cycle(ctx)  # registered, a first binding written through the healthy proxy
    outcomes, n = [], RECORDS
    for fault in faults:
        _produce(net.direct_bootstrap, topic, range(n, n + RECORDS))
        n += RECORDS
        outcomes.append(f"{fault}: {step_under_fault(ctx, net.proxies[service], fault, rng, bound)}")
    catch_up(ctx)
    check_invariants(ctx, set(range(n)))
    ctx.close()
    return outcomes


def test_the_short_plan_puts_every_short_fault_on_some_service_and_some_fault_on_every_service():
    assert set(SHORT_PLAN) == set(SERVICES)
    assert {f for faults in SHORT_PLAN.values() for f in faults} == set(SHORT_FAULTS)


@pytest.mark.parametrize("service", SERVICES)
def test_cycles_through_network_faults_complete_or_fail_cleanly_and_catch_up_exactly(net, db, service,
                                                                                       monkeypatch):
    bound = STEP_BOUND_S
    if service == "postgres":  # the black hole's service: the bounds lowered (SHORT_PG_TIMEOUT_S)
        monkeypatch.setenv("RECLOCK_PG_TIMEOUT_S", str(SHORT_PG_TIMEOUT_S))
        monkeypatch.setattr(persist, "CONNECT_RETRY_S", float(SHORT_PG_TIMEOUT_S))
        db = make_conninfo(db, connect_timeout=str(SHORT_PG_TIMEOUT_S))
        bound = SHORT_PG_STEP_BOUND_S
    outcomes = _faults_against(net, db, service, SHORT_PLAN[service], seed=37, bound=bound)
    print(f"{service}: {outcomes}")


BLOCKER_TAG = "held-executors"


def test_a_write_queued_past_its_step_timeout_is_interrupted_alone_and_the_next_cycles_land_everything_once(
        net, db):
    """Every executor slot of the Spark Connect server held by another session's job (a cluster that lost its
    executors, or the jobs of other tries: issue 37's campaign had a try wait 12.5 minutes so): the write's
    job waits in the queue until the source's ``step_timeout``, is interrupted then, and the step fails with
    ``StepDeadlineExceeded`` naming itself and the deadline, recorded as the source's status. The other
    session's job is not touched by it. Nothing of the step is visible: once the slots are free, the next
    cycles land every record once."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from reclock.persist.status import latest_status

    topic, name = "net_deadline", "net_deadline"
    admin = AdminClient({"bootstrap.servers": net.direct_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    ctx = _context(net, db, "none", topic, name=name)
    _produce(net.direct_bootstrap, topic, range(0, RECORDS))
    minted = cycle.mint(ctx)  # registered, a first binding
    assert minted.descriptions and minted.binding is not None

    other = ConnectSession.builder.remote(net.connect_url).create()  # a session of its own on the server
    held: dict = {}

    def hold() -> None:  # both task slots of local[2], for ten minutes unless interrupted
        other.addTag(BLOCKER_TAG)
        try:
            other.range(2, numPartitions=2).selectExpr(
                "reflect('java.lang.Thread', 'sleep', cast(600000 as bigint))").collect()
            held["end"] = "finished"
        except Exception as e:  # noqa: BLE001 - its interrupt below is how it should end
            held["end"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"

    holder = threading.Thread(target=hold, daemon=True, name="held-executors")
    holder.start()
    default = ctx.spec
    ctx.spec = replace(default, step_timeout_s=4.0)
    try:
        time.sleep(3)  # its tasks started
        with pytest.raises(StepDeadlineExceeded) as raised:
            cycle.write_batches(ctx, minted.descriptions[0])
        assert holder.is_alive(), f"the step's interrupt ended another session's job: {held}"
    finally:
        ctx.spec = default
        other.interruptTag(BLOCKER_TAG)
        holder.join(120)
        other.stop()
    assert "OPERATION_CANCELED" in held.get("end", ""), held
    e = raised.value
    assert e.seconds == 4 and e.interrupted >= 1, f"{e}; cause: {e.__cause__!r}"
    assert f"source {name}: write_batches" in str(e) and "deadline of 4 s" in str(e) and "step_timeout" in str(e)
    with persist.connect(db) as conn:
        status = latest_status(conn, name)
    assert status.status == "stalled" and status.step == "write_batches" and "deadline of 4 s" in status.error, status
    catch_up(ctx)
    check_invariants(ctx, set(range(RECORDS)))
    ctx.close()


def _write_behind_a_held_job(ctx: cycle.CycleContext, desc, url: str, name: str):
    """A job in a session of its own to ``url`` holds both task slots of the server's ``local[2]`` (until the
    server dies under it), and ``write_batches`` of ``desc`` starts in a thread (``name``) and queues behind it.
    Returns the writer thread, the dict its result (``written``) or error (``error``) lands in, and the holding
    session (the caller closes it)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    other = ConnectSession.builder.remote(url).create()

    def hold() -> None:
        with contextlib.suppress(Exception):
            other.range(2, numPartitions=2).selectExpr(
                "reflect('java.lang.Thread', 'sleep', cast(600000 as bigint))").collect()

    threading.Thread(target=hold, daemon=True, name="held-executors").start()
    box: dict = {}

    def write() -> None:
        try:
            box["written"] = cycle.write_batches(ctx, desc)
        except Exception as e:  # noqa: BLE001 - the caller reports it
            box["error"] = e

    writer = threading.Thread(target=write, daemon=True, name=name)
    time.sleep(3)  # the held job's tasks started
    writer.start()
    time.sleep(3)  # the write's job queued behind them
    assert writer.is_alive(), box
    return writer, box, other


def test_a_write_whose_connect_server_restarts_under_its_job_goes_on_in_a_new_session(net, db):
    """The Spark Connect server SIGKILLed while a ``write_batches`` job waits for executor slots, and started
    again on its port (what the fault campaign's ``spark_restart`` does; its server-side sessions and jobs go
    with the old driver): the step's client retries the unreachable server until the new one answers, which
    says the session is gone, and the step writes again in a new session, in the same call, instead of
    failing its task. The cycle then appends it: every record once."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from benchmarks.chaos import start_again
    from reclock.dev import procs

    topic, name = "net_restart", "net_restart"
    admin = AdminClient({"bootstrap.servers": net.direct_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    ctx = _context(net, db, "none", topic, name=name)
    _produce(net.direct_bootstrap, topic, range(0, RECORDS))
    minted = cycle.mint(ctx)
    assert minted.descriptions and minted.binding is not None
    ctx.spark()  # attached before the restart: the session the restart takes away

    writer, box, other = _write_behind_a_held_job(ctx, minted.descriptions[0], net.connect_url, "write-under-restart")
    procs.kill_group(net.server.pidfile)
    try:
        time.sleep(2)
        start_again(net.server, "spark connect", timeout=600)
        writer.join(STEP_BOUND_S)
        assert not writer.is_alive(), f"the write outlived the restart by {STEP_BOUND_S:.0f} s:\n{_stacks(writer)}"
    finally:
        with contextlib.suppress(Exception):
            other.stop()
    assert "error" not in box, f"the write failed instead of writing again: {box['error']!r}"
    from reclock.persist.status import latest_statistics

    with persist.connect(db) as conn:
        (stats,) = latest_statistics(conn, name, "write_batches", limit=1)
    assert stats.metrics.get("session_reattached") == 1 and stats.metrics.get("records_read"), stats
    cycle.append(ctx, box["written"])
    catch_up(ctx)
    check_invariants(ctx, set(range(RECORDS)))
    ctx.close()


_DEAD_WRITER = """
import json, sys
from reclock import cycle
from reclock.config import parse_source
from reclock.persist.blob import blob_store_from_url
from reclock.persist.objectstore import S3Settings
from reclock.settings import SparkTarget

a = json.loads(sys.argv[1])
ctx = cycle.CycleContext(spec=parse_source(a["name"], a["raw"]), dsn=a["dsn"], upstream=a["bootstrap"],
                         blob=blob_store_from_url(a["blob"], S3Settings(**a["s3"])),
                         spark_factory=lambda: SparkTarget(remote=a["url"]).session(a["name"]))
minted = cycle.mint(ctx)
print("writing", flush=True)
cycle.write_batches(ctx, minted.descriptions[0])
print("written", flush=True)
"""


def test_the_next_write_interrupts_the_spark_work_a_killed_writer_left_running(net, db):
    """A cycle process SIGKILLed while its write's job waits on the Spark Connect server (what a killed
    Airflow task leaves): the server keeps the job (its client is gone, nobody will read its output). The
    source's next write step holds the source's write lock, so no live writer runs that job: it interrupts it
    before writing (``reclock.spark.orphans``; the step's statistics count it), then writes and appends
    every record once."""
    import dataclasses
    import subprocess

    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from reclock.persist.status import latest_statistics

    topic, name = "net_orphan", "net_orphan"
    admin = AdminClient({"bootstrap.servers": net.direct_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    ctx = _context(net, db, "none", topic, name=name)
    _produce(net.direct_bootstrap, topic, range(0, RECORDS))
    ctx.spark()  # the source's shared session, made before the holding one (a process's later sessions
    # to the same server would be its default one, the holding one)
    other = ConnectSession.builder.remote(net.connect_url).create()

    def hold() -> None:  # both task slots of the server's local[2], until interrupted
        with contextlib.suppress(Exception):
            other.range(2, numPartitions=2).selectExpr(
                "reflect('java.lang.Thread', 'sleep', cast(600000 as bigint))").collect()

    threading.Thread(target=hold, daemon=True, name="held-executors").start()
    args = {"name": name, "dsn": db, "bootstrap": net.direct_bootstrap, "url": net.connect_url,
            "blob": f"s3://reclock/{name}", "s3": dataclasses.asdict(net.s3),
            "raw": {"kafka": {"topic": topic, "bootstrap": net.direct_bootstrap},
                    "format": {"type": "json", "schema": "id BIGINT, name STRING"},
                    "include": ["partition", "offset", "key"], "budget": {"max_records": 40}}}
    writer = subprocess.Popen([sys.executable, "-c", _DEAD_WRITER, json.dumps(args)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline().strip() == "writing", "the writer died before its write"
        time.sleep(5)  # its job submitted, queued behind the held one
        assert writer.poll() is None, "the write finished: nothing was left running"
        writer.kill()
        writer.wait(30)
        box: dict = {}

        def run() -> None:
            try:
                box["out"] = cycle.run_cycle(ctx)
            except Exception as e:  # noqa: BLE001 - the assertion below reports it
                box["error"] = e

        cycler = threading.Thread(target=run, daemon=True, name="next-writer")
        cycler.start()
        time.sleep(5)  # its write step has interrupted the orphan and queued its own job
        other.interruptAll()
        cycler.join(STEP_BOUND_S)
        assert not cycler.is_alive(), f"the cycle outlived {STEP_BOUND_S:.0f} s:\n{_stacks(cycler)}"
    finally:
        if writer.poll() is None:
            writer.kill()
        with contextlib.suppress(Exception):
            other.interruptAll()
        with contextlib.suppress(Exception):
            other.stop()
    assert "error" not in box, f"the next cycle failed: {box['error']!r}"
    with persist.connect(db) as conn:
        stats = latest_statistics(conn, name, "write_batches", limit=10)
    assert sum(s.metrics.get("orphans_interrupted", 0) for s in stats) == 1, [s.metrics for s in stats]
    catch_up(ctx)
    check_invariants(ctx, set(range(RECORDS)))
    ctx.close()


def test_a_write_whose_connect_server_dies_goes_on_on_the_server_that_stands_in(net, db, stack_state):
    """Two Connect servers named in one URL list: the step's session goes to the longer-running one; that one
    is SIGKILLed (and stays down) while the write's job waits for its executor slots. The step's client gives
    up on it within seconds and the step writes again on the other server, in the same call, instead of
    waiting for the dead one; the cycle appends every record once. A session made while it is down goes to
    the other at once."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from benchmarks.chaos import start_again
    from reclock.dev import procs
    from reclock.dev.spark import LocalSparkConnect
    from reclock.spark import connect as spark_connect

    topic, name = "net_failover", "net_failover"
    admin = AdminClient({"bootstrap.servers": net.direct_bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    stand_in = LocalSparkConnect(stack_state, master="local[2]", driver_memory="1g", name="net_spark_b", s3=net.s3)
    other = None
    try:
        stand_in.start(timeout=600)  # younger than net.server: sessions go to net.server while it answers
        remote = f"{net.connect_url},{stand_in.url}"
        ctx = _context(net, db, "none", topic, name=name)
        ctx.spark_factory = lambda: SparkTarget(remote=remote).session(name)
        _produce(net.direct_bootstrap, topic, range(0, RECORDS))
        minted = cycle.mint(ctx)
        assert minted.descriptions and minted.binding is not None
        port = lambda session: int(session.conf.get("spark.connect.grpc.binding.port"))  # noqa: E731
        assert port(ctx.spark()) == net.server.port, "the session is not on the longer-running server"

        writer, box, other = _write_behind_a_held_job(ctx, minted.descriptions[0], net.connect_url,
                                                      "write-under-failover")
        t0 = time.monotonic()
        procs.kill_group(net.server.pidfile)
        writer.join(STEP_BOUND_S)
        assert not writer.is_alive(), f"the write outlived its server by {STEP_BOUND_S:.0f} s:\n{_stacks(writer)}"
        took = time.monotonic() - t0
        assert "error" not in box, f"the write failed instead of going on on the other server: {box['error']!r}"
        assert took < spark_connect._total_wait_s(spark_connect.RETRY), \
            f"{took:.0f} s: the step waited as long as for a server of its own"
        assert port(ctx.spark()) == stand_in.port
        from reclock.persist.status import latest_statistics

        with persist.connect(db) as conn:
            (stats,) = latest_statistics(conn, name, "write_batches", limit=1)
        assert stats.metrics.get("session_reattached") == 1 and stats.metrics.get("records_read"), stats
        t0 = time.monotonic()
        fresh = SparkTarget(remote=remote).session("net_failover_fresh")
        try:
            assert port(fresh) == stand_in.port and time.monotonic() - t0 < 30
        finally:
            spark_connect.close(fresh)
        cycle.append(ctx, box["written"])
        catch_up(ctx)
        check_invariants(ctx, set(range(RECORDS)))
        ctx.close()
    finally:
        if not net.server.running():
            start_again(net.server, "spark connect", timeout=600)  # the module's other tests use it
        if other is not None:
            spark_connect.close(other)  # no call to its dead server at the interpreter's exit
        stand_in.stop()


@pytest.mark.deployment
@pytest.mark.parametrize("service", SERVICES)
def test_every_network_fault_against_every_service_several_times(net, db, service):
    faults = tuple(random.Random(7).sample(NETWORK_FAULTS * 3, len(NETWORK_FAULTS) * 3))
    outcomes = _faults_against(net, db, service, faults, seed=7)
    print(f"{service}: {outcomes}")
