"""Persistence: consensus in Postgres (remap collections, shards, read holds, status) and parts in a
blob store. Every function takes a psycopg connection and does its work in one transaction."""

import psycopg


def connect(dsn: str) -> psycopg.Connection:
    """A connection for the persist functions: autocommit, so a read never leaves an implicit transaction
    open (that would hold a compare-and-set's row locks past the function); each function opens its
    own transaction, and callers may still group several in ``with conn.transaction():``."""
    return psycopg.connect(dsn, autocommit=True)
