"""An append-only Kafka slice's fingerprint (``reclock.sources.kafka.kind.slice_fingerprint``): what lets a
retried write take a slice an earlier write proved. It must be the same in every process for the same rows,
and differ for anything the rows depend on."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from reclock.batch import OffsetRange
from reclock.config import parse_source
from reclock.sources.kafka.kind import canonical, slice_fingerprint
from reclock.spark.reclocking import BindingRange

RAW = {"kafka": {"topic": "t", "bootstrap": "127.0.0.1:9092"},
       "format": {"type": "json", "schema": "id BIGINT, name STRING"},
       "include": ["partition", "offset", "key"], "budget": {"max_records": 300}, "interval": "2s"}
RANGES = [OffsetRange(0, 10, 40), OffsetRange(1, 0, 5)]
BINDINGS = [BindingRange(0, 0, 20, 100), BindingRange(0, 20, 40, 101), BindingRange(1, 0, 5, 101),
            BindingRange(0, 40, 50, 102)]

_PRINT = """
from reclock.batch import OffsetRange
from reclock.config import parse_source
from reclock.sources.kafka.kind import slice_fingerprint
from reclock.spark.reclocking import BindingRange
import json, sys
raw, ranges, bindings = json.loads(sys.argv[1])
print(slice_fingerprint(parse_source("s", raw), [OffsetRange(*r) for r in ranges],
                        [BindingRange(*b) for b in bindings]))
"""


def _in_process(seed: str) -> str:
    import json

    arg = json.dumps([RAW, [[r.partition, r.start, r.end] for r in RANGES],
                      [[b.partition, b.start, b.end, b.ts] for b in BINDINGS]])
    out = subprocess.run([sys.executable, "-c", _PRINT, arg], env={**os.environ, "PYTHONHASHSEED": seed},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_same_slice_has_the_same_fingerprint_in_every_process():
    """A retry runs in another process (another Airflow try): string hashing is salted per process, so a set
    in the spec must not leak its iteration order into the digest."""
    here = slice_fingerprint(parse_source("s", RAW), RANGES, BINDINGS)
    assert {_in_process("1"), _in_process("2"), _in_process("12345")} == {here}


def test_the_fingerprint_changes_with_what_the_rows_depend_on_and_only_with_it():
    spec = parse_source("s", RAW)
    base = slice_fingerprint(spec, RANGES, BINDINGS)
    # a binding of offsets outside the slice stamps none of its rows; their order does not matter either
    assert slice_fingerprint(spec, RANGES, [*BINDINGS, BindingRange(2, 0, 9, 103)]) == base
    assert slice_fingerprint(spec, RANGES, list(reversed(BINDINGS))) == base
    changed = [
        slice_fingerprint(parse_source("s", {**RAW, "include": ["partition", "offset"]}), RANGES, BINDINGS),
        slice_fingerprint(parse_source("s", {**RAW, "interval": "5s"}), RANGES, BINDINGS),
        slice_fingerprint(parse_source("s2", RAW), RANGES, BINDINGS),
        slice_fingerprint(spec, [OffsetRange(0, 10, 41), OffsetRange(1, 0, 5)], BINDINGS),
        slice_fingerprint(spec, RANGES, [replace(BINDINGS[1], ts=99), *BINDINGS[2:], BINDINGS[0]]),
        slice_fingerprint(spec, RANGES, [*BINDINGS[:3]] + [BindingRange(1, 4, 6, 102)]),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


@given(st.frozensets(st.text(max_size=6), max_size=8), st.sets(st.integers(), max_size=8))
def test_canonical_data_does_not_follow_hash_order(words, numbers):
    """Sets come out sorted: two sets with the same members give the same data whatever order they were
    built in (a set built in reverse iterates differently once its table was resized)."""
    assert canonical(words) == canonical(frozenset(reversed(sorted(words))))
    assert canonical(numbers) == canonical(set(sorted(numbers, reverse=True)))
    assert canonical({"a": words}) == canonical({"a": frozenset(sorted(words))})
