"""Discovery laws (``reclock.sources.s3.discovery``): under each mode's contract every object version gets
exactly one id, nothing is skipped, the catalog stays bounded, overwrites follow the policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.errors import ObjectChanged, ObjectLost
from reclock.sources.s3.client import ObjectInfo
from reclock.sources.s3.discovery import (Discovery, Known, OnOverwrite, Rules, State, forgettable, frontier_of,
                                          reconcile)

STEP = 10  # ms between writes
LOOKBACK = 50


def url(key: str) -> str:
    return f"s3://b/{key}"


class Sim:
    """A bucket written over time and a source that lists it now and then, forgetting what it may."""

    def __init__(self, rules: Rules, mode: Discovery = Discovery.LISTING) -> None:
        self.objects: dict[str, ObjectInfo] = {}
        self.rules, self.mode = rules, mode
        self.catalog: dict[int, Known] = {}
        self.start_after: str | None = None
        self.next_id = 1
        self.next_base = 0
        self.ids_of: dict[tuple[str, str], list[int]] = {}
        self.max_catalog = 0
        self.gap = 0
        self.last = 0

    def put(self, key: str, t: int, body: str = "x") -> None:
        self.objects[key] = ObjectInfo(key, len(body), f"e-{key}-{body}", t)

    def cycle(self, now: int) -> None:
        self.gap, self.last = max(self.gap, now - self.last), now
        listed = [o for k, o in sorted(self.objects.items()) if self.start_after is None or k > self.start_after]
        plan = reconcile("src", url, list(self.catalog.values()), listed, now, self.next_id, self.start_after,
                         self.rules, lambda o, f: o.size, next_base=self.next_base)
        for row in (*plan.added, *plan.changed):
            self.catalog[row.id] = row
        for row in plan.added:
            self.ids_of.setdefault((row.key, row.etag), []).append(row.id)
        self.start_after, self.next_id, self.next_base = plan.start_after, plan.next_id, plan.next_base
        compacted = frontier_of(self.catalog.values(), self.next_base)  # as if all were bound and compacted
        for row in forgettable(self.catalog.values(), compacted, self.start_after, self.mode,
                               self.rules.lookback_ms is not None, None):
            del self.catalog[row.id]
        self.max_catalog = max(self.max_catalog, len(self.catalog))
        # bounded: what stays is what was written within about two lookbacks (a late key holds back the
        # keys after it, which were written at most a lookback before it) and the last gap
        recent = [o for o in self.objects.values() if o.modified_ms >= now - 2 * LOOKBACK - 2 * self.gap]
        if self.rules.lookback_ms is not None:
            assert len(self.catalog) <= len(recent), (now, sorted(r.key for r in self.catalog.values()))


@st.composite
def increasing_writes(draw):
    """(time, key) writes: keys increase with time, except late keys at most LOOKBACK after greater ones."""
    n = draw(st.integers(min_value=1, max_value=60))
    out = []
    for t in range(n):
        late = draw(st.integers(min_value=0, max_value=LOOKBACK // STEP + 1))
        if late and t - late >= 0:
            out.append((t * STEP, f"k{t - late:05d}x{t}"))  # greater keys k{t-late+1}.. were written (late-1) steps ago
        else:
            out.append((t * STEP, f"k{t:05d}"))
    return out


@settings(max_examples=150, deadline=None)
@given(increasing_writes(), st.lists(st.integers(min_value=1, max_value=4 * STEP), min_size=1, max_size=40))
def test_increasing_keys_with_lookback_each_object_once_and_bounded(writes, gaps):
    sim = Sim(Rules(lookback_ms=LOOKBACK))
    now, i = 0, 0
    for gap in gaps:
        now += gap
        while i < len(writes) and writes[i][0] <= now:
            sim.put(writes[i][1], writes[i][0])
            i += 1
        sim.cycle(now)
    for t, key in writes[i:]:
        sim.put(key, t)
    for k in range(3):  # the writes stop: cycles until everything is seen and past the lookback
        now += LOOKBACK + STEP
        sim.cycle(now)
    assert sorted(k for k, _ in sim.ids_of) == sorted(k for _, k in writes)  # nothing skipped
    assert all(len(ids) == 1 for ids in sim.ids_of.values())  # nothing twice
    ids = [i for v in sim.ids_of.values() for i in v]
    assert sorted(ids) == list(range(1, len(ids) + 1))  # dense, from 1
    assert len(sim.catalog) == 0  # after the lookback everything is forgotten


def test_a_key_later_than_the_lookback_is_the_contract_broken():
    sim = Sim(Rules(lookback_ms=LOOKBACK))
    for t in range(10):
        sim.put(f"k{t:03d}", t * STEP)
    sim.cycle(200)
    sim.cycle(300)
    sim.put("k000x", 300)  # far too late: below start_after, never listed (docs/s3.md: an audit finds it)
    sim.cycle(400)
    assert ("k000x", "e-k000x-x") not in sim.ids_of


def test_keys_in_any_order_are_all_remembered():
    sim = Sim(Rules())
    for t in range(20):
        sim.put(f"k{(t * 7) % 20:03d}", t)
        sim.cycle(t * 100)
    assert len(sim.ids_of) == 20 and len(sim.catalog) == 20


def rows_of(sim: Sim) -> list[tuple[str, State]]:
    return [(r.key, r.state) for r in sorted(sim.catalog.values(), key=lambda r: r.id)]


def test_overwrites_follow_the_policy():
    for policy in OnOverwrite:
        sim = Sim(Rules(on_overwrite=policy))
        sim.put("a", 0, "one")
        sim.cycle(10)
        sim.put("a", 20, "two")
        if policy == OnOverwrite.STALL:
            with pytest.raises(ObjectChanged, match=r"s3://b/a was overwritten.*ETag e-a-one.*ETag e-a-two.*on_overwrite"):
                sim.cycle(30)
            continue
        sim.cycle(30)
        sim.cycle(40)  # seen again: nothing new
        want = State.OVERWRITE if policy == OnOverwrite.COLLECT else State.SEALED
        assert rows_of(sim) == [("a", State.SEALED), ("a", want)]
        new = max(sim.catalog.values(), key=lambda r: r.id)
        assert new.previous_etag == "e-a-one" and new.etag == "e-a-two"
        old = min(sim.catalog.values(), key=lambda r: r.id)
        assert (old.base, new.base) == (0, 4)  # "one" takes positions 0..3 of the log, then the new version
        assert frontier_of(sim.catalog.values(), sim.next_base).get(0) == (5 if policy == OnOverwrite.COLLECT else 8)


def test_local_files_grow_settle_and_are_sealed():
    rules = Rules(mutable=True, settle_ms=100)
    known = []
    plan = reconcile("src", url, known, [ObjectInfo("f", 10, "i1", 0)], 50, 1, None, rules, lambda o, f: 8)
    (row,) = plan.added
    assert row.state == State.OPEN and row.complete == 8 and row.own and row.partition == 1
    plan = reconcile("src", url, [row], [ObjectInfo("f", 30, "i1", 60)], 70, 2, None, rules, lambda o, f: 25)
    (row,) = plan.changed
    assert row.state == State.OPEN and row.complete == 25 and row.size == 30
    assert frontier_of([row], 0).as_dict() == {1: 25}
    plan = reconcile("src", url, [row], [ObjectInfo("f", 31, "i1", 60)], 200, 2, None, rules, lambda o, f: 25)
    (row,) = plan.changed
    assert row.state == State.SEALED and row.size == 31  # settled: the last line needs no line end
    assert frontier_of([row], 0).as_dict() == {1: 31} and plan.next_base == 0  # it stays in its partition
    plan = reconcile("src", url, [], [ObjectInfo("g", 5, "i9", 0)], 500, 2, None, rules, lambda o, f: 5)
    assert plan.added[0].base == 0 and not plan.added[0].own and plan.next_base == 6  # settled on sight: the log
    # a sealed file that changes afterwards is an overwrite
    with pytest.raises(ObjectChanged):
        reconcile("src", url, [row], [ObjectInfo("f", 40, "i1", 300)], 400, 1, None, rules, lambda o, f: 40)
    # replaced (new inode) while open: an overwrite too
    open_row = Known(1, "g", "i1", 10, 0, 0, State.OPEN, 5, own=True)
    with pytest.raises(ObjectChanged):
        reconcile("src", url, [open_row], [ObjectInfo("g", 10, "i2", 10)], 20, 1, None, rules, lambda o, f: 5)
    # gone while open, with bytes past its complete lines: lost, loudly
    with pytest.raises(ObjectLost, match="bytes \\[5, 10\\).*gone before it was complete"):
        reconcile("src", url, [open_row], [], 20, 1, None, rules, lambda o, f: 5)


def test_whole_object_formats_wait_until_sealed():
    rules = Rules(mutable=True, settle_ms=100, whole=lambda k: k.endswith(".gz"))
    plan = reconcile("src", url, [], [ObjectInfo("f.gz", 10, "i1", 0)], 50, 1, None, rules, lambda o, f: 8)
    assert plan.added[0].complete == 0 and frontier_of(plan.added, plan.next_base).is_minimum()


def test_notifications_dedupe_by_key_and_etag():
    rules = Rules(on_overwrite=OnOverwrite.COLLECT)
    a = ObjectInfo("a", 3, "e1", 0)
    plan = reconcile("src", url, [], [a, a], 10, 1, None, rules, lambda o, f: 0, complete_listing=False)
    assert len(plan.added) == 1
    again = reconcile("src", url, list(plan.added), [a], 20, 2, None, rules, lambda o, f: 0, complete_listing=False)
    assert not again.added and not again.changed


def test_a_key_exactly_a_lookback_late_is_still_listed():
    sim = Sim(Rules(lookback_ms=LOOKBACK))
    sim.put("k1", 0)
    sim.cycle(0)
    sim.cycle(LOOKBACK - 5)  # k1 was seen less than a lookback ago: the listing still starts before it
    sim.put("k0x", LOOKBACK)  # late by exactly the lookback: within the contract
    sim.cycle(LOOKBACK)
    sim.cycle(4 * LOOKBACK)
    assert set(k for k, _ in sim.ids_of) == {"k1", "k0x"}
    assert sim.start_after == "k1" and not sim.catalog
