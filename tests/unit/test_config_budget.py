"""A source's budget: what it accepts is what the cycle enforces."""

from __future__ import annotations

import pytest

from reclock.config import parse_source
from reclock.errors import ConfigError

RAW = {"kafka": {"topic": "t", "bootstrap": "127.0.0.1:9"}, "format": {"type": "bytes"}}


def test_max_records_sizes_a_cycles_spark_jobs():
    assert parse_source("s", {**RAW, "budget": {"max_records": 7}}).budget.max_records == 7
    with pytest.raises(ConfigError, match=r"source s\.budget: max_records must be positive, got 0"):
        parse_source("s", {**RAW, "budget": {"max_records": 0}})


def test_max_bytes_is_refused_not_ignored():
    """It was accepted and never enforced; a budget the cycle does not keep is refused, saying why."""
    with pytest.raises(ConfigError, match=r"max_bytes is not supported for a source .* use max_records|"
                                          r"max_bytes is not supported for a source"):
        parse_source("s", {**RAW, "budget": {"max_records": 10, "max_bytes": 1 << 20}})
