"""The ``debezium`` envelope on Spark: a slice's Debezium change events, grouped by key with the key's upsert
state row, folded event by event with :func:`reclock.debezium.apply` (one concept, one place: the Spark job
applies the pure module's rules, it does not restate them; unlike :func:`~reclock.debezium.fold`, a malformed
record goes to the errors and the fold goes on), and routed like an upsert slice's rows (output 0 the collection,
1 the error collection, 2 the upsert state's changes).

::

    records (key, value, partition, offset, timestamp, ts)        prior: state rows of the keys touched
        | the row (``after``) checked against the declared schema      | (key, KeyState bytes, ...)
        v                                                              v
    key without Connect's schema wrapper (``parse_key``)  ----- union, group by key ----->  per key, in
    (partition, offset) order: ``apply`` each event to the key's state; updates summed per (row, ts)
        |
        v
    +-1 rows (``after`` as Debezium wrote it, decoded by the declared schema), error rows (a record that is
    not a change event, has no key, or whose row does not fit the schema: never dropped), and one state row
    per key (its ``KeyState``, kept by ``reclock.persist.upsert_state`` as the upsert envelope's values are)

A key's records are folded in one Python task (a grouped map): a key's events form a sequence whose every
step depends on the one before, as the pure fold says.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from reclock.debezium import EventInvalid, KeyState, apply, parse_key, parse_value
from reclock.part_layout import DATA_OUTPUT, ERR_PREFIX, ERRORS_OUTPUT, STATE_OUTPUT, STATE_PREFIX, RecordShape
from reclock.specs import SourceSpec

SCHEMA_REASON = "the row (after) does not parse as JSON of the declared schema"
_FOLDED = ("_row STRING, ts BIGINT, diff BIGINT, _output INT, _ep INT, _eo BIGINT, _ek BINARY, _er BINARY, "
           "_ereason STRING, _sk BINARY, _sv BINARY, _sp INT, _so BIGINT, _st BIGINT")


def _key_of(k):
    return None if k is None else parse_key(bytes(k))


def fold_group(pdf):
    """One key's prior state row (``_prior``) and records, folded (a pandas frame of :data:`_FOLDED`)."""
    import pandas as pd

    pdf = pdf.sort_values(["_prior", "_p", "_o"], ascending=[False, True, True], kind="stable")
    out: list[tuple] = []
    state = None
    totals: dict[tuple[str, int], int] = defaultdict(int)
    last = None
    nk = None
    for r in pdf.to_dict("records"):
        if r["_prior"]:
            nk, state = bytes(r["_nk"]), KeyState.decode(bytes(r["_v"]))
            continue
        raw = None if r["_v"] is None else bytes(r["_v"])
        key = None if r["_k"] is None else bytes(r["_k"])
        try:
            if r["_nk"] is None:
                parse_key(None)  # raises: a record without key
            event = parse_value(raw)
            if event is not None and r["_bad"]:
                raise EventInvalid(SCHEMA_REASON)
        except EventInvalid as e:
            out.append((None, r["ts"], 1, ERRORS_OUTPUT, r["_p"], r["_o"], key, raw, e.reason,
                        None, None, None, None, None))
            continue
        nk = bytes(r["_nk"])
        a = apply(state, event)
        state = a.state
        for row, d in a.updates:
            totals[(row, r["ts"])] += d
        last = r
    for (row, ts), d in totals.items():
        if d:
            out.append((row, ts, d, DATA_OUTPUT, None, None, None, None, None, None, None, None, None, None))
    if last is not None and state is not None:
        out.append((None, last["ts"], 0, STATE_OUTPUT, None, None, None, None, None, nk, state.encode(),
                    last["_p"], last["_o"], last["_t_us"]))
    # nullable integer columns: a float column (pandas' default with nulls) would round offsets past 2**53
    types = {"INT": "Int32", "BIGINT": "Int64"}
    cols = [c.split() for c in _FOLDED.split(", ")]
    return pd.DataFrame({name: pd.array([r[i] for r in out], dtype=types.get(t, object))
                         for i, (name, t) in enumerate(cols)})


def changes(spark, spec: SourceSpec, shape: RecordShape, records, prior: Sequence[tuple], prior_ddl: str,
            data_cols: list[str], row_schema):
    """``records`` (a Kafka slice, reclocked) through the debezium envelope: the columns an upsert slice's
    rows have (``data_cols``, ts, diff, the error and state columns, ``_output``). ``prior``: the upsert
    state rows of the keys the slice touches (their keys without schema wrapper, their values
    :class:`~reclock.debezium.KeyState`; ``prior_ddl`` their Spark schema); ``row_schema``: the declared schema of a row (Spark's)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

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
                          parsed.getField(corrupt).isNotNull().alias("_bad"), F.lit(False).alias("_prior"))
    recs = recs.withColumn("_nk", norm(F.col("_k")))
    before = spark.createDataFrame(list(prior), prior_ddl).select(
        F.col("key").alias("_k"), F.col("value").alias("_v"), F.col(p).alias("_p"), F.col(o).alias("_o"),
        F.col("timestamp_us").alias("_t_us"), F.lit(-1).cast("long").alias("ts"), F.lit(False).alias("_bad"),
        F.lit(True).alias("_prior"), F.col("key").alias("_nk"))
    folded = recs.unionByName(before).groupBy("_nk").applyInPandas(fold_group, _FOLDED)
    row = F.from_json(F.col("_row"), row_schema)
    errors = dict(zip(shape.error_columns, ("_ep", "_eo", "_ek", "_er", "_ereason")))
    states = dict(zip(shape.state_columns, ("_sk", "_sv", "_sp", "_so", "_st")))
    return folded.select(*[row.getField(c).alias(c) for c in data_cols], "ts", "diff",
                         *[F.col(v).alias(ERR_PREFIX + c) for c, v in errors.items()],
                         *[F.col(v).alias(STATE_PREFIX + c) for c, v in states.items()], "_output")
