"""``envelope: debezium`` through the Spark job with records that are not change events it can apply: each
lands in ``<source>_errors`` with its partition, offset, key, raw bytes and the reason, beside the good events
of the same slice (which land exactly); with ``on_decode_error: stall`` the first of them stalls the source and
nothing is appended. The records are written as Debezium 3.6.1.Final's Postgres connector writes them (JSON
without Connect's schemas), by a producer: the envelope, not Debezium, is under test here
(``test_debezium_source.py`` runs the real connector)."""

from __future__ import annotations

import json

import pytest
from ingest_support import make_ctx, produce

from reclock import cycle
from reclock.persist import connect
from reclock.persist.shards import shard_info
from reclock.read import read_as_of, read_updates
from reclock.spark.debezium_decode import SCHEMA_REASON

SCHEMA = "id INT, v STRING"


def event(key: int | None, op: str, after: dict | None, lsn: int, sequence: bool = True) -> tuple[bytes | None, bytes]:
    source = {"version": "3.6.1.Final", "connector": "postgresql", "name": "dbz", "ts_ms": 1795671145479,
              "snapshot": "false", "db": "postgres", "schema": "public", "table": "items", "txId": lsn // 10,
              "lsn": lsn, "xmin": None}
    if sequence:
        source["sequence"] = json.dumps([str(lsn - 5), str(lsn)], separators=(",", ":"))
    value = {"before": {"id": key} if op == "d" else None, "after": after, "source": source,
             "transaction": None, "op": op, "ts_ms": 1795671145480}
    return (None if key is None else json.dumps({"id": key}).encode()), json.dumps(value).encode()


GOOD = [event(1, "c", {"id": 1, "v": "a"}, 100), event(2, "c", {"id": 2, "v": "b"}, 110),
        event(1, "u", {"id": 1, "v": "a2"}, 120)]
BAD = [  # (key, value, what the reason says)
    (b'{"id": 3}', b"{not json", "not valid JSON"),
    (*event(4, "c", {"id": "four", "v": "x"}, 130), SCHEMA_REASON),
    (*event(5, "c", {"id": 5, "v": "y"}, 140, sequence=False), "source.sequence is missing"),
    (*event(6, "t", None, 150), "TRUNCATE"),
    (*event(None, "c", {"id": 7, "v": "z"}, 160), "key"),
    (b'{"id": 8}', b'{"before": null, "after": {"id": 8, "v": "w"}, "source": {"lsn": 170}}', "op"),
]


def test_bad_events_go_to_the_errors_beside_the_good_ones_and_nothing_is_dropped(db, kafka, topic, spark, tmp_path):
    name = topic(partitions=1)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="dbz_bad", envelope="debezium", include=[],
                   format={"type": "json", "schema": SCHEMA})
    records = [*GOOD[:2], *[(k, v) for k, v, _ in BAD], GOOD[2]]
    produce(kafka, name, [(0, k, v) for k, v in records])
    cycle.run_cycle(ctx)
    with connect(db) as conn:
        rows = read_as_of(conn, ctx.blob, ctx.spec.name).to_pylist()
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
    assert sorted((r["id"], r["v"], r["diff"]) for r in rows) == [(1, "a2", 1), (2, "b", 1)]
    got = sorted((e["offset"], e["key"], e["raw"]) for e in errors)
    assert got == [(2 + i, k, v) for i, (k, v, _) in enumerate(BAD)]
    for e in sorted(errors, key=lambda e: e["offset"]):
        want = BAD[e["offset"] - 2][2]
        assert want.lower() in e["reason"].lower(), (e["offset"], e["reason"], want)
        assert e["partition"] == 0 and e["diff"] == 1


def test_a_bad_event_stalls_a_source_that_says_so_and_nothing_is_appended(db, kafka, topic, spark, tmp_path):
    from reclock.errors import DecodeError

    name = topic(partitions=1)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="dbz_stall", envelope="debezium", include=[],
                   format={"type": "json", "schema": SCHEMA}, on_decode_error="stall")
    produce(kafka, name, [(0, k, v) for k, v in [GOOD[0], BAD[2][:2], GOOD[1]]])
    with pytest.raises(DecodeError, match=r"source dbz_stall: record at partition 0 offset 1: .*sequence"):
        cycle.run_cycle(ctx)
    with connect(db) as conn:
        assert shard_info(conn, "dbz_stall").upper == 0  # nothing appended


def test_a_slice_over_two_partitions_is_folded_where_it_was_read_and_again_when_a_key_spans_both(
        db, kafka, topic, spark, tmp_path, caplog):
    """A slice over two partitions is folded where Spark read it (no shuffle). While each key's events are in
    one partition, that is the whole fold; a key whose events are in both (its records moved partition, and
    its prior state is there too) is caught by its two state rows, and the slice is folded again with a
    shuffle: the collection is exact either way, and a bad record is an error row either way."""
    import logging

    name = topic(partitions=2)
    ctx = make_ctx(db, kafka, spark, tmp_path, name, name="dbz_local", envelope="debezium", include=[],
                   format={"type": "json", "schema": SCHEMA})
    produce(kafka, name, [(0, *event(1, "c", {"id": 1, "v": "a"}, 100)), (1, *event(2, "c", {"id": 2, "v": "b"}, 110)),
                          (1, b'{"id": 3}', b"{not json"), (0, *event(1, "u", {"id": 1, "v": "a2"}, 120)),
                          (1, *event(2, "d", None, 130)), (1, json.dumps({"id": 2}).encode(), None),
                          (1, *event(4, "c", {"id": 4, "v": "d"}, 140))])
    again = "folded again with a shuffle"
    with caplog.at_level(logging.WARNING, logger="reclock.sources.kafka.kind"):
        cycle.run_cycle(ctx)
        assert not [r for r in caplog.records if again in r.getMessage()]  # every key in one partition
        with connect(db) as conn:
            rows = read_as_of(conn, ctx.blob, ctx.spec.name).to_pylist()
        assert sorted((r["id"], r["v"], r["diff"]) for r in rows) == [(1, "a2", 1), (4, "d", 1)]
        # key 1 now in both partitions (held in the state), key 4 deleted by a tombstone alone in partition 0
        produce(kafka, name, [(0, *event(1, "u", {"id": 1, "v": "b"}, 200)), (1, *event(1, "u", {"id": 1, "v": "c"}, 210)),
                              (0, json.dumps({"id": 4}).encode(), None), (1, *event(5, "c", {"id": 5, "v": "e"}, 220)),
                              (0, b'{"id": 6}', b"[]")])
        cycle.run_cycle(ctx)
        assert [r for r in caplog.records if again in r.getMessage()]
    with connect(db) as conn:
        rows = read_as_of(conn, ctx.blob, ctx.spec.name).to_pylist()
        errors = read_updates(conn, ctx.blob, ctx.spec.errors_shard).to_pylist()
    assert sorted((r["id"], r["v"], r["diff"]) for r in rows) == [(1, "c", 1), (5, "e", 1)]
    assert sorted((e["partition"], e["offset"]) for e in errors) == [(0, 4), (1, 1)]  # each bad record once
