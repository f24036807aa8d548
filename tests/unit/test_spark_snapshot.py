"""A Postgres snapshot on Spark, the parts that need no Spark: page-range predicates, the JDBC target, which
tables Spark can convert, and the proof of what Spark wrote."""

from __future__ import annotations

import re
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, strategies as st

from reclock.sources.postgres import cdc
from reclock.errors import SettingError, UnaccountedWrite
from reclock.persist.blob import LocalBlobStore
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import TableInfo
from reclock.sources.postgres import spark_snapshot as ss


def _ranges(preds: list[str]) -> list[tuple[int, float]]:
    out = []
    for p in preds:
        bounds = [int(x) for x in re.findall(r"'\((\d+),0\)'", p)]
        out.append((bounds[0], bounds[1] if len(bounds) == 2 else float("inf")))
    return out


@given(st.integers(0, 2_000_000), st.integers(1, 100_000), st.one_of(st.none(), st.integers(1, 16)))
def test_page_ranges_cover_every_page_once_and_are_bounded_in_number(pages, split, slots):
    ranges = _ranges(ss.partition_predicates(pages, split, slots))
    assert ranges[0][0] == 0 and ranges[-1][1] == float("inf"), "from page 0, the last range open-ended"
    assert all(hi == ranges[i + 1][0] for i, (_, hi) in enumerate(ranges[:-1])), "contiguous, no overlap"
    assert all(lo < hi for lo, hi in ranges)
    assert 1 <= len(ranges) <= ss.MAX_PARTITIONS
    sizes = [hi - lo for lo, hi in ranges[:-1]] + [max(pages - ranges[-1][0], 1)]
    assert max(sizes) - min(sizes) <= 1, "ranges of one size (one page apart at most)"
    wanted = -(-max(pages, 1) // split)
    waves = -(-wanted // slots) * slots if slots else wanted
    if waves <= min(ss.MAX_PARTITIONS, pages):  # not capped: at most split pages, whole waves of tasks
        assert max(sizes) <= split and len(ranges) % (slots or 1) == 0


def test_the_jdbc_target_of_a_dsn_and_the_dsns_spark_cannot_follow():
    t = ss.jdbc_target("postgresql://u:p%40ss@db.example:6543/shop?sslmode=require")
    assert t.url == "jdbc:postgresql://db.example:6543/shop"
    assert t.properties == {"driver": ss.DRIVER, "user": "u", "password": "p@ss", "sslmode": "require"}
    assert ss.jdbc_target("host=127.0.0.1 dbname=x user=r").url == "jdbc:postgresql://127.0.0.1:5432/x"
    for dsn in ("host=/var/run/postgresql dbname=x", "host=a,b dbname=x", "dbname=x"):
        with pytest.raises(SettingError, match="one TCP host"):
            ss.jdbc_target(dsn)


def test_tables_spark_cannot_convert_exactly_stay_in_the_task():
    def info(*cols):
        return TableInfo("public.t", 1, tuple(cols))
    assert ss.convertible(info(("id", po.INT8, -1), ("n", po.NUMERIC, -1), ("ch", po.BPCHAR, 7), ("x", 600, -1)))
    assert not ss.convertible(info(("id", po.INT8, -1), ("n", po.NUMERIC, ((50 << 16) | 2) + 4)))  # decimal256
    assert not ss.convertible(info(("a", po.INT8, -1), ("A", po.INT8, -1)))  # one name to Spark
    q = ss.snapshot_query(info(("Odd \"name\"", po.TEXT, -1), ("ch", po.BPCHAR, 7)))
    assert q == ('(SELECT ctid AS reclock_ctid, "Odd ""name"""::text AS c0, textin(bpcharout("ch")) AS c1 '
                 'FROM ONLY "public"."t") reclock_snapshot')
    filtered = replace(info(("id", po.INT8, -1), ("f", po.FLOAT4, -1)), row_filter="((id % 2) = 0)")
    assert ss.snapshot_query(filtered) == ('(SELECT ctid AS reclock_ctid, "id" AS c0, "f"::text AS c1 FROM ONLY '
                                           '"public"."t" WHERE (((id % 2) = 0))) reclock_snapshot')
    init = ss.session_init("00000003-0000001B-1")
    assert init.endswith("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT "
                         "'00000003-0000001B-1'") and "SET TimeZone = 'UTC'" in init


def _spark_like(blob: LocalBlobStore, folder: str, rows: int, success: bool) -> None:
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": list(range(rows)), "ts": [7] * rows, "diff": [1] * rows}), buf)
    blob.put_bytes(f"{folder}/part-00000-x.snappy.parquet", buf.getvalue().to_pybytes())
    blob.put_bytes(f"{folder}/.part-00000-x.snappy.parquet.crc", b"crc")
    if success:
        blob.put_bytes(f"{folder}/_SUCCESS", b"")


def test_spark_snapshot_parts_are_proved_by_marker_footers_and_count(tmp_path):
    blob = LocalBlobStore(tmp_path)
    _spark_like(blob, f"w/s1/{cdc.SPARK_SNAPSHOT}", 5, success=True)
    parts = cdc.collect(blob, "src", "w", {"s1": 5}, ["s1"])
    assert [p.rows for p in parts["s1"]] == [5]
    with pytest.raises(UnaccountedWrite, match="emitted"):
        cdc.collect(blob, "src", "w", {"s1": 6}, ["s1"])  # count(*) under the snapshot said 6
    with pytest.raises(UnaccountedWrite, match="no part of this write"):
        cdc.collect(blob, "src", "w", {"s1": 5}, [])  # a snapshot folder where none was asked
    _spark_like(blob, f"v/s1/{cdc.SPARK_SNAPSHOT}", 5, success=False)
    with pytest.raises(UnaccountedWrite, match="_SUCCESS"):
        cdc.collect(blob, "src", "v", {"s1": 5}, ["s1"])
    with pytest.raises(UnaccountedWrite, match="_SUCCESS"):
        cdc.collect(blob, "src", "u", {"s1": 0}, ["s1"])  # Spark wrote nothing at all


def test_a_table_info_keeps_its_publication_definition_through_json():
    plain = TableInfo("public.t", 1, (("id", po.INT8, -1),))
    assert plain.to_json() == {"table": "public.t", "relid": 1, "columns": [["id", po.INT8, -1]]}  # as before
    assert TableInfo.from_json(plain.to_json()) == plain
    full = TableInfo("public.t", 1, (("id", po.INT8, -1),), "(id > 5)", ("id",), (7, 9))
    assert TableInfo.from_json(full.to_json()) == full
