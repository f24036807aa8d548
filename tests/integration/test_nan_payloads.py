"""NaN payloads (and signs) through the parts Spark writes: Reclock's own part writer (``reclock.spark.jobs.
parts_writer``) keeps every float's bits, plain and dictionary pages alike, at every depth of a nested value;
and a session whose JVM would canonicalise them (parquet-java's ``LittleEndianDataOutputStream`` writes
``floatToIntBits``) refuses a batch that holds such a NaN, loudly, and writes nothing.

The floats are made by Arrow (``createDataFrame`` of a pyarrow table) and read back by pyarrow and by Spark,
compared as raw bits (``.view`` as unsigned integers), never as floats (every NaN compares unequal).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reclock.errors import NaNPayloadsNotKept
from reclock.spark.jobs import keeps_nan_payloads, parts_writer

DOUBLE_BITS = [0x7FF8000000000123, 0x7FF0000000000001, 0xFFF8000000000000, 0x7FF8000000000000,
               0x8000000000000000, 0x0, 0x3FF8000000000000, 0x7FFFFFFFFFFFFFFF, 0xFFF0000000000000]
"""A NaN with a payload, a signalling NaN, a negative NaN (x86's 0/0), the canonical NaN, -0.0, 0.0, 1.5, the
largest-payload NaN, -inf."""
FLOAT_BITS = [0x7FC00123, 0x7F800001, 0xFFC00000, 0x7FC00000, 0x80000000, 0x0, 0x3FC00000, 0x7FFFFFFF,
              0xFF800000]
ROWS = 300  # every value many times: each column starts dictionary-encoded


def _doubles(bits) -> pa.Array:
    return pa.array(np.array(bits, dtype=np.uint64).view(np.float64), pa.float64())


def _floats(bits) -> pa.Array:
    return pa.array(np.array(bits, dtype=np.uint32).view(np.float32), pa.float32())


def awkward_table() -> pa.Table:
    """``ROWS`` rows: ``d`` double, ``f`` float, ``ld`` list<double>, ``st`` struct<x float, y double>,
    ``md`` map<string, double>, each cycling through the awkward bits (a null every 10th row of ``d``)."""
    n = len(DOUBLE_BITS)
    dbits = [DOUBLE_BITS[i % n] for i in range(ROWS)]
    fbits = [FLOAT_BITS[(i * 7) % n] for i in range(ROWS)]
    d = _doubles(dbits)
    d = pa.array(d.to_numpy(zero_copy_only=False), pa.float64(),
                 mask=np.array([i % 10 == 9 for i in range(ROWS)]))
    f = _floats(fbits)
    inner = _doubles([DOUBLE_BITS[(i * 5) % n] for i in range(2 * ROWS)])
    ld = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * ROWS + 1, 2), pa.int32()), inner)
    st = pa.StructArray.from_arrays([_floats([FLOAT_BITS[(i * 3) % n] for i in range(ROWS)]),
                                     _doubles([DOUBLE_BITS[(i * 2) % n] for i in range(ROWS)])], ["x", "y"])
    md = pa.MapArray.from_arrays(pa.array(np.arange(0, 2 * ROWS + 1, 2), pa.int32()),
                                 pa.array(["k", "j"] * ROWS), _doubles([DOUBLE_BITS[(i * 4) % n]
                                                                        for i in range(2 * ROWS)]))
    return pa.table({"i": pa.array(range(ROWS), pa.int64()), "d": d, "f": f, "ld": ld, "st": st, "md": md})


def bits(table: pa.Table) -> dict[str, list]:
    """Every float of every column as its raw bits (unsigned integers), nulls as None, in row order of ``i``."""
    table = table.sort_by("i")

    def raw(arr: pa.Array) -> list:
        arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        width = {pa.float64(): np.uint64, pa.float32(): np.uint32}[arr.type]
        values = arr.fill_null(0).to_numpy(zero_copy_only=False).view(width).tolist()
        return [None if not ok else v for v, ok in zip(values, arr.is_valid().to_pylist())]

    st = table["st"].combine_chunks()
    md = table["md"].combine_chunks()
    return {"d": raw(table["d"]), "f": raw(table["f"]), "ld": raw(table["ld"].combine_chunks().flatten()),
            "st.x": raw(st.field("x")), "st.y": raw(st.field("y")), "md": raw(md.items)}


def test_parts_keep_every_float_bit_for_bit(spark, tmp_path):
    """The smallest round trip: parts Reclock's writer writes from a DataFrame of awkward floats read back by
    pyarrow (the readers' path) and by Spark with the same bits: NaN payloads, signalling and negative NaNs,
    ``-0.0``; in plain columns, lists, structs and maps; every file's float columns without a dictionary
    (parquet-java's dictionary merges NaNs by ``floatToIntBits``)."""
    table = awkward_table()
    want = bits(table)
    assert keeps_nan_payloads(spark), "the test session's JVM has Reclock's raw-floats writer first"
    url = str(tmp_path / "parts")
    parts_writer(spark.createDataFrame(table).repartition(2), url).parquet(url)
    got = pq.read_table(url)
    assert bits(got) == want
    assert bits(spark.read.parquet(url).toArrow()) == want
    for path in (tmp_path / "parts").glob("*.parquet"):
        meta = pq.ParquetFile(path).metadata
        for rg in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                col = meta.row_group(rg).column(c)
                if col.physical_type in ("FLOAT", "DOUBLE"):
                    assert not col.has_dictionary_page, col.path_in_schema


def test_a_session_that_would_lose_nan_payloads_refuses_the_batch(spark, tmp_path, monkeypatch):
    """Without the raw-floats writer (as a user's own Spark may be) a batch that holds a NaN of other bits
    than the canonical one fails the write, naming the fix, and leaves no ``_SUCCESS``: nothing to append. A
    batch of canonical NaNs and ``-0.0`` only is written as ever."""
    from reclock.spark import jobs

    monkeypatch.setattr(jobs, "keeps_nan_payloads", lambda session: False)
    url = str(tmp_path / "refused")
    with pytest.raises(NaNPayloadsNotKept, match="raw-floats"):
        parts_writer(spark.createDataFrame(awkward_table()), url).parquet(url)
    assert not (tmp_path / "refused" / "_SUCCESS").exists()

    plain = pa.table({"i": pa.array([0, 1, 2], pa.int64()),
                      "d": _doubles([0x7FF8000000000000, 0x8000000000000000, 0x3FF8000000000000]),
                      "ld": pa.array([[float("nan")], [], None], pa.list_(pa.float64()))})
    ok = str(tmp_path / "canonical")
    parts_writer(spark.createDataFrame(plain), ok).parquet(ok)
    got = pq.read_table(ok).sort_by("i")
    assert got["d"].combine_chunks().to_numpy().view(np.uint64).tolist() == [
        0x7FF8000000000000, 0x8000000000000000, 0x3FF8000000000000]
