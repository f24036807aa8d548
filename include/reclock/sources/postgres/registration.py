"""The tables a Postgres source registered at its first cycle, kept in its row of ``reclock.sources``
(``config -> 'postgres'``): each table's oid and columns, in output order (``tables``), and the timestamp
of the binding whose write takes a snapshot (``snapshot_ts``; absent: the first binding), and the LSN of
the snapshot the collections start from (``snapshot_lsn``, recorded when it is appended).

Written once, with the source's first binding still to come, and replaced by a re-snapshot, in the
transaction that appends the re-snapshot's binding; a table's columns also change with the append of a write
in which DDL flowed (:func:`update_tables`, ``reclock.sources.postgres.ddl``): cycles compare the stream's
Relation messages against it, so DDL never changes a collection's columns silently
(``reclock.sources.postgres.cdc``).
"""

from __future__ import annotations

from typing import Sequence

from psycopg.types.json import Jsonb

from reclock.sources.postgres.ddl import CatalogTable
from reclock.sources.postgres.upstream import TableInfo

CATALOGS_KEPT = 8
"""How many catalogs as of an upper (:func:`record_catalog`) a source keeps: a write reads its upper's."""


def registered_tables(conn, source: str) -> list[TableInfo] | None:
    """The source's registered tables, or None if none were registered yet."""
    row = conn.execute("SELECT config -> 'postgres' -> 'tables' FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    if row is None or row[0] is None:
        return None
    return [TableInfo.from_json(d) for d in row[0]]


def snapshot_ts(conn, source: str) -> int | None:
    """The timestamp of the binding a re-snapshot appended (None: the source's first binding snapshots)."""
    row = conn.execute("SELECT (config -> 'postgres' ->> 'snapshot_ts')::bigint FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    return None if row is None else row[0]


def snapshot_lsn(conn, source: str) -> int | None:
    """The LSN of the snapshot the source's collections start from (the exported snapshot's consistent
    point), recorded by the append of the write that took it; None before that (or for a source registered
    before it was recorded). A table of key identity takes no change committed below it: the snapshot holds
    it (``reclock.sources.postgres.cdc``)."""
    row = conn.execute("SELECT (config -> 'postgres' ->> 'snapshot_lsn')::bigint FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    return None if row is None else row[0]


def record_snapshot_lsn(conn, source: str, lsn: int) -> None:
    """Record :func:`snapshot_lsn` (in the transaction of the append that makes the snapshot visible)."""
    conn.execute("UPDATE reclock.sources SET config = jsonb_set(config, '{postgres,snapshot_lsn}', to_jsonb(%s::int8)) "
                 "WHERE name = %s", (lsn, source))


def replace_tables(conn, source: str, tables: Sequence[TableInfo], snapshot_at: int) -> None:
    """A re-snapshot's registration: ``tables``, snapshotted at the binding ``snapshot_at`` (in the caller's
    transaction, with that binding's append)."""
    conn.execute("UPDATE reclock.sources SET config = jsonb_set(config, '{postgres}', %s) WHERE name = %s",
                 (Jsonb({"tables": [t.to_json() for t in tables], "snapshot_ts": snapshot_at}), source))


def update_tables(conn, source: str, tables: Sequence[TableInfo]) -> None:
    """The tables with the columns DDL that flowed gave them (``reclock.sources.postgres.ddl``), in the caller's
    transaction (the append of the write that met the DDL); the snapshot's timestamp and LSN stay."""
    conn.execute("UPDATE reclock.sources SET config = jsonb_set(config, '{postgres,tables}', %s) WHERE name = %s",
                 (Jsonb([t.to_json() for t in tables]), source))


def register_tables(conn, source: str, tables: Sequence[TableInfo]) -> list[TableInfo]:
    """Record ``tables`` unless the source already has tables registered; return what is registered."""
    with conn.transaction():
        conn.execute("UPDATE reclock.sources SET config = jsonb_set(config, '{postgres}', %s) "
                     "WHERE name = %s AND NOT config ? 'postgres'",
                     (Jsonb({"tables": [t.to_json() for t in tables]}), source))
    found = registered_tables(conn, source)
    assert found is not None, f"source {source} is registered"
    return found


def record_catalog(conn, source: str, lsn: int, catalog: dict[int, CatalogTable]) -> None:
    """Keep the tables' columns in the catalog as of upper ``lsn`` (``PostgresUpstream.catalog_upper``, read by a
    mint) for the write that decodes up to it (:func:`catalog_at`); the :data:`CATALOGS_KEPT` highest uppers
    are kept."""
    with conn.transaction():
        row = conn.execute("SELECT config -> 'postgres' -> 'catalogs' FROM reclock.sources WHERE name = %s FOR UPDATE",
                           (source,)).fetchone()
        if row is None:
            return
        kept = dict(row[0] or {})
        if str(lsn) in kept:  # minted again at the same upper: no ALTER committed since (it would move the upper)
            return
        kept[str(lsn)] = {str(r): t.to_json() for r, t in catalog.items()}
        kept = {k: kept[k] for k in sorted(kept, key=int)[-CATALOGS_KEPT:]}
        conn.execute("UPDATE reclock.sources SET config = jsonb_set(config, '{postgres,catalogs}', %s) WHERE name = %s "
                     "AND config ? 'postgres'", (Jsonb(kept), source))


def catalog_at(conn, source: str, lsn: int) -> dict[int, CatalogTable] | None:
    """The tables' columns in the catalog as of upper ``lsn`` (:func:`record_catalog`), None if none was kept
    (a binding minted before catalogs were kept, or another cycle's mints pushed it out)."""
    row = conn.execute("SELECT config -> 'postgres' -> 'catalogs' -> %s FROM reclock.sources WHERE name = %s",
                       (str(lsn), source)).fetchone()
    if row is None or row[0] is None:
        return None
    return {int(r): CatalogTable.from_json(t) for r, t in row[0].items()}


def table_snapshots(conn, source: str) -> dict[str, int]:
    """The tables whose snapshot of their own is pending (a table that joined the publication, or ``reclock
    resnapshot <source> --table``): ``{table: ts}``, taken by the write whose description holds the first binding
    at or after ``ts`` (``reclock.sources.postgres.kind``), cleared by its append."""
    row = conn.execute("SELECT config -> 'postgres' -> 'table_snapshots' FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    return {} if row is None or row[0] is None else {t: int(ts) for t, ts in row[0].items()}


def table_snapshot_lsns(conn, source: str) -> dict[str, int]:
    """Per table snapshotted on its own, the LSN of that snapshot (recorded by the append that made it visible):
    a key table takes no change committed below it, as :func:`snapshot_lsn` for every table."""
    row = conn.execute("SELECT config -> 'postgres' -> 'table_snapshot_lsns' FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    return {} if row is None or row[0] is None else {t: int(lsn) for t, lsn in row[0].items()}


def request_table_snapshot(conn, source: str, tables: Sequence[TableInfo], table: TableInfo, at: int) -> None:
    """Register ``tables`` (``table`` among them, new or described again) with a snapshot of ``table`` alone
    pending at ``at`` (:func:`table_snapshots`), in the caller's transaction."""
    conn.execute("UPDATE reclock.sources SET config = jsonb_set(jsonb_set(config, '{postgres,tables}', %s), "
                 "'{postgres,table_snapshots}', coalesce(config -> 'postgres' -> 'table_snapshots', '{}') || %s) "
                 "WHERE name = %s", (Jsonb([t.to_json() for t in tables]), Jsonb({table.table: at}), source))


def record_table_snapshots(conn, source: str, done: dict[str, int | None]) -> None:
    """The append of a write that took the pending snapshots ``done`` (``{table: its snapshot's LSN}``; None:
    subsumed by the source's own snapshot): no longer pending, their LSNs recorded."""
    lsns = {t: lsn for t, lsn in done.items() if lsn is not None}
    conn.execute("UPDATE reclock.sources SET config = jsonb_set(jsonb_set(config, '{postgres,table_snapshots}', "
                 "coalesce(config -> 'postgres' -> 'table_snapshots', '{}') - %s::text[]), "
                 "'{postgres,table_snapshot_lsns}', coalesce(config -> 'postgres' -> 'table_snapshot_lsns', '{}') || %s) "
                 "WHERE name = %s", (list(done), Jsonb(lsns), source))


def chunked_snapshots(conn, source: str) -> dict[str, dict]:
    """The tables whose snapshot of their own is taken online in chunks (``reclock.sources.postgres.chunks``),
    with its progress as appended: ``{table: {"at": the request's ts, "done": the last key read (None: no chunk
    yet), "chunks": chunks appended, "rows": their rows, "total": the chunks expected (an estimate), "landed":
    [[ts, last key], ...]}}``. A table leaves it with the append of its last chunk."""
    row = conn.execute("SELECT config -> 'postgres' -> 'chunked' FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    return {} if row is None or row[0] is None else dict(row[0])


def request_chunked_snapshot(conn, source: str, tables: Sequence[TableInfo], table: TableInfo, at: int,
                             total: int) -> None:
    """Register ``tables`` (``table`` among them) with a chunked snapshot of ``table`` pending from ``at``
    (:func:`chunked_snapshots`, started over if one was under way), in the caller's transaction."""
    progress = {"at": at, "done": None, "chunks": 0, "rows": 0, "total": total, "landed": []}
    conn.execute("UPDATE reclock.sources SET config = jsonb_set(jsonb_set(jsonb_set(config, '{postgres,tables}', %s), "
                 "'{postgres,chunked}', coalesce(config -> 'postgres' -> 'chunked', '{}') || %s), "
                 "'{postgres,table_snapshots}', coalesce(config -> 'postgres' -> 'table_snapshots', '{}') - %s) "
                 "WHERE name = %s", (Jsonb([t.to_json() for t in tables]), Jsonb({table.table: progress}), table.table,
                                     source))


def record_chunk_progress(conn, source: str, progress: dict[str, dict | None]) -> None:
    """The append of a write that landed chunks: each table's progress, in the append's transaction; a table
    whose last chunk is in (``finished``) streams from then on, its progress kept under ``chunked_done``; None:
    no longer chunked (the source's own snapshot took it, or a snapshot of another kind was requested)."""
    with conn.transaction():
        now, ended = chunked_snapshots(conn, source), chunked_done(conn, source)
        for table, p in progress.items():
            now.pop(table, None)
            if p is not None and p.get("finished"):
                ended[table] = p
            elif p is not None:
                now[table] = p
        conn.execute("UPDATE reclock.sources SET config = jsonb_set(jsonb_set(config, '{postgres,chunked}', %s), "
                     "'{postgres,chunked_done}', %s) WHERE name = %s", (Jsonb(now), Jsonb(ended), source))


def chunked_done(conn, source: str) -> dict[str, dict]:
    """The chunked snapshots whose last chunk is in, with their progress (:func:`chunked_snapshots`), the latest
    per table."""
    row = conn.execute("SELECT config -> 'postgres' -> 'chunked_done' FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    return {} if row is None or row[0] is None else dict(row[0])


def record_chunk_stage(conn, source: str, lsn: int, stage: dict[str, dict]) -> None:
    """The chunks a mint read before upper ``lsn`` (``{table: {"prefix": their parts, "chunks": [Chunk.to_json()],
    "from": the progress they follow}}``), for the write of the binding at ``lsn``; the :data:`CATALOGS_KEPT`
    highest uppers are kept."""
    with conn.transaction():
        row = conn.execute("SELECT config -> 'postgres' -> 'chunk_stages' FROM reclock.sources WHERE name = %s "
                           "FOR UPDATE", (source,)).fetchone()
        if row is None:
            return
        kept = dict(row[0] or {})
        kept[str(lsn)] = stage
        kept = {k: kept[k] for k in sorted(kept, key=int)[-CATALOGS_KEPT:]}
        conn.execute("UPDATE reclock.sources SET config = jsonb_set(config, '{postgres,chunk_stages}', %s) "
                     "WHERE name = %s AND config ? 'postgres'", (Jsonb(kept), source))


def chunk_stages(conn, source: str) -> dict[int, dict[str, dict]]:
    """The chunks each recent mint read, by the upper it bound (:func:`record_chunk_stage`)."""
    row = conn.execute("SELECT config -> 'postgres' -> 'chunk_stages' FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    return {} if row is None or row[0] is None else {int(k): v for k, v in row[0].items()}
