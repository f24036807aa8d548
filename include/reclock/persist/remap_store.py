"""The durable remap collection of each source, in Postgres.

Tables (schema ``reclock``):

* ``remap_collections(source, upper, since)`` -- one row per source; ``upper`` is the least timestamp
  without a binding, ``since`` the compaction frontier;
* ``remap_bindings(source, ts)`` -- one row per binding (a binding with the minimum frontier has no
  offsets, so it needs a row of its own);
* ``remap_offsets(source, ts, partition, "offset")`` -- the binding's frontier: one row per partition,
  absolute *next* offsets (an absent partition is at offset 0).

The view ``reclock."<source>_progress"`` exposes the bindings to SQL (the seed's ``EXPOSE PROGRESS``), in the
columns of the source's kind: ``(ts, partition, "offset")`` by default (:data:`OFFSETS_PROGRESS`), a
Postgres source's ``(ts, lsn)``; ``reclock.progress_as_of(source, t)`` is its AS OF form: the frontier of the data at
``ts <= t`` (the last binding at or before ``t``).

Writers serialize on the collection's row (``SELECT ... FOR UPDATE``): :func:`append_binding` is a
compare-and-set on the remap upper, so two concurrent minters can never both succeed.
"""

from __future__ import annotations

from psycopg import sql
from psycopg.types.json import Jsonb

from reclock import remap
from reclock.errors import ConfigError, RemapUpperMismatch, UnknownSource
from reclock.persist.names import validate_source_name
from reclock.remap import Binding, RemapCollection
from reclock.time import MAX_TIMESTAMP, PartitionedFrontier, check_timestamp

OFFSETS_PROGRESS = 'SELECT ts, partition, "offset" FROM reclock.remap_offsets WHERE source = {}'
"""A progress view's body showing the remap collection as it is kept: ``(ts, partition, "offset")``."""

__all__ = ["UnknownSource", "progress_view", "register_source", "load_remap", "append_binding", "drop_partitions",
           "compact_remap"]


def progress_view(name: str) -> sql.Composed:
    """The quoted name of the source's progress view, ``reclock."<name>_progress"``."""
    return sql.SQL("reclock.{}").format(sql.Identifier(f"{validate_source_name(name)}_progress"))


def read_progress(conn, name: str, newest: int | None = None) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The source's ``<source>_progress`` relation in its kind's columns (``ts`` first), oldest binding first,
    every value after ``ts`` as text (an LSN as ``0/16B3748``, a key as itself; null as ``-``); ``newest``:
    only the rows of the newest that many bindings. What ``reclock progress`` and the status page show."""
    where, args = sql.SQL(""), ()
    if newest is not None:
        where = sql.SQL(" WHERE ts IN (SELECT ts FROM reclock.remap_bindings WHERE source = %s ORDER BY ts DESC "
                        "LIMIT %s)")
        args = (name, newest)
    cur = conn.execute(sql.SQL("SELECT * FROM {}{} ORDER BY 1, 2").format(progress_view(name), where), args)
    columns = tuple(d.name for d in cur.description)
    return columns, [(r[0], *("-" if v is None else str(v) for v in r[1:])) for r in cur.fetchall()]


def register_source(conn, name: str, kind: str = "kafka", config: dict | None = None,
                    progress: str = OFFSETS_PROGRESS) -> None:
    """Create the source, its empty remap collection (upper 0, since 0) and its progress view (``progress``:
    the body of its ``CREATE VIEW``, ``{}`` standing for the source's name as a literal; the kind's
    ``reclock.sources.base.SourceKind.progress_view``).

    Idempotent: registering an existing source again changes nothing, except that a ``config`` given
    replaces the stored one. Registering it with another ``kind`` is a ``ConfigError``.
    """
    validate_source_name(name)
    with conn.transaction():
        conn.execute("INSERT INTO reclock.sources (name, kind, config) VALUES (%s, %s, %s) "
                     "ON CONFLICT (name) DO NOTHING", (name, kind, Jsonb(config or {})))
        conn.execute("INSERT INTO reclock.remap_collections (source) VALUES (%s) ON CONFLICT DO NOTHING", (name,))
        # serialize concurrent registrations of this source, then look at what is there
        conn.execute("SELECT 1 FROM reclock.remap_collections WHERE source = %s FOR UPDATE", (name,))
        (have_kind,) = conn.execute("SELECT kind FROM reclock.sources WHERE name = %s", (name,)).fetchone()
        if have_kind != kind:
            raise ConfigError(f"source {name}: already registered as a {have_kind} source, not {kind} "
                              "(choose another name for the new source)")
        if config is not None:
            conn.execute("UPDATE reclock.sources SET config = %s WHERE name = %s AND config <> %s",
                         (Jsonb(config), name, Jsonb(config)))
        view = f"{name}_progress"
        (exists,) = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                 (sql.SQL("reclock.{}").format(sql.Identifier(view)).as_string(conn),)).fetchone()
        if not exists:
            # a view over one source's rows; the name is validated, quoted, and a literal in the body
            conn.execute(sql.SQL("CREATE VIEW {} AS " + progress).format(progress_view(name), sql.Literal(name)))


def newest_binding(conn, name: str) -> tuple[int, dict[int, int]] | None:
    """The timestamp and offsets of source ``name``'s newest binding (None before its first): two index
    lookups, not the whole remap collection."""
    row = conn.execute("SELECT max(ts) FROM reclock.remap_bindings WHERE source = %s", (name,)).fetchone()
    if row is None or row[0] is None:
        return None
    rows = conn.execute('SELECT partition, "offset" FROM reclock.remap_offsets WHERE source = %s AND ts = %s',
                        (name, row[0])).fetchall()
    return row[0], {p: int(o) for p, o in rows}  # offsets are numeric: exact ints


def load_remap(conn, name: str) -> RemapCollection:
    """The source's remap collection, read in one statement (one consistent snapshot)."""
    validate_source_name(name)
    rows = conn.execute(
        'SELECT c.upper, c.since, b.ts, o.partition, o."offset" '
        "FROM reclock.remap_collections c "
        "LEFT JOIN reclock.remap_bindings b ON b.source = c.source "
        "LEFT JOIN reclock.remap_offsets o ON o.source = b.source AND o.ts = b.ts "
        "WHERE c.source = %s ORDER BY b.ts, o.partition", (name,)).fetchall()
    if not rows:
        raise UnknownSource(name)
    upper, since = rows[0][0], rows[0][1]
    frontiers: dict[int, list[tuple[int, int]]] = {}
    for _, _, ts, p, o in rows:
        if ts is None:
            continue
        offsets = frontiers.setdefault(ts, [])
        if p is not None:
            offsets.append((p, o))
    bindings = tuple(Binding(ts, PartitionedFrontier.of(offs)) for ts, offs in frontiers.items())
    return RemapCollection(name, bindings, since, upper)


def _lock(conn, name: str) -> tuple[int, int]:
    row = conn.execute("SELECT upper, since FROM reclock.remap_collections WHERE source = %s FOR UPDATE",
                       (name,)).fetchone()
    if row is None:
        raise UnknownSource(name)
    return row


def _insert_binding(conn, name: str, b: Binding) -> None:
    conn.execute("INSERT INTO reclock.remap_bindings (source, ts) VALUES (%s, %s)", (name, b.ts))
    if len(b.frontier):
        with conn.cursor() as cur:
            cur.executemany('INSERT INTO reclock.remap_offsets (source, ts, partition, "offset") '
                            "VALUES (%s, %s, %s, %s)", [(name, b.ts, p, o) for p, o in b.frontier])


def append_binding(conn, name: str, expected_upper: int, binding: Binding) -> RemapCollection:
    """Append ``binding`` if the remap upper is still ``expected_upper`` (compare-and-set); the new upper
    is ``binding.ts + 1``. Returns the collection as this append left it.

    Raises ``RemapUpperMismatch`` (carrying the actual upper; nothing changes) if another minter came
    first, and ``ValueError`` for a binding below ``expected_upper`` or one whose frontier goes backwards
    from the last binding's.
    """
    validate_source_name(name)
    check_timestamp(expected_upper)
    if binding.ts < expected_upper:
        raise ValueError(f"source {name}: binding at {binding.ts} is below the expected remap upper "
                         f"{expected_upper} (that time is closed; mint at next_binding_ts)")
    if binding.ts >= MAX_TIMESTAMP:
        raise ValueError(f"source {name}: binding at {binding.ts} leaves no room for an upper after it")
    with conn.transaction():
        upper, _ = _lock(conn, name)
        if upper != expected_upper:
            raise RemapUpperMismatch(name, expected_upper, upper)
        appended = remap.append(load_remap(conn, name), binding)  # frontier not backwards, ts not closed
        _insert_binding(conn, name, binding)
        conn.execute("UPDATE reclock.remap_collections SET upper = %s WHERE source = %s", (appended.upper, name))
    return appended


def advance_remap_upper(conn, name: str, expected_upper: int, upper: int) -> RemapCollection:
    """Move the remap upper from ``expected_upper`` to ``upper`` without a binding (``reclock.remap.advance_upper``:
    the probe found nothing new), with the same compare-and-set as :func:`append_binding`:
    ``RemapUpperMismatch`` if another minter came first (nothing changes)."""
    validate_source_name(name)
    check_timestamp(upper)
    with conn.transaction():
        current, _ = _lock(conn, name)
        if current != expected_upper:
            raise RemapUpperMismatch(name, expected_upper, current)
        advanced = remap.advance_upper(load_remap(conn, name), upper)
        conn.execute("UPDATE reclock.remap_collections SET upper = %s WHERE source = %s", (advanced.upper, name))
    return advanced


def compact_remap(conn, name: str, since: int) -> RemapCollection:
    """Advance the remap collection's ``since`` (see :func:`reclock.remap.compact`): the bindings at
    ``ts <= since`` collapse into one binding at ``since`` carrying the last of their frontiers; later
    bindings are untouched, so ``progress_as_of(t)`` is unchanged for every ``t >= since``.

    ``since`` never goes backwards (a ``since`` at or below the current one changes nothing) and never
    passes the upper (``ValueError``; once bindings exist it must stay below it). Returns the collection
    as this compaction left it.
    """
    validate_source_name(name)
    check_timestamp(since)
    with conn.transaction():
        _lock(conn, name)
        rc = load_remap(conn, name)
        compacted = remap.compact(rc, since)
        if compacted.since == rc.since:
            return rc
        conn.execute("DELETE FROM reclock.remap_bindings WHERE source = %s AND ts <= %s", (name, since))
        if compacted.bindings and compacted.bindings[0].ts == since:
            _insert_binding(conn, name, compacted.bindings[0])
        conn.execute("UPDATE reclock.remap_collections SET since = %s WHERE source = %s", (since, name))
    return compacted


def drop_partitions(conn, name: str, partitions) -> int:
    """Delete ``partitions`` from every binding of the source, in the caller's transaction (the collection's
    row locked, as appends lock it): a kind drops positions that say nothing any more (Kinesis: a shard read
    to its end, once its children are in every binding, which say it is done). Every binding's frontier
    loses the same partitions, so the collection stays valid (each frontier still ``less_equal`` the next).
    Returns how many offset rows went."""
    validate_source_name(name)
    _lock(conn, name)
    return conn.execute("DELETE FROM reclock.remap_offsets WHERE source = %s AND partition = ANY(%s)",
                        (name, sorted(int(p) for p in partitions))).rowcount
