"""The fault campaign, short (issue 15): ~20 faults (or what 15 minutes allow on a loaded machine) of every kind ``benchmarks.chaos`` injects (cycle and sink
processes SIGKILLed or stopped at fail points, Postgres restarted immediate, the Kafka broker and the Spark
Connect server killed and restarted), a fixed seed, the same code as ``python -m benchmarks.chaos``. The
oracle reads the topics itself; nothing may be lost, duplicated or at a wrong timestamp."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from benchmarks.chaos import FAULT_KINDS, REPO

SEED = 15
FAULTS = 20


@pytest.mark.timeout(1200)
def test_short_campaign_loses_and_duplicates_nothing():
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.chaos", "--faults", str(FAULTS), "--seed", str(SEED),
                          "--gap", "1", "4", "--max-seconds", "900"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=1150)
    out = run.stdout
    assert f"seed {SEED}" in out, out[-4000:] + run.stderr[-4000:]
    assert "lost 0, duplicated 0, wrong timestamps 0" in out, out[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, out[-4000:] + run.stderr[-4000:]
    kinds = dict(re.findall(r"(\w+) (\d+)", re.search(r"faults by kind: (.*)", out).group(1)))
    assert all(int(kinds[k]) >= 1 for k in FAULT_KINDS), kinds  # every kind comes first, once each
    checked = int(re.search(r"records checked: (\d+)", out).group(1))
    assert checked > 1000, out
