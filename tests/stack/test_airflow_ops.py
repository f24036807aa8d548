"""Airflow as Reclock's users use it, on one real stack (scheduler, dag-processor, triggerer, api-server):
``reclock dev airflow`` and ``reclock dev env``; typed params refused by the REST API; asset events only when an
append added updates, their extra the new range, the sink run only then; a run that fails before any step
shown as failed on the page, in ``reclock status`` and in the metrics; ``airflow backfill create`` of
``rebuild__`` re-deriving a window with a fixed decode (the rejected records back at their timestamps), and of
``sink__`` making one run; OpenLineage events through the provider's file transport; the Prometheus endpoint
scraped and parsed, behind the same authentication."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from reclock.persist import connect
from stack_support import SHARED_CONFIG, SharedStack

pytestmark = pytest.mark.stack

class Ops:
    """The shared stack (tests/stack/conftest.py) and what the tests need of it."""

    def __init__(self, shared: SharedStack) -> None:
        self.shared = shared
        self.config, self.lineage, self.env, self.stack = shared.config, shared.lineage, shared.env, shared.stack

    def reclock(self, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.shared.reclock(*args, env=env, timeout=timeout)

    def shell_env(self) -> dict[str, str]:
        """What `eval "$(reclock dev env)"` gives a shell."""
        return self.shared.shell_env()

    def produce(self, topic: str, values: list[bytes], partitions: int = 2) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.stack.kafka.bootstrap})
        if topic not in admin.list_topics(timeout=10).topics:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
        p = Producer({"bootstrap.servers": self.stack.kafka.bootstrap})
        for i, v in enumerate(values):
            p.produce(topic, value=v, partition=i % partitions)
        assert p.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"

    def run(self, dag_id: str, conf: dict | None = None) -> dict:
        run_id = self.stack.airflow.trigger(dag_id, conf=conf)
        return self.stack.airflow.wait_run(dag_id, run_id, timeout=300)

    def get(self, path: str, token: str | None = None, accept: str | None = None) -> tuple[int, bytes, str]:
        headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **({"Accept": accept} if accept else {})}
        req = urllib.request.Request(self.stack.airflow.url + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read(), r.url
        except urllib.error.HTTPError as e:
            return e.code, e.read(), e.url

    def rows(self, collection: str) -> list[dict]:
        from reclock.persist.blob import LocalBlobStore
        from reclock.read import read_updates

        with connect(self.stack.postgres.dsn()) as conn:
            t = read_updates(conn, LocalBlobStore(self.stack.state.root / "blobs"), collection)
        return [] if t is None else t.to_pylist()

    def wait_runs(self, dag_id: str, n: int, run_type: str | None = None, timeout: float = 300) -> list[dict]:
        """Until ``dag_id`` has ``n`` finished runs (of ``run_type``) and none unfinished."""
        q = f"dags/{dag_id}/dagRuns?limit=100" + (f"&run_type={run_type}" if run_type else "")
        deadline = time.monotonic() + timeout
        while True:
            runs = self.stack.airflow.api("GET", q)["dag_runs"]
            if len(runs) >= n and all(r["state"] in ("success", "failed") for r in runs):
                return runs
            assert time.monotonic() < deadline, runs
            time.sleep(2)


@pytest.fixture(scope="module")
def ops(shared_stack):
    from reclock.dev.demo import shop_upstream

    shared_stack.require_up()
    o = Ops(shared_stack)
    o.shop_dsn = shop_upstream(o.stack, "ops_shop_pub", ["ops_orders"], prefix="ops_")
    for dag in ("ingest__ops_orders", "ingest__ops_fix", "ingest__ops_shop", "rebuild__ops_fix", "sink__ops_out"):
        o.stack.airflow.wait_for_dag(dag)
    return o


def test_the_airflow_cli_and_the_reclock_commands_reach_the_stack(ops):
    import psycopg

    # eval "$(reclock dev env)": the airflow command itself, and a Postgres source's connection for `reclock cycle`
    shell = ops.shell_env()
    with ThreadPoolExecutor(3) as pool:  # three commands side by side (each mostly its interpreter's start-up)
        # reclock dev airflow: any airflow command, against the stack's metadata database
        listing = pool.submit(ops.reclock, "dev", "airflow", "dags", "list", "-o", "json")
        conn_get = pool.submit(subprocess.run, [str(Path(sys.executable).parent / "airflow"), "connections", "get",
                                                "reclock_demo_shop", "-o", "json"],
                               env=shell, capture_output=True, text=True, timeout=300)
        # an error is one line, never a traceback
        nope = pool.submit(ops.reclock, "cycle", "nope", env=shell)
        with psycopg.connect(ops.shop_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO ops_orders SELECT g, 'c', 'open', 1, now() FROM generate_series(1, 25) g")
        out = ops.reclock("cycle", "ops_shop", env=shell)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
        assert sorted(r["order_id"] for r in ops.rows("ops_shop__ops_orders")) == list(range(1, 26))
        ops.run("ingest__ops_shop")  # and one through Airflow (its lineage: the published tables)
    out = listing.result()
    assert out.returncode == 0, out.stderr[-2000:]
    listed = json.loads(out.stdout[out.stdout.index("[{"):])  # after the warnings Airflow prints on stdout
    assert {"ingest__ops_orders", "rebuild__ops_fix", "sink__ops_out"} <= {d["dag_id"] for d in listed}
    out = conn_get.result()
    assert out.returncode == 0 and "demo_shop" in out.stdout, out.stderr[-2000:]
    out = nope.result()
    assert out.returncode == 1 and out.stderr.startswith("error: no source named 'nope'") and "Traceback" not in out.stderr


def test_params_are_typed_and_assets_fire_only_when_data_moved(ops):
    for bad in ({"max_records": "lots"}, {"max_records": 0}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            ops.stack.airflow.api("POST", "dags/ingest__ops_orders/dagRuns", {"logical_date": None, "conf": bad})
        assert refused.value.code == 400 and "max_records" in refused.value.read().decode()
    ops.stack.airflow.unpause("sink__ops_out")
    ops.produce("ops_orders", [b'{"id": %d}' % i for i in range(20)])
    ops.run("ingest__ops_orders", {"max_records": 5})  # four Spark jobs, one append
    ops.run("ingest__ops_orders")  # nothing new: no asset event, no sink run
    events = ops.stack.airflow.api("GET", "assets/events?source_dag_id=ingest__ops_orders&limit=100")["asset_events"]
    assert [(e["name"], e["extra"]["rows"]) for e in events] == [("reclock://ops_orders", 20)], events
    from reclock.persist.remap_store import load_remap

    with connect(ops.stack.postgres.dsn()) as conn:
        (binding,) = load_remap(conn, "ops_orders").bindings  # the idle run bound nothing ...
        (upper,) = conn.execute("SELECT upper FROM reclock.shards WHERE id = 'ops_orders'").fetchone()
    # the event's range holds the binding's updates (its upper is past the binding's ts, and further when a
    # retried mint found the binding already there and the clock ahead of it: an idle advance in the same append)
    assert events[0]["extra"]["lower"] == 0 and binding.ts < events[0]["extra"]["upper"] <= upper, (events, binding)
    assert upper > binding.ts + 1  # ... yet moved the upper on (upper age is freshness)
    quiet_from = time.monotonic()  # a sink run the second cycle could have caused is queued 10 s after it
    runs = ops.wait_runs("sink__ops_out", 1)
    assert [(r["run_type"], r["state"]) for r in runs] == [("asset_triggered", "success")], runs
    # a backfill of the sink over three hours, ten runs at once allowed: one run
    now = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
    out = ops.reclock("dev", "airflow", "backfill", "create", "--dag-id", "sink__ops_out", "--max-active-runs", "10",
                      "--from-date", (now - timedelta(hours=4)).isoformat(), "--to-date",
                      (now - timedelta(hours=1)).isoformat())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert [r["state"] for r in ops.wait_runs("sink__ops_out", 1, run_type="backfill")] == ["success"]
    time.sleep(max(0.0, quiet_from + 10 - time.monotonic()))  # (the backfill's wait counts towards the 10 s)
    runs = ops.wait_runs("sink__ops_out", 2)
    assert sorted((r["run_type"], r["state"]) for r in runs) == [("asset_triggered", "success"),
                                                                  ("backfill", "success")], runs


def test_a_run_that_fails_before_any_step_shows_on_the_page_in_status_and_in_the_metrics(ops):
    from prometheus_client.parser import text_string_to_metric_families

    run_id = ops.stack.airflow.trigger("ingest__ops_orders", conf={"bogus": 1})  # refused in the task, every try
    with pytest.raises(Exception, match="failed"):
        ops.stack.airflow.wait_run("ingest__ops_orders", run_id, timeout=400)
    token = ops.stack.airflow.token()
    status, body, _ = ops.get("/reclock/api/source/ops_orders", token)
    src = json.loads(body)["source"]
    assert status == 200 and src["status"] == "failed" and run_id in src["error"], src
    assert src["airflow"]["runs"][0]["failed_tasks"] == ["mint_write"]
    out = ops.reclock("status", env=ops.shell_env())
    assert out.returncode == 0, out.stderr
    assert "source ops_orders (kafka): failed" in out.stdout and f"(newest: {run_id}" in out.stdout, out.stdout
    # the metrics: anonymous refused, a token's scraped and parsed by Prometheus's own client
    assert ops.get("/reclock/metrics")[0] == 401
    status, body, _ = ops.get("/reclock/metrics", token)
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}
    key = (("kind", "kafka"), ("source", "ops_orders"))
    assert samples[("reclock_source_stalled", key)] == 1 and samples[("reclock_source_failed_runs", key)] == 1
    assert samples[("reclock_source_lag", (*key[:1], *key[1:], ("unit", "records")))] == 0
    assert samples[("reclock_source_cycle_records", key)] == 0  # the last complete cycle found nothing new
    assert 0 <= samples[("reclock_source_upper_age_seconds", key)] < 3600
    assert samples[("reclock_sink_stalled", (("sink", "ops_out"),))] == 0
    # a run that succeeds again clears it
    ops.run("ingest__ops_orders")
    src = json.loads(ops.get("/reclock/api/source/ops_orders", token)[1])["source"]
    assert src["status"] == "running", src
    # /reclock without its slash is the page
    status, _, url = ops.get("/reclock", token)
    assert status == 200 and url.endswith("/reclock/")


def test_a_rebuild_backfill_brings_back_what_a_decode_bug_rejected_at_the_original_timestamps(ops):
    from reclock import remap
    from reclock.persist.remap_store import load_remap

    ops.produce("ops_fix", [json.dumps({"id": i, "amount": i + (0.5 if i % 2 else 0)}).encode() for i in range(20)])
    ops.run("ingest__ops_fix")
    assert len(ops.rows("ops_fix")) == 10 and len(ops.rows("ops_fix_errors")) == 10
    fixed = SHARED_CONFIG.replace('"id BIGINT, amount BIGINT"', '"id BIGINT, amount DOUBLE"')
    assert fixed != SHARED_CONFIG
    ops.config.write_text(fixed)  # the decode fixed
    with connect(ops.stack.postgres.dsn()) as conn:
        (first,) = load_remap(conn, "ops_fix").bindings
    t = datetime.fromtimestamp(first.ts / 1000, tz=timezone.utc)
    out = ops.reclock("dev", "airflow", "backfill", "create", "--dag-id", "rebuild__ops_fix", "--max-active-runs",
                      "10", "--from-date", (t - timedelta(hours=2)).isoformat(), "--to-date",
                      (t + timedelta(seconds=1)).isoformat())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (run,) = ops.wait_runs("rebuild__ops_fix", 1, run_type="backfill")
    assert run["state"] == "success", run
    with connect(ops.stack.postgres.dsn()) as conn:
        rc = load_remap(conn, "ops_fix")
    assert rc.bindings == (first,), "a rebuild mints nothing"
    rows = ops.rows("ops_fix")
    assert sorted(r["id"] for r in rows) == list(range(20)) and ops.rows("ops_fix_errors") == []
    assert all(r["ts"] == remap.reclock(rc, r["_partition"], r["_offset"]) == first.ts for r in rows)
    assert all(r["amount"] == r["id"] + (0.5 if r["id"] % 2 else 0) for r in rows)


def _lineage_done(path) -> dict:
    done = {}
    for e in (json.loads(line) for line in path.read_text().splitlines() if line.strip()):
        if e.get("eventType") == "COMPLETE":
            done[e["job"]["name"]] = ({(d["namespace"], d["name"]) for d in e.get("inputs", [])},
                                      {(d["namespace"], d["name"]) for d in e.get("outputs", [])})
    return done


def test_openlineage_events_name_what_each_task_read_and_wrote(ops):
    jobs = {"ingest__ops_orders.mint_write", "ingest__ops_orders.append", "sink__ops_out.write",
            "rebuild__ops_fix.rebuild", "ingest__ops_shop.mint_write", "ingest__ops_shop.append"}
    deadline = time.monotonic() + 120  # the provider sends a task's events after its state is saved
    while not jobs <= set(done := _lineage_done(ops.lineage)) and time.monotonic() < deadline:
        time.sleep(2)
    assert jobs <= set(done), f"no COMPLETE event for {sorted(jobs - set(done))}"
    kafka = f"kafka://{ops.stack.kafka.bootstrap}"
    pg = f"127.0.0.1:{ops.stack.postgres.port}"
    coll = f"reclock://{pg}/reclock"
    assert done["ingest__ops_orders.mint_write"] == ({(kafka, "ops_orders")}, set())
    assert done["ingest__ops_orders.append"] == (set(), {(coll, "ops_orders"), (coll, "ops_orders_errors")})
    assert done["sink__ops_out.write"] == ({(coll, "ops_orders")}, {(kafka, "ops_orders_out")})
    assert done["rebuild__ops_fix.rebuild"] == ({(kafka, "ops_fix")}, {(coll, "ops_fix"), (coll, "ops_fix_errors")})
    assert done["ingest__ops_shop.mint_write"][0] == {(f"postgres://{pg}", "demo_shop.public.ops_orders")}
    assert done["ingest__ops_shop.append"][1] == {(coll, "ops_shop__ops_orders"), (coll, "ops_shop_errors")}
