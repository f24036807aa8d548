"""Shared fixtures: the real services, started once per test session through ``reclock.dev`` and stopped
at the end. Every server listens on 127.0.0.1 and lives under a temporary state folder."""

from __future__ import annotations

import itertools
import logging
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Callable
import os

import hypothesis
import psycopg
import pytest

from reclock.dev.postgres import LocalPostgres
from reclock.dev.procs import Stops
from reclock.dev.state import StackState

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# boto3 (the Kinesis source's client, in this process and in Spark's Python workers, which inherit the
# environment of the JVMs started from here) signs with the standard chain; the local Kinesis endpoint
# checks no keys, but a client needs some
os.environ.setdefault("AWS_ACCESS_KEY_ID", "reclock-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "reclock-test")
# py4j logs "Closing down clientserver connection" at INFO from a __del__ at interpreter exit, after
# pytest closed the stream a logging handler writes to: a "--- Logging error ---" trace after every run.
logging.getLogger("py4j").setLevel(logging.WARNING)
# hypothesis's per-example deadline is a timing assertion: on a shared 2-core machine a law's example may
# take longer than 200 ms without anything being wrong. Under CI (CI=true, as CI services set it) the
# laws draw the same examples every run, so main's result is the code's; elsewhere (make test in a worktree)
# they draw new ones each run and go on searching, and a law's counterexample is pinned with an @example.
hypothesis.settings.register_profile("reclock", deadline=None,
                                     derandomize=os.environ.get("CI", "").lower() in ("1", "true", "yes"))
hypothesis.settings.load_profile("reclock")

_db_counter = itertools.count()

THROWAWAY_GRACE_S = 3
"""How long a session broker's controlled shutdown may take before it is SIGKILLed: its data goes with the
session's folder (three nodes stopping at once took 7 s of the session's end)."""

DEPLOYMENT = ("deployment tests (long faults of a deployment's shape) run with `make test-deployment` "
              "(pytest --deployment); `make test` runs their short versions")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (``timeout``'s, a CI limit's) ends the session as Ctrl-C does, through the fixtures' teardowns,
    which stop every server the session started; by default Python died at once and the servers (each in a
    session of its own) ran on (``benchmarks/stop.py``).

    Under pytest-xdist (``make test``) the tests and their servers are the workers': the controller passes
    the first SIGINT or SIGTERM on to them and waits while they stop their servers (a second one ends it at
    once); a worker stops on the first of either and ignores the rest, so the clean-up is not cut short.
    (Left to xdist, the controller's interrupt gave the workers 10 s and killed them mid-teardown: a stopped
    run left an Airflow stack running.)"""
    from benchmarks import stop

    if hasattr(config, "workerinput"):
        stop.install(signal.SIGINT, signal.SIGTERM)
    elif config.getoption("numprocesses", None):
        _pass_signals_to_workers()
    else:
        stop.install(signal.SIGTERM)


def _pass_signals_to_workers() -> None:
    import psutil

    controller, got = psutil.Process(), []

    def pass_on(signum: int, frame: object) -> None:
        got.append(signum)
        if len(got) > 1:
            raise KeyboardInterrupt(f"signal {signum} again")
        print(f"\nsignal {signum}: the workers stop every service they started; please wait", flush=True)
        for worker in controller.children():
            try:
                worker.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, pass_on)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--deployment", action="store_true", default=False,
                     help="also run the tests marked deployment (the long cluster, scheduler, failover, upgrade "
                          "and network-fault runs; `make test-deployment`)")


HEAVY = ("bench", "chaos", "stack")
"""The test folders whose tests each start a whole stack of their own (Airflow, Spark, Kafka, Postgres): under
``make test``'s two pytest-xdist workers they form one group, run one after another on one worker, first,
while the other worker takes the rest; two such stacks at once on the 2 cores made both crawl."""


def xdist_scope(nodeid: str) -> str:
    """The pytest-xdist work unit of a test (a unit runs on one worker, in collection order): ``heavy`` for the
    folders of :data:`HEAVY`, else its module, so that a module's fixtures start once."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "heavy" if len(parts) > 2 and parts[0] == "tests" and parts[1] in HEAVY else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``make test``'s scheduler: pytest-xdist's load-scope scheduling over :func:`xdist_scope`'s units, in
    collection order (``--no-loadscope-reorder``). (Its ``loadgroup`` reads ``xdist_group`` marks into node
    ids, which pytest 9.2 no longer lets a plugin change: every test ran as a unit of its own.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return Scopes(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy tests (:data:`HEAVY`) first, so that under pytest-xdist the longest unit starts first and the
    rest fills the other worker; tests marked ``deployment`` are skipped (with the command that runs them)
    unless ``--deployment``."""
    items.sort(key=lambda item: xdist_scope(item.nodeid) != "heavy")  # stable: the order within each part is kept
    if config.getoption("--deployment"):
        return
    skip = pytest.mark.skip(reason=DEPLOYMENT)
    for item in items:
        if "deployment" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def stack_state():
    """A state folder of the test session's own (ports chosen free, secrets generated). It lives outside
    pytest's 0700 temp folders because the ``postgres`` user must reach the cluster's files."""
    root = tempfile.mkdtemp(prefix="reclock-tests-")
    os.chmod(root, 0o755)
    yield StackState(Path(root))
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def stops(stack_state: StackState):
    """The session's services stop side by side at its end (one after another they took 53 s): a service
    fixture's teardown hands its stop to ``stops.later`` and returns at once; this fixture's own teardown,
    which pytest runs after that of every fixture that requested it (and before ``stack_state``'s), stops
    them all at once and fails naming every stop that failed (``reclock.dev.procs.Stops``)."""
    session_stops = Stops()
    yield session_stops
    session_stops.stop_all()


@pytest.fixture(scope="session")
def postgres(stack_state: StackState, stops: Stops):
    """A real Postgres 15+ cluster on a free loopback port (fsync off: throwaway)."""
    pg = LocalPostgres(stack_state, fast=True)
    pg.start()
    yield pg
    stops.later("postgres", pg.stop)


@pytest.fixture
def fresh_db(postgres: LocalPostgres) -> str:
    """A new, empty database for one test; returns its DSN."""
    name = f"t{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres.dsn(name)


@pytest.fixture(scope="session")
def migrated_template(postgres: LocalPostgres) -> str:
    """The name of a database with the ``reclock`` schema migrated, once per session, that ``db`` copies
    (``CREATE DATABASE ... TEMPLATE``: half the time of migrating each new database, ~260 of them a session).
    Nobody may connect to it after its migration (a copy needs its template without sessions): connections
    to it are refused."""
    from reclock.persist.migrate import migrate

    name = f"reclock_template_{os.getpid()}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        migrate(postgres.dsn(name))
        conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
    return name


@pytest.fixture
def db(request: pytest.FixtureRequest, postgres: LocalPostgres, migrated_template: str) -> str:
    """A new database with the ``reclock`` schema migrated (a copy of ``migrated_template``); returns its DSN.
    A test that also takes ``fresh_db`` gets that database, migrated (the two are one database)."""
    if "fresh_db" in request.fixturenames:
        from reclock.persist.migrate import migrate

        dsn = request.getfixturevalue("fresh_db")
        migrate(dsn)
        return dsn
    name = f"t{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}"')
    return postgres.dsn(name)


@pytest.fixture(scope="session")
def kafka(stack_state: StackState, stops: Stops):
    """A real single-node KRaft broker from the Maven jars."""
    from reclock.dev.kafka import LocalKafka

    broker = LocalKafka(stack_state, heap="512m", proxied=True)  # a listener for the network-fault proxy too
    broker.start()
    yield broker
    stops.later("kafka", lambda: broker.stop(grace=THROWAWAY_GRACE_S))


@pytest.fixture(scope="session")
def kafka_cluster(stack_state: StackState, stops: Stops):
    """Three KRaft nodes from the Maven jars (each a broker and a controller), replication factor 3 and
    ``min.insync.replicas`` 2 for every topic and for the offsets and transaction state logs: the faults of a
    cluster (``reclock.dev.kafka.LocalKafkaCluster``)."""
    from reclock.dev.kafka import LocalKafkaCluster

    cluster = LocalKafkaCluster(stack_state, heap="384m")
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    stops.later("kafka_cluster", lambda: cluster.stop(grace=THROWAWAY_GRACE_S))


@pytest.fixture(scope="session")
def toxiproxy(stack_state: StackState, stops: Stops):
    """Toxiproxy (built from its Go module by ``reclock dev install``): proxies that put network faults
    between Reclock and a service (``reclock.dev.toxiproxy``)."""
    from reclock.dev.toxiproxy import LocalToxiproxy

    server = LocalToxiproxy(stack_state)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    yield server
    stops.later("toxiproxy", server.stop)


@pytest.fixture(scope="session")
def spark(stack_state: StackState, stops: Stops):
    """One in-process local Spark session (with the Kafka connector) for the whole test session."""
    from reclock.dev.spark import local_session

    session = local_session(stack_state, app="reclock-tests")
    yield session
    stops.later("spark", session.stop)


@pytest.fixture(scope="session")
def s3(stack_state: StackState, stops: Stops):
    """A real S3 API endpoint (moto's server) on a free loopback port, with one bucket (``s3.url(prefix)``)."""
    from reclock.dev.s3 import LocalS3

    server = LocalS3(stack_state)
    server.start()
    yield server
    stops.later("s3", server.stop)


@pytest.fixture(scope="session")
def kinesis(stack_state: StackState, stops: Stops):
    """A real Kinesis API endpoint (kinesalite) on a free loopback port; ``kinesis.create_stream(name, n)``.
    Its clock is never moved (a test that moves time starts a server of its own: ``kinesis_server``)."""
    from reclock.dev.kinesis import LocalKinesis

    server = LocalKinesis(stack_state)
    server.start()
    yield server
    stops.later("kinesis", server.stop)


@pytest.fixture
def kinesis_server(stack_state: StackState):
    """Start a Kinesis endpoint of the test's own: ``kinesis_server(name)`` (its clock may be moved)."""
    from reclock.dev.kinesis import LocalKinesis

    started = []

    def start(name: str):
        server = LocalKinesis(stack_state, name=name)
        server.start()
        started.append(server)
        return server
    yield start
    for server in started:
        server.stop()


@pytest.fixture
def stream(kinesis) -> "Callable[..., str]":
    """Create a fresh stream on ``kinesis``: ``stream(shards=2)`` returns its name."""
    names = (f"s{next(_db_counter)}-{os.getpid()}" for _ in itertools.count())

    def make(shards: int = 2) -> str:
        name = next(names)
        kinesis.create_stream(name, shards)
        return name
    return make


@pytest.fixture
def topic(kafka) -> "Callable[..., str]":
    """Create a fresh topic: ``topic(partitions=4, **config)`` returns its name."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    made: list[str] = []

    def make(partitions: int = 4, **config: str) -> str:
        name = f"t_{os.getpid()}_{next(_db_counter)}"
        for fut in admin.create_topics([NewTopic(name, partitions, 1, config=config)]).values():
            fut.result(30)
        made.append(name)
        return name

    yield make
    if made:
        for fut in admin.delete_topics(made).values():
            try:
                fut.result(30)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass


@pytest.fixture(scope="session")
def registry(stack_state: StackState, stops: Stops):
    """A real Schema Registry (Apicurio, Confluent-compatible API; HTTP and HTTPS, basic auth) on free
    loopback ports, its schemas in memory."""
    from reclock.dev.registry import LocalRegistry

    server = LocalRegistry(stack_state)
    server.start()
    yield server
    stops.later("registry", server.stop)
