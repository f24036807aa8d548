"""``reclock.sources.postgres.cdc.PartWriter``: however the updates come (one at a time, or in blocks of any sizes,
mixed), the parts are the same files with the same rows, or the same error is raised, and a value that cannot be
converted is named as converting the part's columns in order names it (hypothesis). The tables' last parts are written
side by side at ``close``."""

from __future__ import annotations

import tempfile

import numpy as np
import pyarrow as pa
import pytest
from blob_support import files_rows
from hypothesis import given, settings, strategies as st

from reclock.sources.postgres import cdc
from reclock.errors import ReclockError
from reclock.persist.blob import LocalBlobStore
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import TableInfo

INFO = TableInfo("public.t", 100, (("id", po.INT8, -1), ("n", po.NUMERIC, (12 << 16 | 2) + 4),
                                   ("v", po.TEXT, -1)))
OUT = cdc.Output(INFO, "s__t")

values = st.tuples(st.one_of(st.none(), st.integers(-10**6, 10**6).map(lambda i: str(i).encode()), st.just(b"x1")),
                   st.one_of(st.none(), st.just(b"1.50"), st.just(b"-3"), st.just(b"abc")),
                   st.one_of(st.none(), st.text(max_size=4).map(str.encode)))


def _write(rows: list[tuple], cuts: list[int] | None, chunk: int):
    """Rows ``(values, ts, diff)`` into a writer, one at a time (``cuts`` None) or in blocks of those
    sizes (a size 0: the next row one at a time); the files, or the error."""
    with tempfile.TemporaryDirectory() as tmp:
        blob = LocalBlobStore(tmp)
        w = cdc.PartWriter(blob, "w", [OUT], chunk)
        try:
            at = 0
            for size in (cuts or []):
                if size == 0 and at < len(rows):
                    v, ts, diff = rows[at]
                    w.add(INFO.relid, v, ts, diff)
                    at += 1
                    continue
                block = rows[at:at + size]
                if block:
                    cols = [pa.array([r[0][j] for r in block], pa.binary()) for j in range(3)]
                    w.add_block(INFO.relid, cols, np.array([r[1] for r in block]), np.array([r[2] for r in block]))
                at += len(block)
            for v, ts, diff in rows[at:]:
                w.add(INFO.relid, v, ts, diff)
            emitted = w.close()
        except ReclockError as e:
            return ("error", type(e).__name__, str(e))
        files = files_rows(blob, "w")
        return emitted, files


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(values, st.integers(1, 3), st.sampled_from([-1, 1])), max_size=40),
       st.lists(st.integers(0, 9), max_size=10), st.integers(1, 12))
def test_blocks_and_rows_give_the_same_parts_and_errors(rows, cuts, chunk):
    assert _write(rows, cuts, chunk) == _write(rows, None, chunk)


def test_the_error_names_the_first_column_of_the_part_that_fails_not_the_first_block():
    rows = [((b"1", b"1.50", b"a"), 1, 1), ((b"2", b"abc", b"b"), 1, 1),  # block 1: column n fails
            ((b"x1", b"2", b"c"), 1, 1)]                                  # block 2: column id fails
    got = _write(rows, [2, 1], 10)
    assert got == _write(rows, None, 10)
    assert got[0] == "error" and "public.t.id" in got[2] and "x1" in got[2], got


def test_a_part_of_blocks_and_rows_holds_their_values():
    rows = [((str(i).encode(), b"%d.25" % i, b"v%d" % i), 7, 1 if i % 2 else -1) for i in range(25)]
    emitted, files = _write(rows, [4, 9, 0, 0, 5, 7], 10)
    assert emitted == {"s__t": 25}
    assert sorted(files) == [f"w/s__t/part-{i:05d}.parquet" for i in range(3)]
    got = [r for path in sorted(files) for r in files[path]]
    assert [r["id"] for r in got] == list(range(25))
    assert [str(r["n"]) for r in got] == [f"{i}.25" for i in range(25)]
    assert [r["diff"] for r in got] == [1 if i % 2 else -1 for i in range(25)]


def test_the_tables_last_parts_are_written_side_by_side_and_the_first_tables_error_is_raised():
    infos = [TableInfo(f"public.t{k}", 200 + k, INFO.columns) for k in range(3)]
    outs = [cdc.Output(i, f"s__t{k}") for k, i in enumerate(infos)]
    with tempfile.TemporaryDirectory() as tmp:
        blob = LocalBlobStore(tmp)
        w = cdc.PartWriter(blob, "w", outs, 100)
        for k, info in enumerate(infos):
            for i in range(30 + k):
                w.add(info.relid, (str(i).encode(), b"1.00", b"x"), 1, 1)
        assert w.close() == {"s__t0": 30, "s__t1": 31, "s__t2": 32}
        assert [i.path for i in blob.list("w")] == [f"w/s__t{k}/part-00000.parquet" for k in range(3)]
        w = cdc.PartWriter(blob, "v", outs, 100)
        w.add(infos[2].relid, (b"x2", b"1.00", b"x"), 1, 1)
        w.add(infos[1].relid, (b"x1", b"1.00", b"x"), 1, 1)
        w.add(infos[0].relid, (b"0", b"1.00", b"x"), 1, 1)
        with pytest.raises(ReclockError, match="public.t1.id: 'x1'"):
            w.close()
