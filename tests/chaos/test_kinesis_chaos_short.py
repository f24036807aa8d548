"""The Kinesis source's fault campaign, short (``python -m benchmarks.kinesis_chaos``): a producer writes
while the stream is split and merged, reads are throttled and iterators expire, and the source's cycle
process is SIGKILLed at random moments and ended at fail points inside mint, write (between slices), append
and resume; the oracle reads every shard of the stream itself from TRIM_HORIZON. Nothing may be lost,
duplicated or at a wrong timestamp, and AS OF every binding equals the oracle."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from benchmarks.chaos import REPO


@pytest.mark.timeout(1200)
def test_a_kinesis_source_loses_and_duplicates_nothing_across_reshards_while_cycles_are_killed():
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.kinesis_chaos", "--seconds", "25", "--seed", "11",
                          "--gap", "2", "5", "--reshard", "5", "8"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=1100)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(120)
        pytest.fail(f"the campaign did not finish in time:\n{out[-4000:]}{err[-2000:]}")
    assert "lost 0, duplicated 0, wrong timestamps 0" in out, out[-6000:] + err[-3000:]
    assert p.returncode == 0, out[-4000:] + err[-4000:]
    kills = int(re.search(r"kills: (\d+)", out).group(1))
    bound = int(re.search(r"'bound': (\d+)", out).group(1))
    splits, merges = (int(x) for x in re.search(r"(\d+) splits, (\d+) merges", out).groups())
    # how many cycles finish between kills depends on the machine's load (a loaded one may finish none before
    # the catch-up): reported by the campaign, not asserted here
    assert kills >= 3 and splits >= 1 and merges >= 1 and bound > 1000, out[-3000:]
