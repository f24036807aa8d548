"""``reclock.ahead.read_ahead``: what a caller that stops early leaves behind (the Postgres source reads
the slot's blocks on a helper thread through it: a stall found mid-stream stops the read)."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from reclock.ahead import read_ahead


def test_stopping_early_closes_the_items_on_the_helper_thread():
    closed: list[str] = []

    def items():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.append(threading.current_thread().name)

    it = read_ahead(items(), 2, "t-close")
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert closed == ["t-close"], "the generator's finally ran on the helper thread, before close returned"
    assert not any(t.name == "t-close" for t in threading.enumerate())


def test_an_error_in_the_caller_stops_the_helper_waiting_for_a_slow_item_through_cancel():
    release = threading.Event()
    cancelled: list[bool] = []

    def items():
        yield 1
        release.wait(30)  # a query that would run on: only cancel ends it
        if cancelled:
            raise RuntimeError("canceled")
        yield 2

    def cancel():
        cancelled.append(True)
        release.set()

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="a stall"):
        with contextlib.closing(read_ahead(items(), 1, "t-cancel", cancel=cancel)) as it:
            for x in it:
                time.sleep(0.05)  # the helper is inside next(items) by now
                raise ValueError("a stall")
    assert cancelled == [True]
    assert time.monotonic() - t0 < 10
    assert not any(t.name == "t-cancel" for t in threading.enumerate())


def test_no_cancel_when_the_helper_only_waits_for_room():
    cancelled: list[bool] = []
    it = read_ahead(iter(range(100)), 1, "t-room", cancel=lambda: cancelled.append(True))
    assert next(it) == 0
    time.sleep(0.05)  # the helper has its next item and waits for room in the queue
    it.close()
    assert cancelled == []
