"""benchmarks.chaos's ``--overlap``: service faults run in the background, never two of one service at once, and
every one is recorded once, in the campaign's thread, with its outcome (a hit, a miss or the harness error)."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.chaos import SERVICE_GROUPS, _Overlap

KINDS = sorted(SERVICE_GROUPS)
OUTCOMES = st.sampled_from([True, False, "error"])
STEPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 3), OUTCOMES, st.booleans()), max_size=25)


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_one_fault_per_service_at_a_time_and_each_recorded_once(steps):
    lock = threading.Lock()
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    recorded: list[tuple[int, str, object]] = []
    campaign_thread = threading.get_ident()

    def record(kind, hit):
        assert threading.get_ident() == campaign_thread
        recorded.append((threading.get_ident(), kind, hit))

    def fault(n: int, kind: str, ms: int, outcome):
        group = SERVICE_GROUPS[kind]
        with lock:
            running[group] = running.get(group, 0) + 1
            most[group] = max(most.get(group, 0), running[group])
        try:
            time.sleep(ms / 1000)
            if outcome == "error":
                raise RuntimeError(f"fault {n}")
            return outcome
        finally:
            with lock:
                running[group] -= 1

    background = _Overlap(record)
    try:
        for n, (kind, ms, outcome, collect) in enumerate(steps):
            if collect:
                background.collect()
            background.submit(kind, lambda n=n, kind=kind, ms=ms, outcome=outcome: fault(n, kind, ms, outcome))
            assert background.running <= len(set(SERVICE_GROUPS.values()))
    finally:
        background.close()
    assert background.running == 0
    assert all(n <= 1 for n in most.values()), most
    # each fault once; by service, in the order submitted; an error handed over as the exception
    assert len(recorded) == len(steps)
    for group in set(SERVICE_GROUPS.values()):
        want = [(kind, outcome) for kind, _, outcome, _ in steps if SERVICE_GROUPS[kind] == group]
        got = [(kind, "error" if isinstance(hit, RuntimeError) else hit) for _, kind, hit in recorded
               if SERVICE_GROUPS[kind] == group]
        assert got == want
