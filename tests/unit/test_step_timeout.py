"""``step_timeout``: every kind's sources take it (30m by default); a ``write_batches`` step's Spark work is
interrupted past it (``reclock.spark.deadline``; the real interrupt is tested against a Spark Connect server in
tests/integration/test_network_faults.py), and a ``mint_write`` try is bounded by Airflow's
``execution_timeout``: ``interval`` + ``step_timeout`` + ``TRY_MARGIN_S``."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import yaml

from reclock.config import parse_source
from reclock.errors import ConfigError, StepDeadlineExceeded
from reclock.spark.deadline import SparkDeadline

KINDS = {
    "kafka": {"kafka": {"topic": "t", "bootstrap": "127.0.0.1:9"}, "format": {"type": "bytes"}},
    "postgres": {"postgres": {"dsn_env": "SHOP_DSN", "publication": "p"}},
    "s3": {"s3": {"url": "s3://landing/events/"}, "format": {"type": "json", "schema": "n BIGINT"}},
    "kinesis": {"kinesis": {"stream": "clicks"}, "format": {"type": "json", "schema": "n BIGINT"}},
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_takes_a_step_timeout_and_defaults_to_30_minutes(kind):
    assert parse_source("s", KINDS[kind]).step_timeout_s == 1800.0
    assert parse_source("s", {**KINDS[kind], "step_timeout": "2m"}).step_timeout_s == 120.0


@pytest.mark.parametrize("value", ["0s", "-1m", "soon", 0, True])
def test_a_step_timeout_must_be_a_positive_duration(value):
    with pytest.raises(ConfigError, match=r"source s\.step_timeout: .* is not a duration"):
        parse_source("s", {**KINDS["kafka"], "step_timeout": value})


def test_the_mint_write_try_is_bounded_by_interval_plus_step_timeout_plus_a_margin(tmp_path, monkeypatch):
    from reclock.orchestration.dags import build_all
    from reclock.orchestration.ingest import TRY_MARGIN_S

    (tmp_path / "include").mkdir()
    cfg = {"sources": {"a": {**KINDS["kafka"], "interval": "30s", "step_timeout": "5m"}}}
    (tmp_path / "include" / "reclock.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.delenv("RECLOCK_CONFIG", raising=False)
    dag = build_all(project=tmp_path)["ingest__a"]
    assert dag.get_task("mint_write").execution_timeout == timedelta(seconds=30 + 300 + TRY_MARGIN_S)


class TaggedSession:
    """A session with Spark's tag calls, recording them (only the deadline's own bookkeeping is checked here;
    the interrupt of a real operation is the integration test's)."""

    def __init__(self, interrupted: list[str] | None = None) -> None:
        self.tags: set[str] = set()
        self.interrupts: list[str] = []
        self.ids = interrupted or []
        self.called = threading.Event()

    def addTag(self, tag):  # noqa: N802 - Spark's name
        self.tags.add(tag)

    def removeTag(self, tag):  # noqa: N802
        self.tags.remove(tag)

    def interruptTag(self, tag):  # noqa: N802
        self.interrupts.append(tag)
        self.called.set()
        return self.ids


def test_a_step_within_its_deadline_is_left_alone_and_untagged():
    s = TaggedSession()
    with SparkDeadline("source s: write_batches", 60, lambda: s) as d:
        d.tag(s)
        assert s.tags == {d.job_tag}
    assert s.tags == set() and s.interrupts == [] and not d.fired


def test_past_its_deadline_the_steps_tag_is_interrupted_and_its_failure_names_the_deadline():
    s = TaggedSession(["op-1"])
    with pytest.raises(StepDeadlineExceeded, match=r"source s: write_batches: .* deadline of 0.2 s .* 1 operation"):
        with SparkDeadline("source s: write_batches", 0.2, lambda: s) as d:
            d.tag(s)
            assert s.called.wait(30)
            raise RuntimeError("[OPERATION_CANCELED] Operation has been canceled.")
    assert s.interrupts and set(s.interrupts) == {d.job_tag} and s.tags == set()


def test_a_failure_past_the_deadline_that_no_interrupt_caused_is_raised_as_it_is():
    s = TaggedSession([])  # the interrupt found no operation of the step running
    with pytest.raises(TimeoutError, match="the broker"):
        with SparkDeadline("source s: write_batches", 0.2, lambda: s) as d:
            assert s.called.wait(30)
            raise TimeoutError("the broker did not answer")
    assert d.fired and d.interrupted == 0


def test_a_step_that_ends_well_past_its_deadline_keeps_its_result():
    s = TaggedSession([])
    with SparkDeadline("source s: write_batches", 0.2, lambda: s) as d:
        assert s.called.wait(30)
    assert d.fired


def test_a_deadline_must_be_positive():
    with pytest.raises(ValueError, match="must be positive"):
        SparkDeadline("x", 0, lambda: None)
