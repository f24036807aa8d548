"""A rebuild of a window of bindings (``reclock.cycle.rebuild(window=...)``, what a backfill of
``rebuild__<source>`` runs): records that landed in the error collection under a decode bug come back, once the
decode is fixed, at their original timestamps; only the window's batch rows are swapped, while another
process appends; a swap that lost to another change of the window's rows plans and writes again."""

from __future__ import annotations

import json

from ingest_support import make_ctx, produce, rec

from reclock import cycle, remap
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.persist.shards import batches
from reclock.read import read_updates

KEEP = 10**12  # retain_history_ms: since stays far below the bindings, every binding is exact


def _ctx(db, kafka, spark, tmp_path, topic, schema="id BIGINT, name STRING", **extra):
    ctx = make_ctx(db, kafka, spark, tmp_path, topic, name="win", format={"type": "json", "schema": schema},
                   include=["partition", "offset"], **extra)
    ctx.retain_history_ms = KEEP
    return ctx


def _rows(ctx, shard):
    with connect(ctx.dsn) as conn:
        t = read_updates(conn, ctx.blob, shard)
    return [] if t is None else t.to_pylist()


def _paths(ctx) -> dict[str, set[str]]:
    with connect(ctx.dsn) as conn:
        return {s: {b.path for b in batches(conn, s)} for s in ctx.spec.shards}


def test_a_fixed_decode_brings_back_the_window_s_rejected_records_at_their_timestamps(db, kafka, topic, spark,
                                                                                     tmp_path):
    name = topic(partitions=2)

    def wave(lo: int, hi: int, bad: bool) -> None:  # odd ids carry a fractional amount: not a BIGINT
        produce(kafka, name, [(i % 2, None, json.dumps({"id": i, "amount": i + (0.5 if bad and i % 2 else 0)})
                               .encode()) for i in range(lo, hi)])

    v1 = _ctx(db, kafka, spark, tmp_path, name, "id BIGINT, amount BIGINT")
    wave(0, 10, bad=True)
    cycle.run_cycle(v1)
    wave(10, 20, bad=True)
    cycle.run_cycle(v1)
    assert sorted(r["id"] for r in _rows(v1, "win")) == [i for i in range(20) if i % 2 == 0]
    assert len(_rows(v1, "win_errors")) == 10
    # the decode is fixed (amount DOUBLE); the next cycle decodes everything
    v2 = _ctx(db, kafka, spark, tmp_path, name, "id BIGINT, amount DOUBLE")
    wave(20, 30, bad=False)
    cycle.run_cycle(v2)
    with connect(db) as conn:
        rc = load_remap(conn, "win")
        b1, b2, b3 = rc.bindings
        third = {s: {b.path for b in batches(conn, s) if b.lower > b2.ts} for s in v2.spec.shards}

    out = cycle.rebuild(v2, window=(b1.ts, b2.ts + 1))  # the bindings of the first two waves
    assert out["window"] == [0, b2.ts + 1]  # widened to the first description, [0, b1 + 1)
    rows = _rows(v2, "win")
    assert sorted(r["id"] for r in rows) == list(range(30))  # the rejected ten are back, each once
    for r in rows:
        assert r["ts"] == remap.reclock(rc, r["_partition"], r["_offset"]), "its original timestamp"
        assert r["amount"] == r["id"] + (0.5 if r["id"] < 20 and r["id"] % 2 else 0)
        assert r["diff"] == 1
    assert _rows(v2, "win_errors") == []
    after = _paths(v2)
    assert all(third[s] <= after[s] for s in third), "the third wave's rows, outside the window, stay as they were"


def test_a_window_swaps_its_rows_only_while_another_process_appends(db, kafka, topic, spark, tmp_path, monkeypatch):
    name = topic(partitions=2)
    ctx = _ctx(db, kafka, spark, tmp_path, name)
    other = _ctx(db, kafka, spark, tmp_path, name)  # another process's cycles, on the same source
    for w in range(3):
        produce(kafka, name, [rec(i, i % 2) for i in range(w * 30, w * 30 + 30)])
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        rc = load_remap(conn, "win")
        rows_before = {s: batches(conn, s) for s in ctx.spec.shards}
    b1, b2, b3 = rc.bindings
    before = sorted(map(str, _rows(ctx, "win")))

    real_swap = cycle.swap_batches
    calls: list[int] = []

    def swap_after_a_cycle(conn, swaps):  # a cycle appends between the rebuild's write and its swap
        calls.append(1)
        produce(kafka, name, [rec(i, i % 2) for i in range(90, 100)])
        cycle.run_cycle(other)
        return real_swap(conn, swaps)

    monkeypatch.setattr(cycle, "swap_batches", swap_after_a_cycle)
    out = cycle.rebuild(ctx, window=(b2.ts, b2.ts + 1))
    assert calls == [1] and out["window"] == [b1.ts + 1, b2.ts + 1]  # the second cycle's description, only
    with connect(db) as conn:
        rows_after = {s: batches(conn, s) for s in ctx.spec.shards}
    for s in ctx.spec.shards:
        inside = {r.path for r in rows_before[s] if r.lower == b1.ts + 1}
        outside = {r.path for r in rows_before[s] if r.lower != b1.ts + 1}
        now = {r.path for r in rows_after[s]}
        assert outside <= now and not (inside & now), s  # only the window's rows were swapped
    rows = _rows(ctx, "win")
    assert sorted(r["id"] for r in rows) == list(range(100))  # the appended ten too, once
    assert sorted(map(str, (r for r in rows if r["id"] < 90))) == before  # the same updates, same timestamps


def test_a_lost_swap_plans_and_writes_again(db, kafka, topic, spark, tmp_path, monkeypatch):
    name = topic(partitions=2)
    ctx = _ctx(db, kafka, spark, tmp_path, name)
    for w in range(2):
        produce(kafka, name, [rec(i, i % 2) for i in range(w * 20, w * 20 + 20)])
        cycle.run_cycle(ctx)
    before = sorted(map(str, _rows(ctx, "win")))
    real_swap = cycle.swap_batches
    calls: list[str] = []

    def lose_the_first(conn, swaps):  # another writer changes a row of the window first, once
        if not calls:
            conn.execute("UPDATE reclock.shard_batches SET bytes = bytes + 1 WHERE path = %s",
                         (swaps[0].old[0].path,))
        calls.append(outcome := real_swap(conn, swaps))
        return outcome

    monkeypatch.setattr(cycle, "swap_batches", lose_the_first)
    cycle.rebuild(ctx)
    assert calls == ["conflict", "swapped"]
    assert sorted(map(str, _rows(ctx, "win"))) == before
    with connect(db) as conn:
        (attempts,) = conn.execute("SELECT metrics->'attempts' FROM reclock.statistics WHERE name = 'win' "
                                   "AND step = 'rebuild' ORDER BY id DESC LIMIT 1").fetchone()
    assert attempts == 2
