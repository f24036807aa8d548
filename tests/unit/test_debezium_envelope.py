"""The Debezium envelope's pure half (reclock.debezium): events as they come from Debezium's Postgres connector
(with and without Connect's schema wrapper) become updates against each key's current row; redelivered
runs change nothing; the consolidated updates are each key's last row."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reclock.debezium import (ChangeEvent, EventInvalid, KeyState, Op, Position, apply, fold, parse_key,
                              parse_value)

SNAPSHOT_LSN = 1000


def _source(lsn: int, tx: int, snapshot: str, commit: int | None = None) -> dict:
    # as Debezium 3.6.1.Final writes it (seen from reclock.dev.connect.LocalConnect); sequence is
    # [the end LSN of the transaction committed before, lsn]
    sequence = json.dumps([None if commit is None else str(commit), str(lsn)], separators=(",", ":"))
    return {"version": "3.6.1.Final", "connector": "postgresql", "name": "dbz", "ts_ms": 1795671145479,
            "snapshot": snapshot, "db": "postgres", "sequence": sequence, "schema": "public",
            "table": "a", "txId": tx, "lsn": lsn, "xmin": None}


def record(key: int, op: str, before, after, lsn: int, tx: int = 7, schemas: bool = False,
           commit: int | None = None) -> tuple[bytes, bytes]:
    """A (key, value) record as Debezium writes it."""
    payload = {"before": before, "after": after,
               "source": _source(lsn, tx, "true" if op == "r" else "false", commit),
               "transaction": None, "op": op, "ts_ms": 1795671145480}
    k = {"id": key}
    if schemas:
        payload = {"schema": {"type": "struct", "name": "dbz.public.a.Envelope"}, "payload": payload}
        k = {"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]}, "payload": k}
    return json.dumps(k).encode(), json.dumps(payload).encode()


# -- a history of a table and the events Debezium writes of it ------------------------------------------------

keys = st.integers(0, 4)
changes = st.lists(st.tuples(keys, st.sampled_from(["set", "set", "delete"]), st.integers(0, 3),
                             st.booleans(), st.integers(0, 100)), max_size=20)


def history(initial: dict[int, int], steps, start_lsn: int):
    """The events of a snapshot of ``initial`` then of ``steps`` (key, set|delete, value, tombstone?, early),
    each step a transaction of its own, committed in order, with what the table holds at the end. A step's
    change was written ``early`` bytes before its commit, so its ``lsn`` may be below the changes of the
    transactions committed before it (an insert that waited on the unique index for a delete to commit):
    only ``source.sequence`` orders them. Streamed positions start at ``start_lsn`` (maybe below the
    snapshot's)."""
    table = dict(initial)
    events = [(k, parse_value(record(k, "r", None, {"id": k, "v": v}, SNAPSHOT_LSN)[1])) for k, v in
              sorted(initial.items())]
    commit, before = start_lsn, None  # the end of the last commit; None: none seen since the connector began
    for k, what, v, tombstone, early in steps:
        commit += 48
        lsn = commit - 8 - early
        if what == "set":
            op = "u" if k in table else "c"
            old = {"id": k, "v": table[k]} if k in table else None
            table[k] = v
            events.append((k, parse_value(record(k, op, old, {"id": k, "v": v}, lsn, commit=before)[1])))
        elif k in table:
            del table[k]
            # REPLICA IDENTITY DEFAULT: the delete's before holds only the key
            events.append((k, parse_value(record(k, "d", {"id": k, "v": None}, None, lsn, commit=before)[1])))
            if tombstone:
                events.append((k, None))
        before = commit
    return events, table


def run(events, states=None):
    """Events folded per key: (states, updates in order, skipped)."""
    states = dict(states or {})
    updates, skipped = [], 0
    for k, e in events:
        a = apply(states.get(k), e)
        states[k] = a.state
        updates.extend((k, row, d) for row, d in a.updates)
        skipped += a.skipped
    return states, updates, skipped


histories = st.tuples(st.dictionaries(keys, st.integers(0, 3)), changes,
                      st.sampled_from([SNAPSHOT_LSN - 40, SNAPSHOT_LSN, SNAPSHOT_LSN + 8]))


@settings(max_examples=300, deadline=None)
@given(histories)
def test_consolidated_updates_are_each_keys_last_row(h):
    events, table = history(*h)
    _, updates, skipped = run(events)
    assert skipped == 0
    total = Counter()
    for k, row, d in updates:
        total[(k, row)] += d
    held = {k: json.loads(row)["v"] for (k, row), n in total.items() if n}
    assert all(n in (0, 1) for n in total.values())
    assert held == table


@st.composite
def redelivered(draw):
    """A history and the same events with runs redelivered: a restart resumes from some earlier event and
    writes everything since again (a restart during the snapshot redoes the snapshot before streaming)."""
    events, _ = history(*draw(histories))
    n_snap = sum(1 for _, e in events if e is not None and e.op is Op.READ)
    out, i = [], 0
    restarts = sorted(draw(st.lists(st.integers(0, len(events)), max_size=3)))
    for cut in restarts:
        if cut < len(events) and events[cut][1] is None:
            cut += 1  # a delete and its tombstone are written together (one source offset)
        out.extend(events[i:cut])
        i = max(i, cut)
        # a restart during the snapshot redoes it (from its start, or from any of its rows); once streaming
        # has begun, a restart resumes streaming (a snapshot taken again would read the table as it is then)
        back = draw(st.integers(0, i)) if i <= n_snap else draw(st.integers(n_snap, i))
        while back < len(events) and events[back][1] is None:
            back -= 1  # a tombstone has its delete's source offset: a restart resends both or neither
        out.extend(events[back:i])
    out.extend(events[i:])
    return events, out


def _rows(states):
    return {k: None if s is None else (s.row, s.position) for k, s in states.items()}


@settings(max_examples=200, deadline=None)
@given(redelivered())
def test_redelivered_runs_change_nothing(pair):
    events, with_redelivery = pair
    states, updates, _ = run(events)
    states2, updates2, skipped = run(with_redelivery)
    assert updates2 == updates
    assert _rows(states2) == _rows(states)
    assert skipped <= len(with_redelivery) - len(events)


@settings(max_examples=100, deadline=None)
@given(histories)
def test_state_round_trips_through_its_encoding(h):
    events, _ = history(*h)
    states, _, _ = run(events)
    for s in states.values():
        if s is not None:
            assert KeyState.decode(s.encode()) == s
    # a fold that stops and resumes from the encoded state gives the same updates
    mid = len(events) // 2
    first, u1, _ = run(events[:mid])
    resumed = {k: None if s is None else KeyState.decode(s.encode()) for k, s in first.items()}
    _, u2, _ = run(events[mid:], resumed)
    assert u1 + u2 == run(events)[1]


# -- events as Debezium writes them --------------------------------------------------------------------------

def test_with_and_without_schemas_are_the_same_event():
    for op, before, after in (("r", None, {"id": 1, "v": 2}), ("c", None, {"id": 1, "v": 2}),
                              ("u", {"id": 1, "v": 2}, {"id": 1, "v": 3}), ("d", {"id": 1, "v": None}, None)):
        k1, v1 = record(1, op, before, after, 2000)
        k2, v2 = record(1, op, before, after, 2000, schemas=True)
        assert parse_value(v1) == parse_value(v2)
        assert parse_key(k1) == parse_key(k2) == b'{"id":1}'


def test_after_is_kept_as_written():
    value = (b'{"before":null,"after":{"id":1, "amount":1.10,"big":12345678901234567890,"f":-0.0},'
             b'"source":{"lsn":5,"txId":3,"snapshot":"false","sequence":"[\\"4\\",\\"5\\"]"},"op":"c"}')
    e = parse_value(value)
    assert e.after == '{"id":1, "amount":1.10,"big":12345678901234567890,"f":-0.0}'
    assert e.position == Position(5, 3, False, commit=4)


def test_update_retracts_the_stored_row_and_delete_without_before_retracts_it():
    s, u, _ = fold(None, [parse_value(record(1, "c", None, {"id": 1, "v": 1}, 10)[1]),
                          parse_value(record(1, "u", None, {"id": 1, "v": 2}, 20)[1]),
                          parse_value(record(1, "d", {"id": 1, "v": None}, None, 30)[1]), None])
    one, two = '{"id": 1, "v": 1}', '{"id": 1, "v": 2}'
    assert u == [(one, 1), (one, -1), (two, 1), (two, -1)]
    assert s == KeyState(None, Position(30, 7, False))


def test_a_tombstone_alone_retracts_the_row():
    # log compaction may have removed the delete and kept its tombstone
    s, u, _ = fold(None, [parse_value(record(1, "r", None, {"id": 1, "v": 1}, 10)[1]), None])
    assert u == [('{"id": 1, "v": 1}', 1), ('{"id": 1, "v": 1}', -1)]
    assert s.row is None and s.position == Position(10, 7, True)
    assert fold(None, [None]) == (None, [], 0)


def test_a_delete_keeps_its_position_so_a_redelivered_insert_is_skipped():
    c = parse_value(record(1, "c", None, {"id": 1, "v": 1}, 10)[1])
    d = parse_value(record(1, "d", {"id": 1, "v": None}, None, 20)[1])
    s, u, skipped = fold(None, [c, d, None, c, d, None])
    assert skipped == 3 and len(u) == 2 and s.row is None  # the tombstone after the skipped delete too


def test_a_change_committed_after_the_snapshot_below_its_lsn_is_applied():
    r = parse_value(record(1, "r", None, {"id": 1, "v": 1}, SNAPSHOT_LSN)[1])
    u = parse_value(record(1, "u", None, {"id": 1, "v": 2}, SNAPSHOT_LSN - 16)[1])
    s, _, skipped = fold(None, [r, u])
    assert skipped == 0 and json.loads(s.row)["v"] == 2


def test_an_insert_that_waited_on_a_delete_is_applied_though_its_lsn_is_lower():
    # T1 deletes id 1 at lsn 100 and commits at 120; T2 had written its insert of id 1 at lsn 90, then waited on
    # the unique index for T1: Debezium writes the insert after the delete, with the lower lsn
    c = parse_value(record(1, "c", None, {"id": 1, "v": 1}, 40, commit=None)[1])
    d = parse_value(record(1, "d", {"id": 1, "v": None}, None, 100, commit=60)[1])
    again = parse_value(record(1, "c", None, {"id": 1, "v": 2}, 90, commit=120)[1])
    s, u, skipped = fold(None, [c, d, None, again])
    assert skipped == 0 and json.loads(s.row)["v"] == 2 and [n for _, n in u] == [1, -1, 1]
    # and its redelivery is still recognised
    s2, u2, skipped2 = fold(s, [d, None, again])
    assert skipped2 == 3 and u2 == [] and s2.row == s.row


@pytest.mark.parametrize("value, reason", [
    (b"not json", "not a JSON object"),
    (b'{"a": 1', "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b'[1, 2]', "not a JSON object"),
    (b'{"status": "BEGIN", "id": "732:30699256"}', "no `op`"),
    (b'{"op": "t", "source": {"lsn": 1}}', "TRUNCATE"),
    (b'{"op": "x", "source": {"lsn": 1}}', "unknown op 'x'"),
    (b'{"op": [1], "source": {"lsn": 1}}', "unknown op [1]"),
    (b'{"op": {"c": 1}, "source": {"lsn": 1}}', "unknown op {'c': 1}"),
    (b'{"op": 5, "source": {"lsn": 1}}', "unknown op 5"),
    (b'{"op": "c", "after": [' + b"[" * 100_000 + b"]" * 100_000 + b'], "source": {"lsn": 1}}', "nested too deeply"),
    (b'{"op": "c", "after": null, "source": {"lsn": 1}}', "no `after`"),
    (b'{"op": "c", "after": {"id": 1}}', "no `source`"),
    (b'{"op": "c", "after": {"id": 1}, "source": {"lsn": "5"}}', "source.lsn"),
    (b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 5}} x', "text after the object"),
    (b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 5}}', "source.sequence is missing"),
    (b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 5, "sequence": "[null]"}}', "not [last commit LSN, LSN]"),
    (b'{"op": "c", "after": {"id": 1}, "source": {"lsn": 5, "sequence": "[null,\\"6\\"]"}}',
     "does not end with source.lsn 5"),
])
def test_malformed_events_say_why(value, reason):
    """Each the same either way it is read (the deferred way reads it again member by member to say why)."""
    pattern = reason.replace("(", r"\(").replace("[", r"\[").replace("{", r"\{")
    for deferred in (False, True):
        with pytest.raises(EventInvalid, match=pattern):
            parse_value(value, defer_after=deferred)


def test_a_record_without_key_is_refused():
    with pytest.raises(EventInvalid, match="needs a key"):
        parse_key(None)
    assert parse_key(b"\x00\x01") == b"\x00\x01"


def test_change_event_is_frozen():
    e = ChangeEvent(Op.CREATE, "{}", Position(1))
    with pytest.raises(Exception):
        e.op = Op.DELETE  # type: ignore[misc]


# -- the Spark job's per-key step and the config ---------------------------------------------------------

def _fold_batches(batches: list[list[dict]]) -> list[dict]:
    import pyarrow as pa

    from reclock.spark.debezium_decode import fold_sorted

    types = pa.schema([("_k", pa.binary()), ("_v", pa.binary()), ("_p", pa.int32()), ("_o", pa.int64()),
                       ("_t_us", pa.int64()), ("ts", pa.int64()), ("_bad", pa.bool_()), ("_prior", pa.bool_()),
                       ("_nk", pa.binary())])
    out = list(fold_sorted(pa.RecordBatch.from_pylist(b, schema=types) for b in batches))
    return pa.Table.from_batches(out).to_pylist() if out else []


def _cut(rows: list[dict], cuts: list[int]) -> list[list[dict]]:
    """``rows`` cut into batches of the sizes ``cuts`` gives, in turn (a key's rows may span batches)."""
    batches, at = [], 0
    for c in cuts * (len(rows) + 1):
        if at >= len(rows):
            break
        batches.append(rows[at:at + c])
        at += c
    return batches


def test_the_jobs_fold_routes_bad_records_to_errors_and_keeps_offsets_exact():
    from reclock.spark.debezium_decode import SCHEMA_REASON

    nk = b'{"id":1}'
    k, v = record(1, "u", None, {"id": 1, "v": 2}, 50)
    prior = KeyState('{"id": 1, "v": 1}', Position(40, 1, False)).encode()
    rows = [dict(_k=nk, _v=prior, _p=0, _o=3, _t_us=5, ts=-1, _bad=False, _prior=True, _nk=nk),
            dict(_k=k, _v=v, _p=0, _o=2**60 + 1, _t_us=6, ts=10, _bad=False, _prior=False, _nk=nk),
            dict(_k=k, _v=b"oops", _p=0, _o=2**60 + 2, _t_us=6, ts=10, _bad=True, _prior=False, _nk=nk),
            dict(_k=k, _v=v.replace(b'"lsn": 50', b'"lsn": 51').replace(b'\\"50\\"', b'\\"51\\"'), _p=0,
                 _o=2**60 + 3, _t_us=7, ts=11, _bad=True, _prior=False, _nk=nk)]
    out = _fold_batches([rows[2:], rows[:2]])  # the prior row need not come first
    data = sorted((r["_row"], r["ts"], r["diff"]) for r in out if r["_output"] == 0)
    assert data == [('{"id": 1, "v": 1}', 10, -1), ('{"id": 1, "v": 2}', 10, 1)]
    errors = sorted((r["_eo"], r["_ereason"]) for r in out if r["_output"] == 1)
    assert errors == [(2**60 + 2, "the value is not a JSON object"), (2**60 + 3, SCHEMA_REASON)]
    [state] = [r for r in out if r["_output"] == 2]
    assert state["_sk"] == nk and state["_so"] == 2**60 + 1  # the last record applied, exactly
    assert KeyState.decode(state["_sv"]) == KeyState('{"id": 1, "v": 2}', Position(50, 7, False))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from("cud"), st.integers(0, 3)), max_size=40),
       st.lists(st.integers(1, 6), min_size=1, max_size=5), st.booleans())
def test_the_jobs_fold_over_sorted_batches_is_each_key_folded_alone(events, cuts, keyless):
    """Keys sorted, their rows cut into batches anywhere (a key across batches): the output is each key's
    rows folded alone; records without key are each an error row."""
    from reclock.spark.debezium_decode import fold_key

    rows = []
    for i, (key, op, v) in enumerate(events):
        after = None if op == "d" else {"id": key, "v": v}
        k, val = record(key, op, {"id": key} if op == "d" else None, after, 100 + i)
        rows.append(dict(_k=k, _v=val, _p=0, _o=i, _t_us=i, ts=7, _bad=False, _prior=False,
                         _nk=parse_key(k)))
    if keyless:
        rows.append(dict(_k=None, _v=b"{}", _p=1, _o=0, _t_us=0, ts=7, _bad=False, _prior=False, _nk=None))
    rows.sort(key=lambda r: (r["_nk"] is not None, r["_nk"] or b""))  # nulls first, as Spark sorts them
    batches = _cut(rows, cuts)
    got = sorted(map(repr, (tuple(r.values()) for r in _fold_batches(batches))))
    by_key: dict = {}
    for r in rows:
        by_key.setdefault(r["_nk"], []).append(r)
    want = sorted(map(repr, (t for rs in by_key.values() for t in fold_key(rs))))
    assert got == want
    assert sum(1 for r in _fold_batches(batches) if r["_output"] == 1) == (1 if keyless else 0)


def _fold_local(batches: list[list[dict]], prior: list[tuple]) -> list[dict]:
    import pyarrow as pa

    from reclock.spark.debezium_decode import fold_local, prior_rows

    types = pa.schema([("_k", pa.binary()), ("_v", pa.binary()), ("_p", pa.int32()), ("_o", pa.int64()),
                       ("_t_us", pa.int64()), ("ts", pa.int64()), ("_bad", pa.bool_()), ("_prior", pa.bool_())])
    fold = fold_local(prior_rows(prior, avro=False))
    out = list(fold(pa.RecordBatch.from_pylist(b, schema=types) for b in batches))
    return pa.Table.from_batches(out).to_pylist() if out else []


def _wrapped(key: int) -> bytes:
    """A key as Connect's JsonConverter writes it with schemas (the same key as ``{"id":key}``)."""
    return json.dumps({"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]},
                       "payload": {"id": key}}).encode()


_local_events = st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["c", "u", "d", "tomb", "bad"]),
                                   st.integers(0, 3), st.integers(0, 2)), max_size=40)


def _local_rows(events, wrapped_keys, partition_of):
    """Records of ``events`` (key, op, value, tick), in (partition, offset) order, as a task reads them."""
    rows, lsn, ts = [], 100, 1
    offsets: dict[int, int] = {}
    for key, op, v, tick in events:
        lsn += 16
        ts += tick
        part = partition_of(key)
        o = offsets[part] = offsets.get(part, -1) + 1
        k = _wrapped(key) if key in wrapped_keys else json.dumps({"id": key}, separators=(",", ":")).encode()
        if op == "tomb":
            value = None
        elif op == "bad":
            value = b"not an event"
        else:
            after = None if op == "d" else {"id": key, "v": v}
            value = record(key, op, {"id": key} if op == "d" else None, after, lsn, commit=lsn - 8)[1]
        rows.append(dict(_k=k, _v=value, _p=part, _o=o, _t_us=lsn, ts=ts, _bad=False, _prior=False))
    return rows


@settings(max_examples=120, deadline=None)
@given(_local_events, st.sets(st.integers(0, 5)), st.sets(st.integers(0, 5)), st.integers(1, 3),
       st.lists(st.integers(1, 7), min_size=1, max_size=4))
def test_a_slice_folded_where_it_was_read_is_the_slice_folded_after_a_shuffle(events, wrapped, with_prior,
                                                                              partitions, cuts):
    """Each key's records in one partition (some keys in Connect's schema wrapper, some with a prior state):
    every partition's records folded in its own task, sorted by raw key only, give what the shuffle's fold
    (records and prior rows together, sorted by normalised key) gives, and each key's state row once."""
    from reclock.spark.debezium_decode import keys_distinct

    import pyarrow as pa

    rows = _local_rows(events, wrapped, lambda key: key % partitions)
    prior = [(json.dumps({"id": key}, separators=(",", ":")).encode(),
              KeyState(f'{{"id": {key}, "v": 9}}', Position(50, 1, False, 40)).encode(), key % partitions, 0, 0)
             for key in sorted(with_prior)]
    got = []
    for part in range(partitions):  # a task per partition, its records sorted by raw key (Spark: nulls first)
        mine = sorted((r for r in rows if r["_p"] == part), key=lambda r: r["_k"])
        got += _fold_local(_cut(mine, cuts), prior)
    shuffled = [dict(r, _nk=parse_key(r["_k"])) for r in rows] + \
        [dict(_k=k, _v=v, _p=p, _o=o, _t_us=t, ts=-1, _bad=False, _prior=True, _nk=k) for k, v, p, o, t in prior]
    shuffled.sort(key=lambda r: r["_nk"])
    want = _fold_batches([shuffled])
    assert sorted(map(repr, (tuple(r.values()) for r in got))) == sorted(map(repr, (tuple(r.values()) for r in want)))
    states = [r["_sk"] for r in got if r["_output"] == 2]
    assert keys_distinct(pa.table({"key": pa.array(states, pa.binary())}))


@settings(max_examples=60, deadline=None)
@given(_local_events.filter(lambda es: any(op != "bad" for _, op, _, _ in es)))
def test_a_key_folded_in_two_tasks_shows_in_its_state_rows(events):
    """A key whose valid records (a tombstone alone among them) fall in two tasks, or whose two raw forms
    are not next to each other in one task, gives its state row twice: the check that sends the slice to
    the shuffle sees it."""
    from reclock.spark.debezium_decode import keys_distinct

    import pyarrow as pa

    key = next(k for k, op, _, _ in events if op != "bad")
    extra = (key, "tomb", 0, 0)
    rows = _local_rows([*events, extra], set(), lambda k: 0)
    rows[-1]["_p"] = 1  # the same key in a second partition: its own task
    got = []
    for part in (0, 1):
        got += _fold_local([sorted((r for r in rows if r["_p"] == part), key=lambda r: r["_k"])], [])
    states = [r["_sk"] for r in got if r["_output"] == 2]
    assert not keys_distinct(pa.table({"key": pa.array(states, pa.binary())}))
    # two raw forms of one key apart in one task (another key's records sort between them)
    plain, other = json.dumps({"id": 1}, separators=(",", ":")).encode(), json.dumps({"id": 2}).encode()
    value = record(1, "c", None, {"id": 1, "v": 1}, 500, commit=492)[1]
    value2 = record(2, "c", None, {"id": 2, "v": 1}, 516, commit=508)[1]
    apart = [dict(_k=k, _v=v, _p=0, _o=o, _t_us=0, ts=1, _bad=False, _prior=False)
             for o, (k, v) in enumerate([(plain, value), (b'{"id": 1}', value), (other, value2)])]
    got = _fold_local([sorted(apart, key=lambda r: r["_k"])], [])
    assert [r["_sk"] for r in got if r["_output"] == 2].count(plain) == 2


def _typed(x):
    """``x`` with each value's type and each object's member order in it: 1, 1.0 and True apart, -0.0 apart
    from 0.0 (a float by its repr)."""
    if isinstance(x, dict):
        return ("object", tuple((k, _typed(v)) for k, v in x.items()))
    if isinstance(x, list):
        return ("array", tuple(map(_typed, x)))
    return (type(x).__name__, repr(x) if isinstance(x, float) else x)


def _reading(read, value: bytes):
    try:
        return ("read", _typed(read(value)))
    except (ValueError, StopIteration, RecursionError):
        return ("refused",)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=12)
_noise = st.sampled_from([b" ", b"\t", b"\n", b"\r", b"{", b"}", b"[", b"]", b":", b",", b'"', b"\\", b"0", b"-",
                          b".", b"e", b"E", b"+", b"1", b"NaN", b"Infinity", b"-Infinity", b"\\ud800", b"\\udc00",
                          b"\\u00e9", b"1e400", b"-1e400", b"1e-400", b"\xef\xbb\xbf", b"\x00", b"\x1f", b"\x7f",
                          b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc3\xa9", b"true",
                          b"nul", b"01", b"-0", b"-0.0", b"2.", b".5", b'"a":1', b'"a":', b"123456789012345678901234567890"])


@settings(max_examples=400, deadline=None)
@given(_json_values, st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]), st.booleans(),
       st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), _noise), max_size=3))
def test_the_fast_json_reader_reads_and_refuses_what_json_does(value, seps, ascii_only, edits):
    """``read_json`` (msgspec first, json where msgspec refuses) against ``json.loads`` of the UTF-8 text, on
    JSON texts of any shape (NaN, the infinities, big integers, any text) and on those texts edited (bytes
    inserted, replaced or cut: lone surrogate escapes, numbers past a double, a BOM, control characters,
    bytes that are not UTF-8, duplicate members, trailing text): the same objects, the same values refused."""
    from reclock.debezium import read_json

    text = json.dumps(value, separators=seps, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    for at, how, piece in edits:
        at %= len(text) + 1
        if how == 3:  # inside a string: right after the next quote
            at = text.find(b'"', at) + 1 or at
        text = text[:at] + piece + text[at + (1 if how == 2 else len(piece) if how == 1 else 0):]
    want = _reading(lambda v: json.loads(v.decode("utf-8")), text)
    assert _reading(read_json, text) == want


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=12) | st.text(max_size=8).map(lambda t: t.encode("utf-8", "surrogatepass")),
       st.sampled_from([(b'{"a":"', b'"}'), (b'{"', b'":1}'), (b"[", b"]"), (b'{"a":', b"}")]))
def test_the_fast_json_reader_on_any_bytes_in_a_string_or_a_number(raw, where):
    """Any bytes where a string's characters or a number go (control characters, escapes, quotes, bytes that
    are not UTF-8, digits and signs): the same objects, the same values refused."""
    from reclock.debezium import read_json

    text = where[0] + raw + where[1]
    assert _reading(read_json, text) == _reading(lambda v: json.loads(v.decode("utf-8")), text)


_ws = st.sampled_from(["", " ", "\n", " \t\r "])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["after", "after", "before", "op", "source", "x\u00e9", "a\\"]),
                          _json_values), min_size=1, max_size=6),
       st.lists(_ws, min_size=4, max_size=4), st.booleans(), st.booleans())
def test_the_raw_after_is_cut_as_the_member_by_member_way_cuts_it(members, ws, wrapped, ascii_only):
    """The raw text of ``after`` cut out by msgspec is what the member-by-member way cuts out (the last of
    duplicate members, any whitespace around names, colons and commas, any value, Connect's schema wrapper or
    not), on every value a row is cut from (read as an object); where msgspec declines, that way decides."""
    from reclock.debezium import _payload, _raw_after, json_object

    a, b, c, d = ws
    body = a + "{" + ("," + c).join(f'{b}{json.dumps(n, ensure_ascii=ascii_only)}{c}:{d}'
                                    f'{json.dumps(v, ensure_ascii=ascii_only)}{a}' for n, v in members) + "}" + d
    if wrapped:
        body = '{"schema":' + b + '{"type":"struct"},' + c + '"payload":' + body + "}"
    value = body.encode("utf-8", "surrogatepass")
    if json_object(value) is None or "after" not in dict(members):
        return
    assert _raw_after(value) == _payload(value, "the value")["after"][1]


@pytest.mark.parametrize("text", [b'{"a":NaN}', b'{"a":-Infinity}', b'{"a":"\\ud800"}', b'{"a":1e400}',
                                  b'{"a":1,"b":2,"a":3}', b'{"a":123456789012345678901234567890}', b' {"a":-0.0}\r\n',
                                  b'{"a":"\x01"}', b'\xef\xbb\xbf{}', b'{"a":1}x', b'{"a":"\xed\xa0\x80"}',
                                  b"[" * 100_000 + b"]" * 100_000])
def test_the_fast_json_reader_on_what_only_one_reader_takes(text):
    """Where msgspec and json part (json's NaN, infinities, lone surrogates and doubles out of range; nesting
    too deep for either): json decides, as it does alone."""
    from reclock.debezium import read_json

    assert _reading(read_json, text) == _reading(lambda v: json.loads(v.decode("utf-8")), text)


def test_a_value_nested_too_deeply_is_an_error_not_a_crash():
    """A value nested past what a reader can hold is a malformed event (the error collection), not an
    exception that fails the slice's job again on every retry."""
    deep = b'{"op":"c","after":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(EventInvalid, match="nested too deeply"):
        parse_value(deep, defer_after=True)
    with pytest.raises(EventInvalid, match="nested too deeply"):
        parse_value(deep)


def test_config_of_a_debezium_source():
    from reclock.config import parse_source
    from reclock.errors import ConfigError

    base = {"kafka": {"topic": "dbz.public.items", "bootstrap": "127.0.0.1:9092"}, "envelope": "debezium",
            "format": {"type": "json", "schema": "id INT, v STRING"}}
    spec = parse_source("items", base)
    assert spec.keyed and spec.envelope == "debezium"
    with pytest.raises(ConfigError, match="cannot include Kafka metadata"):
        parse_source("items", {**base, "include": ["offset"]})
    with pytest.raises(ConfigError, match="format: {type: json"):
        parse_source("items", {**base, "format": {"type": "text"}})
    with pytest.raises(ConfigError, match="not one of none, upsert, debezium"):
        parse_source("items", {**base, "envelope": "dbz"})


# -- the fast ways are the slow ways ----------------------------------------------------------------------------

def _slow_key(key: bytes) -> bytes:
    """parse_key without its plain-key shortcut (what it did before it had one)."""
    from reclock.debezium import _payload

    try:
        members = _payload(key, "the key")
    except EventInvalid:
        return key
    return ("{" + ",".join(json.dumps(k) + ":" + raw for k, (_, raw) in members.items()) + "}").encode()


_names = st.sampled_from(["id", "ID", "a_1", "schema", "payload", "x y", "é", 'q"', ""])
_scalars = st.one_of(st.integers(-10**20, 10**20), st.sampled_from(["a", "b_2", "", "x y", "é", "0", None, 1.5]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_names, st.one_of(_scalars, st.dictionaries(_names, _scalars, max_size=2))), max_size=3),
       st.sampled_from([(",", ":"), (", ", ": "), (",", " : ")]), st.binary(max_size=12), st.booleans())
def test_a_plain_key_is_what_parse_key_gives(members, seps, noise, raw):
    """Keys built member by member (duplicate names, the wrapper's names, spaces, nesting, numbers of every
    size) and any bytes: parse_key's shortcut gives what parsing them gives."""
    if raw:
        key = noise
    else:
        key = ("{" + seps[0].join(json.dumps(n) + seps[1] + json.dumps(v, separators=seps) for n, v in members)
               + "}").encode()
    assert parse_key(key) == _slow_key(key)


def _outcome(value: bytes, defer: bool):
    from reclock.debezium import row_text

    try:
        e = parse_value(value, defer_after=defer)
    except EventInvalid as err:
        return ("invalid", err.reason)
    return None if e is None else (e.op, row_text(e.after), e.position)


_mutations = st.sampled_from([
    lambda v: v, lambda v: v + b" ", lambda v: b"\n " + v, lambda v: v + b" x", lambda v: v + b"{}",
    lambda v: v[:-1], lambda v: v.replace(b'"op":', b'"op":"c","op":'), lambda v: v.replace(b'"lsn":', b'"lsn":true,"lsn":'),
    lambda v: v.replace(b'"txId":', b'"txId":"1","txId":', 1) if b'"txId":7' not in v else v.replace(b'"txId":7', b'"txId":"7"'),
    lambda v: v.replace(b'"snapshot":"false"', b'"snapshot":false'), lambda v: v.replace(b'"snapshot":"false"', b'"snapshot":0'),
    lambda v: v.replace(b'"snapshot":"false"', b'"snapshot":"true"'),
    lambda v: v.replace(b'"sequence":"[', b'"sequence":"[ ', 1), lambda v: v.replace(b'\\"]"', b'\\",\\"1\\"]"', 1),
    lambda v: v.replace(b'"sequence":"[\\"', b'"sequence":"[\\"00', 1),
    lambda v: v.replace(b'"sequence":"[\\"', b'"sequence":"[\\"\xd9\xa1', 1),
    lambda v: v.replace(b'"after":{', b'"after":[{', 1).replace(b'},"source"', b'}],"source"', 1),
    lambda v: b'{"schema":{},"payload":' + v + b"}", lambda v: b'{"schema":{},"payload":[' + v + b"]}",
    lambda v: b'{"payload":' + v + b',"schema":null}', lambda v: v.replace(b"{", b"{\xff", 1),
    lambda v: v.replace(b'"op":"', b'"op":"\\u0063', 1) if b'"op":"c"' in v else v.replace(b'"op":"', b'"op":"\\u', 1),
    lambda v: "\ufeff".encode() + v, lambda v: v.replace(b'"lsn":', b'"lsn":1e3,"x":', 1),
    lambda v: v.replace(b'"after":', b'"after":{"a":NaN},"z":', 1),
])


@settings(max_examples=400, deadline=None)
@given(st.sampled_from("rcud"), st.integers(1, 10**12), st.one_of(st.none(), st.integers(0, 10**12)), st.booleans(),
       st.booleans(), st.lists(_mutations, max_size=3))
def test_the_deferred_parse_is_the_parse(op, lsn, commit, schemas, spaces, mutations):
    """Values as Debezium writes them, mutated (a wrapper, duplicate members, text after them, a member of
    another type, bytes that are not UTF-8, a BOM, sequences that are not plain): read with ``after`` left in
    the record, each gives the event, or the reason, that reading it member by member gives."""
    after = None if op == "d" else {"id": 1, "v": -0.0, "n": 1.10, "s": "é\n"}
    _, value = record(1, op, {"id": 1} if op == "d" else None, after, lsn, schemas=schemas, commit=commit)
    if not spaces:
        value = json.dumps(json.loads(value), separators=(",", ":")).encode()
    value = value.replace(b'1.1,', b'1.10,')
    for m in mutations:
        value = m(value)
    assert _outcome(value, True) == _outcome(value, False)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from("cudr"), st.integers(0, 2), st.booleans(),
                          st.integers(0, 2)), max_size=30), st.booleans())
def test_the_jobs_fold_is_apply_summed_by_row_and_ts(steps, with_prior):
    """A key's records (redelivered copies, tombstones, snapshot reads, several timestamps, a prior state)
    folded by the job (rows cut out of their records only where they stand) give the updates ``apply``
    gives, event by event with every row read, summed by (row, ts), and the same state."""
    from collections import defaultdict

    from reclock.spark.debezium_decode import fold_key

    nk = b'{"id":1}'
    rows, seen = [], []
    if with_prior:
        prior = KeyState('{"id": 1, "v": 9}', Position(50, 1, False, 40))
        rows.append(dict(_k=nk, _v=prior.encode(), _p=0, _o=0, _t_us=0, ts=-1, _bad=False, _prior=True, _nk=nk))
    lsn, ts = 100, 1
    for i, (again, op, v, tombstone, tick) in enumerate(steps):
        if again and seen:
            value = seen[-again if again <= len(seen) else 0]  # a redelivered copy of an earlier record
        else:
            lsn += 16
            after = None if op == "d" else {"id": 1, "v": v}
            value = record(1, op, {"id": 1} if op == "d" else None, after, lsn, commit=lsn - 8)[1]
            seen.append(value)
        ts += tick
        rows.append(dict(_k=nk, _v=value, _p=0, _o=2 * i + 1, _t_us=i, ts=ts, _bad=False, _prior=False, _nk=nk))
        if tombstone:
            rows.append(dict(_k=nk, _v=None, _p=0, _o=2 * i + 2, _t_us=i, ts=ts, _bad=False, _prior=False, _nk=nk))
    state = KeyState.decode(rows[0]["_v"]) if with_prior else None
    want: dict = defaultdict(int)
    last = None
    for r in rows[1 if with_prior else 0:]:
        a = apply(state, parse_value(r["_v"]))
        state = a.state
        for row, d in a.updates:
            want[(row, r["ts"])] += d
        last = r
    got = fold_key(rows)
    assert sorted((r[0], r[1], r[2]) for r in got if r[3] == 0) == sorted((row, t, d) for (row, t), d in want.items() if d)
    states = [r for r in got if r[3] == 2]
    if last is None:
        assert states == []
    else:  # a key that saw only tombstones has its state row too, as a key never seen (fold_local needs it)
        [s] = states
        assert KeyState.decode(s[10]) == (state or KeyState(None, None)) and s[12] == last["_o"]


def _slow_commit(text, lsn: int):
    """_last_commit's reading of source.sequence without its plain-text shortcut."""
    try:
        commit, at = json.loads(text) if isinstance(text, str) else text
        commit = 0 if commit is None else int(commit)
        at = int(at)
    except (ValueError, TypeError):
        return "invalid"
    return commit if at == lsn else "invalid"


_seq_parts = st.one_of(st.integers(0, 10**20).map(str), st.sampled_from(["007", " 5", "5 ", "\u0661", "1e3", "-3", "", "x"]),
                       st.none(), st.integers(0, 10**6))


@settings(max_examples=300, deadline=None)
@given(st.lists(_seq_parts, min_size=0, max_size=3), st.sampled_from([(",", ":"), (", ", ": ")]), st.booleans())
def test_a_plain_sequence_is_what_reading_it_gives(parts, seps, same_lsn):
    from reclock.debezium import _last_commit

    text = json.dumps(parts, separators=seps)
    lsn = int(parts[-1]) if same_lsn and parts and isinstance(parts[-1], str) and parts[-1].isascii() \
        and parts[-1].strip().isdigit() else 12345
    try:
        got = _last_commit({"sequence": text}, lsn)
    except EventInvalid:
        got = "invalid"
    assert got == _slow_commit(text, lsn)
