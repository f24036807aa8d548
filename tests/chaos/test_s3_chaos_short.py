"""The S3 source's fault campaign, short (``python -m benchmarks.s3_chaos``): objects arrive in two prefixes
(one source listing after a key frontier with a lookback, one fed by S3 event notifications through SQS)
while the sources' cycle processes are SIGKILLed at random moments; the oracle reads the bucket itself.
Nothing may be lost, duplicated or at a wrong timestamp."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from benchmarks.chaos import REPO


@pytest.mark.timeout(1500)
def test_s3_sources_lose_and_duplicate_nothing_while_cycles_are_killed():
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.s3_chaos", "--seconds", "20", "--seed", "11",
                          "--gap", "1", "3"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        out, err = p.communicate(timeout=1400)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(120)
        pytest.fail(f"the campaign did not finish in time:\n{out[-4000:]}{err[-2000:]}")
    assert "lost 0, duplicated 0, wrong timestamps 0" in out, out[-6000:] + err[-3000:]
    assert p.returncode == 0, out[-4000:] + err[-4000:]
    kills = int(re.search(r"kills: (\d+)", out).group(1))
    records = [int(x) for x in re.findall(r"'expected': (\d+)", out)]
    assert kills >= 5 and len(records) == 2 and min(records) > 500, out[-3000:]
