"""Looking at a Kinesis stream from a source's frontier without reading for it: has it moved (the trigger of
``schedule: upstream``), and how far behind its tip is the source (the lag ``reclock status``, the UI page
and the statistics show).

Kinesis tells no shard's tip. Both questions are answered by reading from the frontier: whether a readable
shard has a record at or after its position (one small ``GetRecords`` per readable shard: one probe of the
stream per poll), and how many records lie beyond it (a count up to a cap) and how old the first of them is
(``now - ApproximateArrivalTimestamp``: the milliseconds the source is behind; Kinesis's own
``MillisBehindLatest`` is the same figure where the endpoint gives it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

from reclock.sources.kinesis.lineage import done_shards, entry_position, readable

LAG_CAP = 100_000
"""A lag probe counts at most this many records per shard (more: the figure is a lower bound)."""


@dataclass(frozen=True)
class StreamLag:
    """Records beyond the frontier (``at_least``: the count stopped at a cap) and the age in ms of the
    oldest of them (0: none)."""

    records: int
    millis: int
    at_least: bool = False

    def describe(self) -> str:
        more = "at least " if self.at_least else ""
        return f"{more}{self.records} records, {self.millis} ms behind the tip"


def moved(upstream, positions: Mapping[int, int]) -> tuple[bool, str]:
    """Whether the stream holds something a mint would bind beyond ``positions`` (the newest binding): a
    record in a readable shard at or after its position, or a closed shard not yet read to its end. With
    the reason in words."""
    listing = upstream.shards()
    for s in readable(listing, positions):
        p = positions.get(s.number, 0) or entry_position(s, listing)
        if p == s.start and p and p != positions.get(s.number, 0):
            return True, f"shard {s.number} can start (its parents are read to their ends)"
        hit, _ = upstream.moved(s, p)
        if hit:
            return True, f"shard {s.number} has records at or after {p}" if not s.closed else \
                f"shard {s.number} has records or its end after {p}"
    return False, "no readable shard has anything beyond the newest binding"


def stream_lag(upstream, positions: Mapping[int, int], cap: int = LAG_CAP, now_ms: int | None = None) -> StreamLag:
    """How far the stream's tip is beyond ``positions`` (the source's offset resumption frontier), over every
    shard the source has yet to read, children of unfinished parents included (their records are behind
    too)."""
    listing = upstream.shards()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    total, oldest, capped = 0, None, False
    done = done_shards(listing, positions)
    for s in listing:
        if s.number in done:
            continue
        p = positions.get(s.number, 0) or entry_position(s, listing)
        n = 0
        for page in upstream.pages(s, p):
            for r in page.records:
                if oldest is None or r["ApproximateArrivalTimestamp"].timestamp() * 1000 < oldest:
                    oldest = r["ApproximateArrivalTimestamp"].timestamp() * 1000
                n += 1
            if n >= cap:
                capped = True
                break
        total += n
    return StreamLag(total, 0 if oldest is None else max(0, int(now - oldest)), capped)
