"""benchmarks/stop.py: a signal stops a benchmark command even inside code that takes the signal over, as
Airflow's task runner does under dag.test() (it sets SIGTERM to a handler of its own, never puts the previous
one back, and catches BaseException around the task). The harness's real run is in test_bench_smoke.py."""

from __future__ import annotations

import os
import signal

import pytest

from benchmarks import stop


@pytest.fixture
def handlers(monkeypatch):
    """Put this process's handlers (pytest's) back after the test, and start with no stop recorded."""
    saved = {s: signal.getsignal(s) for s in stop.SIGNALS}
    monkeypatch.setattr(stop, "_stopping", None)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def task_runner(calls: list[str]) -> None:
    """What airflow.sdk.execution_time.task_runner.run does around a task, with the signal arriving mid-task."""
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append("on_kill"))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        calls.append("task went on")
    except BaseException:  # noqa: BLE001 - as Airflow's: the task only fails
        calls.append("task failed")


@pytest.mark.usefixtures("handlers")
def test_a_sigterm_inside_kept_code_that_takes_it_over_stops_the_run():
    stop.install()
    calls: list[str] = []
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        with stop.kept():
            task_runner(calls)
            calls.append("dag.test went on")
    assert calls == ["on_kill", "task failed", "dag.test went on"]  # theirs ran, then ours stopped the task
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # the clean-up is not cut short by another
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.usefixtures("handlers")
def test_after_kept_code_that_took_sigterm_over_ours_is_back():
    stop.install()
    with stop.kept():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what the code set is only recorded
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is stop._interrupt
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        os.kill(os.getpid(), signal.SIGTERM)
