"""Computing an iterator's items ahead of its consumer, on a helper thread (the sinks read and prepare the
next updates while the current ones are written, a Postgres source fetches the slot's next blocks while it
decodes one: Arrow's readers and kernels, and the network, release the GIL)."""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

_END = object()


class read_ahead(Generic[T]):  # noqa: N801 - used like the function it was
    """``items``, computed on a helper thread at most ``depth`` ahead of the caller. The thread starts at
    once, so the first items are computed while the caller still prepares (and before it asks for them);
    an error there is raised here. :meth:`close` (call it when done, as with a file) stops the thread:
    ``items`` is then closed on that thread (a generator's ``finally`` runs there: e.g. a server-side cursor
    is closed), after ``cancel``, if given, was called while the thread was still waiting for ``items``'
    next one (e.g. to cancel a query that would otherwise run to its end before the thread can stop)."""

    def __init__(self, items: Iterator[T], depth: int, name: str, cancel: Callable[[], None] | None = None) -> None:
        self._q: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._busy = threading.Event()  # the thread is inside next(items)
        self._cancel = cancel
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(iter(items),), name=name, daemon=True)
        self._thread.start()

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, items: Iterator[T]) -> None:
        try:
            while True:
                self._busy.set()
                try:
                    item = next(items)
                except StopIteration:
                    break
                finally:
                    self._busy.clear()
                if not self._put((item, None)):
                    return
            self._put((_END, None))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self._put((_END, e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

    def __iter__(self) -> read_ahead[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item, error = self._q.get()
        if item is _END:
            self._done = True
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        self._done = True
        self._stop.set()
        if self._cancel is not None and self._busy.is_set():
            with contextlib.suppress(Exception):
                self._cancel()
        self._thread.join()
