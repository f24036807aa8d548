"""A Kinesis source's ``schedule: upstream`` trigger: :class:`KinesisMoved` fires when the stream holds something
the source's next mint would bind (``reclock.sources.kinesis.probe.moved``). Kinesis tells no tip without a
read, so each source probes its own stream from its own newest binding: one small ``GetRecords`` per readable
shard every ``poll``. The trigger's arguments hold no secret (credentials come from the triggerer's AWS chain,
the consensus DSN is found as every task finds it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Hashable

from airflow.triggers.base import TriggerEvent

from reclock.sources.trigger import REFIRE_S, SharedProbeTrigger, bound_frontier

log = logging.getLogger(__name__)

CLASSPATH = "reclock.sources.kinesis.trigger.KinesisMoved"


class KinesisMoved(SharedProbeTrigger):
    """Fires when Kinesis source ``source``'s stream holds something its next mint would bind: a record at or
    after the newest binding's position in a readable shard, or a closed shard's end still to be read
    (``reclock.sources.kinesis.probe.moved``: one small ``GetRecords`` per readable shard, every ``poll``;
    Kinesis tells no tip without a read). Fired for again every :data:`REFIRE_S` while it stays so.

    :param source: the Reclock source.
    :param stream: its stream, in ``region``, at ``endpoint_url`` (None: AWS's), found in the triggerer as a
        task finds them (``RECLOCK_KINESIS_ENDPOINT`` ...); credentials from the triggerer's AWS chain.
    :param poll: seconds between probes.
    """

    def __init__(self, *, source: str, stream: str, region: str | None = None, endpoint_url: str | None = None,
                 poll: float = 1.0) -> None:
        super().__init__()
        self.source, self.stream, self.region, self.endpoint_url = source, stream, region, endpoint_url
        self.poll = float(poll)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"source": self.source, "stream": self.stream, "region": self.region,
                                   "endpoint_url": self.endpoint_url, "poll": self.poll}

    def shared_stream_key(self) -> Hashable | None:
        return None  # each source probes its stream from its own frontier

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """One probe of the stream from the source's newest binding every ``poll``: ``(moved, why)``. A probe
        that fails (the endpoint away, Postgres away) is logged and retried."""
        from reclock.settings import find_dsn
        from reclock.sources.kinesis.client import KinesisUpstream
        from reclock.sources.kinesis.config import KinesisSpec, find_stream
        from reclock.sources.kinesis.probe import moved

        spec = KinesisSpec(stream=kwargs["stream"], region=kwargs["region"], endpoint_url=kwargs["endpoint_url"])
        address = await asyncio.to_thread(find_stream, spec, f"source {kwargs['source']}")
        dsn = await asyncio.to_thread(find_dsn, None)
        upstream = KinesisUpstream(kwargs["source"], address, throttle_patience_s=5.0)
        poll = float(kwargs["poll"])
        while True:
            try:
                bound = await asyncio.to_thread(bound_frontier, dsn, kwargs["source"])
                yield await asyncio.to_thread(moved, upstream, bound)
            except Exception as e:  # noqa: BLE001 - the endpoint or Postgres away for a moment
                log.warning("reclock: probing Kinesis stream %s failed: %s; retrying in %ss", kwargs["stream"], e,
                            poll)
            await asyncio.sleep(poll)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        loop = asyncio.get_running_loop()
        fired = 0.0
        async for ahead, why in shared_stream:
            if not ahead:
                fired = 0.0
                continue
            if fired and loop.time() - fired < REFIRE_S:
                continue
            fired = loop.time()
            yield TriggerEvent({"source": self.source, "reason": why})
