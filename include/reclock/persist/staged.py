"""Staged parts: what ``write_batches`` left in the blob store, collected and proved before ``append``
makes any of it visible (DESIGN.md, "accounted writes").

Each slice of a description is one Spark job writing under ``<prefix>/slice-NNNN/`` and reporting what it
read and wrote (:class:`~reclock.batch.SliceWritten`). A slice's parts are taken only when everything adds
up; otherwise :class:`~reclock.errors.UnaccountedWrite` fails the step, and nothing is appended and no
offset committed:

==========================================  ===============================================================
check                                       fails when
==========================================  ===============================================================
the job's commit marker ``_SUCCESS``        it is not there: the job did not commit, or this process does
                                            not see where Spark wrote (a folder on another host)
every Parquet file in the slice's folder    a footer cannot be read, or a file is not of this job's layout
rows per output, from the footers           they differ from the rows the job reported writing
records read (append-only)                  they differ from the rows written (each record is one row), or
                                            exceed the offsets the slice's ranges span
==========================================  ===============================================================

"Found nothing" is never taken for "there was nothing": an empty slice still has its marker, and its job
reported zero rows.

**A slice written once is not written again.** After its job, a slice is recorded by a fingerprint of
everything its rows depend on (:func:`record_slice`: what the job reported, and where). A later write of the
same rows (a retry of a step that a fault ended after some slices) finds the record (:func:`earlier_slice`)
and takes that slice's parts instead of running its job again, only after the same proof as above passes on
them (:func:`prove_earlier`), and only while they are well inside garbage collection's grace period
(:func:`reusable_age_s`). The write leases the slice's folder before the proof, as it leases its own, until
the append (:func:`take_earlier`, ``WrittenBatch.taken``). Anything else (no record, an unreadable one, a proof that fails, older
files) is written again, as before.

An upsert slice's files sit in ``_output=N/`` folders. An append-only slice's files hold the collection's
rows and, packed in one column, the records that did not decode: a file whose footer says that column is
all null is a part of the data shard as it is; the rare one holding rejected records is split into a data
part and an errors part beside it, and those are the parts (the original is garbage).
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from dataclasses import dataclass
from typing import Callable, ContextManager, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from reclock.batch import Part, SliceWritten
from reclock.errors import UnaccountedWrite
from reclock.part_layout import (DATA_OUTPUT, ERR_PREFIX, ERRORS_OUTPUT, KAFKA_SHAPE, OUTPUT_FOLDER, REJECTED_COLUMN,
                                 STATE_OUTPUT, STATE_PREFIX, RecordShape, state_schema, unpack_rejected)
from reclock.persist.blob import BlobStore, _check_rel
from reclock.persist.gc import lease_key, lease_write, release_quietly
from reclock.persist.parquet import null_count, parquet_bytes, part_from_footer, uses_int96

log = logging.getLogger(__name__)

COMMIT_MARKER = "_SUCCESS"
"""The file Spark's committer writes into a job's output folder once every task's output is in place."""

RECORDS_FOLDER = "_slices"
"""The folder of a source's slice records (:func:`record_slice`), one file per fingerprint; garbage collection
takes a record once its grace period passed, as any blob no batch references."""


def slice_folder(prefix: str, index: int) -> str:
    """Where slice ``index`` of a write under ``prefix`` puts its files."""
    return f"{prefix}/slice-{index:04d}"


def split_joint(blob: BlobStore, source: str, base: str, member_column: str, folders: Sequence[str]) -> None:
    """Hand out the files of a joint job (``reclock.sources.kafka.spark_job.write_joint``) written under ``base``:
    slice ``i``'s Parquet files (``base/<member_column>=i/``) move into ``folders[i]``, which then gets a
    commit marker of its own, so each is a slice folder like a job of its own leaves (and is proved by
    :func:`collect_parts` like one). Only after the joint job's own commit marker is found; else
    :class:`UnaccountedWrite` (``source``: the first slice's source) and nothing is moved."""
    listing = blob.list(base)
    if not any(b.path == posixpath.join(base, COMMIT_MARKER) for b in listing):
        raise UnaccountedWrite(source, blob.url(base), blob.url(base), f"the joint job's commit marker "
                               f"{COMMIT_MARKER} is not there ({len(listing)} files)")
    for i, folder in enumerate(folders):
        member = posixpath.join(base, f"{member_column}={i}") + "/"
        for b in listing:
            name = b.path[len(member):]
            if b.path.startswith(member) and "/" not in name and not name.startswith((".", "_")):
                blob.rename(b.path, posixpath.join(folder, name))
        blob.put_bytes(posixpath.join(folder, COMMIT_MARKER), b"")


def collect_parts(blob: BlobStore, source: str, shards: Mapping[int, str], prefix: str,
                  slices: Sequence[SliceWritten], upsert: bool, shape: RecordShape = KAFKA_SHAPE,
                  proved: Sequence[Mapping[int, Sequence[Part]]] = ()
                  ) -> tuple[dict[str, tuple[Part, ...]], tuple[Part, ...]]:
    """The parts the ``slices`` of one write left under ``prefix``, per shard (``shards``: output -> shard
    id, for :data:`DATA_OUTPUT` and :data:`ERRORS_OUTPUT`), and the upsert state's change parts; each slice
    proved to hold exactly what its job reported (see the module), else :class:`UnaccountedWrite`.
    ``proved``: the parts per output of slices taken from an earlier write (:func:`prove_earlier`)."""
    out: dict[int, list[Part]] = {DATA_OUTPUT: [], ERRORS_OUTPUT: [], STATE_OUTPUT: []}
    for s in slices:
        for output, parts in _collect_slice(blob, source, prefix, s, upsert, shape).items():
            out[output].extend(parts)
    for earlier in proved:
        for output, parts in earlier.items():
            out[output].extend(parts)
    done = {o: tuple(sorted(ps, key=lambda p: p.path)) for o, ps in out.items()}
    return {shards[o]: done[o] for o in (DATA_OUTPUT, ERRORS_OUTPUT)}, done[STATE_OUTPUT]


def _collect_slice(blob: BlobStore, source: str, prefix: str, s: SliceWritten,
                   upsert: bool, shape: RecordShape = KAFKA_SHAPE) -> dict[int, list[Part]]:
    folder = slice_folder(prefix, s.index)
    looked_at = blob.url(folder)

    def fail(detail: str) -> UnaccountedWrite:
        return UnaccountedWrite(source, s.url, looked_at, f"slice {s.index}: {detail}")

    reported = _describe(s.rows)
    if not upsert and s.records_read != sum(s.rows.values()):
        raise fail(f"Spark read {s.records_read} records but wrote {sum(s.rows.values())} rows ({reported}); "
                   "every record must become one row")
    if s.records_read > s.offsets:
        raise fail(f"Spark read {s.records_read} records from offset ranges spanning {s.offsets} offsets")
    listing = {info.path: info for info in blob.list(folder)}
    files = [info for path, info in listing.items() if _is_data_file(folder, path, upsert)]
    if posixpath.join(folder, COMMIT_MARKER) not in listing:
        raise fail(f"Spark reported writing {reported}, but its commit marker {COMMIT_MARKER} is not there "
                   f"({len(files)} Parquet files, {len(listing)} files in all)")
    found: dict[int, list[tuple[str, int, object]]] = {DATA_OUTPUT: [], ERRORS_OUTPUT: [], STATE_OUTPUT: []}
    counted = {o: 0 for o in found}
    mixed: list[str] = []  # files holding rejected records
    for info in files:
        try:
            with blob.open(info.path) as f:
                md = pq.ParquetFile(f).metadata
        except Exception as e:  # noqa: BLE001 - any unreadable footer is an unaccounted file
            raise fail(f"the footer of {info.path} cannot be read ({type(e).__name__}: {e})") from e
        if not md.num_rows:
            continue
        if upsert:
            output = _output_of(folder, info.path)
            found[output].append((info.path, info.size, md))
            counted[output] += md.num_rows
            continue
        nulls = null_count(md, REJECTED_COLUMN)
        if nulls is None:
            raise fail(f"{info.path} has no column {REJECTED_COLUMN}: it is not a file of this job")
        if nulls < 0:  # no statistics: count the column itself
            with blob.open(info.path) as f:
                nulls = pq.read_table(f, columns=[REJECTED_COLUMN])[REJECTED_COLUMN].null_count
        counted[DATA_OUTPUT] += nulls
        counted[ERRORS_OUTPUT] += md.num_rows - nulls
        if nulls == md.num_rows:
            found[DATA_OUTPUT].append((info.path, info.size, md))
        else:
            mixed.append(info.path)
    if any(counted[o] != s.rows.get(o, 0) for o in counted):
        raise fail(f"Spark reported writing {reported}, the cycle found {_describe(counted)} in {len(files)} "
                   "Parquet files")
    parts = {o: [part_from_footer(path, size, md) for path, size, md in fs] for o, fs in found.items()}
    for path in mixed:
        for output, part in split_rejected(blob, source, path, shape):
            parts[output].append(part)
    return parts


def slice_record(source: str, fingerprint: str) -> str:
    """Where a write of ``source`` records a slice whose rows have ``fingerprint`` (:func:`record_slice`)."""
    return f"{source}/{RECORDS_FOLDER}/{fingerprint}.json"


def record_slice(blob: BlobStore, source: str, folder: str, s: SliceWritten, fingerprint: str) -> None:
    """Record slice ``s`` of a write of ``source`` under ``folder`` (its files in ``slice_folder(folder,
    s.index)``): what its job reported, by the slice's ``fingerprint`` (the same for a write of the same rows:
    the same offsets, bindings and decode)."""
    record = {"folder": folder, "index": s.index, "url": s.url, "offsets": s.offsets,
              "records_read": s.records_read, "rows": {str(o): n for o, n in s.rows.items()}}
    blob.put_bytes(slice_record(source, fingerprint), json.dumps(record, sort_keys=True).encode())


@dataclass(frozen=True)
class EarlierSlice:
    """A slice an earlier write recorded (:func:`record_slice`): its files are in ``slice_folder(folder,
    written.index)``."""

    folder: str
    written: SliceWritten

    @property
    def files(self) -> str:
        """The folder of the slice's files."""
        return slice_folder(self.folder, self.written.index)


def earlier_slice(blob: BlobStore, source: str, fingerprint: str) -> EarlierSlice | None:
    """The slice with ``fingerprint`` an earlier write of ``source`` recorded, or None: none was (or garbage
    collection took the record), or its record does not read (logged: the slice is written again)."""
    path = slice_record(source, fingerprint)
    try:
        data = blob.get_bytes(path)  # one request where there is a record (a retry) and where there is none
    except FileNotFoundError:
        return None
    try:
        r = json.loads(data)
        written = SliceWritten(int(r["index"]), str(r["url"]), int(r["offsets"]), int(r["records_read"]),
                               {int(o): int(n) for o, n in r["rows"].items()})
        return EarlierSlice(_check_rel(str(r["folder"])), written)
    except Exception as e:  # noqa: BLE001 - an unreadable record only costs the slice's job again
        log.warning("slice record %s does not read (%s: %s): the slice is written again", path, type(e).__name__, e)
        return None


def reusable_age_s(gc_grace_s: float) -> float:
    """How old an earlier slice's files may be to be taken: half of garbage collection's grace period. The
    write leases the slice's folder before it proves the files, and a collection that read the leases before
    that deletes only files older than the grace period when it began; the other half is the margin for such
    a collection still under way and for the blob store's clock (an object store's modification times)."""
    return gc_grace_s / 2


def prove_earlier(blob: BlobStore, source: str, earlier: EarlierSlice, max_age_s: float,
                  shape: RecordShape = KAFKA_SHAPE) -> dict[int, list[Part]] | None:
    """The parts per output of an append-only slice an earlier write left, proved as a slice just written is
    (the module's checks), or None (logged) when they cannot be taken: a file is older than ``max_age_s``
    (:func:`reusable_age_s`) or the proof fails."""
    folder = earlier.files
    now = time.time()
    listing = blob.list(folder)
    oldest = min((info.mtime for info in listing), default=now)
    if now - oldest >= max_age_s:
        log.info("source %s: the slice in %s is %.0f s old (at most %.0f s is taken): written again", source,
                 folder, now - oldest, max_age_s)
        return None
    try:
        return _collect_slice(blob, source, earlier.folder, earlier.written, False, shape)
    except UnaccountedWrite as e:
        log.warning("source %s: the slice an earlier write left in %s is not taken (%s): written again", source,
                    folder, e)
        return None


def take_earlier(connect: Callable[[], ContextManager], blob: BlobStore, source: str, earlier: EarlierSlice,
                 holder: str, max_age_s: float, shape: RecordShape = KAFKA_SHAPE) -> dict[int, list[Part]] | None:
    """Take the slice ``earlier`` for the write whose folder is ``holder``: lease its files' folder for that
    write (``reclock.persist.gc.lease_key``), then prove them (:func:`prove_earlier`). Its parts per output,
    leased until the write's append releases ``WrittenBatch.leased``; or None, the lease released, when
    they cannot be taken (the slice is written again).

    The lease comes before the proof: a garbage collection that reads the leases after it keeps the files,
    and one that read them before deletes only files older than the grace period at its start, which files
    younger than ``max_age_s`` (:func:`reusable_age_s`) at the proof were not."""
    with connect() as conn:
        lease_write(conn, source, earlier.files, holder=holder)
    parts = prove_earlier(blob, source, earlier, max_age_s, shape)
    if parts is None:
        release_quietly(connect, lease_key(earlier.files, holder))
    return parts


def _describe(rows: Mapping[int, int]) -> str:
    names = {DATA_OUTPUT: "data", ERRORS_OUTPUT: "rejected", STATE_OUTPUT: "upsert state"}
    total = sum(rows.values())
    return f"{total} rows (" + ", ".join(f"{names[o]} {n}" for o, n in sorted(rows.items()) if n or o != STATE_OUTPUT) + ")"


def _is_data_file(folder: str, path: str, upsert: bool) -> bool:
    """Whether ``path`` is one of the job's Parquet files: in the slice's folder (append-only) or an
    ``_output=N`` folder in it (upsert); Spark's hidden and ``_``-files (markers, ``_temporary``) are not."""
    rel = path[len(folder) + 1:].split("/")
    if any(p.startswith((".", "_")) and not p.startswith("_output=") for p in rel):
        return False
    if not rel[-1].endswith(".parquet"):
        return False
    return len(rel) == (2 if upsert else 1) and (not upsert or rel[0].startswith("_output="))


def _output_of(folder: str, path: str) -> int:
    name = path[len(folder) + 1:].split("/")[0]
    for o in (DATA_OUTPUT, ERRORS_OUTPUT, STATE_OUTPUT):
        if name == OUTPUT_FOLDER.format(o):
            return o
    raise ValueError(f"{path}: not in an output folder of {folder}")


def split_rejected(blob: BlobStore, source: str, path: str,
                   shape: RecordShape = KAFKA_SHAPE) -> list[tuple[int, Part]]:
    """Write the collection's rows of the file at ``path``, and its rejected records unpacked into the error
    collection's columns, to files of their own beside it; the parts they are, by output."""
    with blob.open(path) as f:
        pf = pq.ParquetFile(f)
        int96 = uses_int96(pf)
        table = pf.read()
    rejected = pc.is_valid(table[REJECTED_COLUMN])
    good = table.filter(pc.invert(rejected)).drop_columns([REJECTED_COLUMN])
    bad = table.filter(rejected)
    errors = unpack_rejected(bad[REJECTED_COLUMN].to_pylist(), shape)
    errors = pa.table({**{c: errors[c] for c in errors.column_names}, "ts": bad["ts"], "diff": bad["diff"]})
    parts = []
    for output, rows in ((DATA_OUTPUT, good), (ERRORS_OUTPUT, errors)):
        if not rows.num_rows:
            continue
        data = parquet_bytes(rows, int96, f"source {source}: output {output} of {path}")
        split = f"{path[:-len('.parquet')]}.output{output}.parquet"
        blob.put_bytes(split, data)
        ts = pc.min_max(rows["ts"]).as_py()
        parts.append((output, Part(split, rows.num_rows, len(data), ts["min"], ts["max"])))
    return parts


def first_rejected(blob: BlobStore, error_parts: Sequence[Part], shape: RecordShape = KAFKA_SHAPE
                   ) -> tuple[object, object, str] | None:
    """``(position, position, reason)`` of the first record (by the shape's positions: Kafka's partition
    and offset, Kinesis's shard and sequence number) in a write's error parts."""
    (first_col, _), (second_col, second_type) = shape.positions
    cols = [ERR_PREFIX + c for c in (first_col, second_col, "reason")]

    def order(row):  # a sequence number is a decimal string: compare it as the number it is
        v = row[cols[1]]
        return (row[cols[0]], int(v) if second_type == "string" else v)
    first = None
    for part in error_parts:
        with blob.open(part.path) as f:
            t = pq.read_table(f, columns=cols)
        t = t.filter(pc.is_valid(t[cols[0]]))
        for row in t.to_pylist():
            if first is None or order(row) < order(first):
                first = row
    return None if first is None else (first[cols[0]], first[cols[1]], first[cols[2]])


def read_state_changes(blob: BlobStore, parts: Sequence[Part], shape: RecordShape = KAFKA_SHAPE) -> pa.Table:
    """The upsert state changes a description's parts carry (an empty table when none)."""
    tables = []
    for p in parts:
        with blob.open(p.path) as f:
            t = pq.read_table(f, columns=[STATE_PREFIX + c for c in shape.state_columns])
        tables.append(t.rename_columns(list(shape.state_columns)))
    return pa.concat_tables(tables) if tables else state_schema(shape).empty_table()
