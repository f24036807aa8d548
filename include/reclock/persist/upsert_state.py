"""The upsert envelope's state in Postgres: each key's current record, as of the data shard's upper.

``write_batches`` reads the rows of only the keys a description touches (:func:`load_prior`), checking in
the same snapshot that the data shard's upper is the description's lower; ``append`` applies the
description's changes (:func:`apply_changes`) inside the transaction that advances the shard, so the state
and the shard never disagree, whatever crashes.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from reclock.errors import UpperMismatch
from reclock.part_layout import KAFKA_SHAPE, RecordShape


def _check_upper(conn, shard: str, lower: int) -> None:
    row = conn.execute("SELECT upper FROM reclock.shards WHERE id = %s FOR SHARE", (shard,)).fetchone()
    actual = row[0] if row else 0
    if actual != lower:
        raise UpperMismatch(shard, lower, actual, "the upsert state is as of the shard's upper, not this "
                            "description's lower; the next cycle re-mints from the actual upper")


def holds_keys(conn, source: str, shard: str, lower: int) -> bool:
    """Whether ``source``'s upsert state holds any key, as of ``shard``'s upper, which must equal ``lower``
    (as :func:`load_prior`). A source with none (its first description) needs no prior rows, so no pass over
    its records to find the keys they touch."""
    with conn.transaction():
        _check_upper(conn, shard, lower)
        return conn.execute("SELECT EXISTS (SELECT 1 FROM reclock.upsert_state WHERE source = %s)",
                            (source,)).fetchone()[0]


def load_prior(conn, source: str, shard: str, lower: int, keys: Sequence[bytes],
               shape: RecordShape = KAFKA_SHAPE) -> list[tuple]:
    """``(key, value, position, position, timestamp_us)`` of those ``keys`` that have a current record, the
    positions typed as ``shape`` says (the table keeps them as text: Kafka's partition and offset,
    Kinesis's shard id and sequence number).

    The state is that of ``shard``'s upper, which must equal ``lower`` (else ``UpperMismatch``: the
    description is stale and its append could not apply anyway).
    """
    with conn.transaction():
        _check_upper(conn, shard, lower)
        if not keys:
            return []
        rows = conn.execute('SELECT key, value, partition, "offset", timestamp_us FROM reclock.upsert_state '
                            "WHERE source = %s AND key = ANY(%s)", (source, list(keys))).fetchall()
    (_, a), (_, b) = shape.positions
    typed = [(lambda v: v) if t == "string" else int for t in (a, b)]
    return [(k, v, typed[0](p), typed[1](o), t) for k, v, p, o, t in rows]


def apply_changes(conn, source: str, changes: pa.Table, shape: RecordShape = KAFKA_SHAPE) -> int:
    """Apply a description's state changes (the shape's state columns: ``key, value``, two positions,
    ``timestamp_us``; a null value deletes the key) in the caller's transaction; returns the number of keys
    touched."""
    if changes.num_rows == 0:
        return 0
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS reclock_upsert_changes (key bytea PRIMARY KEY, value bytea, "
                 'partition text, "offset" text, timestamp_us bigint) ON COMMIT DELETE ROWS')
    with conn.cursor() as cur, cur.copy('COPY reclock_upsert_changes (key, value, partition, "offset", '
                                       "timestamp_us) FROM STDIN") as copy:
        for key, value, p, o, t in zip(*(changes[c].to_pylist() for c in shape.state_columns)):
            copy.write_row((key, value, None if p is None else str(p), None if o is None else str(o), t))
    conn.execute("DELETE FROM reclock.upsert_state s USING reclock_upsert_changes c "
                 "WHERE s.source = %s AND s.key = c.key AND c.value IS NULL", (source,))
    conn.execute('INSERT INTO reclock.upsert_state (source, key, value, partition, "offset", timestamp_us) '
                 'SELECT %s, key, value, partition, "offset", timestamp_us FROM reclock_upsert_changes '
                 "WHERE value IS NOT NULL ON CONFLICT (source, key) DO UPDATE SET value = excluded.value, "
                 'partition = excluded.partition, "offset" = excluded."offset", '
                 "timestamp_us = excluded.timestamp_us", (source,))
    return changes.num_rows


def state_size(conn, source: str) -> int:
    """How many keys currently have a value."""
    return conn.execute("SELECT count(*) FROM reclock.upsert_state WHERE source = %s", (source,)).fetchone()[0]
