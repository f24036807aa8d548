"""How the Iceberg sink cuts a commit's rows into data files (``_chunks``) and counts their size
(``decoded_bytes``): pure, over Arrow tables whose string column is dictionary-encoded in some."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.sinks.iceberg import _chunks, decoded_bytes

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("tag", pa.string())])

tables = st.lists(st.tuples(st.lists(st.sampled_from(["a" * 30, "b", None]), min_size=1, max_size=30),
                            st.booleans()), min_size=1, max_size=12)


def table(tags: list, encoded: bool, start: int) -> pa.Table:
    tag = pa.array(tags, pa.string())
    return pa.table({"id": pa.array(range(start, start + len(tags)), pa.int64()),
                     "tag": tag.dictionary_encode() if encoded else tag})


@settings(max_examples=200, deadline=None)
@given(tables, st.integers(1, 3000))
def test_chunks_keep_every_row_in_order_and_stay_within_a_files_worth(spec, size):
    ts, n = [], 0
    for tags, encoded in spec:
        ts.append(table(tags, encoded, n))
        n += len(tags)
    chunks = list(_chunks(((t, decoded_bytes(t)) for t in ts), SCHEMA, size))
    joined = pa.concat_tables([c.cast(SCHEMA) for c in chunks])
    assert joined.equals(pa.concat_tables([t.cast(SCHEMA) for t in ts]))  # every row, in order, same values
    for c in chunks:
        assert c.num_rows > 0
        if pa.types.is_dictionary(c["tag"].type):  # one dictionary for the chunk
            first = c["tag"].chunks[0].dictionary
            assert all(x.dictionary.equals(first) for x in c["tag"].chunks)
        # a chunk passes the size only as a single table of that size
        parts = [t for t in ts if t["id"][0].as_py() in set(c["id"].to_pylist())]
        assert sum(decoded_bytes(t) for t in parts) <= size or len(parts) == 1


def test_decoded_bytes_count_a_dictionary_column_as_decoded():
    tags = ["x" * 120] * 1000 + [None] * 10
    plain, encoded = table(tags, False, 0), table(tags, True, 0)
    assert decoded_bytes(plain) == plain.nbytes
    assert abs(decoded_bytes(encoded) - plain.nbytes) <= 16  # values and offsets (to Arrow's rounding)
    assert encoded.nbytes < plain.nbytes / 10
