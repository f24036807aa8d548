"""``schedule: continuous`` keys: ``lease``, ``resume``, ``group`` (one task for the group's sources)."""

from __future__ import annotations

import pytest

from reclock.config import groups, parse_config, parse_source
from reclock.errors import ConfigError

RAW = {"kafka": {"topic": "t", "bootstrap": "127.0.0.1:9"}, "format": {"type": "bytes"}}
CONT = {**RAW, "schedule": "continuous"}


def test_defaults_and_the_dag_that_runs_a_source():
    s = parse_source("s", CONT)
    assert (s.lease_s, s.resume_s, s.group, s.ingest_dag) == (600.0, 1.0, None, "ingest__s")
    g = parse_source("s", {**CONT, "group": "g1", "resume": "5s", "lease": "2m"})
    assert (g.lease_s, g.resume_s, g.group, g.ingest_dag) == (120.0, 5.0, "g1", "ingest_group__g1")


@pytest.mark.parametrize("key,value", [("group", "g"), ("resume", "1s"), ("lease", "1m")])
@pytest.mark.parametrize("schedule", ["interval", "upstream"])
def test_continuous_keys_are_refused_for_other_schedules(key, value, schedule):
    with pytest.raises(ConfigError, match=rf"source s: `{key}:` is for `schedule: continuous`"):
        parse_source("s", {**RAW, "schedule": schedule, key: value})


@pytest.mark.parametrize("group", ["G", "1g", "a-b", "", 3, "x" * 50])
def test_a_group_name_must_be_a_plain_name(group):
    with pytest.raises(ConfigError, match=r"source s: `group` must match .* ingest_group__<group>"):
        parse_source("s", {**CONT, "group": group})


@pytest.mark.parametrize("resume", ["0s", "-1s", "soon", 0])
def test_resume_must_be_a_positive_duration(resume):
    with pytest.raises(ConfigError, match=r"source s\.resume: .* is not a duration"):
        parse_source("s", {**CONT, "resume": resume})


def test_a_groups_sources_share_one_lease():
    cfg = parse_config({"sources": {"a": {**CONT, "group": "g"}, "b": {**CONT, "group": "g"},
                                    "c": {**CONT, "group": "h", "lease": "1m"}, "d": CONT}})
    assert {g: [m.name for m in ms] for g, ms in groups(cfg.sources).items()} == {"g": ["a", "b"], "h": ["c"]}
    with pytest.raises(ConfigError, match=r"group g: its sources run in one task and need one `lease:`; "
                                          r"got a: 600s, b: 60s"):
        parse_config({"sources": {"a": {**CONT, "group": "g"}, "b": {**CONT, "group": "g", "lease": "1m"}}})
