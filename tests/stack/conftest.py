"""Fixtures of the stack tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def stack_home():
    """Outside pytest's 0700 temp folders: the ``postgres`` user must reach the cluster's files."""
    root = Path(tempfile.mkdtemp(prefix="reclock-stack-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)
