"""The source interface: what one kind of upstream brings, and what the shared cycle does with it.

Reclock's cycle is one for every kind (``reclock.cycle``: mint, write_batches, append, resume), as
Materialize's ingestion dataflow, reclocking and ``persist_sink`` are one for every source that implements
``SourceRender``. A kind lives in ``reclock/sources/<kind>/`` and is one line of ``reclock.sources.registry``::

    reclock.cycle (shared)                         the kind (sources/<kind>/)
    ----------------------                         --------------------------
    mint           ensure registered  ---------->  SourceRuntime.register: remap collection (its progress
                                                   view), output shards, upstream state (a slot, a key table)
                   probe the upper    ---------->  SourceRuntime.probe_uppers -> PartitionedFrontier(s)
                   bind (remap.mint, CAS)          (its FromTime mapped onto (partition, offset) integers;
                                                   several: one binding each, in order)
                   descriptions       ---------->  SourceRuntime.descriptions (how a backlog is cut)
    write_batches  load the bindings  ---------->  SourceRuntime.write: read exactly the bound range (a Spark
                                                   job, or a reader in the task), reclock, decode, route,
                                                   parts proved by accounted writes -> WrittenBatch
    append         compare_and_append every shard  SourceRuntime.append_effects: what moves with the shards
                   in ONE transaction <----------  in that transaction (Kafka's upsert state), or nothing
    resume         resumption frontier,
                   mapped back to FromTime ----->  SourceRuntime.commit: tell upstream (a consumer group, a
                   compaction, garbage             replication slot), or nothing where upstream has no such
                                                   notion; SourceRuntime.compact: what the kind drops once
                                                   the remap collection is compacted (finished partitions)
    rebuild        replay from 0      ---------->  SourceRuntime.rewrite (SourceKind.rebuild_refused: None)
    resnapshot     ---------------------------->  SourceRuntime.resnapshot (SourceKind.resnapshot_refused)

and around the cycle, :class:`SourceKind` gives config its section parser, orchestration its
``schedule: upstream`` trigger, ``reclock status`` and the UI page the source's lag, a ``spark-submit``
job its settings, and a continuous group its joint Spark jobs (:class:`JointJobs`).

**FromTime in the remap collection.** Every kind's gauge of progress is kept as a
:class:`~reclock.time.PartitionedFrontier`: ``partition`` (an int >= 0) -> the *next* ``offset`` (an exact
int >= 0; an absent partition is at 0). Partitions are independent: a record's timestamp depends only on
the bindings' offsets of its own partition (*local*), and within a partition the offsets carry the order
the mapping must keep. The remap store (``reclock.remap_offsets``) keeps partitions as ``integer`` and
offsets as an integral ``numeric`` (integers of any size: Kinesis's 56-digit sequence numbers too); the
pure core (``reclock.remap``, ``reclock.batch``) works on Python ints. A kind maps its own FromTime onto that shape
and back, as Materialize's ``SourceTimestamp`` encodes each kind's FromTime into the remap shard's rows:

==========  ===========================  ===================================================================
kind        FromTime                     as (partition, offset)
==========  ===========================  ===================================================================
Kafka       (partition, offset)          itself
Postgres    commit LSN                   one partition (0), the LSN as the offset
S3          (key, byte_offset)           sealed objects as one log on partition 0 (each object's start kept
                                         in the kind's catalog table); a file still growing a partition of
                                         its own, its complete lines' byte offset as the offset
Kinesis     (shard_id, sequence_number)  a partition per shard (the shard id's number); sequence numbers as
                                         offsets (exact ints); a child shard bound only in a binding after
                                         the one that binds its parents to their ends (``probe_uppers``)
==========  ===========================  ===================================================================

``mint_descriptions`` cuts a backlog by counting offsets, which is records only where offsets are dense
(Kafka); a kind whose offsets are not (LSNs, byte offsets, sequence numbers) overrides
:meth:`SourceRuntime.descriptions`. Spark jobs that read ``(partition, offset)`` records reclock them with
``reclock.spark.reclocking``; a reader in the task uses ``reclock.remap.reclock`` or its own mapping.

**A new kind** is a folder ``reclock/sources/<kind>/`` and one line of ``reclock.sources.registry``; by the
kinds' example: ``spec.py`` parses its config section into its ``reclock.specs.UpstreamSpec`` (the
helpers of ``reclock.specs``), ``upstream.py`` (S3: ``client.py``) is its upstream's client, ``kind.py`` holds its
:class:`SourceKind` and :class:`SourceRuntime` (a module constant the registry imports), ``trigger.py`` its
``schedule: upstream`` trigger (on ``reclock.sources.trigger``), and whatever its reading needs (Kafka's Spark
job, Postgres's decoder and snapshot, S3's discovery, catalog and reader). Its own consensus tables come as migrations of ``reclock.persist``;
its own progress relation is :meth:`SourceKind.progress_view`.

**Layering.** A kind imports the pure core, ``persist``, ``spark``, ``reclock.settings``, ``reclock.specs``
and this module; never another kind, the registry, ``reclock.cycle``, ``reclock.orchestration`` or
the dev stack (``tests/unit/test_imports.py``). What the cycle hands a kind is a :class:`CycleServices`
(``reclock.cycle.CycleContext`` is one).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Literal, Protocol, Sequence

from reclock.batch import BatchDescription, OffsetRange, Part, SliceWritten, mint_descriptions
from reclock.datasets import DatasetName
from reclock.errors import AcknowledgedStateLost, ConfigError, ReclockError
from reclock.persist.gc import lease_key
from reclock.persist.remap_store import OFFSETS_PROGRESS
from reclock.remap import RemapCollection
from reclock.schema_evolution import SchemaVersion
from reclock.specs import SourceSpec
from reclock.time import PartitionedFrontier

if TYPE_CHECKING:
    from reclock.persist.blob import BlobStore

Schedule = Literal["interval", "upstream", "continuous"]
"""When ``ingest__<source>`` runs: every ``interval:``; when upstream has something (the kind's trigger);
or cycles back to back for a lease (``reclock.continuous``)."""


@dataclass(frozen=True)
class WrittenBatch:
    """The parts one description produced, per shard: what :meth:`SourceRuntime.write` proved it wrote
    (every part found, opened and counted against what was read), and what append makes visible."""

    desc: BatchDescription
    parts: dict[str, tuple[Part, ...]] = field(default_factory=dict)
    state: tuple[Part, ...] = ()  # upsert: the state changes append applies with the shards
    prefix: str | None = None  # the folder the parts were written under, leased until append is done
    schemas: dict[str, tuple[SchemaVersion, ...]] = field(default_factory=dict)  # versions of a shard's schema
    #                                                that begin in desc, recorded with its parts by append
    taken: tuple[str, ...] = ()  # folders of slices an earlier write left that the parts include (a retry
    #                              took them: ``reclock.persist.staged``), each leased until append is done

    @property
    def leased(self) -> tuple[str, ...]:
        """The keys of the leases held for the parts until append is done (or they became garbage):
        ``prefix``'s, and this write's on each folder of ``taken`` (``reclock.persist.gc.lease_key``)."""
        if self.prefix is None:
            return ()
        return (self.prefix, *(lease_key(t, self.prefix) for t in self.taken))


@dataclass(frozen=True)
class Lag:
    """How far a source's upstream is ahead of what it committed, in the kind's own unit (Kafka: records;
    Postgres: bytes of WAL), ``value`` None when unknown (``detail`` says why); ``detail`` also carries the
    kind's own words (the consumer group; the LSN distance and the WAL the slot retains): what ``reclock
    status``, the UI page and the metrics show."""

    value: int | None
    detail: str = ""
    unit: str = "records"

    def text(self) -> str:
        """``1,234 records`` / ``1 object`` / ``16.0 MiB`` / ``unknown``."""
        if self.value is None:
            return "unknown"
        if self.unit == "bytes":
            return human_bytes(self.value)
        unit = self.unit[:-1] if self.value == 1 and self.unit.endswith("s") else self.unit
        return f"{self.value:,} {unit}"


def human_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ``16.0 MiB``, ``2.3 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class CycleServices(Protocol):
    """What the cycle hands a kind (``reclock.cycle.CycleContext`` is one): the source's spec, where its
    upstream is, consensus connections, the blob store, Spark, the clock."""

    spec: SourceSpec
    blob: BlobStore
    upstream: Any  # where the upstream is, as the kind's :meth:`SourceKind.find_upstream` resolved it
    clock: Callable[[], int]
    spark_factory: Callable[[], object] | None
    joint_writer: Callable[..., tuple[SliceWritten, int] | None] | None
    gc_grace_s: float  # how long garbage collection keeps a blob no batch references

    def connect(self) -> ContextManager[Any]:
        """A consensus connection (autocommit; the one the running step holds, else a new one)."""

    def spark(self) -> Any:
        """The context's Spark session (made once)."""


@dataclass(frozen=True)
class JointSlice:
    """One source's append-only slice in a joint job: what its own job would read and reclock."""

    spec: SourceSpec
    upstream: Any
    ranges: Sequence[OffsetRange]
    bindings: Sequence[Any]  # reclock.spark.reclocking.BindingRange


class JointJobs(ABC):
    """A kind whose sources of a continuous group may share Spark jobs (``reclock.continuous.JointWriter``):
    one job writes the append-only slices of several sources, slice ``i``'s files partitioned under
    ``<url>/_reclock_member=<i>/`` (``reclock.part_layout.MEMBER_COLUMN``)."""

    @abstractmethod
    def key(self, spec: SourceSpec) -> tuple | None:
        """Sources with the same key can share a job (their parts have the same columns of the same types);
        None: the source's slices need a job of their own."""

    @abstractmethod
    def write(self, spark: Any, slices: Sequence[JointSlice], url: str) -> list[SliceWritten]:
        """Run one job writing ``slices`` under ``url``; what it read and wrote, per slice (each accounted
        for on its own, as a job of its own would be)."""


@dataclass(frozen=True)
class Acknowledged:
    """What resume has told upstream it may drop (:meth:`SourceRuntime.acknowledged`), and where it is, for a
    message: ``where`` names the place (``consumer group reclock-orders has committed offsets``)."""

    frontier: PartitionedFrontier
    where: str


class SourceRuntime(ABC):
    """A kind's half of one cycle context: its upstream client and what it keeps for the context's steps.
    Made once per context by :meth:`SourceKind.open`; the cycle calls it inside its steps (each step holds
    a consensus connection and what :meth:`holding` holds)."""

    probe_after_register: ClassVar[bool] = False
    """Whether :meth:`probe_upper` needs :meth:`register` done first (Postgres: the slot must exist before
    the flush LSN it covers is probed); else mint probes while it registers."""

    def __init__(self, kind: SourceKind, ctx: CycleServices) -> None:
        self.kind = kind
        self.ctx = ctx

    @property
    def name(self) -> str:
        return self.ctx.spec.name

    def holding(self) -> ContextManager[None]:
        """Hold what every call of a step shares (Postgres: one upstream session) until the block ends."""
        return contextlib.nullcontext()

    @abstractmethod
    def register(self) -> None:
        """Create the source's remap collection with its progress view (``register_source`` with
        :meth:`SourceKind.progress_view`), its output shards (output 0 the main collection, 1 the errors)
        and any upstream state it needs, if they do not exist; check what must still hold upstream.
        Idempotent; every mint runs it."""

    @abstractmethod
    def shards(self) -> tuple[str, ...]:
        """Every output shard of the source, in output order, the error collection included: what append
        puts in its one ``compare_and_append`` and resume compacts."""

    @abstractmethod
    def probe_upper(self) -> PartitionedFrontier:
        """Upstream's upper now, as the kind's FromTime mapped onto ``(partition, offset)`` (the module doc):
        what a binding minted now will say is in. Only what is readable and will stay as it is (Kafka: the
        last stable offsets; Postgres: the flush LSN)."""

    def probe_uppers(self) -> Sequence[PartitionedFrontier]:
        """Upstream's uppers now, in the order mint binds them, one binding each (at consecutive times,
        each a compare-and-set; one that does not move upstream past the last is skipped): a kind that
        must bind a position before another (Kinesis: a parent shard's end before its children's start)
        or cuts a backlog it learns only by reading into budget-sized bindings gives several. By default
        ``(probe_upper(),)``."""
        return (self.probe_upper(),)

    def probe_metrics(self) -> dict:
        """What the last :meth:`probe_uppers` learned, for mint's statistics row (merged last, so a kind may
        set ``offsets_known`` to None where summing its offsets means nothing, and give ``lag_records`` and
        ``lag_ms``: how far upstream was ahead of the newest binding, which the UI's lag plot shows). By
        default nothing."""
        return {}

    def descriptions(self, rc: RemapCollection, lower: int) -> list[BatchDescription]:
        """The batch descriptions from ``lower`` (the least shard upper) up to the newest binding, a backlog
        cut so that one write stays within the source's budget. By default ``mint_descriptions`` with
        ``budget.max_records`` (offsets counted as records)."""
        return mint_descriptions(lower, rc, self.ctx.spec.budget.max_records)

    @abstractmethod
    def write(self, rc: RemapCollection, desc: BatchDescription, metrics: dict) -> WrittenBatch:
        """Write the updates of ``desc`` for every output shard as parts (nothing visible yet): read exactly
        the upstream range the bindings in ``[desc.lower, desc.upper)`` cover, give each record the
        timestamp of its binding, decode, route. Return only parts proved by an accounted write (what was
        read equals the rows of the parts found: else ``UnaccountedWrite``, and nothing is appended); raise
        ``UpstreamDataLost`` (or a subclass) if upstream no longer holds the range. Replayable: a rerun
        writes the same updates (to fresh paths). ``metrics`` is the step's statistics row."""

    def rewrite(self, rc: RemapCollection, desc: BatchDescription, metrics: dict,
                on_slice: Callable[[int, int], None] | None) -> WrittenBatch:
        """A rebuild's write of ``desc`` (a window of whole batches, from 0 where
        :meth:`SourceKind.rebuild_whole`): the updates of the bindings in it, at their timestamps, decoded as
        the config says today, from upstream's retained history; ``on_slice(done, total)`` shows progress.
        Only for a kind whose :meth:`SourceKind.rebuild_refused` is None."""
        raise ConfigError(self.kind.rebuild_refused(self.ctx.spec) or f"source {self.name}: no rebuild")

    def lineage_inputs(self) -> tuple[DatasetName, ...]:
        """The upstream datasets a write reads, as OpenLineage names them (``reclock.datasets``): what an
        Airflow task reports as its inputs. By default none."""
        return ()

    def append_effects(self, written: WrittenBatch, metrics: dict) -> Callable[[Any], None] | None:
        """What must change in consensus in append's one transaction with the shards (Kafka upsert: the
        state's changes), prepared outside it: a function of the transaction's connection, or None."""
        return None

    @abstractmethod
    def commit(self, frontier: PartitionedFrontier) -> None:
        """Tell upstream it may drop everything below ``frontier`` (the offset resumption frontier): commit
        it to a consumer group, advance a replication slot; or nothing, where upstream has no such notion.
        Never backwards; on idle cycles too."""

    def acknowledged(self) -> Acknowledged | None:
        """What :meth:`commit` has told upstream so far (read upstream, not from consensus): mint checks it
        is not beyond what consensus holds (``cycle.check_acknowledged``: a database that went back). None
        where upstream keeps nothing of ours."""
        return None

    def acknowledged_since(self, conn: Any) -> int | None:
        """The timestamp of the binding the acknowledgement started at, if not the first (read in ``conn``, the
        mint's consensus connection): positions up to that binding's frontier are ours whatever the shards'
        uppers hold. Postgres: a re-snapshot's slot, created anew at or below its binding. By default None."""
        return None

    def acknowledged_beyond(self, acked: Acknowledged, ours: PartitionedFrontier, upper: int) -> ReclockError:
        """The error mint raises when ``acked`` is beyond ``ours``, what consensus holds (the bindings at the
        shards' upper ``upper``): by default ``AcknowledgedStateLost`` (the database went back). A kind whose
        upstream position can also be moved by hand (a Postgres slot advanced or consumed) says so."""
        return AcknowledgedStateLost(f"source {self.name}", f"{acked.where} {acked.frontier.as_dict()}",
                                     f"{ours.as_dict()} (the bindings at its shards' upper {upper})")

    def compact(self, conn: Any, since: int) -> None:
        """In resume, in the connection ``conn``, after the remap collection was compacted to ``since``:
        drop what the kind no longer needs for reads at or after ``since`` (partitions finished at their
        end, e.g. a Kinesis shard read to its end whose children are bound, a file sealed whole), so state
        stays bounded. By default nothing."""

    def resnapshot(self, metrics: dict) -> dict:
        """Start the source over from a fresh snapshot at a new binding (never a time in the past). Only for
        a kind whose :meth:`SourceKind.resnapshot_refused` is None."""
        raise ConfigError(self.kind.resnapshot_refused(self.ctx.spec) or f"source {self.name}: no re-snapshot")

    def resnapshot_table(self, table: str, metrics: dict) -> dict:
        """Take one table of the source from a fresh snapshot of its own while the others go on (a kind whose
        sources have tables: Postgres)."""
        raise ConfigError(f"source {self.name}: a {self.kind.title} source has no tables to re-snapshot one by one")


class SourceKind(ABC):
    """A kind of upstream: stateless, one instance in ``reclock.sources.registry``. Everything of the kind
    that is not one cycle context's lives here: its config section, its progress relation, how its
    settings are found, its trigger, its lag probe, what it supports."""

    name: ClassVar[str]
    """The kind's name: its config section's key (``kafka:``), the kind registered in ``reclock.sources``,
    its folder under ``reclock/sources/``."""
    title: ClassVar[str]
    """The kind in words, for DAG descriptions and messages (``Kafka``)."""
    from_time: ClassVar[str]
    """Its FromTime in words (``(partition, offset)``, ``commit LSN``): docs, ``reclock status``."""
    progress_columns: ClassVar[tuple[str, ...]]
    """The columns of its ``<source>_progress`` relation (:meth:`progress_view`)."""
    schedules: ClassVar[tuple[Schedule, ...]] = ("interval", "upstream")
    """The schedules its sources may have: its spec module's ``SCHEDULES``, which parsing its config checks."""
    joint: ClassVar[JointJobs | None] = None
    """Its joint Spark jobs for continuous groups (None: each source's slices run in jobs of their own)."""
    writes_on_spark: ClassVar[bool] = True
    """Whether every write needs Spark (a command finds Spark before any step runs); else Spark is found
    when a write first asks for it (Postgres: a large table's snapshot)."""

    # -- config -------------------------------------------------------------------------------------

    @abstractmethod
    def parse(self, name: str, raw: dict, base: Path | None) -> SourceSpec:
        """The source ``name``'s whole mapping (``raw`` holds the kind's section, ``raw[self.name]``),
        validated: its section (into the kind's ``reclock.specs.UpstreamSpec``, ``SourceSpec.upstream``,
        which also tells the collections the config names) and the top-level keys the kind allows
        (schedule, budget, format, ...; the helpers of ``reclock.specs``); an unknown or misplaced key is a
        ``ConfigError`` naming it. ``base``: the folder relative files in the config are found in."""

    def describe(self, spec: SourceSpec) -> str:
        """The source in words for its DAG's description: ``Kafka topic orders into orders``."""
        return f"{self.title} source {spec.name}"

    # -- settings -----------------------------------------------------------------------------------

    @abstractmethod
    def find_upstream(self, spec: SourceSpec, given: str | None = None) -> Any:
        """Where the source's upstream is (``CycleContext.upstream``): ``given`` (a command's option),
        else the environment, else the source's config or its Airflow connection; a setting found nowhere
        is a ``SettingError`` naming every way to give it."""

    def job_environment(self, spec: SourceSpec) -> dict[str, str]:
        """The environment a ``spark-submit`` job (``spark_jobs/rebuild.py``) needs to find the upstream
        as this process found it (never argv: process lists show it)."""
        return {}

    # -- the cycle ----------------------------------------------------------------------------------

    @abstractmethod
    def open(self, ctx: CycleServices) -> SourceRuntime:
        """The kind's half of the cycle context ``ctx`` (made once per context)."""

    def progress_view(self) -> str:
        """The body of the ``<source>_progress`` view over ``reclock.remap_offsets(source, ts, partition,
        "offset")`` (``{}``: the source's name as a literal), with :attr:`progress_columns`."""
        return OFFSETS_PROGRESS

    def rebuild_refused(self, spec: SourceSpec) -> str | None:
        """Why the source cannot be rebuilt by replaying its bindings (None: it can, and has a
        ``rebuild__<source>`` DAG)."""
        return None

    def rebuild_whole(self, spec: SourceSpec) -> bool:
        """Whether a rebuild of the source must re-derive everything from the first binding to the upper
        (a window's updates are retracted by later ones that name their values, as an upsert's are), rather
        than a window of bindings (``reclock.cycle.rebuild``)."""
        return False

    def resnapshot_refused(self, spec: SourceSpec) -> str | None:
        """Why the source cannot be re-snapshotted (None: it can)."""
        return (f"source {spec.name}: a {self.title} source is not re-snapshotted (a re-snapshot starts a "
                "source that takes a snapshot over from a fresh one)")

    # -- around the cycle ---------------------------------------------------------------------------

    @abstractmethod
    def upstream_trigger(self, spec: SourceSpec) -> Any:
        """The Airflow trigger (a ``BaseEventTrigger``) that fires when the source has something to do, for
        ``schedule: upstream``: upstream moved past the newest binding, or it must run to release upstream
        retention. Imports Airflow only when called."""

    def position_text(self, partition: int, offset: int) -> str:
        """A position of the kind's FromTime (a remap offset row, an error row's) as the kind prints it:
        ``partition 0 offset 40``; Postgres: ``LSN 0/16B3748``."""
        return f"partition {partition} offset {offset}"

    lag_unit: ClassVar[str] = "records"
    """The unit of :meth:`lag` (``Lag.unit``) and of the distance between two bindings' offsets (the page's
    lag plot)."""

    @abstractmethod
    def lag(self, spec: SourceSpec, upstream: Any, timeout: float, dsn: str | None = None) -> Lag:
        """How far upstream is ahead of what the source committed, for ``reclock status`` and the UI page,
        probed within ``timeout`` seconds (``upstream``: what :meth:`find_upstream` found; ``dsn``: the
        consensus database, where a kind keeps its own tables; None: the one the settings name,
        ``reclock.settings.find_dsn``); ``Lag(None, why)`` where it is not probed.
        May raise (the status report turns a failure into an unknown lag with the reason)."""
