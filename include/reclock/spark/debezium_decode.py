"""The ``debezium`` envelope on Spark: a slice's Debezium change events, grouped by key with the key's upsert
state row, folded event by event with :func:`reclock.debezium.apply` (one concept, one place: the Spark job
applies the pure module's rules, it does not restate them; unlike :func:`~reclock.debezium.fold`, a malformed
record goes to the errors and the fold goes on), and routed like an upsert slice's rows (output 0 the collection,
1 the error collection, 2 the upsert state's changes).

::

    records (key, value, partition, offset, timestamp, ts)        prior: state rows of the keys touched
        | the row (``after``) checked against the declared schema      | (key, KeyState bytes, ...)
        v                                                              v
    key without Connect's schema wrapper (``parse_key``)  ----- union, sort by key ----->  per key, in
    (partition, offset) order: ``apply`` each event to the key's state; updates summed per (row, ts)
        |
        v
    +-1 rows (``after`` as Debezium wrote it, decoded by the declared schema), error rows (a record that is
    not a change event, has no key, or whose row does not fit the schema: never dropped), and one state row
    per key (its ``KeyState``, kept by ``reclock.persist.upsert_state`` as the upsert envelope's values are)

A key's records are folded in one Python task, in order: a key's events form a sequence whose every step
depends on the one before, as the pure fold says. They are folded a key at a time over Arrow batches
(``mapInArrow``): a grouped map (``applyInPandas``) built a pandas frame per key, and a slice touches many keys
with a few events each. A slice over several partitions is folded by the tasks that read it (:func:`fold_local`:
a key's events are in one partition, as Connect's default partitioner puts them; the caller checks that every
key was folded in one place, and folds the slice again otherwise); a slice of one partition is repartitioned
and sorted by key first (:func:`fold_sorted`), which spreads its fold over the cluster.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Sequence

from reclock.debezium import EventInvalid, KeyState, apply, parse_key, parse_value, row_text
from reclock.part_layout import DATA_OUTPUT, ERR_PREFIX, ERRORS_OUTPUT, STATE_OUTPUT, STATE_PREFIX, RecordShape
from reclock.specs import SourceSpec

SCHEMA_REASON = "the row (after) does not parse as JSON of the declared schema"
_FOLDED = ("_row STRING, ts BIGINT, diff BIGINT, _output INT, _ep INT, _eo BIGINT, _ek BINARY, _er BINARY, "
           "_ereason STRING, _sk BINARY, _sv BINARY, _sp INT, _so BIGINT, _st BIGINT")


def _key_of(k):
    return None if k is None else parse_key(bytes(k))


def fold_key(rows: list[dict]) -> list[tuple]:
    """One key's prior state row (``_prior``) and records (dicts of the columns ``changes`` folds), folded:
    tuples of :data:`_FOLDED`. Each event is read by the C JSON decoder with its row left in the record
    (``defer_after``); only the rows the fold leaves standing are cut out of their records, when the
    updates are summed by row text."""
    rows = sorted(rows, key=lambda r: (not r["_prior"], r["_p"], r["_o"]))
    out: list[tuple] = []
    state = None
    totals: dict[tuple[object, int], int] = defaultdict(int)  # (row: str or RawAfter, ts) -> diff
    last = None
    nk = None
    for r in rows:
        if r["_prior"]:
            nk, state = bytes(r["_nk"]), KeyState.decode(bytes(r["_v"]))
            continue
        raw = r["_v"]  # bytes (Arrow's binary as a Python value), or None
        try:
            if r.get("_derr") is not None:  # an Avro record that did not decode (its JSON text is null)
                raise EventInvalid(r["_derr"])
            if r["_nk"] is None:
                parse_key(None)  # raises: a record without key
            event = parse_value(raw, defer_after=True)
            if event is not None and r["_bad"]:
                raise EventInvalid(SCHEMA_REASON)
        except EventInvalid as e:
            key = r["_k"]
            if "_ok" in r:  # Avro: the error row keeps the record as it was, not its JSON text
                key, raw = r["_ok"], r["_ov"]
            out.append((None, r["ts"], 1, ERRORS_OUTPUT, r["_p"], r["_o"], key, raw, e.reason,
                        None, None, None, None, None))
            continue
        nk = bytes(r["_nk"])
        a = apply(state, event)
        state = a.state
        for row, d in a.updates:
            totals[(row, r["ts"])] += d
        last = r
    summed: dict[tuple[str, int], int] = defaultdict(int)
    for (row, ts), d in totals.items():
        if d:
            summed[(row_text(row), ts)] += d
    for (row, ts), d in summed.items():
        if d:
            out.append((row, ts, d, DATA_OUTPUT, None, None, None, None, None, None, None, None, None, None))
    if last is not None:  # every key a record was applied to has its state row (see :func:`fold_local`)
        state = state if state is not None else KeyState(None, None)  # only tombstones: as a key never seen
        out.append((None, last["ts"], 0, STATE_OUTPUT, None, None, None, None, None, nk, state.encode(),
                    last["_p"], last["_o"], last["_t_us"]))
    return out


@functools.cache  # once per worker process, not once per batch (:func:`_folded_batch`)
def _folded_arrow_schema():
    import pyarrow as pa

    types = {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32(), "BINARY": pa.binary()}
    return pa.schema([(name, types[t]) for name, t in (c.split() for c in _FOLDED.split(", "))])


def _folded_batch(out: list[tuple]):
    """Rows of :data:`_FOLDED` as one Arrow batch."""
    import pyarrow as pa

    schema = _folded_arrow_schema()
    return pa.RecordBatch.from_arrays([pa.array([r[i] for r in out], type=f.type) for i, f in enumerate(schema)],
                                      schema=schema)


def fold_sorted(batches):
    """``mapInArrow``'s function: Arrow batches of records and prior state rows, sorted by key (``_nk``), folded
    a key at a time (:func:`fold_key`; a key's rows may span batches), as batches of :data:`_FOLDED`. One
    Python call per batch instead of one pandas frame per key: a slice touches many keys, most with a few
    events."""
    return _fold_runs(batches, "_nk", lambda nk: nk, {})


def fold_local(prior: dict[bytes, dict]):
    """``mapInArrow``'s function for a slice folded where it was read (no shuffle): each task's records sorted
    by their raw key (``_k``), a run of one key normalised once (``parse_key``), the key's prior state row
    taken from ``prior`` (normalised key -> the row :func:`fold_key` takes), each key folded by
    :func:`fold_key` as :func:`fold_sorted` folds it.

    Exact only when every key's records are in one task and adjacent there (a Kafka partition read as one
    Spark partition, a key's events in one Kafka partition, one raw form per key). When they are not, a key
    folded in two places gives two state rows (:func:`fold_key` writes one for every key a record was
    applied to): the caller checks the state rows' keys are distinct (:func:`keys_distinct`) and folds the
    slice again with a shuffle otherwise."""
    return lambda batches: _fold_runs(batches, "_k", _key_of, prior)


_UNSEEN = object()


def _fold_runs(batches, column: str, normalise, prior: dict[bytes, dict]):
    """Batches of rows sorted by ``column``, folded a key at a time (:func:`fold_key`): a run of one value of
    ``column`` normalised once (the key, ``_nk``); consecutive runs of one key are one key; the key's row of
    ``prior``, if any, goes first. Each row a dict of its columns, built as it is read."""
    current: list[dict] = []
    last, nk = _UNSEEN, None
    for b in batches:
        names = b.schema.names
        at = names.index(column)
        out: list[tuple] = []
        for values in zip(*(c.to_pylist() for c in b.columns)):
            if values[at] != last:  # a new run: its key, once
                last, key = values[at], normalise(values[at])
                if not current or key != nk:
                    if current:
                        out.extend(fold_key(current))
                    current, nk = [], key
                    if key is not None and key in prior:
                        current.append(prior[key])
            row = dict(zip(names, values))
            row["_nk"] = nk
            current.append(row)
        if out:
            yield _folded_batch(out)
    if current:
        yield _folded_batch(fold_key(current))


def prior_rows(prior: Sequence[tuple], avro: bool) -> dict[bytes, dict]:
    """The upsert state rows ``prior`` (``(key, value, partition, offset, timestamp_us)``) as :func:`fold_key`
    takes them, by key."""
    extra = {"_derr": None, "_ok": None, "_ov": None} if avro else {}
    return {bytes(k): {"_k": bytes(k), "_v": bytes(v), "_p": p, "_o": o, "_t_us": t, "ts": -1, "_bad": False,
                       "_prior": True, "_nk": bytes(k), **extra} for k, v, p, o, t in prior}


def keys_distinct(state) -> bool:
    """Whether the state change rows ``state`` (an Arrow table with ``key``) hold each key once: a slice
    folded where it was read (:func:`fold_local`) folded every key in one place."""
    import pyarrow.compute as pc

    return state.num_rows == 0 or pc.count_distinct(state.column("key"), mode="all").as_py() == state.num_rows


def changes(spark, spec: SourceSpec, shape: RecordShape, records, prior: Sequence[tuple], prior_ddl: str,
            data_cols: list[str], row_schema, plan=None, local: bool = False):
    """``records`` (a Kafka slice, reclocked) through the debezium envelope: the columns an upsert slice's
    rows have (``data_cols``, ts, diff, the error and state columns, ``_output``). ``prior``: the upsert
    state rows of the keys the slice touches (their keys without schema wrapper, their values
    :class:`~reclock.debezium.KeyState`; ``prior_ddl`` their Spark schema); ``row_schema``: the declared schema of a row (Spark's).
    ``plan`` (Avro): the writer schemas, a ``reclock.registry_plan.debezium_plan``. ``local``: each task folds
    the records it read (:func:`fold_local`: no shuffle; the caller checks every key was folded in one place),
    else the records are repartitioned and sorted by key first (:func:`fold_sorted`)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    avro = spec.format.type == "avro"
    if avro:  # Avro through the registry: each record as the JSON text Debezium's JSON converter writes
        records = _avro_as_json(records, plan)
    corrupt = "_reclock_corrupt"
    # the row checked against the declared schema, with Connect's schemas or without: PERMISSIVE parsing
    # sets the corrupt-record column when a field of `after` does not fit its type
    envelope = T.StructType([T.StructField("after", row_schema),
                             T.StructField("payload", T.StructType([T.StructField("after", row_schema)])),
                             T.StructField(corrupt, T.StringType())])
    opts = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": corrupt}
    parsed = F.from_json(F.col("value").cast("string"), envelope, opts)
    norm = F.pandas_udf(lambda s: s.map(_key_of), "binary")
    (p, _), (o, _) = shape.positions
    recs = records.select(F.col("key").alias("_k"), F.col("value").alias("_v"), F.col(p).alias("_p"),
                          F.col(o).alias("_o"), F.unix_micros("timestamp").alias("_t_us"), "ts",
                          parsed.getField(corrupt).isNotNull().alias("_bad"), F.lit(False).alias("_prior"),
                          *(("_derr", "_ok", "_ov") if avro else ()))
    if local:
        folded = recs.sortWithinPartitions("_k").mapInArrow(fold_local(prior_rows(prior, avro)), _FOLDED)
    else:
        folded = _shuffled(spark, recs.withColumn("_nk", norm(F.col("_k"))), prior, prior_ddl, p, o, avro)
    row = F.from_json(F.col("_row"), row_schema)
    errors = dict(zip(shape.error_columns, ("_ep", "_eo", "_ek", "_er", "_ereason")))
    states = dict(zip(shape.state_columns, ("_sk", "_sv", "_sp", "_so", "_st")))
    return folded.select(*[row.getField(c).alias(c) for c in data_cols], "ts", "diff",
                         *[F.col(v).alias(ERR_PREFIX + c) for c, v in errors.items()],
                         *[F.col(v).alias(STATE_PREFIX + c) for c, v in states.items()], "_output")


def _shuffled(spark, recs, prior: Sequence[tuple], prior_ddl: str, p: str, o: str, avro: bool):
    """The records (with their normalised key ``_nk``) and the prior state rows, a key's rows together in one
    task and sorted by key, folded (:func:`fold_sorted`)."""
    from pyspark.sql import functions as F

    before = spark.createDataFrame(list(prior), prior_ddl).select(
        F.col("key").alias("_k"), F.col("value").alias("_v"), F.col(p).alias("_p"), F.col(o).alias("_o"),
        F.col("timestamp_us").alias("_t_us"), F.lit(-1).cast("long").alias("ts"), F.lit(False).alias("_bad"),
        F.lit(True).alias("_prior"), F.col("key").alias("_nk"),
        *((F.lit(None).cast("string").alias("_derr"), F.lit(None).cast("binary").alias("_ok"),
           F.lit(None).cast("binary").alias("_ov")) if avro else ()))
    # a key's rows together and in one task (a record without key, _nk null, is an error row of its own)
    return recs.unionByName(before).repartition("_nk").sortWithinPartitions("_nk").mapInArrow(fold_sorted, _FOLDED)


def plan_converter(plan):
    """An :class:`~reclock.debezium_avro.AvroJson` that knows the writers of ``plan`` (a
    ``reclock.registry_plan.debezium_plan``, made in the driver) and asks no registry: an id the registry
    answered it does not hold (``plan.missing``) is a decode error naming it; an id the plan does not know
    is one too, and the job's ``unknown`` metric tells the driver, which asks the registry and writes the
    description again (``reclock.sources.kafka.kind``), so such a row is never appended."""
    from reclock.debezium_avro import AvroJson

    known = {w.schema_id: w.schema for w in plan.writers}
    missing = set(plan.missing)

    def lookup(i: int) -> str:
        if i in known:
            return known[i]
        raise _NotPlanned("the registry answered it holds no such schema" if i in missing
                          else "not in this write's plan: the description is written again with it")

    return AvroJson(lookup, _NotPlanned)


class _NotPlanned(LookupError):
    """A writer id the plan has no schema for."""


def _avro_as_json(records, plan):
    """``records`` with ``key`` and ``value`` (Confluent wire-format Avro) as JSON text, the records as they were
    in ``_ok``, ``_ov`` and, for one that does not decode, the reason in ``_derr`` (its key and value null).
    The writer schemas are the ``plan``'s, fetched in the driver before the job (a registry that does not
    answer stalls the source there); the tasks ask no registry (:func:`plan_converter`)."""
    import pyarrow as pa
    from pyspark.sql import types as T

    from reclock.debezium import EventInvalid as Invalid

    out_schema = T.StructType(records.schema.fields + [T.StructField("_derr", T.StringType()),
                                                       T.StructField("_ok", T.BinaryType()),
                                                       T.StructField("_ov", T.BinaryType())])

    def convert(batches):
        c = plan_converter(plan)
        for b in batches:
            keys, values = b.column("key").to_pylist(), b.column("value").to_pylist()
            jk, jv, err = [], [], []
            for k, v in zip(keys, values):
                try:
                    one = (None if k is None else c.text(bytes(k), "the key"),
                           c.text(None if v is None else bytes(v), "the value"), None)
                except Invalid as e:
                    one = (None, None, e.reason)
                jk.append(one[0])
                jv.append(one[1])
                err.append(one[2])
            cols = {n: b.column(n) for n in b.schema.names}
            cols.update(key=pa.array(jk, pa.binary()), value=pa.array(jv, pa.binary()))
            yield pa.RecordBatch.from_arrays(
                [*cols.values(), pa.array(err, pa.string()), b.column("key"), b.column("value")],
                names=[*cols, "_derr", "_ok", "_ov"])

    return records.mapInArrow(convert, out_schema)
