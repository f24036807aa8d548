"""Computing an iterator's items ahead of its consumer, on a helper thread (the sinks read and prepare the
next updates while the current ones are written: Arrow's readers and kernels release the GIL)."""

from __future__ import annotations

import queue
import threading
from typing import Generic, Iterator, TypeVar

T = TypeVar("T")

_END = object()


class read_ahead(Generic[T]):  # noqa: N801 - used like the function it was
    """``items``, computed on a helper thread at most ``depth`` ahead of the caller. The thread starts at
    once, so the first items are computed while the caller still prepares (and before it asks for them);
    an error there is raised here; :meth:`close` stops the thread (call it when done, as with a file)."""

    def __init__(self, items: Iterator[T], depth: int, name: str) -> None:
        self._q: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._fill, args=(items,), name=name, daemon=True)
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
            for item in items:
                if not self._put((item, None)):
                    return
            self._put((_END, None))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            self._put((_END, e))

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
        self._thread.join()
