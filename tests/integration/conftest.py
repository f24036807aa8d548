"""Fixtures of the integration tests: a persist connection to a migrated database (``db``, tests/conftest.py)."""

from __future__ import annotations

import pytest

from reclock.persist import connect


@pytest.fixture
def conn(db: str):
    """An autocommit connection to ``db``, as the persist functions expect (``reclock.persist.connect``)."""
    with connect(db) as c:
        yield c
