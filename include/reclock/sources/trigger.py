"""What the kinds' ``schedule: upstream`` triggers share (``SourceKind.upstream_trigger``): a trigger fed by a
probe the triggers of one upstream share, and a source's newest binding read from consensus.

One probe per upstream (a Kafka cluster, a Postgres server) serves every source on it: the triggers of one
upstream share one poll loop in the triggerer (``shared_stream_key``, ``open_shared_stream``) and each
picks its own source's events (``filter_shared_stream``). A source that stays behind (a run failed for
good, or an error a run reports) is fired for again every :data:`REFIRE_S`, so data never waits for
upstream to move. Imports Airflow: only a kind's trigger module imports this one.
"""

from __future__ import annotations

from typing import AsyncIterator

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

REFIRE_S = 60.0
"""A source still behind its upstream this long after the trigger fired is fired for again."""


def newest_binding(dsn: str, source: str) -> tuple[int, dict[int, int]] | None:
    """The timestamp and offsets of ``source``'s newest binding (None before its first)."""
    from reclock.persist import connect
    from reclock.persist.remap_store import newest_binding as newest

    with connect(dsn) as conn:
        return newest(conn, source)


def bound_frontier(dsn: str, source: str) -> dict[int, int]:
    """The offsets of ``source``'s newest binding (empty before its first)."""
    newest = newest_binding(dsn, source)
    return {} if newest is None else newest[1]


class SharedProbeTrigger(BaseEventTrigger):
    """A trigger fed by a probe that the triggers of one upstream share (``shared_stream_key``,
    ``open_shared_stream``); ``filter_shared_stream`` picks its own source's events."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The same events, with a probe of its own (when the triggerer does not share streams)."""
        async for event in self.filter_shared_stream(type(self).open_shared_stream(self.serialize()[1])):
            yield event
