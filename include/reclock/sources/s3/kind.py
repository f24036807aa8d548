"""The S3 kind: the objects under an ``s3://bucket/prefix/`` (or a local folder), FromTime
``(key, byte_offset)`` kept in the remap collection as a log (``reclock.sources.s3.log``).

==================  ========================================================================================
the interface       here
==================  ========================================================================================
register            the remap collection (progress ``(ts, key, byte_offset)``), the collection (output 0),
                    its error collection (output 1), the kind's catalog row
probe_upper         discovery (``reclock.sources.s3.discovery``): list after the key frontier, or receive S3
                    event notifications from SQS; new objects into the catalog, sealed ones placed in the
                    log; the frontier the catalog gives (the log's end, growing files' complete lines)
descriptions        a backlog cut by ``budget.max_bytes`` (a log position per byte, one per object)
write               the bound byte ranges, per object, with their ts (``reclock.sources.s3.log``); read by
                    Spark tasks pinned to each object's ETag (``reclock.sources.s3.read``), decoded, proved
                    by ``reclock.persist.staged``; ``on_decode_error: stall`` refuses the description
commit              nothing upstream (S3 keeps no reader position); the catalog forgets the objects below the
                    resumption frontier that no listing or notification can name again (bounded state)
lag                 objects and bytes upstream not yet in the collection
==================  ========================================================================================
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable

from reclock import remap
from reclock.batch import BatchDescription, SliceWritten, mint_descriptions
from reclock.specs import SourceSpec
from reclock.errors import ConfigError, DecodeError, S3Unavailable
from reclock.failpoints import failpoint
from reclock.part_layout import DATA_KIND, DATA_OUTPUT, ERRORS_KIND, ERRORS_OUTPUT
from reclock.persist.gc import lease_write, release_write
from reclock.persist.objectstore import S3Settings
from reclock.persist.remap_store import load_remap, register_source
from reclock.persist.shards import register_shard
from reclock.persist.status import record_statistics
from reclock.persist.staged import collect_parts, slice_folder
from reclock.remap import RemapCollection
from reclock.sources.base import CycleServices, Lag, SourceKind, SourceRuntime, WrittenBatch
from reclock.sources.s3 import catalog
from reclock.sources.s3.client import RECEIVE_S, EventQueue, ObjectInfo, ObjectStore, open_store
from reclock.sources.s3.discovery import (Discovery, Known, OnOverwrite, Rules, State, forgettable, frontier_of,
                                          reconcile)
from reclock.sources.s3.lines import complete_upto
from reclock.sources.s3.log import LOG, BoundRange, Layout, bound_ranges
from reclock.sources.s3.read import (SPLIT_BYTES, WHOLE_FORMATS, ReaderConf, is_gzip, json_fields, slices_of, units_for,
                                     whole_schema, write_slice)
from reclock.sources.s3.spec import SCHEDULES, parse_s3_source
from reclock.time import PartitionedFrontier

TAIL_STEP = 1 << 16
"""A growing file's complete lines are found by reading back from its end in steps of this many bytes."""

PROGRESS_VIEW = """WITH s(name) AS (SELECT {}::text)
SELECT o.ts, x.key, x.size AS byte_offset
FROM reclock.remap_offsets o
LEFT JOIN LATERAL (
    SELECT y.key, y.base, CASE WHEN y.state = 'overwrite' THEN 0 ELSE y.size END AS size
    FROM reclock.s3_objects y WHERE y.source = o.source AND y.base < o."offset" ORDER BY y.base DESC LIMIT 1
) x ON x.base + x.size + 1 = o."offset"
WHERE o.source = (SELECT name FROM s) AND o.partition = 0
UNION ALL
SELECT o.ts, y.key, o."offset"::bigint FROM reclock.remap_offsets o
JOIN reclock.s3_objects y ON y.source = o.source AND y.id = o.partition
WHERE o.source = (SELECT name FROM s) AND o.partition > 0
"""
"""The ``<source>_progress`` relation ``(ts, key, byte_offset)``: per binding, the last object placed in the
log and how many of its bytes are in (all: it is sealed), and each growing file's complete bytes. A key
the catalog has forgotten is null."""


def rules_of(spec: SourceSpec) -> Rules:
    s3 = spec.upstream
    return Rules(mutable=s3.is_folder, settle_ms=int(s3.settle_s * 1000), on_overwrite=OnOverwrite(s3.on_overwrite),
                 lookback_ms=int(s3.lookback_s * 1000) if s3.keys == "increasing" and s3.discovery == "listing" else None,
                 whole=lambda key: spec.format.type in ("parquet", "avro") or is_gzip(key, s3.compression))


def reader_conf(spec: SourceSpec, settings: S3Settings | None) -> ReaderConf:
    s3 = spec.upstream
    return ReaderConf(spec.name, s3.url, settings, spec.format.type, s3.compression, spec.format.csv_header,
                      OnOverwrite(s3.on_overwrite))


@dataclass
class Discovered:
    """What the last discovery did (statistics of the mint)."""

    listed: int = 0
    added: int = 0
    changed: int = 0
    overwrites: int = 0
    messages: int = 0
    ignored_events: int = 0
    seconds: float = 0.0


class S3Source(SourceRuntime):
    """An S3 source's half of a cycle context: its object store, its queue, and its catalog's rows.
    ``ctx.upstream``: the S3 endpoint and keys its ``connection:`` gives (None for a folder)."""

    probe_after_register = True  # discovery writes the kind's catalog, which the registration creates

    def __init__(self, kind: SourceKind, ctx: CycleServices) -> None:
        super().__init__(kind, ctx)
        self.settings: S3Settings | None = ctx.upstream
        self.last = Discovered()
        self._store: ObjectStore | None = None
        self._queue: EventQueue | None = None

    @property
    def spec(self) -> SourceSpec:
        return self.ctx.spec

    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = open_store(self.name, self.spec.upstream.url, self.settings)
        return self._store

    def queue(self) -> EventQueue:
        if self._queue is None:
            self._queue = EventQueue(self.name, self.spec.upstream.queue, self.settings)
        return self._queue

    # -- register -------------------------------------------------------------------------------------

    def register(self) -> None:
        spec = self.spec
        with self.ctx.connect() as conn:
            register_source(conn, spec.name, kind=self.kind.name, progress=self.kind.progress_view())
            register_shard(conn, spec.data_shard, source=spec.name, output=DATA_OUTPUT, kind=DATA_KIND)
            register_shard(conn, spec.errors_shard, source=spec.name, output=ERRORS_OUTPUT, kind=ERRORS_KIND)
            catalog.ensure(conn, spec.name)

    def shards(self) -> tuple[str, ...]:
        return (self.spec.data_shard, self.spec.errors_shard)

    # -- probe: discovery -----------------------------------------------------------------------------

    def probe_upper(self) -> PartitionedFrontier:
        """Discover (list or receive), record what is new in the catalog, and return the frontier the
        catalog gives. Messages of the queue are deleted only once their objects are recorded."""
        import time

        t0 = time.monotonic()
        self.last = Discovered()
        if self.spec.upstream.discovery == Discovery.NOTIFICATIONS.value:
            frontier = self._notified()
        else:
            frontier = self._listed()
        self.last.seconds = round(time.monotonic() - t0, 3)
        with self.ctx.connect() as conn:  # what discovery did, beside mint's own statistics
            record_statistics(conn, self.name, "discover", vars(self.last))
        return frontier

    def _listed(self) -> PartitionedFrontier:
        store, rules, limit = self.store(), rules_of(self.spec), self.spec.upstream.max_objects_per_cycle
        with self.ctx.connect() as conn:
            row = catalog.source_row(conn, self.name)
            known_keys = {r.key for r in catalog.rows(conn, self.name, row.start_after)}
        now = self.ctx.clock()
        listed, new = [], 0
        for obj in store.list(row.start_after):
            if obj.key not in known_keys:
                if new >= limit:
                    break  # the rest waits for the next cycles (keys after it are not listed either)
                new += 1
            listed.append(obj)
        complete = new < limit
        self.last.listed = len(listed)
        return self._reconcile(listed, now, complete_listing=complete, listed_from=row.start_after)

    def _notified(self) -> PartitionedFrontier:
        spec, now = self.spec, self.ctx.clock()
        with self.ctx.connect() as conn:
            row = catalog.source_row(conn, self.name)
        if spec.upstream.backfill and not row.backfilled:
            listed = list(self.store().list())
            self.last.listed = len(listed)
            self._reconcile(listed, now, complete_listing=False, backfilled=True)
        events, receipts = self._receive()
        frontier = self._reconcile(events, now, complete_listing=False)
        if receipts:
            self.queue().delete(receipts)  # only now: a crash before it delivers them again (deduplicated)
        return frontier

    def _receive(self) -> tuple[list[ObjectInfo], list[str]]:
        """Messages from the queue until it is empty, ``max_objects_per_cycle`` objects are named,
        :data:`~reclock.sources.s3.client.RECEIVE_S` have passed, or a message received already comes again
        (its visibility ran out): the objects created (a removal needs nothing: a bound object that is gone
        fails its read, naming it), and the newest receipt of each message."""
        import time

        store, loc = self.store(), self.spec.upstream.url.split("://", 1)[1]
        bucket, _, prefix = loc.partition("/")
        limit = self.spec.upstream.max_objects_per_cycle
        events: dict[str, Any] = {}
        receipts: dict[str, str] = {}  # message id -> its newest receipt (an older one may not delete it)
        deadline = time.monotonic() + RECEIVE_S
        again = False
        while len(events) < limit and not again and time.monotonic() < deadline:
            msgs = self.queue().receive(max_messages=10, wait_s=0)
            if not msgs:
                break
            for m in msgs:
                key = m.message_id or m.receipt
                again = again or key in receipts
                receipts[key] = m.receipt
                for e in m.events:
                    if e.bucket != bucket or not e.key.startswith(prefix):
                        raise S3Unavailable(
                            f"source {self.name}: SQS queue {self.spec.upstream.queue} delivered an event for "
                            f"s3://{e.bucket}/{e.key}, outside the source's {self.spec.upstream.url}; a queue serves one "
                            "source: filter the bucket's notification by the source's prefix (docs/s3.md)")
                    if not e.created or e.key.endswith("/"):
                        self.last.ignored_events += 1
                        continue
                    events[e.key] = e  # the last event of a key in this batch
            self.last.messages += len(msgs)
        with self.ctx.connect() as conn:
            known = {r.key: r for r in catalog.for_keys(conn, self.name, events)}  # by id: a key's newest last
        objects = []
        exact_time = "last_modified" in self.spec.include  # an event has no LastModified: S3 says it (HEAD)
        for key, e in events.items():
            obj = ObjectInfo(e.key, e.size, e.etag, self.ctx.clock(), e.version)
            k = known.get(key)
            if exact_time and (k is None or k.etag != e.etag):
                now = store.head(key)
                if now is None or (k is not None and now.etag == k.etag):
                    self.last.ignored_events += 1
                    continue
                objects.append(now)
                continue
            if not e.etag or (k is not None and k.etag != e.etag):
                # an event older than what is known, or a real overwrite: S3 says which now
                now = store.head(key)
                if now is None or (k is not None and now.etag == k.etag):
                    self.last.ignored_events += 1
                    continue
                obj = now
            objects.append(obj)
        return objects, list(receipts.values())

    def _complete_of(self, obj: ObjectInfo, start: int) -> int:
        """The end of ``obj``'s last complete line at or after ``start`` (a growing file), reading back."""
        store = self.store()
        hi = obj.size
        while hi > start:
            lo = max(start, hi - TAIL_STEP)
            tail = b"".join(store.read(obj, lo, hi))
            found = complete_upto(tail, lo)
            if found is not None:
                return found
            hi = lo
        return start

    def _reconcile(self, listed: list[ObjectInfo], now: int, complete_listing: bool,
                   listed_from: str | None = None, backfilled: bool | None = None) -> PartitionedFrontier:
        """Reconcile ``listed`` with the catalog in one transaction holding the source's catalog row: the
        rows a listing compares with are those after the key frontier (keys: any: all of them); a
        notification's, those of its keys."""
        rules, store = rules_of(self.spec), self.store()
        notified = self.spec.upstream.discovery == Discovery.NOTIFICATIONS.value
        with self.ctx.connect() as conn, conn.transaction():
            row = catalog.source_row(conn, self.name, lock=True)
            if row.start_after is not None and row.start_after != listed_from:
                # another discovery moved the key frontier since this listing: only what is after it
                listed = [o for o in listed if o.key > row.start_after]
            if notified:
                rows = catalog.for_keys(conn, self.name, [o.key for o in listed])
            else:
                rows = catalog.rows(conn, self.name, row.start_after)
            plan = reconcile(self.name, store.url, rows, listed, now, row.next_id, row.start_after, rules,
                             self._complete_of, complete_listing=complete_listing, next_base=row.next_base)
            catalog.apply(conn, self.name, plan, backfilled)
            own = catalog.own_rows(conn, self.name)
        self.last.added += len(plan.added)
        self.last.changed += len(plan.changed)
        self.last.overwrites += plan.overwrites
        return frontier_of(own, plan.next_base)

    # -- descriptions and write -----------------------------------------------------------------------

    def descriptions(self, rc: RemapCollection, lower: int) -> list[BatchDescription]:
        """A backlog cut by ``budget.max_bytes``: a log position is a byte (plus one per object)."""
        return mint_descriptions(lower, rc, self.spec.upstream.max_bytes)

    def bound(self, rc: RemapCollection, desc: BatchDescription, forgotten_below: int = 0):
        """The byte ranges the bindings in ``desc`` bind, per object with its ts, and the catalog rows."""
        before = remap.source_upper_at(rc, desc.lower)
        bindings = [(b.ts, b.frontier) for b in rc.bindings if desc.lower <= b.ts < desc.upper]
        if not bindings:
            return [], {}
        after = bindings[-1][1]
        with self.ctx.connect() as conn:
            rows = catalog.in_log(conn, self.name, before.get(LOG), after.get(LOG))
            own = {p for p, o in after if p != LOG and o > before.get(p)}
            rows_by_id = {r.id: r for r in rows}
            rows_by_id.update(catalog.by_ids(conn, self.name, own))
        placed = [p for p in (r.placed() for r in rows_by_id.values()) if p is not None]
        return bound_ranges(bindings, before, Layout(placed), forgotten_below), rows_by_id

    def lineage_inputs(self) -> tuple:
        """The bucket's prefix (or the folder) the source takes its objects from."""
        from reclock.datasets import objects

        return (objects(self.spec.upstream.url),)

    def write(self, rc: RemapCollection, desc: BatchDescription, metrics: dict) -> WrittenBatch:
        return self._write(rc, desc, metrics)

    def rewrite(self, rc: RemapCollection, desc: BatchDescription, metrics: dict,
                on_slice: Callable[[int, int], None] | None) -> WrittenBatch:
        """A rebuild's write of a window of whole batches (from 0 where it reaches since): the catalog's objects as the bindings place them, and the objects it
        forgot (all bound at or below since, so at since now) found again by listing. With keys increasing
        those are the objects before the key frontier that the catalog no longer holds; their count, bytes
        and digest of ``(key, ETag, size)`` must be what was forgotten, else the rebuild cannot give the
        same data and raises ``ObjectLost`` (an object deleted or overwritten since, or a key that arrived
        later than the lookback allows). A notification source that forgot objects cannot find them again
        by key order: its rebuild is refused."""
        from reclock.errors import ConfigError, ObjectLost
        from reclock.sources.s3.catalog import digest

        with self.ctx.connect() as conn:
            row = catalog.source_row(conn, self.name)
        if not row.forgotten or desc.lower > 0:  # a window above since (from 0 iff it reaches since) holds none
            return self._write(rc, desc, metrics, on_slice=on_slice)
        s3 = self.spec.upstream
        if s3.discovery != Discovery.LISTING.value or s3.keys != "increasing":
            raise ConfigError(f"source {self.name}: the catalog forgot {row.forgotten} objects bound before since "
                              "(notifications: past the dedupe horizon), which only a listing in key order finds "
                              "again; this source cannot be rebuilt from upstream (drop its collections and remap "
                              "collection to ingest everything anew)")
        with self.ctx.connect() as conn:
            known = {r.key for r in catalog.rows_upto(conn, self.name, row.forgotten_upto)}
        found = []
        for obj in self.store().list():
            if obj.key > row.forgotten_upto:
                break
            if obj.key not in known:
                found.append(obj)
        got = (len(found), sum(o.size for o in found), digest((o.key, o.etag, o.size) for o in found))
        want = (row.forgotten, row.forgotten_bytes, row.forgotten_digest)
        if got != want:
            raise ObjectLost(self.name, self.store().url(row.forgotten_upto), 0, row.forgotten_bytes,
                             f"the {row.forgotten} objects ({row.forgotten_bytes} bytes) ingested before the key "
                             f"frontier are not what the bucket holds there now ({got[0]} objects, {got[1]} bytes, "
                             "another digest: an object deleted or overwritten since, or a key that landed later "
                             "than the lookback); a rebuild could not give the same data")
        ts = rc.bindings[0].ts
        forgotten = [Known(-(k + 1), o.key, o.etag, o.size, o.modified_ms, 0, State.SEALED, o.size, o.version)
                     for k, o in enumerate(found)]
        bound = [BoundRange(r.id, 0, r.size, ts, ends=True) for r in forgotten]
        first = rc.bindings[0].frontier.get(LOG)
        return self._write(rc, desc, metrics, on_slice=on_slice, extra=(bound, forgotten), forgotten_below=first)

    def _write(self, rc: RemapCollection, desc: BatchDescription, m: dict, on_slice=None, extra=((), ()),
               forgotten_below: int = 0) -> WrittenBatch:
        ctx, spec = self.ctx, self.spec
        bound, rows = self.bound(rc, desc, forgotten_below)
        bound = list(extra[0]) + bound
        rows = {**{r.id: r for r in extra[1]}, **rows}
        conf = reader_conf(spec, self.settings)
        units = units_for(bound, rows, conf, split_bytes=min(SPLIT_BYTES, spec.upstream.max_bytes))
        slices = slices_of(units, spec.upstream.max_bytes, spec.upstream.max_objects)
        objects = len({r.id for r in bound})
        if not slices:
            m.update(lower=desc.lower, upper=desc.upper, slices=0, objects=objects, bytes_read=0, records_read=0)
            return WrittenBatch(desc)
        prefix = f"{spec.name}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}"
        spark = ctx.spark()
        if spec.format.type in WHOLE_FORMATS:
            conf = replace(conf, schema_json=whole_schema(spark, spec), avro_schema=spec.format.schema)
        elif spec.format.type == "json":
            conf = replace(conf, json_fields=json_fields(spec))
        with ctx.connect() as conn:
            lease_write(conn, spec.name, prefix)
        try:
            failpoint("write_batches:before_job")
            written: list[SliceWritten] = []
            for i, sl in enumerate(slices):
                written.append(write_slice(spark, spec, conf, sl, spec.include, ctx.blob.url(slice_folder(prefix, i)),
                                           index=i))
                with ctx.connect() as conn:
                    lease_write(conn, spec.name, prefix)
                if on_slice is not None:
                    on_slice(i + 1, len(slices))
                failpoint("write_batches:after_slice")
            shards = {DATA_OUTPUT: spec.data_shard, ERRORS_OUTPUT: spec.errors_shard}
            parts, _ = collect_parts(ctx.blob, spec.name, shards, prefix, written, False)
        except BaseException:
            with contextlib.suppress(Exception), ctx.connect() as conn:
                release_write(conn, prefix)
            raise
        if spec.on_decode_error == "stall" and parts.get(spec.errors_shard):
            first = first_rejected_object(ctx.blob, parts[spec.errors_shard])
            if first is not None:
                key, offset, reason = first
                raise DecodeError(spec.name, 0, offset, f"object {self.store().url(key)}: {reason} "
                                                        "(on_decode_error: stall)")
        m.update(lower=desc.lower, upper=desc.upper, slices=len(slices), objects=objects,
                 bytes_read=sum(u.bytes for u in units), records_read=sum(w.records_read for w in written),
                 records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
                 bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
        return WrittenBatch(desc, parts, (), prefix)

    # -- resume ---------------------------------------------------------------------------------------

    def commit(self, frontier: PartitionedFrontier) -> None:
        """Nothing: S3 keeps no reader's position (objects stay until their owner deletes them)."""

    def compact(self, conn: Any, since: int) -> None:
        """The catalog forgets the objects bound at or below ``since`` (placed below the frontier of the
        remap collection's binding at since: no cycle reads them again, a rebuild gives them ts since) that
        no listing or notification can name again: before the key frontier (listing, keys increasing), or
        older than the dedupe horizon (notifications). With keys in any order every key stays known."""
        s3 = self.spec.upstream
        rc = load_remap(conn, self.name)
        at_since = remap.source_upper_at(rc, since + 1) if rc.bindings else PartitionedFrontier()
        with conn.transaction():
            row = catalog.source_row(conn, self.name, lock=True)
            if s3.discovery == Discovery.NOTIFICATIONS.value:
                horizon_s = s3.dedupe_s if s3.dedupe_s is not None else self.queue().retention_s()
                gone = forgettable(catalog.rows(conn, self.name), at_since, None, Discovery.NOTIFICATIONS, False,
                                   self.ctx.clock() - int(horizon_s * 1000))
            elif s3.keys == "increasing" and row.start_after is not None:
                gone = forgettable(catalog.rows_upto(conn, self.name, row.start_after), at_since, row.start_after,
                                   Discovery.LISTING, True, None)
            else:
                gone = []
            catalog.forget(conn, self.name, gone)

    # -- lag ------------------------------------------------------------------------------------------

    def lag(self) -> tuple[int, int, str]:
        """Objects and bytes upstream not yet in the collection: objects the catalog knows beyond the
        offset resumption frontier (bound or not yet), and objects upstream has that discovery has not
        recorded yet (a listing's new keys after the key frontier; a queue's messages, each at least one
        object)."""
        from reclock.persist.shards import shard_info

        with self.ctx.connect() as conn:
            rc = load_remap(conn, self.name)
            uppers = [shard_info(conn, s).upper for s in self.shards()]
            committed = remap.source_upper_at(rc, min([rc.upper, *uppers]))
            row = catalog.source_row(conn, self.name)
            listing = self.spec.upstream.discovery == Discovery.LISTING.value
            rows = catalog.rows(conn, self.name, row.start_after if listing else None)
        objects = bytes_ = 0
        for r in rows:
            p = r.placed()
            if p is None:
                objects, bytes_ = objects + 1, bytes_ + r.size
            elif p.own:
                behind = r.size - committed.get(r.id)
                if behind > 0:
                    objects, bytes_ = objects + 1, bytes_ + behind
            elif p.span[1] > committed.get(LOG):
                objects, bytes_ = objects + 1, bytes_ + r.bound_size
        detail = ""
        if listing:
            known = {r.key for r in rows}
            for obj in self.store().list(row.start_after):
                if obj.key not in known:
                    objects, bytes_ = objects + 1, bytes_ + obj.size
        else:
            waiting = self.queue().depth()
            objects += waiting
            detail = f"; {waiting} notification(s) in the queue" if waiting else ""
        return objects, bytes_, f"{objects} object(s), {bytes_} byte(s) not yet ingested{detail}"


@dataclass
class _Probing:
    """The little of a cycle context a probe outside a cycle needs."""

    spec: SourceSpec
    dsn: str
    upstream: S3Settings | None = None

    def connect(self):
        from reclock.persist import connect

        return connect(self.dsn)


def probe_lag(spec: SourceSpec, settings: S3Settings | None, dsn: str) -> tuple[int, int, str]:
    """:meth:`S3Source.lag` outside a cycle (``reclock status``, the UI page)."""
    return S3Source(S3, _Probing(spec, dsn, settings)).lag()


def first_rejected_object(blob, error_parts) -> tuple[str, int, str] | None:
    """``(key, offset, reason)`` of the first error row (by key, offset) of a write's error parts."""
    import pyarrow.parquet as pq

    from reclock.part_layout import ERR_PREFIX

    cols = [ERR_PREFIX + c for c in ("key", "offset", "reason")]
    first = None
    for part in error_parts:
        with blob.open(part.path) as f:
            for row in pq.read_table(f, columns=cols).to_pylist():
                item = (bytes(row[cols[0]] or b"").decode("utf-8", "replace"), row[cols[1]] or 0, row[cols[2]])
                if first is None or item[:2] < first[:2]:
                    first = item
    return first


class S3Kind(SourceKind):
    name = "s3"
    title = "S3"
    from_time = "(key, byte_offset)"
    progress_columns = ("ts", "key", "byte_offset")
    schedules = SCHEDULES
    lag_unit = "objects"

    def parse(self, name, raw, base):
        return parse_s3_source(name, raw, base)

    def describe(self, spec) -> str:
        return f"the objects of {spec.upstream.url} into {spec.name}"

    def find_upstream(self, spec, given: Any = None) -> S3Settings | None:
        """The S3 endpoint and keys of the source's ``connection:`` (None for a folder); ``given``: settings a
        caller already has."""
        if spec.upstream.is_folder:
            return None
        if given is not None:
            return given
        from reclock.settings import find_source_s3_settings

        return find_source_s3_settings(spec.upstream.connection, f"source {spec.name}", spec.upstream.connection_named)

    def job_environment(self, spec) -> dict[str, str]:
        """The keys as this process found them: the AWS variables; for a connection the config names (which
        the job, too, must not pass over for them) also that connection, as ``AIRFLOW_CONN_<ID>``."""
        settings = self.find_upstream(spec)
        if settings is None:
            return {}
        from reclock.persist.objectstore import ENV_PATH_STYLE

        env = {"AWS_ACCESS_KEY_ID": settings.access_key, "AWS_SECRET_ACCESS_KEY": settings.secret_key,
               "AWS_REGION": settings.region, ENV_PATH_STYLE: str(settings.path_style).lower()}
        if settings.endpoint_url:
            env["AWS_ENDPOINT_URL"] = settings.endpoint_url
        if settings.ca_bundle:
            env["AWS_CA_BUNDLE"] = settings.ca_bundle
        if spec.upstream.connection_named:
            extra = {"region_name": settings.region, "path_style": settings.path_style,
                     **({"endpoint_url": settings.endpoint_url} if settings.endpoint_url else {}),
                     **({"verify": settings.ca_bundle} if settings.ca_bundle else {})}
            env[f"AIRFLOW_CONN_{spec.upstream.connection.upper()}"] = json.dumps(
                {"conn_type": "aws", "login": settings.access_key, "password": settings.secret_key, "extra": extra})
        return env

    def open(self, ctx: CycleServices) -> S3Source:
        return S3Source(self, ctx)

    def progress_view(self) -> str:
        return PROGRESS_VIEW

    def upstream_trigger(self, spec) -> Any:
        from reclock.sources.s3.trigger import upstream_trigger

        return upstream_trigger(spec)

    def position_text(self, partition: int | None, offset: int) -> str:
        """An error row names its object by key beside this (its partition null): the byte offset; a binding's
        row, its place in the log of sealed objects or in a growing file's own partition."""
        if partition is None:
            return f"byte {offset}"
        return f"log position {offset}" if partition == 0 else f"object {partition} byte {offset}"

    def lag(self, spec, upstream: Any, timeout: float, dsn: str | None = None) -> Lag:
        from reclock.settings import find_dsn

        objects, _, detail = probe_lag(spec, upstream, find_dsn(dsn))
        return Lag(objects, detail, self.lag_unit)


S3 = S3Kind()
