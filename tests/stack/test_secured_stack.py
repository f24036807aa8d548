"""Every service secured, end to end under the real Airflow: ``Stack(secure=True)`` (Postgres TLS-only with
SCRAM and least-privilege roles, Kafka SASL/SCRAM over TLS with exactly the config's ACLs, parts on S3 over
TLS, Spark Connect with a token over TLS; every certificate and user made here). A Kafka source, a
Postgres source (its first snapshot read by Spark over JDBC with TLS), an exactly-once Kafka sink and an
Iceberg export run through their DAGs. Airflow runs in multi-team mode: ``alice`` (viewer, team_a: the
Kafka source and both sinks) and ``bob`` (op, team_b: the Postgres source) each see only their own sources
and sinks on the Reclock pages, in the JSON, in the Prometheus metrics and in a browser. Spark Connect refuses a client without the
token. Then everything the run left behind (every file under the stack's folder, the process command
lines, Airflow's metadata tables (XCom, rendered fields, logs), every table of the reclock schema, Spark's
UI and environment, the pages and their JSON) is searched for every secret the run used."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from reclock.dev.state import REPO_ROOT, StackState

# The whole secured stack under the real Airflow takes many minutes: a deployment test (`make test-deployment`).
# `make test` keeps its parts' short versions: tests/security/ (Kafka SASL/SCRAM and mTLS with the derived ACLs
# and each refusal, Postgres TLS/SCRAM with the least-privilege roles, S3 over TLS, Spark Connect's token over
# TLS, no secret in what a run leaves) and the status report's per-viewer filter (tests/integration).
pytestmark = [pytest.mark.stack, pytest.mark.deployment]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CONFIG = """
sources:
  sec_orders:
    kafka: {connection: reclock_kafka, topic: sec_orders}
    format: {type: json, schema: "id BIGINT, name STRING"}
    interval: 1h
  sec_shop:
    postgres: {connection: reclock_demo_shop, publication: sec_pub, spark_snapshot_min_bytes: 0}
    tables: [public.orders, public.items]
    interval: 1h
sinks:
  sec_out:
    from: sec_orders
    kafka: {connection: reclock_kafka, topic: sec_orders_out}
    format: debezium
  sec_ice:
    from: sec_orders
    iceberg: {table: lake.sec_orders}
"""
TEAMS = {"team_a": ("sec_orders", "sec_out", "sec_ice"), "team_b": ("sec_shop",)}
USERS = {"alice": ("viewer", "team_a"), "bob": ("op", "team_b")}
DAG_FILE = """\"\"\"Airflow DAG file of a team's bundle: the DAGs of its sources and sinks only.\"\"\"
from pathlib import Path
from reclock.orchestration.dags import build_all

globals().update(build_all(project=Path({repo!r}), only={names!r}))
"""


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _bring_up(home: Path):
    from reclock.dev.stack import Stack

    (home / "reclock.yaml").write_text(CONFIG)
    teams = {}
    for team, names in TEAMS.items():
        folder = home / "bundles" / team
        folder.mkdir(parents=True)
        (folder / f"reclock_{team}.py").write_text(DAG_FILE.format(repo=str(REPO_ROOT), names=set(names)))
        teams[team] = folder
    stack = Stack(StackState(home / "stack"), secure=True)
    stack.airflow.teams, stack.airflow.users = teams, USERS
    return stack


def _kafka_topics(stack) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(stack.kafka.admin_config().librdkafka())
    for fut in admin.create_topics([NewTopic("sec_orders", 2, 1), NewTopic("sec_orders_out", 1, 1),
                                    NewTopic("_reclock_progress", 1, 1, config={"cleanup.policy": "compact"})
                                    ]).values():
        fut.result(30)
    producer = Producer(stack.kafka.admin_config().librdkafka({"enable.idempotence": True}))
    for i in range(300):
        producer.produce("sec_orders", json.dumps({"id": i, "name": f"n{i}"}).encode(), partition=i % 2)
    assert producer.flush(30) == 0, "records left unsent"


def _wait(what: str, check, timeout: float = 300, explain=lambda: "") -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout:.0f}s{explain()}")
        time.sleep(2)


def _dag_runs(stack, dag_id: str) -> str:
    """A DAG's runs, their states and each failed task's logged error: why a wait for it failed."""
    out = []
    for r in stack.airflow.api("GET", f"dags/{dag_id}/dagRuns?limit=20")["dag_runs"]:
        out.append(f"\n{dag_id} {r['dag_run_id']} ({r['run_type']}): {r['state']}")
        if r["state"] == "failed":
            for t in stack.airflow.api("GET", f"dags/{dag_id}/dagRuns/{r['dag_run_id']}/taskInstances")[
                    "task_instances"]:
                out.append(stack.airflow._log_tail(dag_id, r["dag_run_id"], t["task_id"]))
    from reclock.persist import connect

    with connect(stack.dsn) as conn:
        out += [f"\nstatus {row}" for row in conn.execute(
            "SELECT status, error FROM reclock.status_history WHERE name = %s ORDER BY id DESC LIMIT 3",
            (dag_id.split("__", 1)[1],)).fetchall()]
    return "".join(out)


def _run(stack) -> dict:
    """The four DAGs under the scheduler; what landed."""
    from reclock.dev.demo import shop_upstream, shop_wave
    from reclock.persist import connect
    from reclock.persist.blob import blob_store_from_url
    from reclock.read import read_as_of
    from reclock.sinks.kafka import read_all, read_progress

    shop = shop_upstream(stack, "sec_pub", ["public.orders", "public.items"])
    shop_wave(shop, 40, seed=7)
    _kafka_topics(stack)
    for dag in ("ingest__sec_orders", "ingest__sec_shop", "sink__sec_out", "sink__sec_ice"):
        stack.airflow.wait_for_dag(dag, timeout=180)
    stack.airflow.unpause("sink__sec_out")
    stack.airflow.unpause("sink__sec_ice")
    for dag in ("ingest__sec_orders", "ingest__sec_shop"):
        stack.airflow.wait_run(dag, stack.airflow.trigger(dag), timeout=600)
    admin = stack.kafka.admin_config()
    with connect(stack.dsn) as conn:
        uppers = dict(conn.execute("SELECT id, upper FROM reclock.shards").fetchall())
    _wait("sink sec_out", lambda: (p := read_progress(admin, "_reclock_progress", "sec_out")) is not None
          and p.frontier >= uppers["sec_orders"], 300, lambda: _dag_runs(stack, "sink__sec_out"))
    blob = blob_store_from_url(stack.blob_url, stack.s3.settings())
    with connect(stack.dsn) as conn:
        rows = {s: read_as_of(conn, blob, s, uppers[s] - 1).num_rows for s in
                ("sec_orders", "sec_shop__orders", "sec_shop__items")}
        _wait("sink sec_ice", lambda: conn.execute(
            "SELECT status FROM reclock.status_history WHERE name = 'sec_ice' ORDER BY id DESC LIMIT 1"
        ).fetchone() == ("running",), 300, lambda: _dag_runs(stack, "sink__sec_ice"))
    out = [json.loads(m.value()) for m in read_all(admin, "sec_orders_out", "oracle")]
    with psycopg.connect(shop) as up:
        upstream = {t: up.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("orders", "items")}
    return {"rows": rows, "out": out, "upstream": upstream}


def _iceberg_rows(stack) -> int:
    from reclock.config import load_config
    from reclock.orchestration import contexts
    from reclock.sinks.iceberg import load_catalog

    spec = load_config().sink("sec_ice")
    ctx = contexts.iceberg_sink_context(spec, dsn=stack.dsn, blob_url=stack.blob_url)
    return load_catalog(ctx.catalog, spec.catalog).load_table("lake.sec_orders").scan().to_arrow().num_rows


def _lineage(path: Path, stack) -> None:
    """OpenLineage events (the provider's file transport) of the secured run: what each task read and wrote,
    the Iceberg export's table among them."""
    import time

    jobs = {"ingest__sec_orders.mint_write", "ingest__sec_shop.mint_write", "sink__sec_out.write",
            "sink__sec_ice.write"}
    done: dict = {}
    deadline = time.monotonic() + 120  # the provider sends a task's events after its state is saved
    while not jobs <= set(done) and time.monotonic() < deadline:
        time.sleep(2)
        lines = path.read_text().splitlines() if path.exists() else []
        for e in (json.loads(line) for line in lines if line.strip()):
            if e.get("eventType") == "COMPLETE":
                done[e["job"]["name"]] = ({d["name"] for d in e.get("inputs", [])},
                                          {d["name"] for d in e.get("outputs", [])})
    assert jobs <= set(done), f"no COMPLETE event for {sorted(jobs - set(done))}"
    assert done["ingest__sec_orders.mint_write"][0] == {"sec_orders"}
    assert done["ingest__sec_shop.mint_write"][0] == {"demo_shop.public.orders", "demo_shop.public.items"}
    assert done["sink__sec_out.write"] == ({"sec_orders"}, {"sec_orders_out"})
    assert done["sink__sec_ice.write"] == ({"sec_orders"}, {"lake.sec_orders"})


def _pages(stack) -> str:
    """Each user sees only their team's sources and sinks (JSON and HTML); returns everything served."""
    base = stack.airflow.url
    served = []
    from prometheus_client.parser import text_string_to_metric_families

    assert _get(base + "/reclock/api/overview")[0] == 401
    assert _get(base + "/reclock/metrics")[0] == 401
    seen, metrics = {}, {}
    expect = {("admin", "sec_orders"): 200, ("admin", "sec_shop"): 200, ("alice", "sec_orders"): 200,
              ("alice", "sec_shop"): 404, ("bob", "sec_orders"): 404, ("bob", "sec_shop"): 200}
    for user in ("admin", "alice", "bob"):
        token = stack.airflow.token(user)
        status, body = _get(base + "/reclock/api/overview", token)
        assert status == 200, body
        ov = json.loads(body)
        seen[user] = ({s["name"] for s in ov["sources"]}, {k["name"] for k in ov["sinks"]})
        served.append(body.decode())
        status, page = _get(base + "/reclock/", token)
        assert status == 200
        served.append(page.decode())
        hidden = {"alice": "sec_shop", "bob": "sec_orders"}.get(user)
        if hidden:
            assert f"data-source='{hidden}'" not in page.decode() and hidden not in served[-2]
        status, body = _get(base + "/reclock/metrics", token)  # Prometheus's endpoint: the same filter
        assert status == 200, body
        scraped = {(s.labels.get("source"), s.labels.get("sink")) for fam in text_string_to_metric_families(
            body.decode()) for s in fam.samples}
        metrics[user] = ({a for a, _ in scraped if a}, {b for _, b in scraped if b})
        served.append(body.decode())
        for source in ("sec_orders", "sec_shop"):
            for path in (f"/reclock/source/{source}", f"/reclock/api/source/{source}"):
                status, body = _get(base + path, token)
                assert status == expect[user, source], (user, path, status)
                served.append(body.decode())
    assert seen["admin"] == ({"sec_orders", "sec_shop"}, {"sec_out", "sec_ice"})
    assert seen["alice"] == ({"sec_orders"}, {"sec_out", "sec_ice"})
    assert seen["bob"] == ({"sec_shop"}, set())
    assert metrics == seen, metrics
    return "\n".join(served)


def _browse_as_alice(stack) -> str:
    from playwright.sync_api import sync_playwright

    base = stack.airflow.url
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            page.goto(f"{base}/auth/login")
            page.locator("input[name=username]").fill("alice")
            page.locator("input[name=password]").fill(stack.airflow.user_password("alice"))
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60_000)
            assert page.goto(f"{base}/reclock/").status == 200
            page.locator("tr[data-source='sec_orders']").wait_for(timeout=60_000)
            assert page.locator("tr[data-source='sec_shop']").count() == 0
            assert page.goto(f"{base}/reclock/source/sec_shop").status == 404
            return page.content()
        finally:
            browser.close()


def _spark_connect_refusals(stack) -> None:
    code = ("import sys; from pyspark.sql import SparkSession as S\n"
            "try:\n  S.builder.remote(sys.argv[1]).getOrCreate().range(3).count(); print('SERVED')\n"
            "except Exception as e:\n  print(type(e).__name__, str(e)[:400])")
    env = {**os.environ, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(stack.ca.cert)}
    front = stack.spark.url.split(";token=")[0]
    for url, words in ((front, "No authentication token provided"),
                       (front + ";token=not-the-token", "Invalid authentication token"),
                       (f"sc://127.0.0.1:{stack.spark.port}", "No authentication token provided")):
        out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env, timeout=180)
        assert "SERVED" not in out.stdout and words in out.stdout, out.stdout + out.stderr[-2000:]


def _spark_ui(stack) -> str:
    """Everything Spark Connect's UI shows through its REST API: environment, jobs, stages, SQL plans."""
    base = f"http://127.0.0.1:{stack.spark.ui_port}"
    texts = []
    (app,) = json.loads(_get(f"{base}/api/v1/applications")[1])
    for path in ("environment", "jobs", "stages?details=true", "sql?details=true&planDescription=true",
                 "executors"):
        status, body = _get(f"{base}/api/v1/applications/{app['id']}/{path}")
        assert status == 200, path
        texts.append(body.decode(errors="replace"))
    status, body = _get(f"{base}/connect/")
    texts.append(body.decode(errors="replace"))
    return "\n".join(texts)


def _tables(dsn: str, schema: str, names: list[str] | None = None) -> str:
    """Every row of every table of ``schema`` (or of ``names``), as text."""
    out = []
    with psycopg.connect(dsn) as conn:
        tables = names or [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)).fetchall()]
        for t in tables:
            out += [r[0] for r in conn.execute(f'SELECT t::text FROM "{schema}"."{t}" t').fetchall()]
    return "\n".join(out)


def _reclock_status(stack) -> str:
    """``reclock status`` (text, JSON, each source's detail) with the stack's settings, as an operator runs it."""
    env = {**os.environ, **stack.settings()}
    out = []
    for extra in ([], ["--json"], ["sec_orders"], ["sec_shop"]):
        res = subprocess.run([sys.executable, "-m", "reclock.cli", "status", *extra], capture_output=True, text=True,
                             env=env, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr[-2000:]
        out.append(res.stdout + res.stderr)
    assert "source sec_orders (kafka)" in out[0]
    return "\n".join(out)


def _command_lines() -> str:
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return "\n".join(lines)


def _files(root: Path, skip: set[Path]) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p not in skip}


@pytest.mark.timeout(3600)
def test_everything_secured_end_to_end(stack_home: Path, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RECLOCK_BOOTSTRAP", "RECLOCK_DSN"):
        monkeypatch.delenv(var, raising=False)  # the stack's processes find everything in their connections
    monkeypatch.setenv("RECLOCK_CONFIG", str(stack_home / "reclock.yaml"))
    lineage = stack_home / "stack" / "lineage.jsonl"  # under the stack's folder: searched for secrets too
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", json.dumps(
        {"type": "file", "log_file_path": str(lineage), "append": True}))
    stack = _bring_up(stack_home)
    try:
        stack.up()
        stack.smoke(echo=lambda line: None)
        monkeypatch.setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", str(stack.ca.cert))
        landed = _run(stack)
        assert landed["rows"]["sec_orders"] == 300
        assert sorted(m["after"]["id"] for m in landed["out"]) == list(range(300))  # exactly once
        assert landed["rows"]["sec_shop__orders"] == landed["upstream"]["orders"]
        assert landed["rows"]["sec_shop__items"] == landed["upstream"]["items"]
        assert _iceberg_rows(stack) == 300
        _lineage(lineage, stack)

        _spark_connect_refusals(stack)
        secrets = {role: stack.password(role) for role in ("reclock_app", "airflow", "reclock_cdc", "reclock")}
        secrets.update({"postgres superuser": stack.postgres.password, "spark connect token": stack.spark.token,
                        "s3 secret": stack.s3.settings().secret_key,
                        **{f"airflow user {u}": stack.airflow.user_password(u) for u in ("admin", "alice", "bob")},
                        "airflow jwt secret": stack.state.secret("airflow_jwt_secret"),
                        "airflow fernet": stack.state.secret("airflow_fernet", 24)})
        served = _pages(stack)
        if CHROMIUM is not None:
            served += _browse_as_alice(stack)

        # everything the run left behind, searched for every secret it used
        root = stack.state.root
        skip = {stack.state.file, root / "airflow" / "simple_auth_manager_passwords.json"}  # the secret stores
        places = {f"file {p.relative_to(root)}": data.decode(errors="replace")
                  for p, data in _files(root, skip).items()}
        places["process command lines"] = _command_lines()
        places["Spark UI"] = _spark_ui(stack)
        places["Reclock pages and JSON"] = served
        places["reclock status"] = _reclock_status(stack)
        places["reclock schema"] = _tables(stack.dsn, "reclock")
        places["Airflow metadata"] = _tables(stack.airflow_dsn, "public", [
            "xcom", "rendered_task_instance_fields", "log", "dag_run", "task_instance", "trigger", "asset_event",
            "serialized_dag", "import_error"])
        leaks = [f"{what} in {where}" for where, text in places.items() for what, s in secrets.items() if s in text]
        assert not leaks, leaks
    finally:
        stack.down(echo=lambda line: None)
