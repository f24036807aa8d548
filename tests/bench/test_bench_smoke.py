"""The benchmark harness runs end to end at a tiny size (its own Postgres, Kafka and Spark, one repetition,
no freshness) and writes every figure and target check it promises. No timing is asserted: the figures
of a tiny run mean nothing, only that they are there and positive."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

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
