"""Computing an iterator's items ahead of its consumer, on a helper thread (the sinks read and prepare the
next updates while the current ones are written: Arrow's readers and kernels release the GIL)."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


def read_ahead(items: Iterator[T], depth: int, name: str, cancel: Callable[[], None] | None = None) -> Iterator[T]:
    """``items``, computed on a helper thread at most ``depth`` ahead of the caller; an error there is
    raised here, and closing this iterator (or leaving the loop over it) stops the thread. ``items`` is then
    closed on that thread (a generator's ``finally`` runs there: e.g. a server-side cursor is closed), after
    ``cancel``, if given, was called while the thread was still waiting for ``items``' next one (e.g. to
    cancel a query that would otherwise run to its end before the thread can stop)."""
    import queue
    import threading

    items = iter(items)
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    busy = threading.Event()  # fill is inside next(items)
    end = object()

    def put(entry: tuple) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fill() -> None:
        try:
            while True:
                busy.set()
                try:
                    item = next(items)
                except StopIteration:
                    break
                finally:
                    busy.clear()
                if not put((item, None)):
                    return
            put((end, None))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            put((end, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    thread = threading.Thread(target=fill, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if item is end:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        if cancel is not None and busy.is_set():
            with contextlib.suppress(Exception):
                cancel()
        thread.join()
