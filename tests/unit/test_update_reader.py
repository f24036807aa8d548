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
from reclock.persist.shards import BatchRow
from reclock.read import UpdateReader

part_rows = st.lists(st.tuples(st.integers(0, 12), st.sampled_from([1, 1, 1, 2, -1])), min_size=1, max_size=40)
parts = st.lists(st.tuples(part_rows, st.integers(1, 9), st.booleans(), st.booleans(), st.booleans()),
                 min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(parts, st.integers(0, 13), st.integers(0, 14), st.booleans())
def test_tables_are_the_range_in_ts_order_in_clusters(spec, lower, width, split_ts):
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
            cols.update(ts=pa.array([u[0] for u in updates], pa.int64()),
                        diff=pa.array([u[1] for u in updates], pa.int64()))
            path = f"s/part-{i}.parquet"
            (blob.root / "s").mkdir(exist_ok=True)
            pq.write_table(pa.table(cols), blob.url(path), row_group_size=group_rows, write_statistics=stats)
            tss = [u[0] for u in updates]
            rows.append(BatchRow("s", 0, 20, path, len(updates), 0, min(tss), max(tss)))
            expected.update((j, f"e{j}" if has_extra else None, ts, d)
                            for j, (ts, d) in zip(ids, updates) if lower <= ts < upper)

        reader = UpdateReader(blob, "s", rows, lower, upper, "data")
        tables = list(reader.tables(split_ts=split_ts))

        assert set(reader.schema.names) == {"id", "ts", "diff"} | ({"extra"} if any(p[4] for p in spec) else set())
        got = Counter()
        for t in tables:
            assert t.schema == reader.schema and t.num_rows > 0
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
