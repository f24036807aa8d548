"""benchmarks.pg_debezium runs end to end at a tiny size (its own Postgres, Reclock's cycle beside Debezium's
embedded engine cold and warm, built by Maven from jvm/dbzembedded) and prints every figure it promises, each
contender checked to deliver exactly the backlog. Kafka Connect is left out here (``--no-connect``: its worker
alone takes longer to start than this test may add); the full run covers it. No timing is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from reclock.dev.state import REPO_ROOT


@pytest.mark.skipif(shutil.which("java") is None or shutil.which("mvn") is None, reason="needs Java and Maven")
@pytest.mark.timeout(600)  # the first run builds the engine's jar (Maven, dependencies in ~/.m2)
def test_pg_debezium_runs_at_tiny_size(tmp_path):
    out = tmp_path / "figures.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks.pg_debezium", "--changes", "300", "--reps", "1",
                          "--no-connect", "--timeout", "120", "--out", str(out)],
                         cwd=REPO_ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    figures = json.loads(out.read_text())
    assert {"changes/s: Reclock's cycle, end to end (median)",
            "changes/s: Debezium embedded engine, cold (JVM start to last record)",
            "changes/s: Debezium embedded engine, warm (engine build to last record, median)",
            "ratio: Reclock / embedded engine, cold",
            "ratio: Reclock / embedded engine, warm (target >= 2)"} == set(figures)
    assert all(f["value"] > 0 for f in figures.values()), figures
    assert "target (Reclock >= 2x a warm embedded engine): " in run.stdout
