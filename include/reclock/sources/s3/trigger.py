"""``schedule: upstream`` for an S3 source: an Asset watcher (a trigger in Airflow's triggerer) that fires
when objects arrived that the source has not taken yet.

* **notifications** (:class:`ObjectsArrived` with a ``queue``): it long-polls the SQS queue the bucket's
  events go to, with a visibility timeout of 0, so it only *looks*: the messages stay for the cycle, which
  receives and deletes them once their objects are recorded. It fires as soon as a message it has not seen
  arrives (a long poll returns the moment one does: the cycle starts within a second of the upload). Each
  look counts as a receive for SQS (``ApproximateReceiveCount``): give the queue no redrive policy, or a
  ``maxReceiveCount`` far above what the looks add (docs/s3.md).
* **listing**: every ``poll`` it lists after the source's key frontier and fires when a key appears that the
  catalog does not hold (with ``keys: any``: the whole prefix each time; prefer notifications for a large
  bucket).

A source whose run failed, or that stays behind, is fired for again every :data:`REFIRE_S`, like the other
kinds' triggers. The trigger's arguments hold no secret: the keys are found in the triggerer as a task finds
them (the source's connection).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, AsyncIterator

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from reclock.sources.trigger import REFIRE_S

log = logging.getLogger(__name__)

CLASSPATH = "reclock.sources.s3.trigger.ObjectsArrived"
SEEN_IDS = 10_000
"""Message ids remembered (a look returns up to 10 of the queue's messages, not necessarily new ones)."""


def new_keys(source: str, url: str, settings, dsn: str, limit: int = 1) -> list[str]:
    """Up to ``limit`` keys after the source's key frontier that its catalog does not hold (a listing)."""
    from reclock.persist import connect
    from reclock.sources.s3 import catalog
    from reclock.sources.s3.client import open_store

    with connect(dsn) as conn:
        row = catalog.source_row(conn, source)
        known = {r.key for r in catalog.rows(conn, source, row.start_after)}
    out = []
    for obj in open_store(source, url, settings).list(row.start_after):
        if obj.key not in known:
            out.append(obj.key)
            if len(out) >= limit:
                break
    return out


class ObjectsArrived(BaseEventTrigger):
    """Fires when S3 source ``source`` has objects to take (see the module).

    :param source: the Reclock source.
    :param url: its ``s3://bucket/prefix/`` (or folder).
    :param connection: its S3 connection (None: a folder), found in the triggerer.
    :param connection_named: the config names it (then it is never passed over for the environment's keys).
    :param queue: the SQS queue (URL or name) of a notification source (None: listing).
    :param poll: seconds between looks (a long poll waits up to 20 s for a message instead).
    """

    def __init__(self, *, source: str, url: str, connection: str | None = None, queue: str | None = None,
                 poll: float = 1.0, connection_named: bool = False) -> None:
        super().__init__()
        self.source, self.url, self.connection, self.queue = source, url, connection, queue
        self.connection_named = bool(connection_named)
        self.poll = float(poll)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"source": self.source, "url": self.url, "connection": self.connection,
                           "connection_named": self.connection_named, "queue": self.queue, "poll": self.poll}

    def _settings(self):
        if self.connection is None:
            return None
        from reclock.settings import find_source_s3_settings

        return find_source_s3_settings(self.connection, f"source {self.source}", self.connection_named)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        loop = asyncio.get_running_loop()
        settings = await asyncio.to_thread(self._settings)
        fired_at: float | None = None
        if self.queue:
            from reclock.sources.s3.client import EventQueue

            queue = EventQueue(self.source, self.queue, settings)
            sqs = await asyncio.to_thread(lambda: queue.client)  # a queue's name is resolved to its URL here
            url = queue.queue_url
            seen: collections.OrderedDict[str, None] = collections.OrderedDict()
            while True:
                try:
                    r = await asyncio.to_thread(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=10,
                                                VisibilityTimeout=0, WaitTimeSeconds=20)
                except Exception as e:  # noqa: BLE001 - the endpoint away for a moment must not end the watch
                    self.log.warning("reclock: looking at %s for %s failed: %s", self.queue, self.source, e)
                    await asyncio.sleep(self.poll)
                    continue
                ids = [m["MessageId"] for m in r.get("Messages", ())]
                fresh = [i for i in ids if i not in seen]
                for i in ids:
                    seen[i] = None
                    seen.move_to_end(i)
                while len(seen) > SEEN_IDS:
                    seen.popitem(last=False)
                due = fired_at is not None and loop.time() - fired_at >= REFIRE_S
                if fresh or (ids and due):
                    fired_at = loop.time()
                    yield TriggerEvent({"source": self.source, "queue": self.queue, "messages": len(fresh)})
                if ids:
                    await asyncio.sleep(self.poll)  # they stay visible until the cycle takes them
            return
        from reclock.settings import find_dsn

        dsn = await asyncio.to_thread(find_dsn, None)
        last: list[str] = []
        while True:
            try:
                keys = await asyncio.to_thread(new_keys, self.source, self.url, settings, dsn)
            except Exception as e:  # noqa: BLE001
                self.log.warning("reclock: listing %s for %s failed: %s", self.url, self.source, e)
                keys = []
            due = fired_at is not None and loop.time() - fired_at >= REFIRE_S
            if keys and (keys != last or due):
                fired_at = loop.time()
                yield TriggerEvent({"source": self.source, "url": self.url, "first_new_key": keys[0]})
            last = keys
            await asyncio.sleep(self.poll)


def upstream_trigger(spec) -> ObjectsArrived:
    s3 = spec.upstream
    return ObjectsArrived(source=spec.name, url=s3.url, connection=None if s3.is_folder else s3.connection,
                          queue=s3.queue if s3.discovery == "notifications" else None, poll=spec.poll_s,
                          connection_named=s3.connection_named)
