"""What the unit tests of part writers share: the rows of every Parquet file a blob store holds under a prefix."""

from __future__ import annotations

import pyarrow.parquet as pq

from reclock.persist.blob import BlobStore


def files_rows(blob: BlobStore, prefix: str) -> dict[str, list[dict]]:
    """Every file under ``prefix``: its path and its rows."""
    out = {}
    for info in blob.list(prefix):
        with blob.open(info.path) as f:
            out[info.path] = pq.read_table(f).to_pylist()
    return out
