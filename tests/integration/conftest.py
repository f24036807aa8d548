"""Fixtures of the integration tests: a persist connection to a migrated database (``db``, tests/conftest.py)."""

from __future__ import annotations

import pytest

from reclock.persist import connect


@pytest.fixture
def conn(db: str):
    """An autocommit connection to ``db``, as the persist functions expect (``reclock.persist.connect``)."""
    with connect(db) as c:
        yield c


@pytest.fixture(scope="session")
def s3_auth(stack_state):
    """A second moto server that checks keys as AWS does (IAM): for wrong credentials."""
    from reclock.dev.s3 import LocalS3

    server = LocalS3(stack_state, name="s3auth", auth=True)
    server.start()
    yield server
    server.stop()
