"""The durable remap collection of each source, in Postgres.

Physical form: one ``remap_bindings`` row per binding and one ``remap_offsets`` row per partition of its
frontier (absolute next offsets). The view ``reclock."<source>_progress"`` shows ``(ts, partition,
"offset")``; ``reclock.progress_as_of(source, t)`` is its AS OF form.
"""

from __future__ import annotations

from psycopg import sql
from psycopg.types.json import Jsonb

from reclock import remap
from reclock.errors import RemapUpperMismatch
from reclock.persist.names import validate_name
from reclock.remap import Binding, RemapCollection
from reclock.time import PartitionedFrontier


class UnknownSource(LookupError):
    pass


def progress_view(name: str) -> sql.Composed:
    return sql.SQL("reclock.{}").format(sql.Identifier(f"{validate_name(name, 'source name')}_progress"))


def register_source(conn, name: str, kind: str = "kafka", config: dict | None = None) -> None:
    """Create the source, its empty remap collection and its progress view; a no-op if they exist."""
    validate_name(name, "source name")
    with conn.transaction():
        conn.execute("INSERT INTO reclock.sources (name, kind, config) VALUES (%s, %s, %s) "
                     "ON CONFLICT (name) DO NOTHING", (name, kind, Jsonb(config or {})))
        conn.execute("INSERT INTO reclock.remap_collections (source) VALUES (%s) ON CONFLICT DO NOTHING", (name,))
        conn.execute(sql.SQL(
            'CREATE OR REPLACE VIEW {} AS SELECT ts, partition, "offset" FROM reclock.remap_offsets '
            "WHERE source = {}").format(progress_view(name), sql.Literal(name)))


def load_remap(conn, name: str) -> RemapCollection:
    row = conn.execute("SELECT upper, since FROM reclock.remap_collections WHERE source = %s", (name,)).fetchone()
    if row is None:
        raise UnknownSource(f"source {name}: no remap collection (the source was never registered)")
    upper, since = row
    offsets: dict[int, list[tuple[int, int]]] = {}
    for ts, p, o in conn.execute("SELECT ts, partition, \"offset\" FROM reclock.remap_offsets WHERE source = %s",
                                 (name,)):
        offsets.setdefault(ts, []).append((p, o))
    tss = [ts for (ts,) in conn.execute("SELECT ts FROM reclock.remap_bindings WHERE source = %s ORDER BY ts",
                                        (name,))]
    bindings = tuple(Binding(ts, PartitionedFrontier.of(offsets.get(ts, []))) for ts in tss)
    return RemapCollection(name, bindings, since, upper)


def _insert_binding(conn, name: str, b: Binding) -> None:
    conn.execute("INSERT INTO reclock.remap_bindings (source, ts) VALUES (%s, %s)", (name, b.ts))
    if len(b.frontier):
        with conn.cursor() as cur:
            cur.executemany('INSERT INTO reclock.remap_offsets (source, ts, partition, "offset") '
                            "VALUES (%s, %s, %s, %s)", [(name, b.ts, p, o) for p, o in b.frontier])


def append_binding(conn, name: str, expected_upper: int, binding: Binding) -> RemapCollection:
    """Append ``binding`` if the remap upper is still ``expected_upper`` (compare-and-set); the new upper is
    ``binding.ts + 1``. Raises ``RemapUpperMismatch`` (nothing changes) if another minter came first."""
    if binding.ts < expected_upper:
        raise ValueError(f"source {name}: binding at {binding.ts} is below the expected upper {expected_upper}")
    with conn.transaction():
        row = conn.execute("SELECT upper FROM reclock.remap_collections WHERE source = %s FOR UPDATE",
                           (name,)).fetchone()
        if row is None:
            raise UnknownSource(f"source {name}: no remap collection (the source was never registered)")
        if row[0] != expected_upper:
            raise RemapUpperMismatch(name, expected_upper, row[0])
        rc = load_remap(conn, name)
        remap.append(rc, binding)  # validates: not in the past, frontier not backwards
        _insert_binding(conn, name, binding)
        conn.execute("UPDATE reclock.remap_collections SET upper = %s WHERE source = %s", (binding.ts + 1, name))
    return load_remap(conn, name)


def compact_remap(conn, name: str, since: int) -> RemapCollection:
    """Advance the remap collection's since: bindings at ``ts <= since`` collapse into one at ``since``
    (see :func:`reclock.remap.compact`); reads at any ``t >= since`` are unchanged."""
    with conn.transaction():
        conn.execute("SELECT 1 FROM reclock.remap_collections WHERE source = %s FOR UPDATE", (name,))
        rc = load_remap(conn, name)
        compacted = remap.compact(rc, since)
        if compacted is rc:
            return rc
        conn.execute("DELETE FROM reclock.remap_bindings WHERE source = %s AND ts <= %s", (name, since))
        if compacted.bindings and compacted.bindings[0].ts == since:
            _insert_binding(conn, name, compacted.bindings[0])
        conn.execute("UPDATE reclock.remap_collections SET since = %s WHERE source = %s", (since, name))
    return load_remap(conn, name)
