"""Compaction of shard parts against real Postgres: reads AS OF every ``t >= since`` and reads of the updates
above since are the same before and after, batch rows drop, a race with a rebuild or another compaction
changes nothing, read holds keep it back, and garbage collection takes the replaced parts, never the merged.

The parts are written with pyarrow the way a cycle's Spark job writes them: under the source's folder, one
file per output, every file with the union of the data shard's and the errors shard's columns (the errors
shard's prefixed with ``_reclock_err_``), timestamps as INT96.
"""

from __future__ import annotations

import io
import math
import os
import random
import struct
import time
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reclock.batch import BatchDescription as D, Part
from reclock.failpoints import FailpointHit, enabled
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.compact import compact_parts
from reclock.persist.gc import collect_garbage
from reclock.persist.remap_store import register_source
from reclock.persist.shards import (Append, Merge, acquire_read_hold, advance_since, batches, compare_and_append,
                                    merge_batches, register_shard, shard_info, swap_batches, Swap)
from reclock.read import read_as_of, read_updates

DATA, ERRORS = "orders", "orders_errors"
UNION = pa.schema([("id", pa.int64()), ("name", pa.string()), ("price", pa.float64()),
                   ("created", pa.timestamp("ns")), ("ts", pa.int64()), ("diff", pa.int64()),
                   ("_reclock_err_offset", pa.int64()), ("_reclock_err_raw", pa.binary()),
                   ("_reclock_err_reason", pa.string())])
STEP = 10  # each cycle's description is [STEP * i, STEP * (i + 1))


def write_part(store: LocalBlobStore, desc: D, output: int, rows: list[dict]) -> Part:
    """One Parquet file as a cycle's Spark job writes it (the union of columns, INT96 timestamps)."""
    table = pa.Table.from_pylist([{**dict.fromkeys(UNION.names), **r} for r in rows], schema=UNION)
    buf = io.BytesIO()
    pq.write_table(table, buf, use_deprecated_int96_timestamps=True, store_schema=False)
    path = f"orders/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}/slice-0000/_output={output}/part-0.parquet"
    store.put_bytes(path, buf.getvalue())
    ts = table["ts"].to_pylist()
    return Part(path, table.num_rows, len(buf.getvalue()), min(ts), max(ts))


def run_cycles(conn, store: LocalBlobStore, cycles: int, seed: int = 7, start: int = 0) -> None:
    """``cycles`` appends to both shards: inserts (nulls, NaN), retractions of earlier rows (they cancel),
    duplicates (they sum), two data parts a cycle and an error part every other cycle."""
    rng = random.Random(seed + start)
    live: list[dict] = [r for b in batches(conn, DATA) for r in _rows(store, b.path) if r["diff"] > 0]
    for i in range(start, start + cycles):
        desc = D(STEP * i, STEP * (i + 1))
        rows = []
        for k in range(4):
            n = 4 * i + k
            row = {"id": n, "name": None if n % 5 == 0 else f"n{n % 3}",
                   "price": [1.5, math.nan, None, -0.0][n % 4], "created": 1_700_000_000_000_000_000 + n % 2}
            rows.append({**row, "ts": desc.lower + rng.randrange(STEP), "diff": 1})
        for old in rng.sample(live, min(2, len(live))):
            rows.append({**old, "ts": desc.lower + rng.randrange(STEP), "diff": -1})  # retracted
            rows.append({**old, "ts": desc.lower + rng.randrange(STEP), "diff": 1})  # ... and back: it sums
            rows.append({**old, "ts": desc.lower + rng.randrange(STEP), "diff": 1})  # a duplicate
        live += [r for r in rows if r["diff"] > 0]
        data = tuple(write_part(store, desc, 0, part) for part in (rows[::2], rows[1::2]))
        errors = () if i % 2 else (write_part(store, desc, 1, [{
            "_reclock_err_offset": i, "_reclock_err_raw": b"{bad" if i % 4 else None,
            "_reclock_err_reason": "not JSON", "ts": desc.upper - 1, "diff": 1}]),)
        compare_and_append(conn, [Append(DATA, desc, data), Append(ERRORS, desc, errors)])


def _read(store: LocalBlobStore, path: str) -> pa.Table:
    with store.open(path) as f:
        return pq.read_table(f)


def _rows(store: LocalBlobStore, path: str) -> list[dict]:
    """A data part's rows: data columns and diff."""
    return _read(store, path).select(["id", "name", "price", "created", "diff"]).to_pylist()


def _key(v):
    return struct.pack("<d", v) if isinstance(v, float) else v


def bag(table: pa.Table | None) -> Counter:
    """Rows as a multiset; floats by their bits (NaN is a value like any other)."""
    return Counter() if table is None else Counter(tuple((k, _key(v)) for k, v in sorted(r.items()))
                                                   for r in table.to_pylist())


def reads(conn, store, shard: str) -> dict:
    """Every read compaction must not change: AS OF each t in [since, upper), and the updates from each
    lower above since (to the upper, and to a few uppers below it)."""
    info = shard_info(conn, shard)
    out = {("as_of", t): bag(read_as_of(conn, store, shard, t)) for t in range(info.since, info.upper)}
    for lower in range(info.since + 1, info.upper, 3):
        out[("updates", lower, None)] = bag(read_updates(conn, store, shard, lower))
        out[("updates", lower, lower + 7)] = bag(read_updates(conn, store, shard, lower, lower + 7))
    return out


@pytest.fixture
def orders(conn, tmp_path):
    register_source(conn, "orders")
    register_shard(conn, DATA, source="orders", output=0)
    register_shard(conn, ERRORS, source="orders", output=1, kind="errors")
    return conn, LocalBlobStore(tmp_path / "blobs")


def test_compaction_changes_no_read_at_or_after_since(orders):
    conn, store = orders
    run_cycles(conn, store, 12)  # upper 120
    for s in (DATA, ERRORS):
        assert advance_since(conn, s, 79) == 79  # cycles 0..7 are at or below since
    before = {s: reads(conn, store, s) for s in (DATA, ERRORS)}
    assert sum(bag(read_as_of(conn, store, DATA, 79)).values()) > 20 and before[DATA][("as_of", 79)]
    n_before = {s: len(batches(conn, s)) for s in (DATA, ERRORS)}

    reports = {s: compact_parts(conn, store, s, min_parts=4) for s in (DATA, ERRORS)}
    assert {s: (r.status, r.parts_merged, r.parts_written) for s, r in reports.items()} == \
        {DATA: ("merged", 16, 1), ERRORS: ("merged", 4, 1)}
    data = reports[DATA]
    assert (data.parts_before, data.parts_after) == (n_before[DATA], n_before[DATA] - 15) == (24, 9)
    assert 0 < data.rows_after < data.rows_before and 0 < data.bytes_written and data.bytes_read > 0
    assert {s: reads(conn, store, s) for s in (DATA, ERRORS)} == before

    for s, upper in ((DATA, 80), (ERRORS, 70)):  # errors every other cycle: the last in cycle 6
        merged = batches(conn, s)[0]
        assert (merged.lower, merged.upper, merged.min_ts, merged.max_ts) == (0, upper, upper - 1, upper - 1)
        assert merged.path.startswith(f"{s}/0-{upper}/")
        assert all(b.lower >= 80 for b in batches(conn, s)[1:])
        with store.open(merged.path) as f:
            columns = pq.read_schema(f).names
        if s == ERRORS:  # the on-file names: the errors shard's columns keep their prefix
            assert columns == ["_reclock_err_offset", "_reclock_err_raw", "_reclock_err_reason", "ts", "diff"]
        else:
            assert columns == ["id", "name", "price", "created", "ts", "diff"]
    merged_data = _read(store, batches(conn, DATA)[0].path)
    assert merged_data.schema.field("created").type == pa.timestamp("ns")  # as the INT96 parts read
    assert 0 not in merged_data["diff"].to_pylist() and max(merged_data["diff"].to_pylist()) > 1  # duplicates sum
    keys = Counter(tuple(_key(v) for k, v in r.items() if k != "diff") for r in merged_data.to_pylist())
    assert max(keys.values()) == 1  # consolidated: one row per (data, ts), nulls and NaN included

    # nothing new at or below since: a second compaction is a no-op
    again = compact_parts(conn, store, DATA, min_parts=4)
    assert (again.status, again.parts_merged, again.parts_written, again.bytes_read) == ("nothing_to_do", 0, 0, 0)

    # more cycles and a later since: the merged part is merged again with the new candidates
    run_cycles(conn, store, 4, start=12)
    advance_since(conn, DATA, 139)
    before = reads(conn, store, DATA)
    report = compact_parts(conn, store, DATA, min_parts=4)
    assert (report.status, report.parts_merged) == ("merged", 13)  # the merged part + cycles 8..13
    assert [(b.lower, b.upper) for b in batches(conn, DATA)][:1] == [(0, 140)]
    assert reads(conn, store, DATA) == before


def test_fewer_than_min_parts_candidates_is_a_no_op(orders):
    conn, store = orders
    run_cycles(conn, store, 6)
    advance_since(conn, DATA, 29)  # 3 cycles: 6 candidates
    before = batches(conn, DATA)
    report = compact_parts(conn, store, DATA, min_parts=7)
    assert (report.status, report.parts_before, report.parts_after) == ("nothing_to_do", 12, 12)
    assert batches(conn, DATA) == before
    # big parts are not candidates at all
    assert compact_parts(conn, store, DATA, min_parts=2, target_bytes=100).status == "nothing_to_do"
    assert compact_parts(conn, store, DATA, min_parts=6).status == "merged"


def test_runs_are_bounded_by_the_target(orders):
    conn, store = orders
    run_cycles(conn, store, 10)
    advance_since(conn, DATA, 99)
    before = reads(conn, store, DATA)
    part_bytes = max(b.bytes for b in batches(conn, DATA))
    report = compact_parts(conn, store, DATA, min_parts=4, target_bytes=5 * part_bytes)
    assert report.status == "merged" and report.parts_written >= 2  # 20 parts, about 5 a run
    assert report.parts_after == 20 - report.parts_merged + report.parts_written == len(batches(conn, DATA))
    merged = [b for b in batches(conn, DATA) if b.path.startswith(f"{DATA}/")]
    assert len(merged) == report.parts_written and all(b.max_ts == b.upper - 1 for b in merged)
    assert reads(conn, store, DATA) == before


def test_an_append_only_run_is_streamed_a_batch_at_a_time(orders, monkeypatch):
    """No retraction in any footer: the run is merged a few rows at a time, never held whole; a part
    written without a column (an older schema) gets it as nulls; every read is the same."""
    from reclock.persist import compact

    conn, store = orders
    monkeypatch.setattr(compact, "STREAM_BATCH_ROWS", 3)
    held = []
    conform = compact.conform
    monkeypatch.setattr(compact, "_read_run", lambda *a: pytest.fail("an append-only run was read whole"))
    for i in range(6):
        desc = D(STEP * i, STEP * (i + 1))
        rows = [{"id": 10 * i + k, "name": f"n{k}", "price": [1.5, math.nan, None][k % 3],
                 "created": 1_700_000_000_000_000_000 + k, "ts": desc.lower + k, "diff": 1 + k % 2} for k in range(7)]
        part = write_part(store, desc, 0, rows)
        if i == 2:  # the same rows, written before the "price" column existed
            table = _read(store, part.path).drop_columns(["price"])
            buf = io.BytesIO()
            pq.write_table(table, buf, use_deprecated_int96_timestamps=True)
            store.put_bytes(part.path, buf.getvalue())
            part = Part(part.path, part.rows, len(buf.getvalue()), part.min_ts, part.max_ts)
        compare_and_append(conn, [Append(DATA, desc, (part,))])
    advance_since(conn, DATA, 49)
    before = reads(conn, store, DATA)
    monkeypatch.setattr(compact, "conform", lambda b, schema: held.append(b.num_rows) or conform(b, schema))
    report = compact_parts(conn, store, DATA, min_parts=4)
    monkeypatch.setattr(compact, "conform", conform)  # reads conform their batches too
    assert (report.status, report.parts_merged, report.parts_written) == ("merged", 5, 1)
    assert report.rows_before == report.rows_after == 35 and held and max(held) <= 3
    assert reads(conn, store, DATA) == before
    merged = _read(store, batches(conn, DATA)[0].path)
    assert merged.schema.field("created").type == pa.timestamp("ns") and set(merged["ts"].to_pylist()) == {49}
    assert merged["price"].null_count == 7 + 4 * 2  # the part without the column; two None prices in each other


def test_a_run_with_retractions_is_cut_to_the_decoded_limit(orders):
    conn, store = orders
    run_cycles(conn, store, 12)
    advance_since(conn, DATA, 79)
    before = reads(conn, store, DATA)
    decoded = []
    for b in batches(conn, DATA)[:16]:
        with store.open(b.path) as f:
            md = pq.ParquetFile(f).metadata
            decoded.append(sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups)))
    limit = sum(decoded[:5])  # the first five candidates fit, the sixth does not
    report = compact_parts(conn, store, DATA, min_parts=4, decoded_limit=limit)
    assert (report.status, report.parts_merged, report.parts_written) == ("merged", 5, 1)
    assert reads(conn, store, DATA) == before
    again = compact_parts(conn, store, DATA, min_parts=4, decoded_limit=limit)  # the merged part and the next
    assert again.status == "merged" and 2 <= again.parts_merged < 16 - 5 + 1
    assert reads(conn, store, DATA) == before
    too_small = compact_parts(conn, store, DATA, min_parts=2, decoded_limit=1)  # one part each: nothing merges
    assert (too_small.status, too_small.parts_merged) == ("nothing_to_do", 0)


def test_footer_statistics_are_found_by_column_path_past_nested_columns():
    """A struct column's leaves come before ``ts`` in the footer: the Arrow field index would name the wrong
    leaf; the path names the right one."""
    from reclock.persist.parquet import column_stats

    table = pa.table({"addr": pa.array([{"city": "a", "zip": 9}, {"city": "b", "zip": 7}]),
                      "ts": pa.array([5, 3], pa.int64()), "diff": pa.array([1, -1], pa.int64())})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    md = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata
    assert [(s.min, s.max) for s in column_stats(md, "ts")] == [(3, 5)]
    assert [(s.min, s.max) for s in column_stats(md, "diff")] == [(-1, 1)]
    assert column_stats(md, "nope") is None


def test_updates_that_cancel_out_leave_no_part(orders):
    conn, store = orders
    desc = D(0, 10)
    row = {"id": 1, "name": None, "price": math.nan}
    parts = [write_part(store, desc, 0, [{**row, "ts": t, "diff": d}]) for t, d in ((1, 1), (2, -1), (3, 1), (4, -1))]
    compare_and_append(conn, [Append(DATA, desc, parts)])
    later = write_part(store, D(10, 20), 0, [{**row, "ts": 15, "diff": 1}])
    compare_and_append(conn, [Append(DATA, D(10, 20), (later,))])
    advance_since(conn, DATA, 12)
    before = reads(conn, store, DATA)
    report = compact_parts(conn, store, DATA, min_parts=4)
    assert (report.status, report.parts_merged, report.parts_written, report.rows_after) == ("merged", 4, 0, 0)
    assert [(b.lower, b.upper) for b in batches(conn, DATA)] == [(10, 20)]
    assert reads(conn, store, DATA) == before
    assert bag(read_as_of(conn, store, DATA, 19)) == bag(pa.Table.from_pylist(
        [{"id": 1, "name": None, "price": math.nan, "created": None, "diff": 1}]))


def test_a_rebuild_or_another_compaction_between_read_and_swap_is_a_conflict_that_changes_nothing(orders, db):
    conn, store = orders
    run_cycles(conn, store, 8)
    advance_since(conn, DATA, 59)
    upper = shard_info(conn, DATA).upper

    def rebuild() -> None:  # what cycle.rebuild swaps in: the same updates in fresh parts
        with connect(db) as other:
            old = batches(other, DATA)
            parts = [write_part(store, D(0, upper), 0, _read(store, b.path).to_pylist()) for b in old]
            assert swap_batches(other, [Swap(DATA, old, D(0, upper), parts)]) == "swapped"

    before = reads(conn, store, DATA)
    report = compact_parts(conn, store, DATA, min_parts=4, before_swap=rebuild)
    rebuilt = batches(conn, DATA)
    assert (report.status, report.parts_merged, report.parts_written) == ("conflict", 0, 1)
    assert report.parts_after == report.parts_before
    assert all((b.lower, b.upper) == (0, upper) for b in rebuilt)  # the rebuild's, untouched
    assert reads(conn, store, DATA) == before
    orphans = [b.path for b in store.list(DATA) if b.path.startswith(f"{DATA}/0-60/")]
    assert len(orphans) == 1 and orphans[0] not in {b.path for b in rebuilt}  # garbage for gc

    # the rebuild's parts are [0, upper): above since, so not candidates; run more cycles past them
    run_cycles(conn, store, 6, start=8)
    advance_since(conn, DATA, 139)
    before = reads(conn, store, DATA)
    inner: list = []

    def compact_first() -> None:
        with connect(db) as other:
            inner.append(compact_parts(other, store, DATA, min_parts=4))

    report = compact_parts(conn, store, DATA, min_parts=4, before_swap=compact_first)
    assert inner[0].status == "merged" and report.status == "conflict"
    assert reads(conn, store, DATA) == before and len(batches(conn, DATA)) == 1


def test_a_crash_before_the_swap_changes_nothing(orders):
    conn, store = orders
    run_cycles(conn, store, 4)
    advance_since(conn, DATA, 39)
    before = batches(conn, DATA)
    with enabled("compact:before_swap"), pytest.raises(FailpointHit):
        compact_parts(conn, store, DATA, min_parts=4)
    assert batches(conn, DATA) == before


def test_a_part_whose_file_lost_rows_fails_every_read_and_is_never_merged(orders):
    """A part's file replaced by one with fewer rows (a truncated rewrite, a stale copy): reads AS OF, reads
    of the updates, the table reads' part list and compaction all raise ``PartDamaged`` naming the part,
    instead of going on without its rows; compaction changes nothing."""
    from reclock.errors import PartDamaged
    from reclock.tables import list_parts

    conn, store = orders
    run_cycles(conn, store, 6)
    advance_since(conn, DATA, 39)
    before = batches(conn, DATA)
    victim = next(b for b in before if b.rows >= 2 and b.upper <= 40)  # a candidate for compaction
    table = pq.read_table(store.root / victim.path)
    buf = io.BytesIO()
    pq.write_table(table.slice(0, table.num_rows - 1), buf, use_deprecated_int96_timestamps=True)
    store.put_bytes(victim.path, buf.getvalue())
    want = f"part {victim.path} holds {victim.rows - 1} rows by its footer, but {victim.rows} were recorded"
    for read in (lambda: read_as_of(conn, store, DATA, shard_info(conn, DATA).upper - 1),
                 lambda: read_updates(conn, store, DATA, 0),
                 lambda: list_parts(conn, store, DATA, shard_info(conn, DATA).upper - 1),
                 lambda: compact_parts(conn, store, DATA, min_parts=2)):
        with pytest.raises(PartDamaged, match=want):
            read()
    assert batches(conn, DATA) == before


def test_a_read_hold_keeps_since_and_so_compaction_back(orders):
    conn, store = orders
    run_cycles(conn, store, 8)
    acquire_read_hold(conn, DATA, "sink_orders", 25)  # a sink that has written everything up to 25
    assert advance_since(conn, DATA, 79) == 25
    before = reads(conn, store, DATA)
    report = compact_parts(conn, store, DATA, min_parts=4)
    assert (report.status, report.since, report.parts_merged) == ("merged", 25, 4)  # cycles 0 and 1 only
    rows = batches(conn, DATA)
    assert (rows[0].lower, rows[0].upper, rows[0].min_ts, rows[0].max_ts) == (0, 20, 19, 19)
    assert len(rows) == 13 and all(b.lower >= 20 for b in rows[1:])
    assert reads(conn, store, DATA) == before  # the sink reads the same from 26 on


def test_gc_deletes_the_replaced_parts_after_the_grace_period_never_the_merged_one(orders):
    conn, store = orders
    run_cycles(conn, store, 8)
    for s in (DATA, ERRORS):
        advance_since(conn, s, 79)
    old = {b.path for s in (DATA, ERRORS) for b in batches(conn, s)}
    hours_ago = time.time() - 7200
    for p in old:  # written long ago: only the time they were replaced keeps them now
        os.utime(store.root / p, (hours_ago, hours_ago))
    for s in (DATA, ERRORS):
        assert compact_parts(conn, store, s, min_parts=4).status == "merged"
    merged = {b.path for s in (DATA, ERRORS) for b in batches(conn, s)}
    assert len(merged) == 2 and not merged & old
    before = {s: reads(conn, store, s) for s in (DATA, ERRORS)}
    retired = {p for (p,) in conn.execute("SELECT path FROM reclock.retired_parts")}
    assert retired == old

    # the cycle's parts live under the source's folder, the merged ones under each shard's: collect both
    for prefix in (DATA, ERRORS):
        report = collect_garbage(conn, store, prefix, grace_seconds=600)
        assert report.deleted == 0  # replaced just now: a reader that listed them may still open them
    assert all(store.exists(p) for p in old | merged)
    later = time.time() + 3600
    deleted = sum(collect_garbage(conn, store, prefix, grace_seconds=600, now=later).deleted
                  for prefix in (DATA, ERRORS))
    assert deleted == len(old) and not any(store.exists(p) for p in old)
    assert all(store.exists(p) for p in merged)
    assert {s: reads(conn, store, s) for s in (DATA, ERRORS)} == before
    assert conn.execute("SELECT count(*) FROM reclock.retired_parts").fetchone() == (0,)  # forgotten once gone


def test_merge_batches_refuses_a_wrong_description_and_parts_above_since(orders):
    conn, store = orders
    run_cycles(conn, store, 3)
    advance_since(conn, DATA, 19)
    rows = batches(conn, DATA)
    low = [b for b in rows if b.upper <= 20]
    with pytest.raises(ValueError, match=r"under \[0, 20\), the span of the rows"):
        merge_batches(conn, DATA, [Merge(low, D(0, 30))])
    with pytest.raises(ValueError, match="not all at or below since 19"):
        merge_batches(conn, DATA, [Merge(rows, D(0, 30))])
    with pytest.raises(ValueError, match="outside its description"):
        merge_batches(conn, DATA, [Merge(low, D(0, 20), (Part(f"{DATA}/x.parquet", 1, 1, 20, 20),))])
    assert batches(conn, DATA) == rows
    assert merge_batches(conn, DATA, [Merge(low, D(0, 20))]) == "merged"  # (dropping them: a test's shortcut)
    assert merge_batches(conn, DATA, [Merge(low, D(0, 20))]) == "conflict"
