"""Every reader across parts of two schemas (issue 32, part 2): a collection whose schema evolved at some time
(columns added, a struct field added, types widened) has parts of the old schema, parts of the new one, and a
part of the new one holding updates from before the change; retractions in new parts retract rows inserted
in old ones. ``read_as_of``, ``spark_as_of``, ``duckdb_as_of``, ``read_table`` (Spark and DuckDB) and the
sinks' ``UpdateReader`` give, AS OF every time, the collection with the schema in force then (its columns
and types) and exactly the rows the updates sum to; so does every reader after compaction merged parts of
both schemas. The schema history is recorded by ``compare_and_append`` with the parts (hypothesis over the
histories; real parts in a real shard in Postgres, real Spark and DuckDB). The Iceberg export of such a
collection evolves its table in the commit that first holds the new columns."""

from __future__ import annotations

import collections
import itertools
from decimal import Decimal

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reclock.batch import BatchDescription
from reclock.persist import connect
from reclock.persist.blob import LocalBlobStore
from reclock.persist.compact import compact_parts
from reclock.persist.parquet import part_from_footer
from reclock.persist.schemas import insert_versions, load_history
from reclock.persist.shards import Append, advance_since, compare_and_append, register_shard, shard_info
from reclock.read import UpdateReader, read_as_of, updates_parts
from reclock.schema_evolution import CollectionSchema, Column, SchemaVersion, evolve
from reclock.schema_projection import arrow_type, duckdb_type, spark_type
from reclock.sinks.iceberg import FRONTIER, TS_COLUMN, CatalogSettings, IcebergSinkContext, catalog_uri, load_catalog, \
    run_once
from reclock.config import IcebergBudget, IcebergSinkSpec
from reclock.tables import duckdb_as_of, read_table, spark_as_of

OLD = CollectionSchema((Column("id", "bigint"), Column("amount", "int"), Column("price", "decimal(10,2)"),
                        Column("st", "struct<x:double>"), Column("tags", "array<int>")))
INCOMING = CollectionSchema((Column("id", "bigint"), Column("amount", "bigint"), Column("price", "decimal(12,2)"),
                             Column("st", "struct<x:double,y:string>"), Column("tags", "array<bigint>"),
                             Column("note", "string")))
NEW = evolve(OLD, INCOMING).schema
COLUMNS = list(NEW.names)


def old_row(draw) -> dict:
    return {"id": draw(st.integers(0, 5)), "amount": draw(st.sampled_from([0, -7, 2**31 - 1, None])),
            "price": draw(st.sampled_from([Decimal("1.50"), Decimal("-99999999.99"), None])),
            "st": draw(st.sampled_from([None, {"x": 1.5, "y": None}, {"x": None, "y": None}])),
            "tags": draw(st.sampled_from([None, [], [1, 2**31 - 1]])), "note": None}


def new_row(draw) -> dict:
    r = old_row(draw)
    r["amount"] = draw(st.sampled_from([r["amount"], 2**40]))
    r["price"] = draw(st.sampled_from([r["price"], Decimal("9999999999.99")]))
    r["st"] = draw(st.sampled_from([r["st"], {"x": 2.0, "y": "y"}]))
    r["tags"] = draw(st.sampled_from([r["tags"], [2**40]]))
    r["note"] = draw(st.sampled_from([None, "n"]))
    return r


def key(row: dict) -> tuple:
    return tuple(repr(row[c]) for c in COLUMNS)


@st.composite
def histories(draw):
    """``(batches, change)``: batch ``i`` (updates ``(row, diff)`` at ts ``10 * (i + 1)``), and the first batch
    of the new schema; multiplicities never go below zero; the change's batch inserts a new row."""
    n = draw(st.integers(2, 5))
    change = draw(st.integers(1, n - 1))
    live: dict = {}
    batches = []
    for i in range(n):
        ups = []
        for j in range(draw(st.integers(0 if i != change else 1, 4))):
            rows = sorted((k for k, (_, m) in live.items() if m > 0))
            if rows and draw(st.booleans()) and not (i == change and j == 0):
                k = draw(st.sampled_from(rows))
                r, m = live[k]
                ups.append((r, -1))
                live[k] = (r, m - 1)
                continue
            r = new_row(draw) if i >= change else old_row(draw)
            if i == change and j == 0:
                r["note"] = "first"  # the first update carrying the new schema
            ups.append((r, 1))
            live[key(r)] = (r, live.get(key(r), (r, 0))[1] + 1)
        batches.append(ups)
    return batches, change


_shards = itertools.count()


def _rows_table(schema: CollectionSchema, rows: list[tuple[dict, int, int]]) -> pa.Table:
    """Updates ``(row, ts, diff)`` as a part of ``schema`` (a struct's fields the schema lacks left out)."""
    def fit(v, t):
        if isinstance(v, dict):
            from reclock.schema_evolution import struct_fields
            return {n: v.get(n) for n, _ in struct_fields(t)}
        return v
    cols = {c.name: pa.array([fit(r[c.name], c.type) for r, _, _ in rows], arrow_type(c.type)) for c in schema.columns}
    cols["ts"] = pa.array([ts for _, ts, _ in rows], pa.int64())
    cols["diff"] = pa.array([d for _, _, d in rows], pa.int64())
    return pa.table(cols)


def write_history(conn, blob: LocalBlobStore, batches, change: int) -> tuple[str, list[int], int]:
    """The batches as parts of a new shard with a recorded history (the old schema from 0, the new one from
    the change's ts): batches before the change in parts of the old schema, except the last of them, which
    shares a description (and a part of the new schema) with the change's batch; the shard, the times, and
    the change's ts."""
    shard = f"ev{next(_shards)}"
    register_shard(conn, shard)
    times = [10 * (i + 1) for i in range(len(batches))]
    change_ts = times[change]
    groups = [[i] for i in range(change - 1)] + [[change - 1, change]] + [[i] for i in range(change + 1, len(batches))]
    lower = 0
    for g in groups:
        upper = times[g[-1]] + 1
        schema = NEW if upper - 1 >= change_ts else OLD
        updates = [(r, times[i], d) for i in g for r, d in batches[i]]
        parts = []
        if updates:
            table = _rows_table(schema, updates)
            path = f"{shard}/{lower}-{upper}.parquet"
            blob.put_bytes(path, _parquet(table))
            parts.append(part_from_footer(path, 1, pq.read_metadata(blob.url(path))))
        versions = []
        if lower == 0:
            versions.append(SchemaVersion(0, OLD, cause="the first"))
        if lower <= change_ts < upper:
            versions.append(SchemaVersion(change_ts, NEW, cause="note added, amount widened"))
        compare_and_append(conn, [Append(shard, BatchDescription(lower, upper), tuple(parts), tuple(versions))])
        lower = upper
    return shard, times, change_ts


def _parquet(table: pa.Table) -> bytes:
    import io
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def expected(batches, times: list[int], t: int, change_ts: int) -> collections.Counter:
    """The collection AS OF ``t`` as a bag of comparable rows of the schema then in force."""
    bag: collections.Counter = collections.Counter()
    for ts, ups in zip(times, batches):
        if ts <= t:
            for r, d in ups:
                bag[comparable(r, t >= change_ts)] += d
    return +bag


def comparable(row: dict, new: bool) -> tuple:
    """A row as the reader of the old (``new`` false) or new schema gives it, hashable (Decimals by value,
    floats as they are: this history has no -0.0 nor NaN)."""
    st_ = row["st"]
    if st_ is not None and not new:
        st_ = {"x": st_["x"]}
    out = [row["id"], row["amount"], row["price"], None if st_ is None else tuple(sorted(st_.items())),
           None if row["tags"] is None else tuple(row["tags"])]
    if new:
        out.append(row["note"])
    return tuple(out)


def bag(table: pa.Table, diff: str | None = None) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for r in table.to_pylist():
        new = "note" in r
        out[comparable({**r, "note": r.get("note")}, new)] += r[diff] if diff else 1
    return out


def check_types(schema: CollectionSchema, arrow: pa.Schema, what: str) -> None:
    got = [(f.name, spark_type(f.type)) for f in arrow if f.name not in ("diff", "ts")]
    assert got == [(c.name, c.type) for c in schema.columns], f"{what}: the columns of the schema in force"


def check_readers(conn, spark, dsn, blob, shard, batches, times, change_ts, at: list[int]) -> None:
    history = load_history(conn, shard)
    con = duckdb.connect()
    for t in at:
        schema = history.read_as(t)
        assert schema == (NEW if t >= change_ts else OLD)
        want = expected(batches, times, t, change_ts)
        got = read_as_of(conn, blob, shard, t)
        check_types(schema, got.schema, f"read_as_of AS OF {t}")
        assert bag(got, "diff") == want, f"read_as_of AS OF {t}"
        df = spark_as_of(spark, shard, t, dsn=dsn, blob=blob)
        assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == \
            [(c.name, c.type) for c in schema.columns], f"spark_as_of AS OF {t}: the schema in force"
        assert bag(df.toArrow()) == want, f"spark_as_of AS OF {t}"
        rel = duckdb_as_of(con, shard, t, dsn=dsn, blob=blob)
        assert [str(x) for x in rel.types] == [str(con.sql(f"SELECT NULL::{duckdb_type(c.type)}").types[0])
                                               for c in schema.columns], f"duckdb_as_of AS OF {t}: the schema"
        assert bag(rel.to_arrow_table()) == want, f"duckdb_as_of AS OF {t}"
    conn.execute("UPDATE reclock.read_holds SET expires_at = now() WHERE holder LIKE 'reader:%%'")


def check_update_reader(conn, blob, shard, batches, times, change_ts, lower: int) -> None:
    """What the sinks read: the updates at ``lower <= ts``, cut where the schema changes, each piece with the
    schema of its times."""
    rows, hi = updates_parts(conn, shard, lower)
    reader = UpdateReader(blob, shard, rows, lower, hi, "data", history=load_history(conn, shard))
    got: collections.Counter = collections.Counter()
    for schema, piece in reader.by_version(reader.tables()):
        ts = piece["ts"].to_pylist()
        assert schema == (NEW if min(ts) >= change_ts else OLD) and (max(ts) < change_ts or min(ts) >= change_ts)
        check_types(schema, piece.schema, "UpdateReader.by_version")
        for r in piece.to_pylist():
            got[(r["ts"], comparable({**r, "note": r.get("note")}, "note" in r))] += r["diff"]
    want: collections.Counter = collections.Counter()
    for ts, ups in zip(times, batches):
        if ts >= lower:
            for r, d in ups:
                want[(ts, comparable(r, ts >= change_ts))] += d
    assert +got == +want or {k: v for k, v in got.items() if v} == {k: v for k, v in want.items() if v}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(histories(), st.data())
def test_every_reader_reads_parts_of_two_schemas_as_of_every_time(db, spark, tmp_path, history, data):
    batches, change = history
    blob = LocalBlobStore(tmp_path / "blobs")
    with connect(db) as conn:
        shard, times, change_ts = write_history(conn, blob, batches, change)
        assert [v.since_ts for v in load_history(conn, shard).versions] == [0, change_ts]
        check_readers(conn, spark, db, blob, shard, batches, times, change_ts, times)
        check_update_reader(conn, blob, shard, batches, times, change_ts, 0)

        t = times[-1]
        with read_table(shard, t, dsn=db, blob=blob) as r:
            want = expected(batches, times, t, change_ts)
            assert bag(r.spark(spark).toArrow()) == want, "read_table(...).spark"
            assert bag(r.duckdb(duckdb.connect()).to_arrow_table()) == want, "read_table(...).duckdb"
        with read_table(shard, times[0], dsn=db, blob=blob) as r:  # before the change: the old columns
            assert r.spark(spark).columns == list(OLD.names)

        # compaction merges parts of both schemas into one of the newest: reads at or after since stay
        since = data.draw(st.sampled_from(times), label="since")
        conn.execute("UPDATE reclock.read_holds SET expires_at = now() WHERE holder LIKE 'reader:%%'")
        advance_since(conn, shard, since)
        compact_parts(conn, blob, shard, min_parts=2)
        assert shard_info(conn, shard).since == since
        check_readers(conn, spark, db, blob, shard, batches, times, change_ts, [x for x in times if x >= since])
        check_update_reader(conn, blob, shard, batches, times, change_ts, since + 1)


def test_a_history_is_recorded_with_its_parts_or_not_at_all(db):
    """A version outside the description, or not after the newest, is refused before anything changes; an
    append that is already present records nothing."""
    with connect(db) as conn:
        register_shard(conn, "hist")
        with pytest.raises(ValueError, match="outside its description"):
            compare_and_append(conn, [Append("hist", BatchDescription(0, 5), (), (SchemaVersion(5, OLD),))])
        assert shard_info(conn, "hist").upper == 0
        compare_and_append(conn, [Append("hist", BatchDescription(0, 5), (), (SchemaVersion(0, OLD),))])
        with pytest.raises(ValueError, match="not after the newest"), conn.transaction():
            insert_versions(conn, "hist", [SchemaVersion(0, NEW)])
        out = compare_and_append(conn, [Append("hist", BatchDescription(0, 5), (), (SchemaVersion(3, NEW),))])
        assert out[0].status == "already_present"
        assert [(v.since_ts, v.schema) for v in load_history(conn, "hist").versions] == [(0, OLD)]


def test_the_iceberg_export_evolves_its_table_in_the_commit_that_first_needs_it(db, tmp_path):
    """Old-schema updates at ts 10 and 20 are exported; then the new schema's first update at 30 (and one at
    40) arrive: the commit that holds ts 30 adds ``note`` and ``st.y`` and widens ``amount``, ``price`` and
    ``tags`` in the same catalog transaction as its rows; the commit before it kept the old schema."""
    blob = LocalBlobStore(tmp_path / "blobs")
    old = [({"id": 1, "amount": 5, "price": Decimal("1.50"), "st": {"x": 1.0, "y": None}, "tags": [1], "note": None},
            10, 1),
           ({"id": 2, "amount": 6, "price": None, "st": None, "tags": None, "note": None}, 20, 1)]
    new = [({"id": 3, "amount": 2**40, "price": Decimal("9999999999.99"), "st": {"x": 2.0, "y": "y"},
             "tags": [2**40], "note": "first"}, 30, 1),
           ({"id": 1, "amount": 5, "price": Decimal("1.50"), "st": {"x": 1.0, "y": None}, "tags": [1], "note": None},
            40, -1)]
    with connect(db) as conn:
        register_shard(conn, "evi")
        blob.put_bytes("evi/a.parquet", _parquet(_rows_table(OLD, old)))
        part = part_from_footer("evi/a.parquet", 1, pq.read_metadata(blob.url("evi/a.parquet")))
        compare_and_append(conn, [Append("evi", BatchDescription(0, 21), (part,), (SchemaVersion(0, OLD),))])
    spec = IcebergSinkSpec(name="evolving", collection="evi", table="lake.evi", layout="changelog",
                           budget=IcebergBudget(max_rows=1))
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob,
                             catalog=CatalogSettings(uri=catalog_uri(db), warehouse=str(blob.root) + "/_iceberg"))
    assert run_once(ctx).frontier == 21
    with connect(db) as conn:
        blob.put_bytes("evi/b.parquet", _parquet(_rows_table(NEW, new)))
        part = part_from_footer("evi/b.parquet", 1, pq.read_metadata(blob.url("evi/b.parquet")))
        compare_and_append(conn, [Append("evi", BatchDescription(21, 41), (part,), (SchemaVersion(30, NEW),))])
    assert run_once(ctx).frontier == 41
    table = load_catalog(ctx.catalog, spec.catalog).load_table(spec.table)
    assert [f.name for f in table.schema().fields] == [*NEW.names, TS_COLUMN, "_reclock_diff"]
    assert {f.name: str(f.field_type) for f in table.schema().fields}["amount"] == "long"
    by_frontier = {int(sn.summary[FRONTIER]): table.schemas()[sn.schema_id] for sn in table.snapshots()}
    first_new = min(f for f in by_frontier if f > 30)
    assert "note" in [f.name for f in by_frontier[first_new].fields]
    assert all("note" not in [f.name for f in s.fields] for f, s in by_frontier.items() if f <= 30)
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda x: (x[TS_COLUMN], x["id"]))
    assert [(x["id"], x["amount"], x["note"], x["st"], x[TS_COLUMN], x["_reclock_diff"]) for x in rows] == [
        (1, 5, None, {"x": 1.0, "y": None}, 10, 1), (2, 6, None, None, 20, 1),
        (3, 2**40, "first", {"x": 2.0, "y": "y"}, 30, 1), (1, 5, None, {"x": 1.0, "y": None}, 40, -1)]


def test_a_dropped_column_and_one_added_again_under_its_name_in_every_reader_and_the_iceberg_export(db, spark,
                                                                                                     tmp_path):
    """``w`` (string) until 30, dropped at 30, ``w`` (int, another column) from 50. AS OF 20 the old ``w``; AS OF
    40 none; AS OF 60 the new one, null in every row written before 50 (never 'a' or 'b'), and the rows
    inserted with the old ``w`` and retracted without it cancel. The updates across the drop keep the old
    ``w`` up to it (``across``). The Iceberg export deletes ``w`` at the drop and adds the new one as another
    field: its changelog sums to the collection AS OF 60."""
    blob = LocalBlobStore(tmp_path / "blobs")
    v0 = CollectionSchema((Column("id", "bigint"), Column("w", "string")))
    v1 = CollectionSchema((Column("id", "bigint"),))
    v2 = CollectionSchema((Column("id", "bigint"), Column("w", "int")))
    parts = [(v0, [({"id": 1, "w": "a"}, 10, 1), ({"id": 2, "w": "b"}, 20, 1)], 0, 21, (SchemaVersion(0, v0),)),
             (v1, [({"id": 1}, 30, -1), ({"id": 3}, 40, 1)], 21, 41, (SchemaVersion(30, v1),)),
             (v2, [({"id": 4, "w": 7}, 50, 1), ({"id": 2, "w": None}, 60, -1)], 41, 61, (SchemaVersion(50, v2),))]
    spec = IcebergSinkSpec(name="dropping", collection="evd", table="lake.evd", layout="changelog",
                           budget=IcebergBudget(max_rows=1))
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob,
                             catalog=CatalogSettings(uri=catalog_uri(db), warehouse=str(blob.root) + "/_iceberg"))
    with connect(db) as conn:
        register_shard(conn, "evd")
    for i, (schema, rows, lower, upper, versions) in enumerate(parts):
        with connect(db) as conn:
            path = f"evd/{i}.parquet"
            blob.put_bytes(path, _parquet(_rows_table(schema, rows)))
            part = part_from_footer(path, 1, pq.read_metadata(blob.url(path)))
            compare_and_append(conn, [Append("evd", BatchDescription(lower, upper), (part,), versions)])
        assert run_once(ctx).frontier == upper
    con = duckdb.connect()
    with connect(db) as conn:
        for t, want in [(20, {(1, "a"), (2, "b")}), (40, {(2,), (3,)}), (60, {(3, None), (4, 7)})]:
            got = read_as_of(conn, blob, "evd", t)
            assert {tuple(r[c] for c in got.column_names if c != "diff") for r in got.to_pylist()} == want, t
            rel = duckdb_as_of(con, "evd", t, dsn=db, blob=blob).fetchall()
            assert set(rel) == want, f"duckdb AS OF {t}"
            df = spark_as_of(spark, "evd", t, dsn=db, blob=blob)
            assert {tuple(r) for r in df.collect()} == want, f"spark AS OF {t}"
        rows, hi = updates_parts(conn, "evd", 0, 41)
        reader = UpdateReader(blob, "evd", rows, 0, hi, "data", history=load_history(conn, "evd"), across=True)
        pieces = [(schema.names, piece.select(list(schema.names)).to_pylist())
                  for schema, piece in reader.by_version(reader.tables())]
    assert pieces == [(("id", "w"), [{"id": 1, "w": "a"}, {"id": 2, "w": "b"}]), (("id",), [{"id": 1}, {"id": 3}])]
    table = load_catalog(ctx.catalog, spec.catalog).load_table(spec.table)
    assert [(f.name, str(f.field_type)) for f in table.schema().fields][:2] == [("id", "long"), ("w", "int")]
    summed = collections.Counter()
    for r in table.scan().to_arrow().to_pylist():
        summed[(r["id"], r["w"])] += r["_reclock_diff"]
    assert {k for k, n in summed.items() if n} == {(3, None), (4, 7)} and all(n in (0, 1) for n in summed.values())


def test_a_renamed_column_and_one_added_under_its_old_name_in_every_reader_and_the_iceberg_export(db, spark,
                                                                                                  tmp_path):
    """``w`` (string) renamed ``w2`` at 30 and another ``w`` (int) added at the same time (the Postgres source
    records the two at different times, as it stalls them in one binding; readers take them at one time too:
    a part's ``w`` without ``w2`` is ``w2``'s); ``w2`` renamed ``w3`` at 50. AS OF 20 ``w`` holds 'a', 'b';
    AS OF 40 ``w2`` holds them (read from the parts' ``w``) and the new ``w`` is null in the rows written
    before 30; AS OF 60 ``w3`` holds them. The updates across the renames carry the names of their times
    (``across``). The Iceberg export renames the field (its id kept: the rows exported before read under the
    new name) and adds the new ``w`` as another field: its changelog sums to the collection AS OF 60."""
    blob = LocalBlobStore(tmp_path / "blobs")
    v0 = CollectionSchema((Column("id", "bigint"), Column("w", "string")))
    v1 = CollectionSchema((Column("id", "bigint"), Column("w2", "string", renamed_from="w"), Column("w", "int")))
    v2 = CollectionSchema((Column("id", "bigint"), Column("w3", "string", renamed_from="w2"), Column("w", "int")))
    parts = [(v0, [({"id": 1, "w": "a"}, 10, 1), ({"id": 2, "w": "b"}, 20, 1)], 0, 21, (SchemaVersion(0, v0),)),
             (v1, [({"id": 1, "w2": "a", "w": None}, 30, -1), ({"id": 3, "w2": "c", "w": 5}, 40, 1)], 21, 41,
              (SchemaVersion(30, v1),)),
             (v2, [({"id": 4, "w3": "d", "w": 7}, 50, 1)], 41, 61, (SchemaVersion(50, v2),))]
    spec = IcebergSinkSpec(name="renaming", collection="evr", table="lake.evr", layout="changelog",
                           budget=IcebergBudget(max_rows=1))
    ctx = IcebergSinkContext(spec=spec, dsn=db, blob=blob,
                             catalog=CatalogSettings(uri=catalog_uri(db), warehouse=str(blob.root) + "/_iceberg"))
    with connect(db) as conn:
        register_shard(conn, "evr")
    for i, (schema, rows, lower, upper, versions) in enumerate(parts):
        with connect(db) as conn:
            path = f"evr/{i}.parquet"
            blob.put_bytes(path, _parquet(_rows_table(schema, rows)))
            part = part_from_footer(path, 1, pq.read_metadata(blob.url(path)))
            compare_and_append(conn, [Append("evr", BatchDescription(lower, upper), (part,), versions)])
        assert run_once(ctx).frontier == upper
    con = duckdb.connect()
    wants = [(20, ("id", "w"), {(1, "a"), (2, "b")}), (40, ("id", "w2", "w"), {(2, "b", None), (3, "c", 5)}),
             (60, ("id", "w3", "w"), {(2, "b", None), (3, "c", 5), (4, "d", 7)})]
    with connect(db) as conn:
        for t, names, want in wants:
            got = read_as_of(conn, blob, "evr", t)
            assert tuple(got.column_names) == (*names, "diff"), t
            assert {tuple(r[c] for c in names) for r in got.to_pylist()} == want, t
            assert set(duckdb_as_of(con, "evr", t, dsn=db, blob=blob).fetchall()) == want, f"duckdb AS OF {t}"
            df = spark_as_of(spark, "evr", t, dsn=db, blob=blob)
            assert tuple(df.columns) == names and {tuple(r) for r in df.collect()} == want, f"spark AS OF {t}"
        pieces = []
        for lo, hi in ((0, 30), (30, 61)):  # cut where another w comes, as the Kafka sink cuts its readers
            rows, hi = updates_parts(conn, "evr", lo, hi)
            reader = UpdateReader(blob, "evr", rows, lo, hi, "data", history=load_history(conn, "evr"), across=True)
            pieces += [(schema.names, piece.select(list(schema.names)).to_pylist())
                       for schema, piece in reader.by_version(reader.tables())]
    assert pieces == [(("id", "w"), [{"id": 1, "w": "a"}, {"id": 2, "w": "b"}]),
                      (("id", "w2", "w"), [{"id": 1, "w2": "a", "w": None}, {"id": 3, "w2": "c", "w": 5}]),
                      (("id", "w3", "w"), [{"id": 4, "w3": "d", "w": 7}])]
    table = load_catalog(ctx.catalog, spec.catalog).load_table(spec.table)
    fields = [(f.field_id, f.name, str(f.field_type)) for f in table.schema().fields]
    assert [(n, t) for _, n, t in fields][:3] == [("id", "long"), ("w3", "string"), ("w", "int")]
    assert fields[1][0] == [f.field_id for f in table.schemas()[0].fields if f.name == "w"][0], "w3 is w's field"
    summed = collections.Counter()
    for r in table.scan().to_arrow().to_pylist():
        summed[(r["id"], r["w3"], r["w"])] += r["_reclock_diff"]
    assert {k for k, n in summed.items() if n} == wants[-1][2] and all(n in (0, 1) for n in summed.values())
