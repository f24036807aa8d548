"""``reclock.dev.procs.side_by_side``: stops run at the same time (the session's services and a cluster's
daemons stop in the time of the slowest), every one runs whatever another raised, and the results and errors
come back by name."""

from __future__ import annotations

import threading

import pytest

from reclock.dev import procs
from reclock.errors import StackError


def test_calls_run_at_the_same_time_and_each_runs_whatever_another_raised():
    met = threading.Barrier(3, timeout=30)  # passed only if all three are in flight at once

    def ok(value):
        def call():
            met.wait()
            return value
        return call

    def fails():
        met.wait()
        raise RuntimeError("port still bound")

    results, errors = procs.side_by_side({"kafka": ok(True), "s3": ok(False), "postgres": fails})
    assert results == {"kafka": True, "s3": False}
    assert list(errors) == ["postgres"] and str(errors["postgres"]) == "port still bound"


def test_nothing_to_call():
    assert procs.side_by_side({}) == ({}, {})


def test_stops_noted_for_later_all_run_and_a_failed_one_is_named():
    stops = procs.Stops()
    ran = []
    stops.later("toxiproxy", lambda: ran.append("toxiproxy"))
    stops.later("kafka", lambda: (_ for _ in ()).throw(OSError("still running")))
    with pytest.raises(StackError, match="kafka: OSError: still running"):
        stops.stop_all()
    assert ran == ["toxiproxy"] and stops.pending == {}
