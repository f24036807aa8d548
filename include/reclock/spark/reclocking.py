"""Reclocking on Spark, for any kind whose FromTime maps onto ``(partition, offset)`` integers: give each record
read from a bound range the ``ts`` of the binding whose offset range holds it, vectorised (a SQL expression
compiled into the scan's generated code, or a broadcast range join), never a per-record Python function.

A kind's Spark job reads its records with ``partition`` and ``offset`` columns and hands them to
:func:`reclocked` with the description's :class:`BindingRange` s (``reclock.remap.reclock_ranges``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from reclock.batch import OffsetRange


@dataclass(frozen=True)
class BindingRange:
    """Offsets ``[start, end)`` of ``partition`` are bound at ``ts``."""

    partition: int
    start: int
    end: int
    ts: int


CASE_LIMIT = 256
"""Up to this many binding ranges in a slice, reclocking is one ``CASE`` expression over (partition, offset),
compiled into the scan's generated code; above it (a rebuild over a long history), a broadcast range join."""


def _intersecting(ranges: Sequence[OffsetRange], bindings: Sequence[BindingRange]) -> list[BindingRange]:
    """The bindings whose offset range intersects ``ranges`` (the only ones a slice's records can fall in)."""
    wanted = {r.partition: r for r in ranges}
    return [b for b in bindings if b.partition in wanted
            and b.start < wanted[b.partition].end and b.end > wanted[b.partition].start]


def reclock_case_sql(bindings: Sequence[BindingRange]) -> str:
    """The SQL expression giving each record the ts of the binding whose range holds its offset (NULL where
    none does).

    Per partition the bindings are disjoint offset ranges, so the branch order does not matter; every value
    is an integer, so the text needs no quoting."""
    by_partition = _by_partition(bindings)
    if not by_partition:
        return "CAST(NULL AS BIGINT)"
    arms = []
    for p, bs in sorted(by_partition.items()):
        inner = " ".join(f"WHEN offset >= {b.start} AND offset < {b.end} THEN CAST({b.ts} AS BIGINT)" for b in bs)
        arms.append(f"WHEN partition = {int(p)} THEN CASE {inner} END")
    return f"CASE {' '.join(arms)} END"


def _by_partition(bindings: Sequence[BindingRange]) -> dict[int, list[BindingRange]]:
    out: dict[int, list[BindingRange]] = {}
    for b in sorted(bindings, key=lambda b: (b.partition, b.start)):
        out.setdefault(b.partition, []).append(b)
    return out


def _covers(r: OffsetRange, bindings: Sequence[BindingRange]) -> bool:
    """Whether ``bindings`` (one partition's, by start) leave no offset of ``r`` unbound."""
    at = r.start
    for b in bindings:
        if b.start > at:
            return False
        at = max(at, b.end)
    return at >= r.end


def reclock_ts_sql(ranges: Sequence[OffsetRange], bindings: Sequence[BindingRange]) -> tuple[str, bool]:
    """The SQL expression giving each record of ``ranges`` the ts of the binding that holds its offset, and
    whether records no binding holds must still be dropped (their ts is NULL).

    A description's ranges are exactly what its bindings cover (:func:`reclock.batch.ranges_for`), so the
    usual answer needs no filter and no comparisons: where each partition's range lies in one binding, the
    ts is an array's entry for the partition; otherwise a partition whose range lies in one binding is one
    ``CASE partition`` arm, and only a partition that several bindings share compares offsets, against each
    binding's end. Ranges the bindings do not cover (never from a description) get the general
    :func:`reclock_case_sql` and the filter."""
    return _ts_sql(ranges, _intersecting(ranges, bindings))


BY_PARTITION_LIMIT = 4096
"""Partitions below this number get their ts from an array indexed by partition (see :func:`_ts_sql`)."""


def _ts_sql(ranges: Sequence[OffsetRange], hits: Sequence[BindingRange]) -> tuple[str, bool]:
    """:func:`reclock_ts_sql` over ``hits``, the bindings already known to intersect ``ranges``.

    Where each partition's range lies in one binding (a cycle's usual slice), the ts comes from an array
    with one entry per partition, indexed by ``partition``: Spark passes an array literal to its generated
    code by reference, where it writes a number literal into the code itself, so the next cycle's new
    timestamps would miss Spark's code cache and its branches be compiled again."""
    by_partition = _by_partition(hits)
    if not ranges or not all(_covers(r, by_partition.get(r.partition, ())) for r in ranges):
        return reclock_case_sql(hits), True
    top = max(by_partition)
    if all(len(bs) == 1 for bs in by_partition.values()) and top < BY_PARTITION_LIMIT:
        entries = ["NULL"] * (top + 1)
        for p, (b,) in by_partition.items():
            entries[p] = str(int(b.ts))
        return f"CAST(element_at(array({', '.join(entries)}), partition + 1) AS BIGINT)", False
    arms = []
    for p, bs in sorted(by_partition.items()):
        if len(bs) == 1:
            arm = f"CAST({bs[0].ts} AS BIGINT)"
        else:
            arm = "CASE " + " ".join(f"WHEN offset < {b.end} THEN CAST({b.ts} AS BIGINT)" for b in bs[:-1]) + \
                f" ELSE CAST({bs[-1].ts} AS BIGINT) END"
        arms.append(f"WHEN {int(p)} THEN {arm}")
    return f"CASE partition {' '.join(arms)} END", False


def reclocked(spark, raw, ranges: Sequence[OffsetRange], bindings: Sequence[BindingRange]):
    """``raw`` (a DataFrame of the records of ``ranges``, with integer ``partition`` and ``offset`` columns)
    with the ``ts`` of the binding that covers each offset (a record that no binding covers is dropped, as by
    an inner join: the read ranges are the bindings' ranges, so none is).

    Vectorised either way, never a per-record Python function: a SQL expression
    (:func:`reclock_ts_sql`: usually an array's entry per partition) when the slice intersects at most
    :data:`CASE_LIMIT` binding ranges (the usual cycle: one or a few bindings per partition), else a
    broadcast range join against those bindings."""
    from pyspark.sql import functions as F

    hits = _intersecting(ranges, bindings)
    if len(hits) <= CASE_LIMIT:
        expr, drop_unbound = _ts_sql(ranges, hits)
        df = raw.withColumn("ts", F.expr(expr))
        return df.filter("ts IS NOT NULL") if drop_unbound else df
    bdf = spark.createDataFrame([(b.partition, b.start, b.end, b.ts) for b in hits],
                                "b_partition INT, b_start BIGINT, b_end BIGINT, ts BIGINT")
    return raw.join(F.broadcast(bdf), (raw["partition"] == bdf["b_partition"]) & (raw["offset"] >= bdf["b_start"])
                    & (raw["offset"] < bdf["b_end"]), "inner").drop("b_partition", "b_start", "b_end")
