"""The tables a Postgres source registered at its first cycle, kept in its row of ``reclock.sources``
(``config -> 'postgres' -> 'tables'``): each table's oid and columns, in output order.

Written once, with the source's first binding still to come, and never replaced: later cycles compare the
stream's Relation messages against it, so DDL never changes a collection's columns silently
(``reclock.cdc``).
"""

from __future__ import annotations

from typing import Sequence

from psycopg.types.json import Jsonb

from reclock.sources.postgres import TableInfo


def registered_tables(conn, source: str) -> list[TableInfo] | None:
    """The source's registered tables, or None if none were registered yet."""
    row = conn.execute("SELECT config -> 'postgres' -> 'tables' FROM reclock.sources WHERE name = %s",
                       (source,)).fetchone()
    if row is None or row[0] is None:
        return None
    return [TableInfo.from_json(d) for d in row[0]]


def register_tables(conn, source: str, tables: Sequence[TableInfo]) -> list[TableInfo]:
    """Record ``tables`` unless the source already has tables registered; return what is registered."""
    with conn.transaction():
        conn.execute("UPDATE reclock.sources SET config = jsonb_set(config, '{postgres}', %s) "
                     "WHERE name = %s AND NOT config ? 'postgres'",
                     (Jsonb({"tables": [t.to_json() for t in tables]}), source))
    found = registered_tables(conn, source)
    assert found is not None, f"source {source} is registered"
    return found
