"""Laws of Kinesis shard lineage: which shards a source reads, how scans become bindings, what compaction
drops. A small model of a stream (puts, splits, merges, sparse sequence numbers) drives a source's mints
the way the Kinesis wing drives them against the endpoint, and the laws are checked on what it binds:
every record bound exactly once, per partition key in put order by (ts, sequence number), children after
their parents (the KCL rule), budgets, counts, and dropping finished shards changing nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reclock.sources.kinesis.lineage import (FINISHED, Segment, ShardInfo, ShardScan, done_shards, droppable,
                                             entry_position, foreign_shards, iterator_for, kcl_checkpoint, lost_shards,
                                             plan_bindings, position_of_checkpoint, readable, scan_segments)

HASHES = 64  # partition keys hash to 0..63 in the model


@dataclass
class ModelShard:
    number: int
    lo: int
    hi: int
    parents: tuple[int, ...]
    start: int
    end: int | None = None
    records: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, key, put number)

    def info(self) -> ShardInfo:
        return ShardInfo(self.number, self.parents, self.start, self.end)


@dataclass
class ModelStream:
    """Kinesis as the API shows it: sequence numbers increase per shard, far apart; a split or merge closes
    the parent(s) with their records and opens empty children."""

    shards: dict[int, ModelShard] = field(default_factory=dict)
    counter: int = 10 ** 40  # beyond BIGINT and DECIMAL(38)
    puts: int = 0

    def seq(self) -> int:
        self.counter += 7919
        return self.counter

    def open_shards(self) -> list[ModelShard]:
        return [s for s in self.shards.values() if s.end is None]

    def add(self, lo: int, hi: int, parents: tuple[int, ...]) -> None:
        n = len(self.shards)
        self.shards[n] = ModelShard(n, lo, hi, parents, self.seq())

    def put(self, key: int) -> None:
        shard = next(s for s in self.open_shards() if s.lo <= key <= s.hi)
        shard.records.append((self.seq(), key, self.puts))
        self.puts += 1

    def split(self, i: int) -> None:
        cands = [s for s in self.open_shards() if s.hi > s.lo]
        if not cands:
            return
        s = cands[i % len(cands)]
        mid = (s.lo + s.hi + 1) // 2
        s.end = self.seq()
        self.add(s.lo, mid - 1, (s.number,))
        self.add(mid, s.hi, (s.number,))

    def merge(self, i: int) -> None:
        opened = sorted(self.open_shards(), key=lambda s: s.lo)
        if len(opened) < 2:
            return
        a, b = opened[i % (len(opened) - 1)], opened[i % (len(opened) - 1) + 1]
        a.end = b.end = self.seq()
        self.add(a.lo, b.hi, (a.number, b.number))

    def listing(self) -> list[ShardInfo]:
        return [s.info() for s in self.shards.values()]

    def scan(self, number: int, start: int, stride: int) -> ShardScan:
        """Read a shard from position ``start`` to its tip, a point every ``stride`` records and at the tip;
        a closed shard read to its end ends at FINISHED."""
        s = self.shards[number]
        after = [r for r in s.records if r[0] >= start]
        points = [(r[0] + 1, i + 1) for i, r in enumerate(after) if (i + 1) % stride == 0 or i + 1 == len(after)]
        if s.end is not None:
            points.append((FINISHED, len(after)))
            if len(points) > 1 and points[-2][1] == len(after) and points[-2][0] == FINISHED:
                points.pop()
        return ShardScan(number, start, tuple(points), ended=s.end is not None)


def mint(stream: ModelStream, positions: dict[int, int], budget: int, stride: int):
    """What the wing's mint does: scan every readable shard from its position (children from their start),
    again for children its parents' ends make readable, then plan the bindings."""
    listing = stream.listing()
    scans: dict[int, ShardScan] = {}
    simulated = dict(positions)
    while True:
        fresh = [s for s in readable(listing, simulated) if s.number not in scans]
        if not fresh:
            break
        for s in fresh:
            start = simulated.get(s.number, 0) or entry_position(s, listing)
            scans[s.number] = stream.scan(s.number, start, stride)
            simulated[s.number] = scans[s.number].tip
    return listing, plan_bindings(listing, positions, scans, budget)


ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, HASHES - 1)),
    st.tuples(st.just("put"), st.integers(0, HASHES - 1)),
    st.tuples(st.just("put"), st.integers(0, HASHES - 1)),
    st.tuples(st.just("split"), st.integers(0, 7)),
    st.tuples(st.just("merge"), st.integers(0, 7)),
    st.tuples(st.just("mint"), st.integers(0, 0)),
    st.tuples(st.just("compact"), st.integers(0, 0)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 3), st.integers(1, 12), st.integers(1, 5))
@example([("put", 0)] * 5, 1, 1, 1)  # one mint, a backlog of five bindings
@example([("put", 0), ("split", 0), ("put", 0), ("put", 63), ("merge", 0), ("put", 5), ("mint", 0), ("put", 40),
          ("split", 1), ("put", 50), ("mint", 0), ("compact", 0), ("put", 1)], 2, 2, 1)
def test_a_source_binds_every_record_once_in_key_order_children_after_parents(program, initial, budget, stride):
    stream = ModelStream()
    width = HASHES // initial
    for i in range(initial):
        stream.add(i * width, HASHES - 1 if i == initial - 1 else (i + 1) * width - 1, ())
    bindings: list[tuple[int, dict[int, int]]] = []  # (ts, frontier) as appended
    segments: list[Segment] = []
    positions: dict[int, int] = {}
    ts = 0

    def run_mint():
        nonlocal positions, ts
        listing, plan = mint(stream, positions, budget, stride)
        prev = positions
        segments.extend(plan.segments)
        for f in plan.frontiers:
            moved = {n for n, p in f.items() if p != prev.get(n, 0)}
            assert moved, "a binding that moves nothing"
            assert all(p >= prev.get(n, 0) for n, p in f.items()), "a frontier went backwards"
            assert all(n in f for n in prev), "a shard left the frontier outside compaction"
            ok = {s.number for s in readable(listing, prev)}
            assert moved <= ok, f"shards {moved - ok} moved before their parents were done (KCL rule)"
            added = sum(len([r for r in stream.shards[n].records if prev.get(n, 0) <= r[0] < f[n]]) for n in moved)
            steps = [sg.records for sg in plan.segments]
            assert added <= budget or added <= max(steps), f"binding adds {added} records, budget {budget}"
            ts += 1
            bindings.append((ts, f))
            prev = f
        positions = dict(prev)

    for op, arg in program:
        if op == "put":
            stream.put(arg)
        elif op == "split":
            stream.split(arg)
        elif op == "merge":
            stream.merge(arg)
        elif op == "mint":
            run_mint()
        else:
            listing = stream.listing()
            drop = droppable(listing, [positions])
            before_done = done_shards(listing, positions) | drop
            before_read = [s.number for s in readable(listing, positions)]
            positions = {n: p for n, p in positions.items() if n not in drop}
            assert done_shards(listing, positions) | drop == before_done
            assert [s.number for s in readable(listing, positions)] == before_read
    for _ in range(2 * len(stream.shards) + 2):  # drain: nothing new upstream, mints run to the end
        run_mint()

    # exactly once: each record is bound by exactly one binding, the first whose position passes it
    bound: dict[tuple[int, int], int] = {}
    prev: dict[int, int] = {}
    for t, f in bindings:
        for n, p in f.items():
            for seq, _, _ in stream.shards[n].records:
                if prev.get(n, 0) <= seq < p:
                    assert (n, seq) not in bound, f"record {seq} of shard {n} bound twice"
                    bound[(n, seq)] = t
        prev = {**prev, **f}
    everything = {(s.number, r[0]): r for s in stream.shards.values() for r in s.records}
    assert set(bound) == set(everything), "a record was never bound"
    # per key, ordered by (ts, sequence number) the records come in put order
    by_key: dict[int, list] = {}
    for (n, seq), t in bound.items():
        _, key, put = everything[(n, seq)]
        by_key.setdefault(key, []).append(((t, seq), put))
    for key, rs in by_key.items():
        assert [p for _, p in sorted(rs)] == sorted(p for _, p in rs), f"key {key} out of put order"
    # a binding never holds a shard and its descendant with records of the same key at one ts
    # (follows from the order law); the last frontier finished every closed shard
    for s in stream.shards.values():
        if s.end is not None and s.records and bindings:
            assert bindings[-1][1].get(s.number, FINISHED) == FINISHED
    # counted: each segment holds exactly the records between its ends
    for sg in segments:
        have = [r for r in stream.shards[sg.shard].records if sg.start <= r[0] < sg.stop]
        assert len(have) == sg.records


def test_iterator_for_each_kind_of_position():
    s = ShardInfo(3, (1,), start=1000)
    assert iterator_for(s, 0) == ("TRIM_HORIZON", None)
    assert iterator_for(s, 1000) == ("AT_SEQUENCE_NUMBER", 1000)
    assert iterator_for(s, 1501) == ("AFTER_SEQUENCE_NUMBER", 1500)
    with pytest.raises(ValueError, match="read to its end"):
        iterator_for(s, FINISHED)


@given(st.integers(1, 10 ** 60), st.integers(0, 10 ** 60))
def test_kcl_checkpoints_round_trip(start, gap):
    s = ShardInfo(0, (), start=start)
    for pos in (start + gap + 1, FINISHED, 0):
        assert position_of_checkpoint(kcl_checkpoint(s, pos)) == pos
    assert kcl_checkpoint(s, start) == "TRIM_HORIZON"


def test_a_split_child_waits_for_its_parent():
    listing = [ShardInfo(0, (), 10, 50), ShardInfo(1, (0,), 60), ShardInfo(2, (0,), 61)]
    assert [s.number for s in readable(listing, {})] == [0]
    assert [s.number for s in readable(listing, {0: 31})] == [0]
    assert [s.number for s in readable(listing, {0: FINISHED})] == [1, 2]
    assert entry_position(listing[1], listing) == 60


def test_a_merged_child_waits_for_both_parents():
    listing = [ShardInfo(0, (), 10, 50), ShardInfo(1, (), 11, 50), ShardInfo(2, (0, 1), 60)]
    assert [s.number for s in readable(listing, {0: FINISHED})] == [1]
    assert [s.number for s in readable(listing, {0: FINISHED, 1: FINISHED})] == [2]


def test_a_child_of_an_expired_parent_starts_at_trim_horizon():
    listing = [ShardInfo(2, (0,), 60)]
    assert [s.number for s in readable(listing, {})] == [2]
    assert entry_position(listing[0], listing) == 0


def test_a_shard_gone_part_way_is_lost():
    listing = [ShardInfo(2, (0,), 60)]
    assert lost_shards(listing, {0: 41, 1: FINISHED}) == [0]


def test_a_finished_parent_is_dropped_once_its_children_are_in():
    listing = [ShardInfo(0, (), 10, 50), ShardInfo(1, (0,), 60), ShardInfo(2, (0,), 61)]
    assert droppable(listing, [{0: FINISHED}]) == set()
    assert droppable(listing, [{0: FINISHED, 1: 60, 2: 61}]) == {0}
    assert droppable(listing, [{0: FINISHED}, {0: FINISHED, 1: 60, 2: 61}]) == set()
    # dropped, the parent is still known done through its children
    assert 0 in done_shards(listing, {1: 60, 2: 61})


def test_scan_segments_count_between_points():
    scan = ShardScan(4, 100, ((120, 2), (151, 5), (FINISHED, 5)), ended=True)
    assert scan_segments(scan) == [Segment(4, 100, 120, 2), Segment(4, 120, 151, 3), Segment(4, 151, FINISHED, 0)]


def test_a_shard_that_begins_after_the_position_read_under_its_number_is_foreign():
    # a stream created again under its name (whose creation time a coarse clock may not tell apart): its
    # shard 0 begins after the position the source had read shard 0 to
    listing = [ShardInfo(0, start=500), ShardInfo(1, start=100)]
    assert foreign_shards(listing, {0: 120, 1: 180}) == [listing[0]]
    assert foreign_shards(listing, {0: 500, 1: 100}) == []  # at the start: nothing read yet
    assert foreign_shards(listing, {0: FINISHED}) == []
    assert foreign_shards(listing, {}) == []  # never read
