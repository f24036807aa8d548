"""Fixtures of the stack tests: a state folder per test (``stack_home``), and the one stack that
test_stack_up, test_airflow_ops and test_status_ui share (``shared_stack``: ``reclock dev up`` before the
first of them, ``reclock dev down`` right after the last, each test with sources of its own)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from stack_support import SharedStack

HERE = Path(__file__).resolve().parent
_LAST_ON_SHARED: set[str] = set()  # the node id of the last collected test on the shared stack


def _home() -> Path:
    """Outside pytest's 0700 temp folders: the ``postgres`` user must reach the cluster's files."""
    root = Path(tempfile.mkdtemp(prefix="reclock-stack-"))
    root.chmod(0o755)
    return root


@pytest.fixture
def stack_home():
    root = _home()
    yield root
    shutil.rmtree(root, ignore_errors=True)


class _Shared:
    """The shared stack's life: started once, stopped once (after its last test, or at the session's end when
    that test never ran: ``-x``, an interrupt)."""

    stack: SharedStack | None = None

    @classmethod
    def down(cls) -> None:
        shared, cls.stack = cls.stack, None
        if shared is not None:
            try:
                shared.down()
            finally:
                shutil.rmtree(shared.home, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_stack():
    """``reclock dev up`` (smoke checks included) once for the tests that take this fixture; ``reclock dev
    down``, checked (every service down, every port closed), in the teardown of the last of them. A failed
    up fails each of them (:meth:`SharedStack.require_up`)."""
    _Shared.stack = SharedStack(_home())
    try:
        _Shared.stack.start()
        yield _Shared.stack
    finally:
        _Shared.down()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The stack tests that start stacks of their own run before those on the shared stack, so that two
    Airflow stacks never run at once; the last test on the shared stack is noted (its teardown stops it)."""
    slots = [i for i, item in enumerate(items) if HERE in Path(str(item.path)).parents]
    mine = [items[i] for i in slots]
    mine.sort(key=lambda item: "shared_stack" in getattr(item, "fixturenames", ()))
    for i, item in zip(slots, mine):
        items[i] = item
    _LAST_ON_SHARED.clear()
    _LAST_ON_SHARED.update([i.nodeid for i in mine if "shared_stack" in getattr(i, "fixturenames", ())][-1:])


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After the last test on the shared stack: ``reclock dev down`` (its failure is that test's teardown
    error), so the stack never runs beside the tests after it."""
    if item.nodeid in _LAST_ON_SHARED:
        _Shared.down()
