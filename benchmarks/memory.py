"""Peak resident memory of the processes taking part in a measurement, sampled on a helper thread.

A :class:`PeakRss` watches named groups of processes (e.g. ``python``: the benchmark driver itself;
``jvm``: the Spark driver JVM and its children) every ``interval`` seconds and keeps, per group and for
their sum, the largest resident set seen. Sampling may miss a spike shorter than the interval; the sum's
peak is the peak of the sampled sums (what the machine had to hold at once), not the sum of the groups'
peaks.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

import psutil

MB = 1e6


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every descendant still alive (an empty list if ``pid`` is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def rss_bytes(procs: Iterable[psutil.Process]) -> int:
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


class PeakRss:
    """Context manager: ``with PeakRss({"python": f, "jvm": g}) as peak: ...`` then ``peak.mb()``.

    Each group is a function returning the processes to count right now (re-evaluated every few samples,
    so children that start during the measurement are seen).
    """

    def __init__(self, groups: dict[str, Callable[[], list[psutil.Process]]], interval: float = 0.05) -> None:
        self.groups = groups
        self.interval = interval
        self.peaks: dict[str, int] = {name: 0 for name in groups}
        self.peaks["total"] = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def _run(self) -> None:
        procs: dict[str, list[psutil.Process]] = {}
        tick = 0
        while True:
            if tick % 10 == 0:
                procs = {name: find() for name, find in self.groups.items()}
            self._sample(procs)
            tick += 1
            if self._stop.wait(self.interval):
                self._sample({name: find() for name, find in self.groups.items()})
                return

    def _sample(self, procs: dict[str, list[psutil.Process]]) -> None:
        total = 0
        for name, ps in procs.items():
            rss = rss_bytes(ps)
            self.peaks[name] = max(self.peaks[name], rss)
            total += rss
        self.peaks["total"] = max(self.peaks["total"], total)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mb(self) -> dict[str, float]:
        """Peak per group and of the sum (``total``), in MB (10^6 bytes)."""
        return {name: v / MB for name, v in self.peaks.items()}


def cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds (user + system) used so far by the processes under each of ``roots`` (each root and every
    descendant still alive), including their children already reaped (a Postgres backend that ended, a
    Python worker Spark replaced): take it before and after a measurement, the difference is the work done
    on the machine's cores whatever else ran beside it (wall seconds stretch with the load, this does not)."""
    total = 0.0
    seen: set[int] = set()
    for root in roots:
        for p in process_tree(root):
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                t = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total
