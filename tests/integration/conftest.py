"""Fixtures of the integration tests: a migrated database per test, and a persist connection to it."""

from __future__ import annotations

import pytest

from reclock.persist import connect
from reclock.persist.migrate import migrate


@pytest.fixture
def db(fresh_db: str) -> str:
    """A new database with the ``reclock`` schema migrated; returns its DSN."""
    migrate(fresh_db)
    return fresh_db


@pytest.fixture
def conn(db: str):
    """An autocommit connection to ``db``, as the persist functions expect (``reclock.persist.connect``)."""
    with connect(db) as c:
        yield c
