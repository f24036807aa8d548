"""The benchmark harness runs end to end at a tiny size (its own Postgres, Kafka and Spark, one repetition,
no freshness) and writes every figure and target check it promises. No timing is asserted: the figures
of a tiny run mean nothing, only that they are there and positive. A SIGTERM after its in-process dag.test()
stops the run and every process it started (benchmarks/stop.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest

from reclock.dev.state import REPO_ROOT

CONTENDERS = ("reclock", "reclock_dag_test", "structured_streaming", "spark_batch", "kafka_consumer")
SIZES = ("small", "base", "large")
STATE_CYCLES = 6  # the "half" and "full" state figures: after 3 and 6 cycles
OVERHEAD_CYCLES = 2


@pytest.mark.timeout(900)
def test_harness_runs_at_tiny_size_and_writes_every_figure(tmp_path):
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--reps", "1",
                          "--state-cycles", str(STATE_CYCLES), "--overhead-cycles", str(OVERHEAD_CYCLES),
                          "--out", str(tmp_path)],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "| ratio / target |" in run.stdout  # the table went to stdout

    results = json.loads((tmp_path / "results.json").read_text())
    figures = {f["name"]: f for f in results["figures"]}
    expected = {f"{kind}_{c}_{s}" for kind in ("throughput_records", "throughput_mb", "memory_peak_total")
                for c in CONTENDERS for s in SIZES}
    expected |= {f"cycle_overhead_{step}" for step in ("total", "mint", "write_batches", "append", "resume")}
    expected |= {f"state_{kind}_{when}" for kind in ("remap_bindings", "remap_offset_rows", "shard_batch_rows",
                                                     "shard_batch_bound", "remap_bound") for when in ("half", "full")}
    expected |= {"sink_throughput", "plain_producer_throughput", "sink_start"}
    assert expected <= set(figures), sorted(expected - set(figures))
    for name, f in figures.items():
        assert set(f) == {"name", "unit", "median", "min", "max"}, f
        assert f["min"] <= f["median"] <= f["max"], f
        assert f["min"] >= 0, f
    for name in expected - {"cycle_overhead_append"}:  # a step may round to 0 ms, nothing else may be 0
        assert figures[name]["min"] > 0, figures[name]

    ratios = {r["name"]: r for r in results["ratios"]}
    expected_ratios = {f"{c}_vs_{other}_{s}" for c in ("reclock", "reclock_dag_test")
                       for other in ("structured_streaming", "spark_batch") for s in SIZES}
    expected_ratios |= {"memory_total_reclock_large_vs_base", "cycle_overhead_total_s",
                        "state_remap_offset_rows_full_vs_half", "state_shard_batch_rows_vs_bound"}
    assert expected_ratios <= set(ratios), sorted(expected_ratios - set(ratios))
    for r in ratios.values():
        assert r["value"] > 0 and r["met"] == (r["value"] >= r["target"] if r["op"] == ">="
                                                else r["value"] <= r["target"]), r
    assert (tmp_path / "results.md").read_text().startswith("# Reclock benchmarks")
    if importlib.util.find_spec("matplotlib") is not None:  # the plot needs matplotlib
        assert (tmp_path / "results.png").stat().st_size > 0


@pytest.mark.timeout(600)
def test_sigterm_after_dag_test_stops_every_service_the_harness_started(tmp_path):
    """Airflow's task runner (which dag.test() runs in the harness's process) sets SIGTERM to a handler of its
    own and leaves it there: a SIGTERM after dag.test() did nothing, and a kill then leaked the services."""
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.run", "--size", "tiny", "--reps", "1",
                          "--out", str(tmp_path)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines, root, started = [], None, []
    try:
        for line in p.stdout:  # up to the end of the first dag.test() (the warm-up: the DAG's two tasks ran)
            lines.append(line)
            root = root or (m := re.search(r"work folder (\S+)", line)) and m.group(1)
            if "warm-up reclock_dag_test" in line:
                break
        assert root, "".join(lines[-50:])
        harness = psutil.Process(p.pid)
        started = [*harness.children(recursive=True), *_processes_under(root)]
        assert any("postgres" in q.name() for q in started) and any("java" in q.name() for q in started), started
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=180)  # a SIGTERM that does nothing lets the run go on to its end
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines.append(out)
    assert p.returncode == 130, "".join(lines)[-4000:]
    assert "interrupted: every service this run started has been stopped" in out, out[-4000:]
    left = [q for q in started if _alive(q)] + [q for q in _processes_under(root) if _alive(q)]
    assert not left, left
    assert not os.path.exists(root), "the run's folder stays only with --keep"


def _processes_under(root: str) -> list[psutil.Process]:
    """Every process whose command line names the run's folder (Postgres and Kafka run in sessions of their own)."""
    found = []
    for q in psutil.process_iter(["cmdline"]):
        if any(root in arg for arg in q.info["cmdline"] or ()):
            found.append(q)
    return found


def _alive(q: psutil.Process) -> bool:
    try:
        return q.is_running() and q.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
