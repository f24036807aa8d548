"""The streaming reader of a shard's updates (what the sink reads from): clusters of row groups in ts order,
each sorted, together exactly the updates in the range; a ts in two tables only when allowed and no part
retracts. Parts are real Parquet files (random row groups, with and without footer statistics, sorted or
not, one lacking a column) in a local blob store; no database is needed."""

from __future__ import annotations

import tempfile
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.persist.blob import LocalBlobStore
from reclock.persist.parquet import dictionary_columns, holds_type
from reclock.persist.shards import BatchRow
from reclock.read import UpdateReader

part_rows = st.lists(st.tuples(st.integers(0, 12), st.sampled_from([1, 1, 1, 2, -1])), min_size=1, max_size=40)
parts = st.lists(st.tuples(part_rows, st.integers(1, 9), st.booleans(), st.booleans(), st.booleans()),
                 min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(parts, st.integers(0, 13), st.integers(0, 14), st.booleans(), st.booleans())
def test_tables_are_the_range_in_ts_order_in_clusters(spec, lower, width, split_ts, dictionaries):
    upper = lower + width
    with tempfile.TemporaryDirectory() as root:
        blob = LocalBlobStore(root)
        rows, expected, n = [], Counter(), 0
        for i, (updates, group_rows, stats, by_ts, has_extra) in enumerate(spec):
            if by_ts:
                updates = sorted(updates, key=lambda u: u[0])
            ids = list(range(n, n + len(updates)))
            n += len(updates)
            cols = {"id": pa.array(ids, pa.int64())}
            if has_extra:
                cols["extra"] = pa.array([f"e{j}" for j in ids])
            cols["tag"] = pa.array(["t" * 40] * len(ids))
            cols.update(ts=pa.array([u[0] for u in updates], pa.int64()),
                        diff=pa.array([u[1] for u in updates], pa.int64()))
            path = f"s/part-{i}.parquet"
            (blob.root / "s").mkdir(exist_ok=True)
            pq.write_table(pa.table(cols), blob.url(path), row_group_size=group_rows, write_statistics=stats)
            tss = [u[0] for u in updates]
            rows.append(BatchRow("s", 0, 20, path, len(updates), 0, min(tss), max(tss)))
            expected.update((j, f"e{j}" if has_extra else None, ts, d)
                            for j, (ts, d) in zip(ids, updates) if lower <= ts < upper)

        reader = UpdateReader(blob, "s", rows, lower, upper, "data", dictionaries=dictionaries)
        tables = list(reader.tables(split_ts=split_ts))

        names = {"id", "tag", "ts", "diff"} | ({"extra"} if any(p[4] for p in spec) else set())
        assert set(reader.schema.names) == names
        got = Counter()
        for t in tables:
            assert t.schema.names == reader.schema.names and t.num_rows > 0
            assert all(holds_type(a, b) for a, b in zip(t.schema.types, reader.schema.types))
            if not dictionaries or reader.retractions:
                assert t.schema == reader.schema
            t = t.cast(reader.schema)
            assert t["tag"].to_pylist() == ["t" * 40] * t.num_rows
            ts = t["ts"].to_pylist()
            assert ts == sorted(ts)
            d = t.to_pydict()
            got.update(zip(d["id"], d.get("extra", [None] * t.num_rows), d["ts"], d["diff"]))
        assert got == expected
        retracts = any(d <= 0 for p in spec for _, d in p[0])
        for a, b in zip(tables, tables[1:]):
            last, first = a["ts"][-1].as_py(), b["ts"][0].as_py()
            assert last <= first
            if not split_ts or retracts:
                assert last < first  # every ts in one table


def test_a_part_beyond_the_range_is_not_read(tmp_path):
    """Row groups whose footer bounds miss the range are skipped; a part is opened for its footer only."""
    blob = LocalBlobStore(tmp_path)
    (tmp_path / "s").mkdir()
    pq.write_table(pa.table({"ts": pa.array([5, 6], pa.int64()), "diff": pa.array([1, 1], pa.int64())}),
                   blob.url("s/a.parquet"), row_group_size=1)
    reader = UpdateReader(blob, "s", [BatchRow("s", 0, 10, "s/a.parquet", 2, 0, 5, 6)], 6, 10, "data")
    assert [(g.lo, g.hi) for g in reader.groups] == [(6, 6)]
    assert [t.to_pydict() for t in reader.tables()] == [{"ts": [6], "diff": [1]}]


def test_a_small_dictionary_comes_as_a_dictionary_where_every_part_of_a_cluster_keeps_one(tmp_path):
    """With ``dictionaries``, a string column whose row groups are a small dictionary's indices comes as a
    dictionary array (the same values); not where a part of the same cluster keeps it plain, nor for a
    column of unique values, nor when a part may retract."""
    blob = LocalBlobStore(tmp_path)
    (tmp_path / "s").mkdir()
    n = 2000

    def part(name: str, ts0: int, tags: list[str], diff: int = 1) -> BatchRow:
        ts = [ts0 + i // 500 for i in range(n)]
        pq.write_table(pa.table({"key": pa.array([f"{name}-{i}" for i in range(n)]), "tag": pa.array(tags),
                                 "ts": pa.array(ts, pa.int64()), "diff": pa.array([diff] * n, pa.int64())}),
                       blob.url(f"s/{name}.parquet"), row_group_size=1000)
        return BatchRow("s", 0, 100, f"s/{name}.parquet", n, 0, ts[0], ts[-1])

    repeated = ["a" * 100 if i % 3 else "b" * 100 for i in range(n)]
    a = part("a", 0, repeated)
    md = pq.read_metadata(blob.url("s/a.parquet"))
    assert dictionary_columns(md, range(md.num_row_groups)) == {"tag"}

    def read(*rows, dictionaries=True):
        return list(UpdateReader(blob, "s", rows, 0, 100, "data", dictionaries=dictionaries).tables(split_ts=True))

    plain = read(a, dictionaries=False)
    tables = read(a)
    assert [t["tag"].type for t in tables] == [pa.dictionary(pa.int32(), pa.string())] * len(tables)
    assert [t["key"].type for t in tables] == [pa.string()] * len(tables)
    assert [t.cast(plain[0].schema) for t in tables] == plain

    unique = part("u", 0, [f"tag-{i}" for i in range(n)])  # the same ts: one cluster with a
    later = part("l", 50, repeated)  # its own cluster
    tables = read(a, unique, later)
    assert [pa.types.is_dictionary(t["tag"].type) for t in tables] == [False] * (len(tables) - 2) + [True, True]
    retracting = part("r", 50, repeated, diff=-1)
    assert not any(pa.types.is_dictionary(t["tag"].type) for t in read(a, retracting))
