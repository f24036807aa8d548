"""Persistence: consensus in Postgres (schema ``reclock``) and immutable parts in a blob store.

=================  ======================================================================================
``migrate``        ``migrate(dsn_or_conn)``: the schema's versioned, checksummed, lock-serialized migrations
``remap_store``    a source's durable remap collection: ``register_source``, ``load_remap``,
                   ``append_binding`` (compare-and-set on the remap upper), ``compact_remap``; the
                   ``<source>_progress`` view and ``reclock.progress_as_of(source, t)``
``shards``         shards' ``upper``/``since``, their batches of parts, ``compare_and_append`` over several
                   shards in one transaction, reads AS OF t, read holds, ``advance_since``
``blob``           the ``BlobStore`` protocol: ``LocalBlobStore`` (default), ``FsspecBlobStore`` (S3, ...)
``compact``        ``compact_parts``: merge a shard's small parts at or below its since (bounded batches)
``gc``             ``collect_garbage``: unreferenced parts older than a grace period
``status``         status history and statistics rows
=================  ======================================================================================

Every function takes a psycopg 3 connection and does its work in one transaction of its own (a
savepoint when the caller already has one open). Every query is parameterised; names that become SQL
identifiers are validated (``names``) and quoted with ``psycopg.sql.Identifier``.
"""

import psycopg


def connect(dsn: str) -> psycopg.Connection:
    """A connection for the persist functions: autocommit, so a read never leaves an implicit transaction
    open (that would hold a compare-and-set's row locks past the function); each function opens its
    own transaction, and callers may still group several in ``with conn.transaction():``.

    A server (or database, or role) set to ``synchronous_commit = off`` acknowledges a commit before its
    WAL is flushed, and a crash then forgets it: an append a sink has already exported, or a frontier a
    slot has already been advanced to. So where the setting is ``off`` the session turns it ``on``
    (``local`` and the replication levels already flush locally and are kept)."""
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute("SELECT set_config('synchronous_commit', 'on', false) "
                     "WHERE current_setting('synchronous_commit') = 'off'")
    except BaseException:
        conn.close()
        raise
    return conn
