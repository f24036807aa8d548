"""The Reclock pages in the real Airflow UI, on the stack the stack tests share (tests/stack/conftest.py):
cycles under the scheduler (one source that collects a bad record, one that stalls on it), anonymous requests
refused, a login in headless Chromium, the page's figures checked against Postgres, a screenshot, and
``reclock status`` printing the JSON's figures."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reclock.dev.state import REPO_ROOT
from reclock.persist import connect
from stack_support import wait_sink_caught_up
from reclock.errors import StackError
from reclock.sources.base import Lag

pytestmark = pytest.mark.stack

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT = Path(os.environ.get("RECLOCK_UI_SCREENSHOT", REPO_ROOT / ".reclock" / "ui-overview.png"))
def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _overview(base: str, token: str, names=("ui_orders", "ui_shop", "ui_events"),
              tries: int = 10) -> tuple[bytes, dict]:
    """The overview's JSON once the lags of ``names`` are known: each request probes every source's lag with
    the page's deadline (status_report.LAG_DEADLINE_S), which a loaded machine can miss (the lag is then
    unknown); the stack holds the other stack tests' sources too, probed beside these."""
    for _ in range(tries):
        status, body = _get(base + "/reclock/api/overview", token)
        assert status == 200
        ov = json.loads(body)
        lags = {s["name"]: s["lag"] for s in ov["sources"] if s["name"] in names}
        if all(lag["value"] is not None for lag in lags.values()):
            return body, ov
    raise AssertionError(f"lags still unknown after {tries} requests: {lags}")


def _goto_overview(page, url: str, want: dict, tries: int = 10):
    """The overview page, loaded again (up to ``tries`` times) until each source in ``want`` shows a lag
    ``want[source]`` accepts (see :func:`_overview`); returns the last response."""
    for _ in range(tries):
        response = page.goto(url)
        texts = {n: page.locator(f"tr[data-source='{n}'] [data-field=lag]").inner_text() for n in want}
        if all(ok(texts[n]) for n, ok in want.items()):
            return response
    raise AssertionError(f"lags not as wanted after {tries} loads: {texts}")


def _run_cycles(stack) -> None:
    """The four sources' runs, side by side (each on DAGs of its own; most of their time is waiting on runs),
    then a reader's lapsed lease."""
    with ThreadPoolExecutor(4) as pool:
        for done in [pool.submit(runs, stack) for runs in (_kafka_runs, _stalled_run, _postgres_runs, _s3_runs)]:
            done.result()
    # a reader's lease that lapsed holds nothing and shows nowhere
    with connect(stack.postgres.dsn()) as conn:
        conn.execute("INSERT INTO reclock.read_holds (shard, holder, ts, expires_at) SELECT 'ui_orders', "
                     "'reader:lapsed', since, now() - interval '1 minute' FROM reclock.shards WHERE id = 'ui_orders'")


def _topic(stack, topic: str):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": stack.kafka.bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    return Producer({"bootstrap.servers": stack.kafka.bootstrap})


def _kafka_runs(stack) -> None:
    """ui_orders: two waves (each with a record that does not decode), the sink caught up, an idle cycle."""
    producer = _topic(stack, "ui_orders")
    for dag_id in ("ingest__ui_orders", "sink__ui_out"):
        stack.airflow.wait_for_dag(dag_id)
    stack.airflow.unpause("sink__ui_out")  # runs on the appends' asset events
    for wave in range(2):
        for i in range(wave * 300, wave * 300 + 300):
            producer.produce("ui_orders", value=b'{"id": %d}' % i, partition=i % 2)
        producer.produce("ui_orders", value=b"not json", partition=0)  # collected in ui_orders_errors
        assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
        run_id = stack.airflow.trigger("ingest__ui_orders")
        stack.airflow.wait_run("ingest__ui_orders", run_id, timeout=300)
    wait_sink_caught_up(stack, "ui_out", "ui_orders")
    # an idle cycle: nothing new upstream, yet the upper follows the clock (its age is the freshness)
    stack.airflow.wait_run("ingest__ui_orders", stack.airflow.trigger("ingest__ui_orders"), timeout=300)


def _stalled_run(stack) -> None:
    """ui_payments: a record that does not decode stalls the source; its run fails."""
    producer = _topic(stack, "ui_payments")
    stack.airflow.wait_for_dag("ingest__ui_payments")
    for i in range(50):
        producer.produce("ui_payments", value=b'{"id": %d}' % i, partition=i % 2)
    producer.produce("ui_payments", value=b"{broken", partition=1)  # stalls the source
    assert producer.flush(30) == 0, "records left unsent: the broker did not acknowledge them in time"
    run_id = stack.airflow.trigger("ingest__ui_payments")
    with pytest.raises(StackError, match="failed"):
        stack.airflow.wait_run("ingest__ui_payments", run_id, timeout=400)


def _postgres_runs(stack) -> None:
    """ui_shop, a Postgres source: two transactions, one run each."""
    import psycopg

    from reclock.dev.demo import shop_upstream

    dsn = shop_upstream(stack, "ui_shop_pub", ["ui_orders", "ui_items"], prefix="ui_")
    stack.airflow.wait_for_dag("ingest__ui_shop")
    for lo in (1, 21):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO ui_orders SELECT g, 'c', 'open', 1, now() FROM generate_series(%s::int, %s::int) g",
                         (lo, lo + 19))
        stack.airflow.wait_run("ingest__ui_shop", stack.airflow.trigger("ingest__ui_shop"), timeout=300)


def _s3_runs(stack) -> None:
    """ui_events, an S3 source: two objects ingested, a third waiting (its lag counts objects)."""
    stack.s3.create_bucket("ui-landing")
    s3 = stack.s3.client()
    s3.put_object(Bucket="ui-landing", Key="events/a.json", Body=b'{"id": 1}\n{"id": 2}\n')
    s3.put_object(Bucket="ui-landing", Key="events/b.json", Body=b'{"id": 3}\n')
    stack.airflow.wait_for_dag("ingest__ui_events")
    stack.airflow.wait_run("ingest__ui_events", stack.airflow.trigger("ingest__ui_events"), timeout=300)
    # no run of its own took (or could take) the third object: its interval is not due (SHARED_CONFIG)
    runs = stack.airflow.api("GET", "dags/ingest__ui_events/dagRuns?limit=100")["dag_runs"]
    assert [r["run_type"] for r in runs] == ["manual"], runs
    s3.put_object(Bucket="ui-landing", Key="events/c.json", Body=b'{"id": 4}\n')


def _truth(dsn: str) -> dict:
    """What Postgres says, per source: the least upper, the latest status, the error collection's rows."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        out = {}
        for name in ("ui_orders", "ui_payments", "ui_shop"):
            (upper,) = conn.execute(
                "SELECT least((SELECT upper FROM reclock.remap_collections WHERE source = %s), "
                "(SELECT min(upper) FROM reclock.shards WHERE source = %s))", (name, name)).fetchone()
            status, error = conn.execute("SELECT status, error FROM reclock.status_history WHERE name = %s "
                                         "ORDER BY id DESC LIMIT 1", (name,)).fetchone()
            (errors,) = conn.execute("SELECT coalesce(sum(b.rows), 0) FROM reclock.shard_batches b JOIN "
                                     "reclock.shards s ON s.id = b.shard WHERE s.source = %s AND s.kind = 'errors'",
                                     (name,)).fetchone()
            out[name] = {"upper": upper, "status": status, "error": error, "errors": int(errors)}
    return out


def _history_is_runs_and_steps(page) -> None:
    """Status history rows: each names its step and Airflow run; none repeats the one before it."""
    rows = [(r.locator("td").nth(1).inner_text(), r.locator("[data-field=step]").inner_text(),
             r.locator("[data-field=run]").inner_text(), r.locator("td").nth(4).inner_text())
            for r in page.locator("tr[data-field=history]").all()]
    assert rows and all(step != "-" and run.startswith(("manual__", "scheduled__")) for _, step, run, _ in rows), rows
    assert all(a != b for a, b in zip(rows, rows[1:])), rows


def _browse(stack, truth: dict, secrets: list[str]) -> None:
    from playwright.sync_api import expect, sync_playwright

    base = stack.airflow.url
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 820})
            page.set_default_timeout(120_000)  # a loaded machine: the UI's first render can be slow
            # not logged in: the page (even without its slash) sends the browser to Airflow's login form, which
            # sends it back after the login
            page.goto(f"{base}/reclock")
            page.wait_for_url(lambda url: "/auth/login" in url, timeout=60_000)
            assert "next=" in page.url, page.url
            page.locator("input[name=username]").fill("admin")
            page.locator("input[name=password]").fill(stack.airflow.admin_password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: url.rstrip("/").endswith("/reclock"), timeout=60_000)
            page.locator("tr[data-source='ui_orders']").wait_for(timeout=60_000)
            # the trigger form offers the DAG's typed params: no letters, nothing below the minimum
            page.goto(f"{base}/dags/ingest__ui_orders")
            page.get_by_role("button", name="Trigger").first.click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_text("Records per Spark job").wait_for()
            field = dialog.locator("input[name=element_max_records]")
            field.fill("lots")
            assert field.input_value() == ""
            field.fill("0")
            field.blur()
            # the form clamps to the minimum in its own state update after the blur: read until it shows
            expect(field).to_have_value("1", timeout=30_000)
            page.keyboard.press("Escape")
            # the navigation links the page (Browse > Reclock), which shows it inside Airflow's UI
            page.goto(f"{base}/plugin/reclock")
            frame = page.frame_locator("iframe")
            frame.locator("tr[data-source='ui_orders']").wait_for(timeout=60_000)
            page.screenshot(path=str(SCREENSHOT.with_name(SCREENSHOT.stem + "-in-airflow.png")))
            # the page itself: its figures are Postgres's
            response = _goto_overview(page, f"{base}/reclock/", {
                "ui_shop": lambda t: re.fullmatch(r"\d+(\.\d)? (B|KiB|MiB|GiB)", t) is not None})
            assert response.status == 200
            html = page.content()
            for secret in secrets:
                assert secret not in html
            for name, t in truth.items():
                row = page.locator(f"tr[data-source='{name}']")
                assert row.locator("[data-field=upper]").inner_text() == str(t["upper"])
                assert row.locator("[data-field=status]").inner_text() == t["status"]
                assert row.locator("[data-field=errors]").inner_text() == str(t["errors"])
                if t["status"] == "stalled":
                    assert row.locator("[data-field=error]").inner_text() == t["error"]
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            shop = page.locator("tr[data-source='ui_shop']")
            assert re.fullmatch(r"\d+(\.\d)? (B|KiB|MiB|GiB)", shop.locator("[data-field=lag]").inner_text())
            assert "rebuild__ui_shop" not in shop.inner_html()
            assert "reader:lapsed" not in page.content()
            # one source's page: bindings as its kind prints them, history, the three plots with time axes
            page.locator("tr[data-source='ui_orders'] a", has_text="ui_orders").first.click()
            page.wait_for_url("**/reclock/source/ui_orders")
            assert page.locator("svg polyline").count() == 3 and page.locator("svg .xtick").count() >= 3
            assert "ui_orders_progress" in page.content() and "<th>partition</th><th>offset</th>" in page.content()
            _history_is_runs_and_steps(page)
            page.screenshot(path=str(SCREENSHOT.with_name(SCREENSHOT.stem + "-source.png")), full_page=True)
            page.goto(f"{base}/reclock/source/ui_shop")
            cells = page.locator("table[data-field=bindings] tr td:nth-child(3)").all_inner_texts()
            assert cells and all(re.fullmatch(r"[0-9A-F]+/[0-9A-F]+", c) for c in cells), cells  # LSNs
            assert "lag at mint (bytes of WAL)" in page.content()
            _history_is_runs_and_steps(page)
            # an S3 source's page: lag in objects, bindings as (key, byte_offset)
            _goto_overview(page, f"{base}/reclock/", {"ui_events": lambda t: t == "1 object"})
            page.goto(f"{base}/reclock/source/ui_events")
            assert "<th>key</th><th>byte_offset</th>" in page.content()
            keys = page.locator("table[data-field=bindings] tr td:nth-child(3)").all_inner_texts()
            assert keys and keys[0] == "events/b.json", keys
            assert "lag at mint (objects)" in page.content()
        finally:
            browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (scripts/bootstrap.sh installs it)")
def test_status_pages_in_the_airflow_ui(shared_stack):
    shared_stack.require_up()
    env, stack = shared_stack.env, shared_stack.stack
    reclock = [sys.executable, "-m", "reclock.cli"]
    _run_cycles(stack)
    truth = _truth(stack.postgres.dsn())
    assert truth["ui_orders"]["status"] == "running" and truth["ui_orders"]["errors"] == 2
    assert truth["ui_payments"]["status"] == "stalled" and "stall" in truth["ui_payments"]["error"]
    secrets = [stack.airflow.admin_password, stack.postgres.dsn().split("@")[0].rsplit(":", 1)[1]]

    # anonymous requests are refused, a token's are served
    base = stack.airflow.url
    for path in ("/reclock/", "/reclock/api/overview", "/reclock/api/source/ui_orders", "/reclock/source/x"):
        assert _get(base + path)[0] == 401, path
    assert _get(base + "/reclock/api/overview", token="not-a-jwt")[0] in (401, 403)
    token = stack.airflow.token()
    body, ov = _overview(base, token)
    assert not any(s in body.decode() for s in secrets)
    by_name = {s["name"]: s for s in ov["sources"]}
    for name, t in truth.items():
        assert (by_name[name]["upper"], by_name[name]["status"], by_name[name]["errors_count"]) == (
            t["upper"], t["status"], t["errors"])
    assert by_name["ui_orders"]["lag"] == {"value": 0, "unit": "records", "detail": "group reclock-ui_orders"}
    shop_lag = by_name["ui_shop"]["lag"]  # the kind's own terms: WAL bytes beyond the slot, LSNs
    assert shop_lag["unit"] == "bytes" and shop_lag["value"] is not None and "retains" in shop_lag["detail"]
    assert by_name["ui_shop"]["dags"] == ["ingest__ui_shop"]  # no rebuild__ for a kind that cannot replay
    events = by_name["ui_events"]
    assert (events["kind"], events["status"], events["lag"]["value"], events["lag"]["unit"]) == (
        "s3", "running", 1, "objects"), events
    assert "1 object(s), 10 byte(s) not yet ingested" in events["lag"]["detail"]
    assert by_name["ui_orders"]["dags"] == ["ingest__ui_orders", "rebuild__ui_orders"]
    assert by_name["ui_orders"]["paused"] is False
    assert len(by_name["ui_orders"]["errors_latest"]) == 2
    assert all(e["position"].startswith("partition ") for e in by_name["ui_orders"]["errors_latest"])
    assert [h["holder"] for h in by_name["ui_orders"]["read_holds"]] == ["sink:ui_out"]  # the lapsed one: not
    # the idle cycle moved the upper to its mint: upper age is freshness
    with connect(stack.postgres.dsn()) as conn:
        (minted_at,) = conn.execute("SELECT extract(epoch FROM max(at)) * 1000 FROM reclock.statistics WHERE "
                                    "name = 'ui_orders' AND step = 'mint'").fetchone()
    assert by_name["ui_orders"]["upper"] >= float(minted_at) - 10_000
    sink = next(k for k in ov["sinks"] if k["name"] == "ui_out")  # the other tests' sinks: theirs
    with connect(stack.postgres.dsn()) as conn:
        (hold,) = conn.execute("SELECT ts FROM reclock.read_holds WHERE holder = 'sink:ui_out'").fetchone()
    # the idle cycle added nothing: the sink did not run, and nothing waits for it
    assert (sink["name"], sink["status"], sink["read_hold"], sink["lag_ms"]) == ("ui_out", "running", hold, 0)
    assert _get(base + "/reclock/api/source/ui_orders", token)[0] == 200
    assert _get(base + "/reclock/api/source/nope", token)[0] == 404

    _browse(stack, truth, secrets)

    # `reclock status` prints the JSON's figures
    exports = subprocess.run([*reclock, "dev", "env"], env=env, capture_output=True, text=True, timeout=120)
    settings = dict(shlex.split(line)[1].split("=", 1) for line in exports.stdout.splitlines())
    for _ in range(5):  # its lag probes have the page's deadline too (see _overview): until they answered in time
        out = subprocess.run([*reclock, "status"], env={**env, **settings}, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        if "lag: 1 object (" in out.stdout and "lag: 0 records" in out.stdout:
            break
    for s in (s for s in ov["sources"] if s["name"].startswith("ui_")):  # the other tests' sources: theirs
        c = s["last_cycle"]
        assert f"source {s['name']} ({s['kind']}): {s['status']}" in out.stdout
        assert f"upper {s['upper']} (" in out.stdout and f"since {s['since']} (" in out.stdout
        assert f"errors: {s['errors_count']}" in out.stdout
        if c:
            assert f"mint {c['mint']:.2f}s + write_batches {c['write_batches']:.2f}s" in out.stdout
            assert f"; {c['records']} records, {c['bytes']} bytes" in out.stdout
        if s["lag"]["value"] is not None and s["lag"]["unit"] in ("records", "objects"):
            assert f"lag: {Lag(s['lag']['value'], '', s['lag']['unit']).text()} (" in out.stdout
    assert f"error: {by_name['ui_payments']['error']}" in out.stdout
