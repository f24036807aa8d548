"""The Kafka kind: a topic read with ``read_committed`` semantics, FromTime ``(partition, offset)``.

==================  ========================================================================================
the interface       here
==================  ========================================================================================
register            the remap collection (progress ``(ts, partition, "offset")``), the collection (output
                    0) and its error collection (output 1)
probe_upper         the partitions' last stable offsets (``reclock.sources.kafka.upstream``); with Debezium's
                    ``transaction_topic``: whole upstream transactions only (``reclock.sources.kafka.transactions``)
descriptions        a backlog cut by ``budget.max_records`` offsets; upsert: one description a cycle (its
                    retractions read the state its predecessor's append produces)
write               one Spark job per budget slice (``reclock.sources.kafka.spark_job``), reclocked by
                    ``reclock.spark.reclocking``, decoded, proved by ``reclock.persist.staged``; upsert: one
                    job with the touched keys' state; ``on_decode_error: stall`` refuses the description;
                    a registry format: each record by its writer schema (``reclock.registry_plan``), the
                    collection's schema versions handed to append with the parts
append_effects      upsert, debezium: the state's changes (``reclock.persist.upsert_state``)
commit              the offsets, to the consumer group ``reclock-<source>`` (lag tools see them)
rewrite             the same jobs from offset 0 of the bindings (rebuild)
joint               a continuous group's append-only slices of the same columns in one job
trigger, lag        ``UpstreamMoved``; the consumer group's lag
==================  ========================================================================================
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import uuid
from typing import Any, Callable, Sequence

import pyarrow as pa

from reclock import remap
from reclock.batch import BatchDescription, SliceWritten, ranges_for, split_ranges
from reclock.datasets import DatasetName, kafka_topic
from reclock.debezium import EventInvalid, parse_key
from reclock.errors import ConfigError, DecodeError, ReclockError, SchemaIncompatible
from reclock.failpoints import failpoint
from reclock.kafka_client import KafkaClientConfig
from reclock.part_layout import DATA_KIND, DATA_OUTPUT, ERRORS_KIND, ERRORS_OUTPUT
from reclock.persist.gc import lease_write, release_quietly
from reclock.persist.remap_store import load_remap, register_source
from reclock.persist.schemas import load_history
from reclock.persist.shards import register_shard, shard_info
from reclock.persist.staged import (collect_parts, earlier_slice, first_rejected, read_state_changes,
                                    record_slice, reusable_age_s, slice_folder, take_earlier)
from reclock.persist.upsert_state import apply_changes, holds_keys, load_prior
from reclock.registry_plan import (AvroPlan, AvroWriter, Choice, Reader, WriterTally, avro_plan, choose_reader,
                                   debezium_plan, initial_reader, schema_text, subject_texts, versions_seen,
                                   writer_columns, writer_texts)
from reclock.remap import RemapCollection
from reclock.schema_evolution import CollectionSchema, Column, SchemaHistory, SchemaVersion, evolve
from reclock.schema_registry import RegistryClient
from reclock.settings import find_kafka, find_registry
from reclock.sources.base import (Acknowledged, CycleServices, JointJobs, JointSlice, Lag, SourceKind, SourceRuntime,
                                  WrittenBatch)
from reclock.sources.kafka import spark_job, transactions
from reclock.sources.kafka.spec import SCHEDULES, parse_kafka_source
from reclock.sources.kafka.topics import by_topic, slot, state_key, topic_partition, topic_specs
from reclock.sources.kafka.upstream import KafkaUpstream
from reclock.spark.reclocking import BindingRange
from reclock.time import PartitionedFrontier

log = logging.getLogger(__name__)


class KafkaSource(SourceRuntime):
    """A Kafka source's half of a cycle context: its upstream (one admin client for the context's probes)."""

    def __init__(self, kind: SourceKind, ctx: CycleServices) -> None:
        super().__init__(kind, ctx)
        self._upstream: KafkaUpstream | None = None
        self._registry: RegistryClient | None = None
        self._pending: tuple[SchemaVersion, ...] = ()  # versions written by this context, maybe not appended
        self._met: set[int] = set()  # writer ids met by this context's jobs
        self._probed: dict = {}
        self._row_columns: dict[str, CollectionSchema] = {}  # debezium Avro, schema: evolve: the rows' per shard
        # the transaction topic is read from the newest binding's offset: the source must be registered first
        self.probe_after_register = bool(ctx.spec.upstream.transaction_topic)

    def upstream(self) -> KafkaUpstream:
        if self._upstream is None:
            kafka = self.ctx.spec.upstream
            self._upstream = KafkaUpstream(self.name, self.ctx.upstream, kafka.topic, topics=kafka.topics,
                                           transaction_topic=kafka.transaction_topic)
        return self._upstream

    def probe_uppers(self) -> Sequence[PartitionedFrontier]:
        """With Debezium's transaction topic: the upper at the last upstream transaction that is all there,
        in the transaction topic's order, from the newest binding (``reclock.sources.kafka.transactions``);
        else the last stable offsets."""
        kafka = self.ctx.spec.upstream
        if not kafka.transaction_topic:
            return (self.probe_upper(),)
        with self.ctx.connect() as conn:  # the bound first: the last stable offsets probed after it are beyond
            bound = remap.last_frontier(load_remap(conn, self.name))
        upper = self.probe_upper()
        tx_slot = slot(len(kafka.tables), 0)
        earliest = self.upstream().earliest().get(tx_slot, 0) if bound.get(tx_slot) else 0
        found = transactions.probe(self.name, self.upstream().config, [t.topic for t in kafka.tables],
                                   kafka.transaction_topic, bound, upper, earliest, decode=self._avro_text())
        self._probed = {"tx_covered": len(found.upper.covered), "tx_waiting": found.waiting,
                        "tx_records_read": found.read}
        return (found.frontier,)

    def _avro_text(self) -> Callable[[bytes], bytes] | None:
        """Debezium's Avro: a value to the JSON text its writer schema (asked of the registry, cached by id)
        decodes it to (``reclock.debezium_avro``); else None (JSON as it is)."""
        if self.ctx.spec.format.type != "avro":
            return None
        from reclock.debezium_avro import AvroJson
        from reclock.errors import SchemaNotFound

        client = self.registry()
        conv = AvroJson(lambda i: schema_text("avro", client.schema(i)), SchemaNotFound)
        return lambda value: conv.text(value, "the value")

    def probe_metrics(self) -> dict:
        return self._probed

    def register(self) -> None:
        spec = self.ctx.spec
        with self.ctx.connect() as conn:
            if spec.upstream.tables:
                check_topic_order(conn, spec)
                check_transaction_topic(conn, spec)
            register_source(conn, spec.name, kind=self.kind.name, progress=self.kind.progress_view(),
                            config={"topics": list(spec.upstream.topics)} if spec.upstream.tables else None)
            for i, sub in enumerate(topic_specs(spec)):
                # a source over several topics: topic i's collection is output 2i, its errors 2i + 1
                register_shard(conn, sub.data_shard, source=spec.name, output=DATA_OUTPUT + 2 * i, kind=DATA_KIND)
                register_shard(conn, sub.errors_shard, source=spec.name, output=ERRORS_OUTPUT + 2 * i,
                               kind=ERRORS_KIND)

    def shards(self) -> tuple[str, ...]:
        return self.ctx.spec.shards

    def probe_upper(self) -> PartitionedFrontier:
        return self.upstream().probe_upper()

    def descriptions(self, rc: RemapCollection, lower: int) -> list[BatchDescription]:
        descs = super().descriptions(rc, lower)
        # upsert: a description's retractions read the state as of its lower, which only its predecessor's
        # append produces, so a cycle writes one description (the backlog takes one cycle per budget)
        return descs[:1] if self.ctx.spec.keyed else descs

    def write(self, rc: RemapCollection, desc: BatchDescription, metrics: dict) -> WrittenBatch:
        ctx, spec = self.ctx, self.ctx.spec
        if spec.keyed:
            with ctx.connect() as conn:  # a source's shards advance together: its first tells
                if shard_info(conn, topic_specs(spec)[0].data_shard).upper >= desc.upper:
                    metrics.update(lower=desc.lower, upper=desc.upper, already_present=True)
                    return WrittenBatch(desc)  # a replay: the state has moved on, and append is a no-op
        written = self._write(rc, desc, metrics)
        for sub in topic_specs(spec):
            if spec.on_decode_error == "stall" and written.parts.get(sub.errors_shard):
                # refuse the whole description (nothing is appended) naming the first record that failed; the
                # source stays stalled until the record or the config changes
                first = first_rejected(ctx.blob, written.parts[sub.errors_shard])
                if first is not None:
                    partition, offset, reason = first
                    where = "" if sub is spec else f" (topic {sub.upstream.topic})"
                    raise DecodeError(spec.name, partition, offset, f"{reason}{where} (on_decode_error: stall)")
        return written

    def lineage_inputs(self) -> tuple[DatasetName, ...]:
        up = self.ctx.upstream  # a KafkaClientConfig (an address alone where a test gives one)
        return tuple(kafka_topic(up if isinstance(up, str) else up.bootstrap, t)
                     for t in self.ctx.spec.upstream.topics)

    def rewrite(self, rc: RemapCollection, desc: BatchDescription, metrics: dict,
                on_slice: Callable[[int, int], None] | None) -> WrittenBatch:
        return self._write(rc, desc, metrics, on_slice, rebuilding=True)

    def _write(self, rc: RemapCollection, desc: BatchDescription, m: dict,
               on_slice: Callable[[int, int], None] | None = None, rebuilding: bool = False) -> WrittenBatch:
        if self.ctx.spec.format.registry is None:
            return self._write_once(rc, desc, m, on_slice, rebuilding)
        if self.ctx.spec.envelope == "debezium":
            return self._write_debezium_avro(rc, desc, m, on_slice, rebuilding)
        return self._write_registry(rc, desc, m, on_slice, rebuilding)

    def registry(self) -> RegistryClient:
        """The context's registry client (its schemas cached by id for the context's life)."""
        if self._registry is None:
            spec = self.ctx.spec
            self._registry = RegistryClient(find_registry(spec.format.registry, f"source {spec.name}"))
        return self._registry

    def history(self) -> SchemaHistory:
        """The collection's recorded schema history, with the versions this context wrote since (appended or
        not yet: a cycle writes its descriptions before it appends them)."""
        with self.ctx.connect() as conn:
            h = load_history(conn, self.ctx.spec.data_shard)
            upper = shard_info(conn, self.ctx.spec.data_shard).upper
        # a version below the shard's upper that is not recorded was never appended (its append failed, or
        # another run appended the range): forgotten; one at or above it waits for its description's append
        self._pending = tuple(v for v in self._pending if v.since_ts >= upper)
        for v in self._pending:
            if not h.versions or v.since_ts > h.versions[-1].since_ts:
                h = h.with_change(v.since_ts, v.schema, v.upstream, v.cause)
        return h

    def _write_registry(self, rc: RemapCollection, desc: BatchDescription, m: dict,
                        on_slice: Callable[[int, int], None] | None, rebuilding: bool) -> WrittenBatch:
        """A registry source's description: the reader chosen (``reclock.registry_plan``), the slices written
        with the plan of every writer the subject holds and every id met before; ids the jobs met that the
        plan did not know are asked of the registry and the description written again (the first folder is
        garbage). ``schema: evolve``: the versions the description begins go to append with its parts, or a
        writer the collection cannot take is :class:`~reclock.errors.SchemaIncompatible` (nothing is
        appended). The first description records the reader as the collection's first version. A rebuild
        decodes with the newest recorded reader and records nothing."""
        ctx, spec = self.ctx, self.ctx.spec
        fmt, subject = spec.format.type, spec.format.registry.subject
        client = self.registry()
        history = self.history()
        # the collection's columns are the value's, then the metadata columns (``include:``): the registry's
        # schemas reason about the value's; the recorded versions hold both
        meta = spark_job.meta_columns(spec)

        def with_meta(cs: CollectionSchema) -> CollectionSchema:
            return CollectionSchema(cs.columns + meta)

        first: list[SchemaVersion] = []
        if history.versions:
            reader = Reader.from_upstream(history.versions[-1].upstream)
            if reader is None:
                raise ReclockError(f"source {spec.name}: collection {spec.data_shard} has a schema history not "
                                   f"recorded by a registry source; its format changed: rebuild into a new source")
            collection = CollectionSchema(tuple(c for c in history.latest().columns if c not in meta))
        else:
            reader = initial_reader(client, fmt, subject, spec.format.schema if fmt == "avro" else None)
            collection = reader.columns()
            which = f"schema id {reader.schema_id}" if reader.schema_id is not None else "schema_file"
            first = [SchemaVersion(desc.lower, with_meta(collection), reader.upstream(), f"the reader: {which}")]
        mode = "fixed" if rebuilding else spec.schema_mode
        choice = None

        def make_plan(ids: set[int]) -> AvroPlan:
            nonlocal choice
            writers = writer_texts(client, subject, fmt)
            for w in avro_plan(client, reader.text, None, ids, fmt).writers:
                writers.setdefault(w.schema_id, w.schema)
            choice = choose_reader(mode, reader, collection, writers)
            return avro_plan(client, choice.reader.text, subject, ids, fmt,
                             choice.columns if fmt == "json_schema" else None)

        written, plan, tally = self._write_planned(rc, desc, m, on_slice, rebuilding, make_plan)
        m.update(writers={str(i): ts for i, ts in sorted(tally.first_ts.items())},
                 reader=choice.reader.schema_id)
        if rebuilding:
            return written
        versions: list[SchemaVersion] = []
        if mode == "evolve":
            versions, refusal = versions_seen(choice, plan, collection, tally.first_ts)
            if refusal is not None:
                release_quietly(self.ctx.connect, *written.leased)
                inc = refusal.incompatibility
                raise SchemaIncompatible(
                    spec.name, spec.data_shard, inc.field, inc.change, inc.old, inc.new,
                    f"register a schema the collection can take (a new optional field, a widened type) and "
                    f"produce with it, or read the topic as a new source, or set `schema: fixed` (records its "
                    f"reader cannot read become errors, per on_decode_error)", refusal.reader, refusal.writer)
        merged = {v.since_ts: v for v in first}
        merged.update({v.since_ts: dataclasses.replace(v, schema=with_meta(v.schema)) for v in versions})
        recorded = tuple(merged[t] for t in sorted(merged))
        self._pending = self._pending + recorded
        return dataclasses.replace(written, schemas={spec.data_shard: recorded}) if recorded else written

    def _write_planned(self, rc: RemapCollection, desc: BatchDescription, m: dict,
                       on_slice: Callable[[int, int], None] | None, rebuilding: bool,
                       make_plan: Callable[[set[int]], AvroPlan]) -> tuple[WrittenBatch, AvroPlan, WriterTally]:
        """The description written with the plan ``make_plan(ids)`` gives (asked of the registry in the driver:
        a registry that does not answer raises ``RegistryUnavailable`` before any job, or between two
        attempts, and nothing is appended), ``ids`` the writer ids met before; ids the jobs met that the plan
        did not know are added and the description written again (the first folder is garbage). The
        written batch, the last plan, and what the jobs met of its writers."""
        ids = set(self._met)
        for _attempt in range(3):
            plan = make_plan(ids)
            tally = WriterTally()
            written = self._write_once(rc, desc, m, on_slice, rebuilding, plan, tally)
            unknown = tally.unknown - set(plan.ids)
            if not unknown:
                break
            # its records of unknown writers are no errors yet: write it again
            release_quietly(self.ctx.connect, *written.leased)
            ids |= unknown
            m.update(replanned_for=sorted(unknown))
        else:
            raise ReclockError(f"source {self.ctx.spec.name}: the registry's answers for writer ids {sorted(unknown)} "
                               "changed while the description was written; the next cycle tries again")
        self._met |= set(tally.first_ts) | (ids - set(plan.missing))
        return written, plan, tally

    def _write_debezium_avro(self, rc: RemapCollection, desc: BatchDescription, m: dict,
                             on_slice: Callable[[int, int], None] | None, rebuilding: bool) -> WrittenBatch:
        """``envelope: debezium`` over Avro: the writer schemas of every topic's key and value subjects and of
        every id met, asked of the registry here, in the driver (``reclock.registry_plan.debezium_plan``),
        and handed to the jobs, whose tasks ask no registry (:meth:`_write_planned`): a registry lost after
        the plan fails no Spark job; one lost when the jobs met a writer the plan did not know is
        ``RegistryUnavailable``, and nothing is appended."""
        spec = self.ctx.spec
        client = self.registry()
        subs = topic_specs(spec)
        subjects = [f"{sub.upstream.topic}-{side}" for sub in subs for side in ("key", "value")]
        if spec.schema_mode != "evolve":
            written, _plan, _tally = self._write_planned(rc, desc, m, on_slice, rebuilding,
                                                          lambda ids: debezium_plan(client, subjects, ids))
            return written
        # schema: evolve: each topic's collection as recorded (or declared, at its first description), evolved
        # before the job by every writer of its value subject (the job's rows have those columns); after it,
        # a version at the first record of each writer that changes it (registry_plan.versions_seen)
        before: dict[str, CollectionSchema] = {}
        first: dict[str, SchemaVersion] = {}
        with self.ctx.connect() as conn:
            for sub in subs:
                h = load_history(conn, sub.data_shard)
                before[sub.data_shard] = h.latest() if h.versions else declared_columns(sub)
                if not h.versions:
                    first[sub.data_shard] = SchemaVersion(desc.lower, before[sub.data_shard],
                                                          Reader("debezium", sub.format.schema).upstream(),
                                                          "the declared schema")
        values: dict[str, dict[int, str]] = {}

        def make_plan(ids: set[int]) -> AvroPlan:
            for sub in subs:
                values[sub.data_shard] = subject_texts(client, f"{sub.upstream.topic}-value")
                cols = before[sub.data_shard]
                for i in sorted(values[sub.data_shard]):
                    ev = evolve(cols, writer_columns("debezium", values[sub.data_shard][i]))
                    cols = cols if ev.incompatible is not None else ev.schema
                self._row_columns[sub.data_shard] = cols
            return debezium_plan(client, subjects, ids)

        written, _plan, tally = self._write_planned(rc, desc, m, on_slice, rebuilding, make_plan)
        if rebuilding:
            return written
        schemas = {}
        for sub in subs:
            shard, own = sub.data_shard, values[sub.data_shard]
            plan = AvroPlan("", tuple(AvroWriter(i, t) for i, t in sorted(own.items())), (), "debezium")
            reader = Reader("debezium", sub.format.schema)
            met = {i: ts for i, ts in tally.first_ts.items() if i in own}
            versions, refusal = versions_seen(Choice(reader, before[shard]), plan, before[shard], met)
            if refusal is not None:
                release_quietly(self.ctx.connect, *written.leased)
                inc = refusal.incompatibility
                raise SchemaIncompatible(
                    spec.name, shard, inc.field, inc.change, inc.old, inc.new,
                    "a column whose type the collection cannot take: read the topic as a new source with the "
                    "column's new type declared, or set `schema: fixed` (the declared columns only)",
                    None, refusal.writer)
            merged = {v.since_ts: v for v in ([first[shard]] if shard in first else []) + versions}
            if merged:
                schemas[shard] = tuple(merged[t] for t in sorted(merged))
        return dataclasses.replace(written, schemas=schemas) if schemas else written

    def _write_once(self, rc: RemapCollection, desc: BatchDescription, m: dict,
                    on_slice: Callable[[int, int], None] | None = None, rebuilding: bool = False,
                    plan: AvroPlan | None = None, writers: WriterTally | None = None) -> WrittenBatch:
        """Read the ranges the bindings in ``desc`` cover, one Spark job per budget slice, and collect the
        parts, each slice proved to hold what its job read (``reclock.persist.staged``: else
        ``UnaccountedWrite``, and nothing is appended); ``on_slice(done, total)`` after each job (the
        progress of a long rebuild).

        Upsert: one job for the whole description (a key's records must meet in one job), with the state
        rows of the keys it touches as of ``desc.lower`` (none when rebuilding from 0, and no pass over the
        records to find those keys while the state holds none: a new source's first description). A source
        over several topics: that per topic (``reclock.sources.kafka.topics``), each topic's parts under a
        folder of its own, all of them one written batch (one append)."""
        ctx, spec = self.ctx, self.ctx.spec
        ranges = ranges_for(rc, desc)
        subs = topic_specs(spec)
        # the transaction topic's range (its last topic) is bound, not written: no rows
        ranges = [r for r in ranges if topic_partition(r.partition)[0] < len(subs)] if spec.upstream.tables \
            else ranges
        if ranges:
            self.upstream().check_retained(
                remap.source_upper_at(rc, desc.lower), remap.source_upper_at(rc, desc.upper))
        bindings = [BindingRange(r.partition, s, e, ts) for r in ranges
                    for (s, e, ts) in remap.reclock_ranges(rc, r.partition)
                    if s < r.end and e > r.start and desc.lower <= ts < desc.upper]
        prefix = f"{spec.name}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}"
        m.update(lower=desc.lower, upper=desc.upper)
        if not ranges:
            m.update(slices=0, offsets=0, records_read=0)
            return WrittenBatch(desc)
        several = bool(spec.upstream.tables)
        with ctx.connect() as conn:
            lease_write(conn, spec.name, prefix)  # garbage collection leaves the folder alone until append
        parts: dict[str, tuple] = {}
        state: list = []
        written: list[SliceWritten] = []
        taken: list[str] = []  # folders of slices an earlier write left, leased as they are taken
        try:
            for sub, (rs, bs) in zip(subs, by_topic(ranges, bindings, len(subs))):
                if not rs:
                    continue
                folder = f"{prefix}/{sub.data_shard}" if several else prefix
                ns = sub.data_shard.encode() if several else None
                w, p, st = self._write_topic(sub, ns, rs, bs, desc, folder, prefix, m, on_slice, rebuilding, plan,
                                             writers, taken)
                written += w
                parts.update(p)
                state += st
        except BaseException:  # what it wrote, and what it took, is garbage
            release_quietly(ctx.connect, *WrittenBatch(desc, prefix=prefix, taken=tuple(taken)).leased)
            raise
        m.update(offsets=sum(r.end - r.start for r in ranges),
                 records_read=sum(w.records_read for w in written),
                 records={s: sum(p.rows for p in ps) for s, ps in parts.items()},
                 bytes={s: sum(p.bytes for p in ps) for s, ps in parts.items()})
        return WrittenBatch(desc, parts, tuple(state), prefix, taken=tuple(taken))

    def _write_topic(self, spec, ns: bytes | None, ranges: list, bindings: list, desc: BatchDescription, folder: str,
                     lease: str, m: dict, on_slice, rebuilding: bool, plan: AvroPlan | None,
                     writers: WriterTally | None,
                     taken: list[str]) -> tuple[list[SliceWritten], dict[str, tuple], list]:
        """One topic's slices of a description (``spec``: the topic's own, :func:`topic_specs`), written under
        ``folder`` and proved; ``ns``: its keys' namespace in the source's upsert state (a source over
        several topics). Its slices, its parts per shard and its state change parts; the folder of each slice it
        takes from an earlier write is leased and added to ``taken``."""
        ctx, source = self.ctx, self.ctx.spec
        upsert = spec.keyed  # upsert or debezium: keyed by the upsert state
        slices = [ranges] if upsert else split_ranges(ranges, spec.budget.max_records)
        spark = ctx.spark()
        prior: list[tuple] = []
        if upsert and not rebuilding:
            with ctx.connect() as conn:
                held = holds_keys(conn, source.name, spec.data_shard, desc.lower)
            keys = spark_job.upsert_keys(spark, spec, ctx.upstream, ranges) if held else []
            if spec.envelope == "debezium":
                keys = sorted(debezium_keys(keys, spec, plan))  # kept without Connect's schema wrapper
            with ctx.connect() as conn:
                prior = load_prior(conn, source.name, spec.data_shard, desc.lower, [state_key(ns, k) for k in keys])
            if ns is not None:
                prior = [(bytes(k)[len(ns) + 1:], *rest) for k, *rest in prior]
            m.update(prior_keys=m.get("prior_keys", 0) + len(prior))
            if held:  # keys: when they were read
                m.update(keys=m.get("keys", 0) + len(keys))
        if plan is not None and plan.format == "debezium" and spec.data_shard in self._row_columns:
            plan = dataclasses.replace(plan, columns=self._row_columns[spec.data_shard])
        failpoint("write_batches:before_job")
        written: list[SliceWritten] = []
        joinable = ctx.joint_writer is not None and len(slices) == 1 and not upsert and not rebuilding \
            and plan is None
        joint = ctx.joint_writer(ctx, slices[0], bindings, slice_folder(folder, 0)) if joinable else None
        if joint is not None:
            written.append(joint[0])
            m.update(joint_sources=joint[1])
            failpoint("write_batches:after_slice")
        # an append-only slice's rows depend on its offsets, bindings and decode only: a slice an earlier write
        # recorded for the same (a retry after a fault ended a step) is taken once proved (reclock.persist.staged)
        resumable = joint is None and not upsert and not rebuilding and plan is None and writers is None
        proved: list[dict] = []  # per slice taken, its parts per output
        reused: list[SliceWritten] = []  # what those slices' jobs reported
        first = 1 if joinable else 0  # a joint job that failed may have left files in slice 0's folder
        for i, sl in enumerate(slices if joint is None else (), start=first):
            key = slice_fingerprint(spec, sl, bindings) if resumable else ""
            earlier = earlier_slice(ctx.blob, source.name, key) if resumable else None
            got = None if earlier is None else take_earlier(ctx.connect, ctx.blob, source.name, earlier, lease,
                                                            reusable_age_s(ctx.gc_grace_s))
            if got is not None:
                taken.append(earlier.files)
                proved.append(got)
                reused.append(earlier.written)
                m.update(slices_reused=m.get("slices_reused", 0) + 1)
            else:
                local = spec.envelope == "debezium" and folds_in_place(spec, sl, prior)
                done = spark_job.write_slice(spark, spec, ctx.upstream, sl, bindings,
                                             ctx.blob.url(slice_folder(folder, i)), prior, index=i,
                                             plan=plan, writers=writers, local=local)
                if local and not self._folded_once(done, folder, spec.upstream.topic):
                    again = len(slices) + i  # a folder of its own; what the first job wrote is garbage
                    done = spark_job.write_slice(spark, spec, ctx.upstream, sl, bindings,
                                                 ctx.blob.url(slice_folder(folder, again)), prior, index=again,
                                                 plan=plan, writers=writers)
                    m.update(folded_again=m.get("folded_again", 0) + 1)
                written.append(done)
                if resumable:
                    record_slice(ctx.blob, source.name, folder, done, key)
            with ctx.connect() as conn:
                lease_write(conn, source.name, lease)  # renewed: a long rebuild keeps its first slices
            if on_slice is not None:
                on_slice(i + 1 - first, len(slices))
            failpoint("write_batches:after_slice")
        if proved:
            log.warning("source %s: [%s, %s): %d of %d slices taken from an earlier write of the description",
                        source.name, desc.lower, desc.upper, len(proved), len(slices))
        shards = {DATA_OUTPUT: spec.data_shard, ERRORS_OUTPUT: spec.errors_shard}
        parts, state = collect_parts(ctx.blob, source.name, shards, folder, written, upsert, proved=proved)
        m.update(slices=m.get("slices", 0) + len(slices))
        return written + reused, parts, list(state)

    def _folded_once(self, done: SliceWritten, folder: str, topic: str) -> bool:
        """Whether a debezium slice folded where Spark read it folded every key in one place (each key's state
        row is there once); if not, says why the slice is folded again with a shuffle."""
        from reclock.spark.debezium_decode import keys_distinct

        ctx = self.ctx
        _, state = collect_parts(ctx.blob, ctx.spec.name, {DATA_OUTPUT: "", ERRORS_OUTPUT: ""}, folder, [done], True)
        if keys_distinct(read_state_changes(ctx.blob, state)):
            return True
        log.warning("source %s: a key's events are in more than one partition of topic %s (or in several forms of "
                    "the key): the slice is folded again with a shuffle; Debezium orders a key's events only "
                    "within one partition", ctx.spec.name, topic)
        return False

    def append_effects(self, written: WrittenBatch, metrics: dict) -> Callable[[Any], None] | None:
        if not self.ctx.spec.keyed:
            return None
        spec = self.ctx.spec
        if spec.upstream.tables:  # each topic's keys under its collection's name (its parts in its folder)
            changes = pa.concat_tables([namespaced(read_state_changes(self.ctx.blob, [
                p for p in written.state if p.path.startswith(f"{written.prefix}/{sub.data_shard}/")]),
                sub.data_shard.encode()) for sub in topic_specs(spec)])
            if changes.num_rows != sum(p.rows for p in written.state):
                raise ReclockError(f"source {spec.name}: state change parts outside every topic's folder under "
                                   f"{written.prefix}; nothing is appended")
        else:
            changes = read_state_changes(self.ctx.blob, written.state)
        metrics.update(state_changes=changes.num_rows)
        return lambda conn: apply_changes(conn, self.name, changes)

    def commit(self, frontier: PartitionedFrontier) -> None:
        self.upstream().commit(self.ctx.spec.consumer_group, frontier)

    def acknowledged(self) -> Acknowledged:
        group = self.ctx.spec.consumer_group
        return Acknowledged(self.upstream().acknowledged(group), f"consumer group {group} has committed offsets")


class KafkaJointJobs(JointJobs):
    """Append-only slices of Kafka sources of the same format and metadata columns, in one Spark job
    (``reclock.sources.kafka.spark_job.write_joint``)."""

    def key(self, spec) -> tuple | None:
        return spark_job.joint_key(spec)

    def write(self, spark: Any, slices: Sequence[JointSlice], url: str) -> list[SliceWritten]:
        return spark_job.write_joint(spark, slices, url)


class KafkaKind(SourceKind):
    name = "kafka"
    title = "Kafka"
    from_time = "(partition, offset)"
    progress_columns = ("ts", "partition", "offset")
    schedules = SCHEDULES
    joint = KafkaJointJobs()

    def parse(self, name, raw, base):
        return parse_kafka_source(name, raw, base)

    def describe(self, spec) -> str:
        if spec.upstream.tables:
            return f"Kafka topics {', '.join(spec.upstream.topics)} into {spec.name}"
        return f"Kafka topic {spec.upstream.topic} into {spec.name}"

    def rebuild_whole(self, spec) -> bool:
        return spec.keyed  # later updates retract the values a window holds

    def find_upstream(self, spec, given: str | None = None) -> KafkaClientConfig:
        """The source's cluster: its connection's brokers and security settings (``reclock.kafka_client``),
        or an unsecured cluster's address given."""
        return find_kafka(spec.upstream, f"source {spec.name}", given)

    def job_environment(self, spec) -> dict[str, str]:
        """An unsecured cluster as ``RECLOCK_BOOTSTRAP``; a secured one as the source's connection
        (``AIRFLOW_CONN_<ID>``, its certificates as text): in the job's environment, never its argv."""
        kafka = self.find_upstream(spec)
        if kafka.protocol == "PLAINTEXT":
            return {"RECLOCK_BOOTSTRAP": kafka.bootstrap}
        return {f"AIRFLOW_CONN_{spec.upstream.connection.upper()}": kafka.connection_json()}

    def open(self, ctx: CycleServices) -> KafkaSource:
        return KafkaSource(self, ctx)

    def upstream_trigger(self, spec) -> Any:
        from reclock.sources.kafka.trigger import UpstreamMoved

        kafka = spec.upstream
        which = {"topics": kafka.topics} if kafka.tables else {"topic": kafka.topic}
        return UpstreamMoved(source=spec.name, **which, connection=kafka.connection, bootstrap=kafka.bootstrap,
                             poll=spec.poll_s)

    def lag(self, spec, upstream: Any, timeout: float, dsn: str | None = None) -> Lag:
        up = KafkaUpstream(spec.name, upstream, spec.upstream.topic, timeout=timeout, topics=spec.upstream.topics)
        end = up.probe_upper()
        committed = up.committed(spec.consumer_group)
        return Lag(sum(max(0, o - committed.get(p)) for p, o in end), f"group {spec.consumer_group}")


KAFKA = KafkaKind()


def slice_fingerprint(spec, ranges: Sequence, bindings: Sequence[BindingRange]) -> str:
    """What an append-only slice's rows depend on, as one digest: the release, the (topic's) spec as
    configured, the slice's offset ranges and the bindings that stamp them. Two writes with the same
    fingerprint write the same rows (*replayable*), so a slice one of them recorded may stand for the other's
    (``reclock.persist.staged``), whatever descriptions they belong to."""
    from reclock import __version__

    stamps = sorted([b.partition, b.start, b.end, b.ts] for b in bindings
                    if any(b.partition == r.partition and b.start < r.end and b.end > r.start for r in ranges))
    what = [__version__, canonical(spec), [[r.partition, r.start, r.end] for r in ranges], stamps]
    return hashlib.sha256(json.dumps(what, separators=(",", ":")).encode()).hexdigest()


def canonical(value: Any) -> Any:
    """``value`` (a spec: dataclasses, mappings, sequences, sets, enums, scalars) as JSON data that is the same
    in every process (sets sorted, not in their hash order)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: canonical(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return sorted([str(k), canonical(v)] for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((canonical(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, enum.Enum):
        return canonical(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.hex()
    return repr(value)


def namespaced(changes, ns: bytes):
    """A topic's upsert state changes with each key under the topic's namespace (``topics.state_key``)."""
    keys = pa.array([state_key(ns, bytes(k)) for k in changes["key"].to_pylist()], pa.binary())
    return changes.set_column(changes.schema.get_field_index("key"), "key", keys)


def check_transaction_topic(conn, spec) -> None:
    """A source that binds whole upstream transactions (``transaction_topic``) must have done so from its
    first binding: read from offset 0, the transaction topic's ENDs of transactions bound before would wait
    for events already bound. Named on a source with bindings and no transaction topic registered:
    ``ConfigError``."""
    tx = spec.upstream.transaction_topic
    row = conn.execute("SELECT config FROM reclock.sources WHERE name = %s", (spec.name,)).fetchone()
    had = list((row[0] or {}).get("topics", ())) if row else []
    if tx is None or tx in had or not conn.execute(
            "SELECT 1 FROM reclock.remap_bindings WHERE source = %s LIMIT 1", (spec.name,)).fetchone():
        return
    raise ConfigError(f"source {spec.name}: `transaction_topic: {tx}` is new, and the source has bound its topics "
                      f"{had} without it (its bindings do not end at transaction boundaries, and the transaction "
                      "topic's offset is in none of them): read the topics with the transaction topic as a new "
                      "source")


def check_topic_order(conn, spec) -> None:
    """A source over several topics keeps its topics' order (topic i's partitions are the frontier's
    ``reclock.sources.kafka.topics.slot(i, p)``): the topics it was registered with must begin the config's
    list (a topic may be added at the end), else ``ConfigError`` naming both lists."""
    row = conn.execute("SELECT config FROM reclock.sources WHERE name = %s", (spec.name,)).fetchone()
    had = list((row[0] or {}).get("topics", ())) if row else []
    if row is not None and not had and conn.execute(
            "SELECT 1 FROM reclock.remap_bindings WHERE source = %s LIMIT 1", (spec.name,)).fetchone():
        raise ConfigError(f"source {spec.name}: it was registered over one topic (its collection {spec.data_shard}); "
                          "a source over several topics has a collection per topic: read them as a new source")
    now = list(spec.upstream.topics)
    if now[:len(had)] != had:
        raise ConfigError(f"source {spec.name}: it reads topics {had} in this order (each topic's place numbers "
                          f"its partitions in the source's frontier); the config names {now}: a topic may be "
                          "added at the end only. Removing or reordering topics: read them as a new source")


LOCAL_FOLD_PRIOR_ROWS = 200_000
"""The most upsert state rows a debezium slice folded where Spark reads it takes along (they travel with the
job, to every task); a slice whose keys hold more is folded with a shuffle."""


def folds_in_place(spec, ranges: Sequence, prior: Sequence) -> bool:
    """Whether a debezium slice is folded where Spark reads it (``reclock.spark.debezium_decode.fold_local``: no
    shuffle, no second Python pass over the keys): its records span two partitions or more (a partition is
    one Spark task: one alone would be folded on one core, where a shuffle spreads it), Spark reads a
    partition as one task (no ``minPartitions`` or ``maxRecordsPerPartition``), and the prior state is at
    most :data:`LOCAL_FOLD_PRIOR_ROWS` rows. Whatever it says, the result is the same: a key folded in two
    places is caught and the slice folded again (``KafkaSource._folded_once``)."""
    split = {k for k, _ in spec.upstream.options} & {"minPartitions", "maxRecordsPerPartition"}
    return len({r.partition for r in ranges if r.end > r.start}) > 1 and not split \
        and len(prior) <= LOCAL_FOLD_PRIOR_ROWS


def debezium_keys(keys: list[bytes], spec, plan: AvroPlan | None = None) -> set[bytes]:
    """The upsert state's keys of a debezium slice's record ``keys``: their JSON without Connect's schema
    wrapper; Avro keys (``format: avro``) decoded by the writer schemas of ``plan`` first (a key that does
    not decode has no state: its record is a decode error; one of a writer the plan does not know makes the
    job's plan be made again)."""
    if spec.format.type != "avro":
        return {parse_key(k) for k in keys}
    from reclock.spark.debezium_decode import plan_converter

    conv = plan_converter(plan)
    out = set()
    for k in keys:
        try:
            out.add(parse_key(conv.text(k, "the key")))
        except EventInvalid:
            pass
    return out


def declared_columns(spec) -> CollectionSchema:
    """A debezium topic's declared row (``format.schema``, Spark DDL) as the collection's columns (Spark's
    parse: its type strings)."""
    from reclock.spark.decode import data_schema

    return CollectionSchema(tuple(Column(f.name, f.dataType.simpleString(), True) for f in data_schema(spec).fields))
