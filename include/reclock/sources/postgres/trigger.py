"""A Postgres source's ``schedule: upstream`` trigger: :class:`PublicationChanged` fires when a transaction that
changed a published table committed at or after the slot's position (one transaction peeked from a
temporary copy of the slot, so the probe never waits for, blocks or moves the slot a cycle uses); or the
source is idle but WAL behind its slot is to be released (``PostgresUpstream.reason_to_bind``: an idle source
never pins WAL); or it has no binding yet (the first cycle takes the snapshot).

One probe per upstream Postgres reads its flush LSN a ``poll``, and a source looks at its slot only when the
flush LSN moved (nothing was written, so nothing can be pending). The trigger's arguments hold no secret
(the DSNs are found in the triggerer, as every task finds them).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Hashable

from airflow.triggers.base import TriggerEvent

from reclock.sources.postgres.upstream import IDLE_S
from reclock.sources.trigger import REFIRE_S, SharedProbeTrigger, newest_binding

log = logging.getLogger(__name__)

PG_CLASSPATH = "reclock.sources.postgres.trigger.PublicationChanged"


@dataclass(frozen=True)
class RunReason:
    """Why a Postgres source should run a cycle now: ``reason`` in words, its slot's confirmed position
    ``slot`` (None before the first binding), and whether it is ``news`` (fired for at once when the slot
    moved since the last event) or a standing condition fired for only every :data:`REFIRE_S`."""

    reason: str
    slot: int | None
    news: bool = True


def why_run(upstream, consensus_dsn: str, now_ms: int, idle_s: float = IDLE_S) -> RunReason | None:
    """Why Postgres source ``upstream.source`` should run a cycle now (None: nothing to do). Errors a run
    would report (``SlotLost``, ``PublicationMissing``) are raised. Without a free replication slot for the
    probe's copy, the source runs every :data:`REFIRE_S` (its cycles need no extra slot)."""
    from psycopg.errors import ConfigurationLimitExceeded

    newest = newest_binding(consensus_dsn, upstream.source)
    if newest is None:
        return RunReason("no binding yet: the first cycle takes the snapshot", None)
    ts, offsets = newest
    with upstream.connect() as conn:
        state = upstream.healthy_slot(conn)
        slot = state.confirmed_flush
        if slot < offsets.get(0, 0):
            return RunReason("the slot is behind the newest binding (a cycle is under way, or failed)", slot, False)
        try:
            reason = upstream.reason_to_bind(conn, slot, ts, now_ms, idle_s)
        except ConfigurationLimitExceeded:  # max_replication_slots: no room for the copy; run now and then
            return RunReason("no replication slot free for the probe's copy of the slot", slot, False)
    return RunReason(reason, slot) if reason is not None else None


class PublicationChanged(SharedProbeTrigger):
    """Fires when Postgres source ``source`` has a cycle to run (:func:`why_run`): changes to its publication
    committed at or after its slot's position, WAL to release while idle, or no binding yet.

    A reason found again at the slot position last fired at (the run it fired is still under way), or a
    standing one (the slot behind the newest binding, an error a run reports), is fired for again only every
    :data:`REFIRE_S`.

    :param source: the Reclock source.
    :param publication: its publication.
    :param connection: its upstream's Airflow connection, or ``dsn_env`` the environment variable holding
        the DSN (found in the triggerer as a task finds them); the triggers of one upstream share a probe.
    :param poll: seconds between probes of the flush LSN.
    :param idle: seconds after which an idle source's newest binding is renewed, to release WAL.
    """

    def __init__(self, *, source: str, publication: str, connection: str | None = None,
                 dsn_env: str | None = None, poll: float = 1.0, idle: float = IDLE_S) -> None:
        super().__init__()
        self.source, self.publication, self.connection, self.dsn_env = source, publication, connection, dsn_env
        self.poll, self.idle = float(poll), float(idle)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return PG_CLASSPATH, {"source": self.source, "publication": self.publication,
                              "connection": self.connection, "dsn_env": self.dsn_env, "poll": self.poll,
                              "idle": self.idle}

    def shared_stream_key(self) -> Hashable | None:
        return ("reclock-pg-flush", self.connection, self.dsn_env, self.poll)

    @staticmethod
    def _upstream_dsn(kwargs: dict[str, Any]) -> str:
        from reclock.sources.postgres.spec import PostgresSpec, find_upstream_dsn

        spec = PostgresSpec(publication=kwargs["publication"], connection=kwargs["connection"],
                            dsn_env=kwargs["dsn_env"])
        return find_upstream_dsn(spec, f"source {kwargs['source']}")

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One probe loop per upstream: its flush LSN, every ``poll`` seconds. A probe that fails (the server
        away) is logged and retried; the loop never ends by itself."""
        from reclock.sources.postgres.upstream import PostgresUpstream

        dsn = await asyncio.to_thread(cls._upstream_dsn, kwargs)
        probe = PostgresUpstream(kwargs["source"], dsn, kwargs["publication"])
        poll = float(kwargs["poll"])
        conn = None
        while True:
            try:
                if conn is None or conn.closed:
                    conn = await asyncio.to_thread(probe.connect)
                yield await asyncio.to_thread(probe.flush_lsn, conn)
            except Exception as e:  # noqa: BLE001 - a server restart must not end the watch
                log.warning("reclock: probing the upstream of %s failed: %s; retrying in %ss", kwargs["source"], e,
                            poll)
                if conn is not None:
                    conn.close()
                conn = None
            await asyncio.sleep(poll)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """This source's events: the flush LSN moved since the last look (or a refire is due) and
        :func:`why_run` gives a reason that was not fired for at this slot position already. While a fired
        reason stands at the same slot position (its run is under way), the slot is looked at every probe,
        so changes committed during the run fire as soon as its resume moves the slot."""
        import time

        from reclock.errors import ReclockError
        from reclock.settings import find_dsn
        from reclock.sources.postgres.upstream import PostgresUpstream, UpstreamUnavailable

        kwargs = self.serialize()[1]
        dsn = await asyncio.to_thread(find_dsn, None)
        upstream = PostgresUpstream(self.source, await asyncio.to_thread(self._upstream_dsn, kwargs),
                                    self.publication)
        loop = asyncio.get_running_loop()
        seen: int | None = None
        fired_at: float | None = None
        fired_slot: int | None = None
        async for flush in shared_stream:
            due = fired_at is None or loop.time() - fired_at >= REFIRE_S
            if flush == seen and not due:
                continue
            try:
                why = await asyncio.to_thread(why_run, upstream, dsn, int(time.time() * 1000), self.idle)
            except UpstreamUnavailable as e:
                self.log.warning("reclock: %s", e)
                continue
            except ReclockError as e:  # a run reports it (its status: stalled)
                why = RunReason(f"error: {e}", fired_slot, news=False)
            except Exception as e:  # noqa: BLE001 - Postgres away for a moment: look again at the next probe
                self.log.warning("reclock: looking at %s's slot failed: %s", self.source, e)
                continue
            if why is not None and not (due or (why.news and why.slot != fired_slot)):
                continue  # already fired for: look again at the next probe (the run under way moves the slot)
            seen = flush  # nothing to do, or fired for: nothing new until the flush LSN moves
            if why is None:
                continue
            fired_at, fired_slot = loop.time(), why.slot
            yield TriggerEvent({"source": self.source, "reason": why.reason, "flush_lsn": flush, "slot": why.slot})
