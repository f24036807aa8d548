"""Typed errors that carry the fields a user needs to act (STYLE.md, "Errors a user can act on")."""

from __future__ import annotations


class ReclockError(Exception):
    """Base of every error Reclock raises on purpose."""


class UpperMismatch(ReclockError):
    """``compare_and_append`` found the shard's upper was not the description's ``lower``."""

    def __init__(self, shard: str, expected: int, actual: int | None, hint: str = "") -> None:
        self.shard = shard
        self.expected = expected
        self.actual = actual
        actual_s = "[] (closed)" if actual is None else str(actual)
        msg = f"shard {shard}: upper is {actual_s}, append expected {expected}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class ShardModified(UpperMismatch):
    """The shard's upper is *behind* the description's ``lower``: it was modified under us."""


class RemapUpperMismatch(ReclockError):
    """Another minter appended a binding to the source's remap collection first."""

    def __init__(self, source: str, expected: int, actual: int) -> None:
        self.source = source
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"source {source}: remap upper is {actual}, mint expected {expected} "
            "(another cycle minted first; re-read the bindings and mint again)"
        )


class SinceViolation(ReclockError):
    """A read or hold asked for a time below a collection's ``since``."""

    def __init__(self, name: str, requested: int, since: int) -> None:
        self.name = name
        self.requested = requested
        self.since = since
        super().__init__(
            f"{name}: time {requested} is below since {since}; compaction already advanced it "
            "(read at or after since, or take a read hold before compaction passes your time)"
        )


class UpstreamDataLost(ReclockError):
    """Upstream no longer holds offsets a shard still needs (retention ran past them)."""

    def __init__(self, source: str, partition: int, start: int, end: int, earliest: int) -> None:
        self.source = source
        self.partition = partition
        self.start = start
        self.end = end
        self.earliest = earliest
        super().__init__(
            f"source {source}: partition {partition} offsets [{start}, {end}) are needed but upstream "
            f"now starts at {earliest}; the data is gone and will not be skipped silently"
        )


class DecodeError(ReclockError):
    """A record could not be decoded with the source's declared format."""

    def __init__(self, source: str, partition, offset, reason: str, where: str | None = None) -> None:
        self.source = source
        self.partition = partition
        self.offset = offset
        self.reason = reason
        where = where or f"partition {partition} offset {offset}"
        super().__init__(f"source {source}: record at {where}: {reason}")


class UnaccountedWrite(ReclockError):
    """What ``write_batches`` (or a rebuild) collected does not add up to what Spark reported writing: a
    commit marker, a part or rows are missing, or more turned up. Nothing is appended, no offset committed."""

    def __init__(self, source: str, written_to: str, looked_at: str, detail: str) -> None:
        self.source = source
        self.written_to = written_to
        self.looked_at = looked_at
        self.detail = detail
        where = (f"Spark wrote to {written_to}" if written_to == looked_at
                 else f"Spark wrote to {written_to}, the cycle looked at {looked_at}")
        super().__init__(
            f"source {source}: {detail} ({where}); nothing was appended and no offset committed. If Spark "
            "and this process do not see the same blob store (a local folder on another host or in another "
            "container), give both one shared store: an s3:// blob URL or a shared filesystem")


class NaNPayloadsNotKept(ReclockError):
    """A batch holds a NaN of other bits than the canonical NaN (a payload, the sign bit, a signalling NaN) and
    the Spark session would write it as the canonical NaN: the write is refused and nothing is appended."""

    def __init__(self, written_to: str, column: str) -> None:
        self.written_to, self.column = written_to, column
        super().__init__(
            f"parts at {written_to}: column {column} holds a NaN with a payload (or a sign bit, or a signalling "
            "NaN), which this Spark would write as the canonical NaN (parquet-java's writer canonicalises NaNs); "
            "nothing was written or appended. Put Reclock's raw-floats jar (reclock-raw-floats.jar, built from "
            "jvm/rawfloats) first on the classpath of the driver and the executors: spark.driver.extraClassPath "
            "and spark.executor.extraClassPath (RECLOCK_SPARK_JARS naming it does that for the sessions Reclock "
            "starts); see docs/deployment.md")


class ShardsDisagree(ReclockError):
    """A source's output shards have different uppers where one is needed (a rebuild replays them all)."""

    def __init__(self, source: str, uppers: dict[str, int]) -> None:
        self.source = source
        self.uppers = dict(uppers)
        listed = ", ".join(f"{s} {u}" for s, u in sorted(uppers.items()))
        super().__init__(f"source {source}: its shards' uppers differ ({listed}); run a cycle first, whose "
                         "append brings them together")


class RebuildConflict(ReclockError):
    """A windowed rebuild's swap kept losing to concurrent changes of the rows in its window."""

    def __init__(self, source: str, lower: int, upper: int, attempts: int) -> None:
        self.source = source
        self.lower = lower
        self.upper = upper
        super().__init__(f"source {source}: the rebuild of [{lower}, {upper}) lost its swap {attempts} times in a row "
                         "to another change of the rows in that window (another rebuild); nothing was swapped, "
                         "run it again")


class SinkRefused(ReclockError):
    """A sink (Kafka or Iceberg) will not start or go on: it could only write duplicates or leave a gap."""

    def __init__(self, sink: str, reason: str) -> None:
        super().__init__(f"sink {sink}: {reason}")
        self.sink = sink


class ConfigError(ReclockError):
    """A source, sink or stack configuration is invalid."""


class SettingError(ConfigError):
    """A setting the library needs (config file, Postgres DSN, blob store, Kafka brokers, Spark) was given
    nowhere; the message names the environment variable, option or Airflow connection that gives it."""


class StackError(ReclockError):
    """A local service of the dev stack failed to install, start or answer."""


class UnknownSource(ReclockError, LookupError):
    """No source of that name is registered (no remap collection)."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__(f"source {source}: not registered (no remap collection); run register_source "
                         "(the cycle's mint step does) first")


class UnknownShard(ReclockError, LookupError):
    """No shard of that id is registered."""

    def __init__(self, shard: str) -> None:
        self.shard = shard
        super().__init__(f"shard {shard}: not registered; run register_shard (the cycle's mint step does) first")


class UnknownReadHold(ReclockError, LookupError):
    """A holder asked to move or drop a read hold it does not have."""

    def __init__(self, shard: str, holder: str) -> None:
        self.shard = shard
        self.holder = holder
        super().__init__(f"shard {shard}: {holder} holds no read hold (acquire one first)")


class BeyondUpper(ReclockError, ValueError):
    """A read asked for a time the collection has not completed yet (``t >= upper``)."""

    def __init__(self, name: str, requested: int, upper: int) -> None:
        self.name = name
        self.requested = requested
        self.upper = upper
        super().__init__(f"{name}: time {requested} is not complete yet (upper is {upper}); read at most "
                         f"{upper - 1}, or wait for the next append")


class NothingComplete(ReclockError, ValueError):
    """A read of a collection that has no complete time yet (its upper is 0)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"{name}: nothing is complete yet (upper is 0); run a cycle of its source first")


class PartAlreadyReferenced(ReclockError):
    """``compare_and_append`` was given a part path that a batch already references."""

    def __init__(self, shard: str, path: str, referenced_by: str | None, concurrent: bool = False) -> None:
        self.shard = shard
        self.path = path
        self.referenced_by = referenced_by
        if concurrent:
            where = "a batch that a concurrent append just committed"
        elif referenced_by:
            where = f"a batch of shard {referenced_by}"
        else:
            where = "another part of the same append"
        super().__init__(f"shard {shard}: part {path} is already referenced by {where}; parts are immutable "
                         "and belong to one batch (write the data again under a fresh path)")


class PartDamaged(ReclockError):
    """A part's file no longer holds the rows the shard recorded when the part was appended."""

    def __init__(self, shard: str, path: str, recorded: int, found: int) -> None:
        self.shard, self.path, self.recorded, self.found = shard, path, recorded, found
        super().__init__(f"shard {shard}: part {path} holds {found} rows by its footer, but {recorded} were "
                         "recorded when it was appended: the file was replaced or damaged since; nothing was read "
                         "from it (restore the file from a backup, or rebuild the collection from upstream)")


class MigrationError(ReclockError):
    """The ``reclock`` schema cannot be migrated safely (an applied migration changed, or the database is
    newer than this code)."""


class SchemaVersionMismatch(MigrationError):
    """The consensus database's ``reclock`` schema is not the one this release ships: older (run ``reclock
    migrate``) or newer (a newer release migrated it; this one must not run on it)."""

    def __init__(self, missing: list[str], unknown: list[str]) -> None:
        self.missing, self.unknown = missing, unknown
        if unknown:
            msg = (f"the consensus database's reclock schema is newer than this release: it has migration(s) "
                   f"{', '.join(unknown)}, which this release does not ship. A newer release migrated it, and this "
                   "one would misread its state: run that release (a rollback is only safe by restoring the "
                   "backup taken before `reclock migrate`, and only if no cycle or sink of the newer release ran "
                   "since; see docs/operations.md, Upgrades)")
        else:
            msg = (f"the consensus database's reclock schema is older than this release: migration(s) "
                   f"{', '.join(missing)} are not applied; run `reclock migrate` (with this release) first")
        super().__init__(msg)


class AcknowledgedStateLost(ReclockError):
    """Progress Reclock acknowledged outside its consensus database (a consumer group's committed offsets, a
    replication slot's confirmed position, a sink's progress) is beyond what the database now holds: the
    database went back (a failover to a standby that lacked the last commits, a restored backup). Going on
    would give records already stamped, and perhaps exported, new timestamps; nothing is minted or written."""

    def __init__(self, what: str, acknowledged: str, holds: str) -> None:
        self.what = what
        super().__init__(
            f"{what}: acknowledged state went back: {acknowledged}, but the consensus database holds only "
            f"{holds}. The database lost commits it had acknowledged (a failover to an asynchronous standby, or a "
            "restored backup); continuing would stamp records again at new timestamps, so nothing was minted or "
            "written. Promote the node that has the lost commits if it still exists; otherwise the state is gone: "
            "rebuild the source and its sinks under new names (see docs/operations.md, Consensus failover). "
            "Reclock's Postgres needs synchronous replication to fail over without this")


class SlotLost(UpstreamDataLost):
    """A Postgres source's replication slot is gone, invalidated (``wal_status = lost``), or already past
    changes a shard still needs: the changes are gone upstream and will not be skipped silently."""

    def __init__(self, source: str, slot: str, detail: str) -> None:
        self.source = source
        self.slot = slot
        self.detail = detail
        ReclockError.__init__(
            self, f"source {source}: replication slot {slot} {detail}; the changes it held are gone and will not "
                  "be skipped silently (re-snapshot the source: drop its shards and remap collection, or create "
                  "it under a new name)")



class SlotAheadOfConsensus(SlotLost, AcknowledgedStateLost):
    """A Postgres source's slot is confirmed past the changes its shards need: the consensus database went
    back (``AcknowledgedStateLost``: it lost commits that had moved the slot), or someone advanced or consumed
    the slot by hand (``SlotLost``). Reclock cannot tell which; both stop the source, and both are caught as
    either."""

    def __init__(self, source: str, slot: str, confirmed: str, needed: str, upper: int) -> None:
        self.source = source
        self.slot = slot
        self.what = f"source {source}"
        self.detail = f"is at {confirmed}, past {needed} where the shards need changes from"
        ReclockError.__init__(
            self, f"source {source}: acknowledged state went back: replication slot {slot} is confirmed at "
                  f"{confirmed}, past {needed} where the shards need changes from (the bindings at their upper "
                  f"{upper}). Either the consensus database lost commits it had acknowledged (a failover to an "
                  "asynchronous standby, a restored backup: promote the node that has them if it still exists, see "
                  "docs/operations.md, Consensus failover), or someone advanced or consumed the slot. The changes "
                  "it held are gone and will not be skipped silently: re-snapshot the source (`reclock resnapshot`) "
                  "or create it under a new name")

class TransactionMetadataInvalid(ReclockError):
    """A source with Debezium's transaction topic (``transaction_topic``) met a record it cannot place in an
    upstream transaction: a transaction topic record that is not a BEGIN or END, a streamed change event
    without its ``transaction`` block, an event of another table than its topic's. Mint binds nothing, the
    source stays stalled at the record until ``remedy`` is done."""

    def __init__(self, source: str, topic: str, partition: int, offset: int, reason: str, remedy: str) -> None:
        self.source, self.topic, self.partition, self.offset = source, topic, partition, offset
        self.reason, self.remedy = reason, remedy
        super().__init__(f"source {source}: topic {topic} partition {partition} offset {offset}: {reason}; nothing "
                         f"is bound past it and the source is stalled ({remedy})")


class SourceStalled(ReclockError):
    """A Postgres source cannot go on past a change it cannot represent: it names the table and the change,
    appends nothing past it, and stays stalled until the user acts (``remedy``)."""

    def __init__(self, source: str, table: str, change: str, remedy: str) -> None:
        self.source = source
        self.table = table
        self.change = change
        self.remedy = remedy
        super().__init__(f"source {source}: table {table}: {change}; the source is stalled and nothing past "
                         f"it is appended ({remedy})")


class ReplicaIdentityMissing(SourceStalled):
    """A published table whose updates and deletes carry neither the whole old row (``REPLICA IDENTITY
    FULL``) nor a key (a primary key under ``DEFAULT``, or ``USING INDEX``): a retraction has nothing to go
    by. ``alter`` is the statement that gives it the whole old row; a primary key works as well."""

    def __init__(self, source: str, table: str, identity: str) -> None:
        schema, _, name = table.partition(".")
        self.alter = f'ALTER TABLE "{schema}"."{name}" REPLICA IDENTITY FULL;'
        super().__init__(source, table, f"replica identity is {identity}: its updates and deletes carry neither "
                                        "the old row nor a key", f"give it a primary key (ALTER TABLE \"{schema}\"."
                                        f"\"{name}\" ADD PRIMARY KEY (...)), or run: {self.alter}")


class ReplicaIdentityChanged(SourceStalled):
    """A table's replica identity (FULL, or which key) is not what it was when the source took its
    snapshot: the changes would be matched to rows another way."""


class KeyedRowMissing(SourceStalled):
    """An update or delete of a table of key identity names a key whose row the collection does not hold
    (or holds twice): the collection and the table disagree, and no exact retraction exists."""


class TableTruncated(SourceStalled):
    """A ``TRUNCATE`` of a published table: Reclock cannot retract rows it is not told."""


class TruncatedUnderSnapshot(ReclockError):
    """A table was truncated after a snapshot was exported and before the snapshot read it: ``TRUNCATE`` is
    not MVCC-safe, so the snapshot would read it empty. Nothing is appended; the next cycle's write takes
    the snapshot again."""

    def __init__(self, source: str, table: str) -> None:
        self.source, self.table = source, table
        super().__init__(f"source {source}: table {table} was truncated after the snapshot was exported and before "
                         "it was read (TRUNCATE is not MVCC-safe: the snapshot would read the table empty); nothing "
                         "was appended, and the next cycle takes the snapshot again")


class ChunkRaced(ReclockError):
    """A chunk of a table snapshotted online was read under a snapshot that missed transactions already
    committed (still leaving the process array) which committed before the write's first LSN: the write
    cannot tell what the chunk holds of them (``reclock.sources.postgres.chunks``). Nothing is appended; the
    next cycle's mint reads the chunk again."""

    def __init__(self, source: str, table: str, xids: list[int]) -> None:
        self.source, self.table = source, table
        super().__init__(f"source {source}: table {table}: a chunk of its online snapshot was read under a "
                         f"snapshot that missed transaction(s) {', '.join(map(str, xids))}, committed before the "
                         "write's first LSN; nothing was appended, and the next cycle reads the chunk again")


class TableSchemaChanged(SourceStalled):
    """DDL changed a published table's columns (a Relation message differs from the registered columns)."""


class ColumnReplaced(TableSchemaChanged):
    """A column was dropped and added again under its name where no Relation message could show it (the
    same type, last, no change of the table between): the catalog as of the binding's upper holds the name at
    another column number (``attnum``) than the one the collection's column was registered with, so the rows
    the table holds there are not the ones the collection holds. Nothing is appended for the binding."""


class CatalogBusy(ReclockError):
    """A mint could not take the ``ACCESS SHARE`` lock on a published table within its ``lock_timeout`` (an
    ``ALTER TABLE`` holds or waits for an ``ACCESS EXCLUSIVE`` lock on it): no binding was minted; the next
    cycle tries again."""

    def __init__(self, source: str, table: str, detail: str) -> None:
        self.source, self.table = source, table
        super().__init__(f"source {source}: table {table}: the mint could not lock it in ACCESS SHARE mode to read "
                         f"its columns as of the new upper ({detail}): an ALTER TABLE holds or waits for it; no "
                         "binding was minted, and the next cycle tries again")


class PublicationMissing(SourceStalled):
    """The source's publication does not exist, or a table of the source is missing from it or dropped."""


class PublicationUnsupported(SourceStalled):
    """The publication is defined in a way whose changes Reclock cannot land exactly (a ``publish`` list
    without ``update``, ``delete`` or ``truncate``: the collections would keep rows the tables no longer
    hold). Refused at the first cycle (and at every cycle after), naming what to change."""


class PublicationRedefined(SourceStalled):
    """A table's row filter or column list in the publication changed after the source registered it (the
    rows already landed were filtered the old way, the changes from now on the new way), or a partition was
    attached to or detached from a root published through it (its rows came or went without a change to
    read). Refused until ``reclock resnapshot``, which takes the new definition from a fresh snapshot."""


class SlotBusy(ReclockError):
    """Another process reads or advances the source's replication slot (another cycle of the same source):
    this cycle fails loudly and changes nothing; the next one carries on."""

    def __init__(self, source: str, slot: str, detail: str) -> None:
        self.source = source
        self.slot = slot
        super().__init__(f"source {source}: replication slot {slot} is in use by another process ({detail}); "
                         "another cycle of this source runs, this one changed nothing")


class KinesisDataLost(UpstreamDataLost):
    """A Kinesis stream no longer holds records a source bound (or may have bound): retention trimmed them,
    or their shard expired, before the source read them."""

    def __init__(self, source: str, shard: str, start: int, end: int | None, detail: str) -> None:
        ReclockError.__init__(
            self, f"source {source}: shard {shard}, sequence numbers [{start}, {'end' if end is None else end}): "
                  f"{detail}; the data is gone and will not be skipped silently (raise the stream's retention "
                  "period, run cycles more often than it; to go on without those records, start a new source)")
        self.source = source
        self.shard = shard
        self.partition = None
        self.start = start
        self.end = end
        self.earliest = None
        self.detail = detail


class StepDeadlineExceeded(ReclockError):
    """A step's Spark work ran past the source's ``step_timeout``: its operations were interrupted and the
    step failed (nothing it wrote is visible; the next try writes again). ``cause``: the error the
    interrupted operation raised."""

    def __init__(self, what: str, seconds: float, interrupted: int, cause: BaseException) -> None:
        self.what = what
        self.seconds = seconds
        self.interrupted = interrupted
        first = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else type(cause).__name__
        super().__init__(
            f"{what}: its Spark work ran past the step's deadline of {seconds:g} s (the source's "
            f"`step_timeout`) and {interrupted} operation(s) of it were interrupted ({type(cause).__name__}: "
            f"{first}); nothing of the step is visible and the next try writes again. If the work is this long "
            "by nature, raise `step_timeout` or lower `budget.max_records`; else see why the Spark cluster is "
            "slow (lost executors, queued jobs: the Spark UI)")


class KinesisUnavailable(ReclockError):
    """A Kinesis source's stream cannot be reached, or does not exist."""


class UpstreamThrottled(ReclockError):
    """A Kinesis shard kept answering ``ProvisionedThroughputExceededException`` for longer than the read's
    patience; nothing was skipped."""


class StreamReplaced(ReclockError):
    """The Kinesis stream a source reads was deleted and created again under the same name: its shards and
    sequence numbers start over, so the source's frontier means nothing there."""

    def __init__(self, source: str, stream: str, bound_ms: int, now_ms: int, evidence: str = "") -> None:
        import datetime as _dt

        def when(ms: int) -> str:
            return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat(timespec="seconds")
        self.source, self.stream, self.bound_ms, self.now_ms = source, stream, bound_ms, now_ms
        why = f" ({evidence})" if evidence else ""
        read = (f"the source has read the stream of that name created at {when(bound_ms)}" if bound_ms != now_ms else
                "the source has read another stream of that name, created within the same second (as the endpoint "
                "reports creation times)")
        super().__init__(
            f"source {source}: stream {stream!r} was created at {when(now_ms)}, but {read}: it was deleted and "
            f"created again{why}. Its shards and "
            "sequence numbers start over, and Reclock will not restart from zero silently: ingest the new stream as "
            "a new source (another name), and drop this one when its collections are no longer needed")


class KafkaAccessDenied(ReclockError):
    """A Kafka broker refused an operation: the client's principal has no ACL for it."""

    def __init__(self, what: str, cluster: str, principal: str, operation: str, resource_type: str,
                 resource: str) -> None:
        self.what = what
        self.cluster = cluster
        self.principal = principal
        self.operation = operation
        self.resource_type = resource_type
        self.resource = resource
        flag = {"topic": f"--topic {resource}", "group": f"--group {resource}",
                "transactional id": f"--transactional-id {resource}", "cluster": "--cluster"}[resource_type]
        named = "the cluster" if resource_type == "cluster" else f"{resource_type} {resource!r}"
        super().__init__(
            f"{what}: Kafka at {cluster} denied {operation} on {named}: grant {principal} that ACL "
            f"(kafka-acls.sh --add --allow-principal {principal} --operation {operation.title().replace('_', '')} "
            f"{flag}; docs/security.md lists every ACL Reclock needs)")


class KafkaAuthenticationFailed(ReclockError):
    """A Kafka broker refused the client's login or TLS handshake (wrong password, unknown user, an
    untrusted certificate)."""

    def __init__(self, what: str, cluster: str, reason: str) -> None:
        self.what = what
        self.cluster = cluster
        self.reason = reason
        super().__init__(f"{what}: Kafka at {cluster} refused the connection: {reason} (check the connection's "
                         "user, password and certificates)")


class ValueNotCarried(ReclockError):
    """A reader or sink would change values on their way (a type its engine or format cannot hold bit for
    bit), so it refuses instead."""

    def __init__(self, where: str, column: str, what: str, remedy: str) -> None:
        self.where = where
        self.column = column
        super().__init__(f"{where}: column {column}: {what}; nothing was read or written ({remedy})")


class ObjectLost(UpstreamDataLost):
    """An object of an S3 source (or a file of a folder source) that is bound, and not read in full yet, is
    gone upstream (deleted, or its folder removed): its bytes are gone and will not be skipped silently."""

    def __init__(self, source: str, url: str, start: int, end: int, detail: str = "it no longer exists") -> None:
        self.source = source
        self.url = url
        self.start = start
        self.end = end
        ReclockError.__init__(
            self, f"source {source}: object {url}: bytes [{start}, {end}) are bound and must be read, but {detail}; "
                  "the data is gone and will not be skipped silently (restore the object as it was, or drop the "
                  "source's collections and remap collection and ingest it anew)")


class ObjectChanged(ReclockError):
    """An object of an S3 source changed after Reclock recorded it: its ETag (or version, or for a local
    file its identity or length) is not the one bound, so the bytes a binding covers can no longer be read
    as they were."""

    def __init__(self, source: str, url: str, bound: str, found: str, remedy: str) -> None:
        self.source = source
        self.url = url
        self.bound = bound
        self.found = found
        super().__init__(f"source {source}: object {url} was overwritten: it was recorded as {bound}, it is now "
                         f"{found}; {remedy}")


class S3Unavailable(ReclockError):
    """An S3 source's bucket, folder or queue cannot be reached: it does not exist, the credentials are
    refused, or the endpoint does not answer."""


class RegistryUnavailable(ReclockError):
    """A Schema Registry did not answer as one (unreachable, refused the login, a server error, TLS that does
    not verify). The records are not at fault: a cycle that needs the registry stalls, whatever
    ``on_decode_error`` says, and the next cycle reads the same records again."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        self.detail = detail
        super().__init__(f"schema registry {url}: {detail}")


class SchemaNotFound(ReclockError, LookupError):
    """The registry answered that a schema id, subject or version does not exist."""

    def __init__(self, url: str, what: str, detail: str) -> None:
        self.url = url
        self.what = what
        super().__init__(f"schema registry {url}: {what} does not exist ({detail})")


class SchemaIncompatible(ReclockError):
    """A collection's schema cannot take a change (a type narrowed, a required field removed, a column's
    type changed to another): the source stalls naming the field, the schemas, and what to do; nothing past
    the change is appended."""

    def __init__(self, source: str, collection: str, field: str, change: str, old: str, new: str,
                 remedy: str, old_id: int | None = None, new_id: int | None = None) -> None:
        self.source = source
        self.collection = collection
        self.field = field
        self.change = change
        self.old = old
        self.new = new
        self.remedy = remedy
        self.old_id = old_id  # the registry ids of the schema in force and of the writer refused, when known
        self.new_id = new_id
        ids = ""
        if new_id is not None:
            ids = f" in writer schema id {new_id}" + (f" (the collection reads as schema id {old_id})"
                                                      if old_id is not None else "")
        super().__init__(f"source {source}: collection {collection}: field {field!r} {change} (from {old} to "
                         f"{new}){ids}; the source is stalled and nothing past the change is appended ({remedy})")
