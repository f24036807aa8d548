"""``reclock.parquet_footer``: a footer decodes and encodes back byte for byte, and a rewritten footer after
the unread pages reads as the original's kept columns, renamed, with the field ids asked for (the law in the
module's docstring); footers it does not handle are refused, never mangled."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock import parquet_footer as pf

TYPES = {
    "i64": (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    "i32": (pa.int32(), st.integers(-2**31, 2**31 - 1)),
    "f64": (pa.float64(), st.floats(allow_nan=False)),
    "str": (pa.string(), st.text(max_size=30)),
    "few": (pa.string(), st.sampled_from(["a", "bb", "ccc"])),
    "bin": (pa.binary(), st.binary(max_size=20)),
    "bool": (pa.bool_(), st.booleans()),
    "dec": (pa.decimal128(12, 2), st.decimals(min_value=-10**9, max_value=10**9, places=2, allow_nan=False,
                                              allow_infinity=False)),
    "ts": (pa.timestamp("us", tz="UTC"), st.datetimes(timezones=st.just(__import__("datetime").timezone.utc))),
}


@st.composite
def tables(draw):
    kinds = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=6))
    n = draw(st.integers(0, 60))
    cols = {}
    for i, k in enumerate(kinds):
        t, values = TYPES[k]
        cols[f"c{i}_{k}"] = pa.array(draw(st.lists(st.none() | values, min_size=n, max_size=n)), t)
    return pa.table(cols)


def _written(table: pa.Table, **options) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **options)
    return buf.getvalue()


@settings(max_examples=150, deadline=None)
@given(tables(), st.data(), st.sampled_from([
    {}, {"row_group_size": 7}, {"compression": "zstd", "write_page_index": True},
    {"write_statistics": False, "use_dictionary": False}, {"data_page_size": 64, "row_group_size": 20}]))
def test_a_rewritten_footer_reads_as_the_kept_columns_renamed_with_their_ids(table, data, options):
    raw = _written(table, **options)
    footer = pf.read_footer(raw[-(len(raw) if data.draw(st.booleans()) else 1 << 16):], len(raw))
    assert pf.encode(footer.meta) == raw[footer.start:-8], "encode(decode(b)) == b"
    assert footer.columns() == table.column_names and footer.num_rows == table.num_rows
    kept = data.draw(st.lists(st.sampled_from(table.column_names), unique=True))
    keep = {c: f"new_{c}" if data.draw(st.booleans()) else c for c in kept}
    ids = {new: 100 + i for i, new in enumerate(keep.values())}
    copied = raw[:footer.start] + pf.rewrite(footer, keep, ids)
    back = pq.ParquetFile(io.BytesIO(copied))
    order = [c for c in table.column_names if c in keep]
    assert back.schema_arrow.names == [keep[c] for c in order]
    assert [int(back.schema_arrow.field(keep[c]).metadata[b"PARQUET:field_id"]) for c in order] == \
        [ids[keep[c]] for c in order]
    got = back.read()
    want = table.select(order).rename_columns([keep[c] for c in order])
    assert got.num_rows == table.num_rows and got.cast(want.schema).equals(want) if order else True
    assert back.metadata.num_row_groups == pq.ParquetFile(io.BytesIO(raw)).metadata.num_row_groups


def test_footers_it_does_not_handle_are_refused():
    nested = _written(pa.table({"a": pa.array([{"x": 1}]), "b": [1]}))
    with pytest.raises(pf.FooterError, match="nested"):
        pf.rewrite(pf.read_footer(nested, len(nested)), {"b": "b"}, {})
    flat = _written(pa.table({"a": [1], "b": [2]}))
    with pytest.raises(pf.FooterError, match="no column"):
        pf.rewrite(pf.read_footer(flat, len(flat)), {"zz": "zz"}, {})
    with pytest.raises(pf.FooterError, match="not in the last") as short:
        pf.read_footer(flat[-20:], len(flat))
    assert pf.read_footer(flat[-short.value.need:], len(flat)).start == pf.read_footer(flat, len(flat)).start
    with pytest.raises(pf.FooterError, match="not a Parquet file"):
        pf.read_footer(flat[:-4] + b"PARE", len(flat))
    with pytest.raises(pf.FooterError):
        pf.decode(b"\x15")  # a field header and no value
