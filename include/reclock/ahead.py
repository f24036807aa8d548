"""Computing an iterator's items ahead of its consumer, on a helper thread (the sinks read and prepare the
next updates while the current ones are written: Arrow's readers and kernels release the GIL)."""

from __future__ import annotations

from typing import Iterator, TypeVar

T = TypeVar("T")


def read_ahead(items: Iterator[T], depth: int, name: str) -> Iterator[T]:
    """``items``, computed on a helper thread at most ``depth`` ahead of the caller; an error there is
    raised here, and closing this iterator (or leaving the loop over it) stops the thread."""
    import queue
    import threading

    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
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
            for item in items:
                if not put((item, None)):
                    return
            put((end, None))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            put((end, e))

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
        thread.join()
