"""The durable remap collection: registration and the progress view, compare-and-set appends, the AS OF
form, and compaction -- checked against the pure core (``reclock.remap``), which is the model."""

from __future__ import annotations

import random
import threading

import pytest

from reclock import remap
from reclock.errors import ConfigError, RemapUpperMismatch, UnknownSource
from reclock.persist import connect
from reclock.persist.remap_store import append_binding, compact_remap, load_remap, register_source
from reclock.remap import Binding, RemapCollection
from reclock.time import PartitionedFrontier as F


def progress(conn, name: str) -> list[tuple[int, int, int]]:
    return conn.execute(f'SELECT ts, partition, "offset" FROM reclock."{name}_progress" ORDER BY 1, 2').fetchall()


def as_of(conn, name: str, t: int) -> F:
    return F.of(conn.execute("SELECT partition, \"offset\" FROM reclock.progress_as_of(%s, %s)", (name, t)).fetchall())


def test_register_source_is_idempotent_and_creates_the_progress_view(conn):
    register_source(conn, "orders", config={"topic": "orders"})
    register_source(conn, "orders")
    assert load_remap(conn, "orders") == RemapCollection("orders", (), 0, 0)
    assert conn.execute("SELECT kind, config FROM reclock.sources").fetchall() == [("kafka", {"topic": "orders"})]
    cols = conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = "
                        "'reclock' AND table_name = 'orders_progress' ORDER BY ordinal_position").fetchall()
    assert cols == [("ts", "bigint"), ("partition", "integer"), ("offset", "numeric")]
    assert progress(conn, "orders") == []
    with pytest.raises(ConfigError, match="already registered as a kafka source"):
        register_source(conn, "orders", kind="postgres")


def test_source_names_are_validated(conn):
    for bad in ("Orders", "1orders", "orders-x", 'x"; DROP TABLE reclock.shards; --', "", "a" * 52, "ö", None):
        with pytest.raises(ConfigError, match="source name"):
            register_source(conn, bad)
        with pytest.raises(ConfigError, match="source name"):
            load_remap(conn, bad)
    register_source(conn, "a" * 51)  # the longest name still leaves room for "_progress"
    assert progress(conn, "a" * 51) == []
    assert conn.execute("SELECT count(*) FROM reclock.sources").fetchone()[0] == 1


def test_unknown_source(conn):
    with pytest.raises(UnknownSource, match="source nope: not registered"):
        load_remap(conn, "nope")
    with pytest.raises(UnknownSource):
        append_binding(conn, "nope", 0, Binding(5, F.of({0: 1})))


def test_append_binding_is_a_compare_and_set_on_the_remap_upper(conn):
    register_source(conn, "orders")
    rc = append_binding(conn, "orders", 0, Binding(100, F.of({0: 5, 1: 3})))
    assert rc == RemapCollection("orders", (Binding(100, F.of({0: 5, 1: 3})),), 0, 101)
    with pytest.raises(RemapUpperMismatch) as e:  # a stale minter
        append_binding(conn, "orders", 0, Binding(150, F.of({0: 9})))
    assert (e.value.source, e.value.expected, e.value.actual) == ("orders", 0, 101)
    assert "remap upper is 101, mint expected 0" in str(e.value)
    assert load_remap(conn, "orders") == rc  # nothing changed
    with pytest.raises(ValueError, match="below the expected remap upper"):
        append_binding(conn, "orders", 101, Binding(100, F.of({0: 9})))
    with pytest.raises(ValueError, match="backwards"):
        append_binding(conn, "orders", 101, Binding(300, F.of({0: 9})))  # partition 1 would go back to 0
    assert load_remap(conn, "orders") == rc
    rc = append_binding(conn, "orders", 101, Binding(101, F.of({0: 5, 1: 3})))  # an unchanged frontier is fine
    rc = append_binding(conn, "orders", 102, Binding(200, F.of({0: 9, 1: 3, 2: 1})))  # a new partition
    assert load_remap(conn, "orders") == rc
    assert (rc.upper, [b.ts for b in rc.bindings]) == (201, [100, 101, 200])


def test_progress_view_and_progress_as_of(conn):
    register_source(conn, "orders")
    register_source(conn, "other")
    append_binding(conn, "other", 0, Binding(120, F.of({0: 1000})))
    rc = load_remap(conn, "orders")
    for b in (Binding(100, F.of({0: 5, 1: 3})), Binding(150, F.of({0: 5, 1: 3})), Binding(200, F.of({0: 9, 1: 3, 2: 1}))):
        rc = append_binding(conn, "orders", rc.upper, b)
    assert progress(conn, "orders") == remap.progress_rows(rc)  # only this source's rows
    register_source(conn, "empty")
    empty = append_binding(conn, "empty", 0, Binding(7, F()))  # upstream held nothing at the first binding
    assert load_remap(conn, "empty") == empty and empty.bindings == (Binding(7, F()),)
    assert progress(conn, "empty") == [] and as_of(conn, "empty", 7) == F()
    assert progress(conn, "orders")[:2] == [(100, 0, 5), (100, 1, 3)]
    assert as_of(conn, "orders", 99) == F()
    assert as_of(conn, "orders", 100) == F.of({0: 5, 1: 3})
    assert as_of(conn, "orders", 199) == F.of({0: 5, 1: 3})
    assert as_of(conn, "orders", 10**12) == F.of({0: 9, 1: 3, 2: 1})
    for t in range(90, 210):
        assert as_of(conn, "orders", t) == remap.source_upper_at(rc, t + 1), t


def test_compaction_keeps_every_read_at_or_after_since(conn):
    register_source(conn, "orders")
    rc = load_remap(conn, "orders")
    for ts, f in [(10, {0: 1}), (20, {0: 4, 1: 2}), (30, {0: 4, 1: 7}), (40, {0: 9, 1: 7, 3: 1})]:
        rc = append_binding(conn, "orders", rc.upper, Binding(ts, F.of(f)))
    before = {t: as_of(conn, "orders", t) for t in range(0, 50)}
    c = compact_remap(conn, "orders", 25)
    assert c == remap.compact(rc, 25) == load_remap(conn, "orders")
    assert c.bindings == (Binding(25, F.of({0: 4, 1: 2})), Binding(30, F.of({0: 4, 1: 7})),
                          Binding(40, F.of({0: 9, 1: 7, 3: 1})))
    for t in range(25, 50):
        assert as_of(conn, "orders", t) == before[t], t
    assert progress(conn, "orders") == remap.progress_rows(c)
    assert compact_remap(conn, "orders", 20) == c  # never backwards
    assert compact_remap(conn, "orders", 25) == c
    with pytest.raises(ValueError, match="beyond the remap upper"):
        compact_remap(conn, "orders", 42)
    with pytest.raises(ValueError, match="must stay below the remap upper"):
        compact_remap(conn, "orders", 41)
    assert load_remap(conn, "orders") == c
    c2 = compact_remap(conn, "orders", 40)  # bounded state: one binding left
    assert c2.bindings == (Binding(40, F.of({0: 9, 1: 7, 3: 1})),) and c2.since == 40
    assert conn.execute("SELECT count(*) FROM reclock.remap_bindings").fetchone()[0] == 1
    rc = append_binding(conn, "orders", 41, Binding(41, F.of({0: 10, 1: 7, 3: 1})))  # appends continue
    assert rc.bindings[-1].ts == 41 and rc.since == 40


def test_random_appends_and_compactions_match_the_pure_core(conn):
    rng = random.Random(7)
    register_source(conn, "orders")
    model = load_remap(conn, "orders")
    for _ in range(40):
        if model.bindings and rng.random() < 0.25:
            since = rng.randint(model.since, model.upper - 1)
            model = remap.compact(model, since)
            assert compact_remap(conn, "orders", since) == model
        else:
            frontier = remap.last_frontier(model).join(F.of({p: rng.randint(0, 50) for p in rng.sample(range(4), 2)}))
            b = Binding(model.upper + rng.randint(0, 5), frontier)
            if rng.random() < 0.2:  # a stale minter loses and changes nothing
                with pytest.raises(RemapUpperMismatch):
                    append_binding(conn, "orders", model.upper + 1, Binding(b.ts + 1, frontier))
            expected = model.upper
            model = remap.append(model, b)
            assert append_binding(conn, "orders", expected, b) == model
        remap.validate(model)
        assert load_remap(conn, "orders") == model
        assert progress(conn, "orders") == remap.progress_rows(model)
        for t in (model.since, (model.since + model.upper) // 2, model.upper - 1, model.upper + 3):
            assert as_of(conn, "orders", t) == remap.source_upper_at(model, t + 1)


def test_concurrent_minters_exactly_one_wins_each_round(db):
    with connect(db) as conn:
        register_source(conn, "orders")
    n, rounds = 6, 10
    barrier = threading.Barrier(n)
    wins: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def mint(me: int) -> None:
        try:
            with connect(db) as conn:
                for rnd in range(rounds):
                    rc = load_remap(conn, "orders")
                    b = Binding(rc.upper + me, remap.last_frontier(rc).join(F.of({me: rnd + 1})))
                    barrier.wait(30)
                    try:
                        append_binding(conn, "orders", rc.upper, b)
                        wins.append((rnd, me))
                    except RemapUpperMismatch as e:
                        assert e.actual > rc.upper
                    barrier.wait(30)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=mint, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(r for r, _ in wins) == list(range(rounds))
    with connect(db) as conn:
        rc = load_remap(conn, "orders")
    remap.validate(rc)
    assert len(rc.bindings) == rounds


def test_offsets_are_exact_integers_of_any_size(conn):
    """A kind maps its FromTime onto (partition, offset) integers (``reclock.sources.base``): the store keeps
    any integer offset exactly (Kinesis sequence numbers: 56 digits as AWS issues them, 129 by the API's
    pattern), in the collection, its progress view and its AS OF form; a fraction is refused."""
    register_source(conn, "wide")
    seq = 49680563784135358040182390463303046395080030960589209602  # a Kinesis sequence number
    end = 10**129
    rc = append_binding(conn, "wide", 0, Binding(10, F.of({0: seq, 7: 2**63 + 1})))
    rc = append_binding(conn, "wide", rc.upper, Binding(20, F.of({0: end, 7: 2**63 + 1})))
    assert load_remap(conn, "wide") == rc
    assert rc.bindings[-1].frontier.get(0) == end and type(rc.bindings[-1].frontier.get(0)) is int
    assert progress(conn, "wide") == [(10, 0, seq), (10, 7, 2**63 + 1), (20, 0, end), (20, 7, 2**63 + 1)]
    assert as_of(conn, "wide", 15) == F.of({0: seq, 7: 2**63 + 1})
    assert as_of(conn, "wide", 20) == F.of({0: end, 7: 2**63 + 1})
    with pytest.raises(Exception, match="remap_offsets_offset_integral"):
        conn.execute('INSERT INTO reclock.remap_offsets (source, ts, partition, "offset") VALUES '
                     "('wide', 20, 9, 1.5)")
    assert load_remap(conn, "wide") == rc
