"""Collections' schema histories in Postgres (``reclock.collection_schemas``), for every source kind.

A collection whose upstream schema changes (a registry's writer schemas, a declared DDL the user edits, a
Postgres table's DDL) records each version of its schema (:class:`~reclock.schema_evolution.SchemaVersion`)
at the timestamp of the first update that carries it. A write hands its versions to
``compare_and_append`` with its parts (``Append.schemas``), which records them in the same transaction, so
the history and the parts never disagree: a version is durable exactly when the updates that need it are.
A rebuild (``swap_batches``) replays the same updates at the same timestamps and keeps the recorded history.

Readers (``reclock.read``, ``reclock.tables``, the sinks) read a collection AS OF ``t`` with the schema
``load_history(...).read_as(t)``, each part through ``reclock.schema_projection``. A collection with no
recorded version reads its parts' own columns (every collection written before this existed).
"""

from __future__ import annotations

import json
from typing import Sequence

from reclock.schema_evolution import CollectionSchema, SchemaHistory, SchemaVersion

__all__ = ["load_history", "insert_versions", "check_versions"]


def load_history(conn, shard: str) -> SchemaHistory:
    """``shard``'s recorded schema versions, oldest first (empty: none recorded)."""
    rows = conn.execute("SELECT since_ts, columns, upstream, cause FROM reclock.collection_schemas "
                        "WHERE shard = %s ORDER BY since_ts", (shard,)).fetchall()
    return SchemaHistory(tuple(
        SchemaVersion(ts, CollectionSchema.from_json(json.dumps(cols)), json.dumps(up, sort_keys=True), cause)
        for ts, cols, up, cause in rows))


def check_versions(shard: str, versions: Sequence[SchemaVersion], lower: int, upper: int) -> None:
    """Versions an append of ``[lower, upper)`` may record: at times in that range, strictly increasing
    (``ValueError`` otherwise: a write that would record a schema for updates it does not hold)."""
    last = None
    for v in versions:
        if not lower <= v.since_ts < upper:
            raise ValueError(f"shard {shard}: a schema version at {v.since_ts} is outside its description "
                             f"[{lower}, {upper})")
        if last is not None and v.since_ts <= last:
            raise ValueError(f"shard {shard}: schema versions must have increasing times, got {last} then "
                             f"{v.since_ts}")
        last = v.since_ts


def insert_versions(conn, shard: str, versions: Sequence[SchemaVersion]) -> None:
    """Record ``versions`` after ``shard``'s newest one, in the caller's transaction (which holds the shard's
    row locked: ``compare_and_append``). A version at or before the newest recorded one is a ``ValueError``
    (a history only grows forward)."""
    if not versions:
        return
    (newest,) = conn.execute("SELECT max(since_ts) FROM reclock.collection_schemas WHERE shard = %s",
                             (shard,)).fetchone()
    if newest is not None and versions[0].since_ts <= newest:
        raise ValueError(f"shard {shard}: a schema version at {versions[0].since_ts} is not after the newest "
                         f"recorded one at {newest}")
    _insert(conn, shard, versions)


def _insert(conn, shard: str, versions: Sequence[SchemaVersion]) -> None:
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO reclock.collection_schemas (shard, since_ts, columns, upstream, cause) "
                        "VALUES (%s, %s, %s::jsonb, %s::jsonb, %s)",
                        [(shard, v.since_ts, v.schema.to_json(), v.upstream or "{}", v.cause) for v in versions])
