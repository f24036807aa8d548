"""A written description crosses from the mint_write task to the append task as XCom (JSON): its parts, the
upsert state, its folder, the folders of the slices it took from an earlier write and the schema versions it
begins, all as they were."""

from __future__ import annotations

import json

from reclock.batch import BatchDescription, Part
from reclock.orchestration.ingest import _written_from_x, _written_to_x
from reclock.schema_evolution import CollectionSchema, Column, SchemaVersion
from reclock.sources.base import WrittenBatch


def test_a_written_batch_round_trips_through_json():
    v = SchemaVersion(17, CollectionSchema((Column("id", "bigint", False), Column("st", "struct<x:double>"))),
                      json.dumps({"reader": "{}", "format": "avro", "reader_id": 3, "writer": 4}), "writer schema 4")
    w = WrittenBatch(BatchDescription(10, 20), {"orders": (Part("orders/a.parquet", 3, 100, 10, 19),)},
                     (Part("s.parquet", 1, 5, 11, 11),), "orders/10-20/x", {"orders": (v,)},
                     ("orders/10-20/y/slice-0000", "orders/10-20/y/slice-0002"))
    assert w.leased == ("orders/10-20/x", "orders/10-20/y/slice-0000\\orders/10-20/x",
                        "orders/10-20/y/slice-0002\\orders/10-20/x")  # the taken folders, held by this write
    assert _written_from_x(json.loads(json.dumps(_written_to_x(w)))) == w
    plain = WrittenBatch(BatchDescription(0, 1))
    assert _written_from_x(json.loads(json.dumps(_written_to_x(plain)))) == plain and plain.leased == ()
    before = _written_to_x(w)
    del before["taken"]  # what a mint_write of the previous release handed on
    assert _written_from_x(before).taken == ()
