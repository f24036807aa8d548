"""pytest imports test files by their base name (rootdir-relative ``tests/`` has no packages): two test files
of one name in different folders stop the whole run at collection. Checked here, in the unit tests every
engineer runs, rather than by the full suite's first seconds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_a_name_of_its_own():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if ".venv" not in p.parts)
    assert not [n for n, c in names.items() if c > 1]
