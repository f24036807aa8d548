"""Debezium change events as updates (pure): the ``debezium`` envelope of a Kafka source.

Debezium writes one Kafka record per row change of a table, keyed by the table's key::

    key   {"id": 2}                                    (or {"schema": ..., "payload": {"id": 2}})
    value {"before": row|null, "after": row|null, "op": "c"|"u"|"d"|"r", "source": {"lsn": .., "txId": ..,
           "snapshot": "true"|"last"|"false"|.., ...}, ...}   (or {"schema": ..., "payload": {...}})
    value null                                         a tombstone: it follows a delete, for log compaction

Each key's current value is kept in the upsert state (``reclock.persist.upsert_state``, the same state the
``upsert`` envelope keeps; its value is :meth:`KeyState.encode`): the key's row and the source position of
the last event applied to it. An event becomes updates against it (:func:`apply`)::

    r, c, u   -1 the stored row (if any and if it differs), +1 ``after``     state: (after, position)
    d         -1 the stored row (if any)                                       state: (deleted, position)
    tombstone -1 the stored row (if any: the delete itself was compacted away) state: (deleted, as before)

so an update is -1 old +1 new, and a delete retracts exactly the row the collection holds, whatever its
``before`` has (under ``REPLICA IDENTITY DEFAULT`` only the key). A row is the raw JSON text of ``after``
as Debezium wrote it (never parsed and written again: numbers keep their digits); the decode path reads it
as the source's JSON ``format`` declares.

**Redelivery.** After a crash, a Kafka Connect worker resumes from its last flushed offsets and writes again
what it had written since. Debezium writes transactions in commit order, but a change's WAL position
(``source.lsn``) is where it was written, not where its transaction committed: a row deleted by one
transaction and inserted again by another (which wrote its heap tuple first, then waited on the unique index
for the delete to commit) comes *after* the delete with a *lower* ``lsn``. So events are ordered by
``source.sequence``, ``[last commit LSN, lsn]`` (the end of the transaction committed before the event's own,
then its ``lsn``), which increases along the topic: a streamed event at or below the sequence of the last
streamed event applied to its key is a redelivery and is skipped (a delete keeps its position in the state for
this). A streamed event without ``source.sequence`` (Debezium before 1.6, or a transform that dropped it)
cannot be ordered and is refused, never applied on a guess. A tombstone has no position: Debezium writes it
right after its delete with the delete's source offset, so a restart redelivers both or neither, and a
tombstone that follows a skipped event is skipped with it. Snapshot reads (``op: r``) are not ordered by
``lsn`` against streamed changes (a transaction that commits after the snapshot's point may have written below
it): a read is always applied (it is the table's value at the snapshot, never older than what precedes it in
the topic), and a streamed change is only compared with a streamed one.

Law: folding any sequence of events with redelivered runs inserted gives the updates and the state that
folding it without them gives; the consolidated updates per key are the key's last ``after``.

Malformed events (not JSON, not a change event, an unknown ``op``, no key) raise :class:`EventInvalid`
with the reason; the caller routes the record to the error collection or stalls the source
(``on_decode_error``), never drops it.
"""

from __future__ import annotations

import enum
import json
import json.scanner
import re
from json.decoder import scanstring
from typing import Iterable, NamedTuple, Sequence

__all__ = ["Op", "Position", "ChangeEvent", "KeyState", "Applied", "EventInvalid", "RawAfter", "parse_key",
           "json_object", "read_json", "parse_value", "row_text", "apply", "fold"]


try:
    import msgspec as _msgspec

    _fast_read = _msgspec.json.Decoder().decode
    _raw_read = _msgspec.json.Decoder(dict[str, _msgspec.Raw]).decode  # an object's members as raw bytes
    _FAST_REFUSED: tuple[type[BaseException], ...] = (_msgspec.DecodeError, RecursionError, ValueError)
except ImportError:  # pragma: no cover - a dependency; without it every value is read the json way
    _fast_read = _raw_read = None
    _FAST_REFUSED = ()


class EventInvalid(ValueError):
    """A record is not a Debezium change event this envelope can apply; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class Op(enum.Enum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"


_OPS = {o.value: o for o in Op}
_REFUSED_OPS = {"t": "a TRUNCATE event (op t) names no rows to retract; exclude it with the connector's "
                     "skipped.operations (its default) or re-snapshot",
                "m": "a logical decoding message (op m) is not a row change"}


# Position, ChangeEvent, KeyState and Applied are named tuples (immutable; a third of the cost of a frozen dataclass
# to make, and a slice makes the four of them per event)
class Position(NamedTuple):
    """Where an event is upstream: ``source.lsn``, ``source.txId``, whether it is a snapshot read, and
    ``commit``, the first element of ``source.sequence`` (the end LSN of the transaction committed before
    the event's; 0 where Debezium writes null: no commit seen since the connector began)."""

    lsn: int
    tx_id: int | None = None
    snapshot: bool = False
    commit: int = 0

    def covers(self, later: "Position") -> bool:
        """An event at ``later`` was already applied when the key's last applied event is at ``self``: both
        streamed, ``later``'s sequence ``(commit, lsn)`` at or below this one's (a snapshot read is never
        compared)."""
        return not self.snapshot and not later.snapshot and (later.commit, later.lsn) <= (self.commit, self.lsn)

    def to_json(self) -> list:
        return [self.lsn, self.tx_id, self.snapshot, self.commit]

    @classmethod
    def from_json(cls, v: Sequence) -> "Position":
        lsn, tx, snap, *commit = v
        return cls(int(lsn), None if tx is None else int(tx), bool(snap), int(commit[0]) if commit else 0)


class ChangeEvent(NamedTuple):
    """One change: ``after`` (the raw JSON text of the new row, or a :class:`RawAfter` holding it; None for a
    delete) at ``position``."""

    op: Op
    after: "str | RawAfter | None"
    position: Position


class KeyState(NamedTuple):
    """A key's entry in the upsert state: its current ``row`` (raw JSON text; None: deleted), the position
    of the last event applied to it (None: only a tombstone was ever seen), and whether the key's last event
    was a skipped redelivery (``redelivered``: the tombstone that follows a redelivered delete is one too)."""

    row: "str | RawAfter | None"
    position: Position | None
    redelivered: bool = False

    def encode(self) -> bytes:
        return json.dumps({"row": row_text(self.row), "pos": None if self.position is None else self.position.to_json(),
                           "redelivered": self.redelivered}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> "KeyState":
        d = json.loads(value)
        return cls(d["row"], None if d["pos"] is None else Position.from_json(d["pos"]), d["redelivered"])


class Applied(NamedTuple):
    """What one event did: the key's new state, its updates ``(row, diff)`` and whether it was a redelivery."""

    state: KeyState | None
    updates: tuple[tuple[str, int], ...] = ()
    skipped: bool = False


def _members(text: str, what: str) -> dict[str, tuple[object, str]]:
    """The members of the JSON object ``text``: name -> (parsed value, raw text of the value)."""
    dec = json.JSONDecoder()
    out: dict[str, tuple[object, str]] = {}
    n = len(text)

    def ws(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    i = ws(0)
    if i >= n or text[i] != "{":
        raise EventInvalid(f"{what} is not a JSON object")
    i = ws(i + 1)
    if i < n and text[i] == "}":
        i += 1
    else:
        while True:
            if i >= n or text[i] != '"':
                raise EventInvalid(f"{what} is not valid JSON (a member name expected at character {i})")
            name, i = scanstring(text, i + 1)
            i = ws(i)
            if i >= n or text[i] != ":":
                raise EventInvalid(f"{what} is not valid JSON (':' expected at character {i})")
            i = ws(i + 1)
            value, j = dec.raw_decode(text, i)
            out[name] = (value, text[i:j])
            i = ws(j)
            if i < n and text[i] == ",":
                i = ws(i + 1)
                continue
            if i < n and text[i] == "}":
                i += 1
                break
            raise EventInvalid(f"{what} is not valid JSON (',' or '}}' expected at character {i})")
    if ws(i) != n:
        raise EventInvalid(f"{what} is not valid JSON (text after the object at character {i})")
    return out


def _payload(raw: bytes, what: str) -> dict[str, tuple[object, str]]:
    """The members of a JSON value, without Connect's schema wrapper (``{"schema": ..., "payload": ...}``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EventInvalid(f"{what} is not UTF-8") from None
    try:
        members = _members(text, what)
        if set(members) == {"schema", "payload"}:
            members = _members(members["payload"][1], f"{what}'s payload")
    except json.JSONDecodeError as e:
        raise EventInvalid(f"{what} is not valid JSON ({e.msg} at character {e.pos})") from None
    except RecursionError:
        raise EventInvalid(f"{what} is nested too deeply to read") from None
    return members


# a key already in the form parse_key gives (members "name":value with no whitespace, names of letters,
# digits and _, values integers or strings of those): returned as it is, the members' names checked distinct
_MEMBER = rb'"([A-Za-z0-9_]+)":(?:-?(?:0|[1-9][0-9]*)|"[A-Za-z0-9_]*")'
_PLAIN_KEY = re.compile(rb"\{" + _MEMBER + rb"(?:," + _MEMBER.replace(rb"(", rb"(?:", 1) + rb")*\}")
_KEY_NAMES = re.compile(_MEMBER)


def parse_key(key: bytes | None) -> bytes:
    """The key a change event's row is kept under: the key's JSON without a schema wrapper, as written."""
    if key is None:
        raise EventInvalid("a Debezium event needs a key (the table's primary key or replica identity index); "
                           "this record has none")
    if _PLAIN_KEY.fullmatch(key):
        names = _KEY_NAMES.findall(key)
        if len(names) == len(set(names)) and set(names) != {b"schema", b"payload"}:
            return key  # what the members below give back, found without parsing
    try:
        members = _payload(key, "the key")
    except EventInvalid:
        return key  # a key of another converter (not a JSON object) is kept as its bytes
    return ("{" + ",".join(json.dumps(k) + ":" + raw for k, (_, raw) in members.items()) + "}").encode()


class RawAfter:
    """``after`` of a change event not yet cut out of its record's ``value`` (:func:`parse_value` with
    ``defer_after``): folding a key's events needs the text of the rows that survive it only. Compared by
    identity (two events' rows are never taken as equal unread: their updates cancel once summed by
    text, :func:`row_text`)."""

    __slots__ = ("value", "_text")

    def __init__(self, value: bytes) -> None:
        self.value = value
        self._text: str | None = None

    def text(self) -> str:
        """The raw JSON text of ``after``, as :func:`parse_value` without ``defer_after`` gives it."""
        if self._text is None:
            self._text = _raw_after(self.value)
        return self._text


def _raw_after(value: bytes) -> str:
    """The raw text of the member ``after`` of a value read as a change event (its last, as :func:`_members`
    takes it; inside Connect's schema wrapper if there is one): msgspec cuts the members out as raw bytes,
    the member-by-member way (:func:`_payload`) where it cannot."""
    if _raw_read is not None:
        try:
            members = _raw_read(value)
            if set(members) == {"schema", "payload"}:
                members = _raw_read(members["payload"])
            return bytes(members["after"]).decode("utf-8")
        except (*_FAST_REFUSED, KeyError, TypeError):
            pass
    return _payload(value, "the value")["after"][1]


def row_text(row: "str | RawAfter | None") -> str | None:
    """A row as its raw JSON text (None stays None)."""
    return row.text() if isinstance(row, RawAfter) else row


def json_object(value: bytes) -> dict | None:
    """A record's value as a JSON object without Connect's schema wrapper (``{"schema": ..., "payload": ...}``),
    read as ``json.loads`` reads it (:func:`read_json`); None where it is not UTF-8, not JSON (or nested too
    deeply to read) or not an object."""
    try:
        d = read_json(value)
    except (ValueError, StopIteration, RecursionError):
        return None
    if isinstance(d, dict) and len(d) == 2 and "schema" in d and "payload" in d:
        d = d["payload"]
    return d if isinstance(d, dict) else None


def parse_value(value: bytes | None, *, defer_after: bool = False) -> ChangeEvent | None:
    """The change event a record's value holds; None for a tombstone (a null value). ``defer_after``: the
    value is read by the C JSON decoder and ``after`` left in it (a :class:`RawAfter`); a value that does
    not read so goes the member-by-member way, which names what is wrong with it. Both ways accept the same
    values (the same decoder reads every member; a wrapper, a duplicate member and trailing text are
    treated alike) and check them by the same rules (:func:`_event`)."""
    if value is None:
        return None
    if defer_after:
        d = json_object(value)  # None: not UTF-8, not JSON, not an object: the way below says which
        if d is not None:
            return _event(d, RawAfter(value))
    m = _payload(value, "the value")
    return _event({name: v for name, (v, _) in m.items()}, m["after"][1] if "after" in m else "null")


def read_json(value: bytes) -> object:
    """``json.loads(value.decode("utf-8"))``: the same objects, the same values refused (``ValueError``,
    ``StopIteration`` or ``RecursionError`` where it raises), about twice as fast. msgspec's JSON decoder reads
    a value first; it accepts a subset of what ``json`` accepts and reads it the same (strict JSON: not
    ``NaN``, ``Infinity``, a lone surrogate escape or a number past a double's range), so what it refuses is
    read again the json way, which decides (``tests/unit/test_debezium_envelope.py`` holds the two to this
    on generated and mutated texts). The UTF-8 check is Python's, before either."""
    text = value.decode("utf-8")
    if _fast_read is not None:
        try:
            return _fast_read(value)
        except _FAST_REFUSED:
            pass
    return _whole(text)


_scan = json.scanner.make_scanner(json.JSONDecoder())
_ws = re.compile(r"[ \t\n\r]*")


def _whole(text: str) -> object:
    """``json.loads(text)`` without its layers (the same scanner, the same whitespace either side); raises
    ``ValueError`` or ``StopIteration`` where it raises."""
    obj, end = _scan(text, _ws.match(text, 0).end())
    if _ws.match(text, end).end() != len(text):
        raise ValueError("text after the value")
    return obj


def _event(m: dict, after_raw: "str | RawAfter") -> ChangeEvent:
    """The change event of a value's members ``m`` (parsed), ``after_raw`` the raw text of its ``after``."""
    if "op" not in m:
        raise EventInvalid("the value has no `op`: not a Debezium change event (is the topic written with "
                           "ExtractNewRecordState, or is it the transaction topic?)")
    op_name = m["op"]
    if not isinstance(op_name, str):  # a list or an object would not even look up
        raise EventInvalid(f"unknown op {op_name!r} (expected one of c, u, d, r)")
    if op_name in _REFUSED_OPS:
        raise EventInvalid(_REFUSED_OPS[op_name])
    if op_name not in _OPS:
        raise EventInvalid(f"unknown op {op_name!r} (expected one of c, u, d, r)")
    op = _OPS[op_name]
    if op is Op.DELETE:
        after = None
    elif not isinstance(m.get("after"), dict):
        raise EventInvalid(f"op {op.value} has no `after` row")
    else:
        after = after_raw
    source = m.get("source")
    if not isinstance(source, dict):
        raise EventInvalid("the value has no `source` block (its lsn orders the events of a key)")
    lsn, tx = source.get("lsn"), source.get("txId")
    if type(lsn) is not int:  # a JSON number without fraction or exponent (not a bool: its own type)
        raise EventInvalid(f"source.lsn is {lsn!r}, not a number (is the topic written by Debezium's Postgres "
                           "connector?)")
    if tx is not None and type(tx) is not int:
        raise EventInvalid(f"source.txId is {tx!r}, not a number")
    snapshot = op is Op.READ or source.get("snapshot") not in (None, "false", False)
    return ChangeEvent(op, after, Position(lsn, tx, snapshot, 0 if snapshot else _last_commit(source, lsn)))


_PLAIN_SEQUENCE = re.compile(r'\["([0-9]+)","([0-9]+)"\]')


def _last_commit(source: dict, lsn: int) -> int:
    """The first element of ``source.sequence`` (``'["<last commit LSN>","<lsn>"]'``, a JSON text), 0 for
    null; its second element must be the event's ``lsn``."""
    text = source.get("sequence")
    if isinstance(text, str):
        plain = _PLAIN_SEQUENCE.fullmatch(text)
        if plain is not None:  # what json.loads and int() below give it, found without them
            if int(plain[2]) != lsn:
                raise EventInvalid(f"source.sequence {text!r} does not end with source.lsn {lsn}")
            return int(plain[1])
    if text is None:
        raise EventInvalid("source.sequence is missing: a streamed change cannot be ordered against a "
                           "redelivery by its lsn alone (use Debezium 1.6 or later, and keep `source` whole)")
    try:
        commit, at = json.loads(text) if isinstance(text, str) else text
        commit = 0 if commit is None else int(commit)
        at = int(at)
    except (ValueError, TypeError):
        raise EventInvalid(f"source.sequence is {text!r}, not [last commit LSN, LSN]") from None
    if at != lsn:
        raise EventInvalid(f"source.sequence {text!r} does not end with source.lsn {lsn}")
    return commit


def apply(state: KeyState | None, event: ChangeEvent | None) -> Applied:
    """One event (None: a tombstone) applied to its key's ``state`` (None: the key was never seen)."""
    old = state.row if state is not None else None
    if event is None:
        if state is not None and state.redelivered:
            return Applied(state, skipped=True)  # it follows a redelivered delete: a redelivery too
        if old is None:
            return Applied(state)
        return Applied(KeyState(None, state.position), ((old, -1),))
    if state is not None and state.position is not None and state.position.covers(event.position):
        return Applied(KeyState(state.row, state.position, redelivered=True), skipped=True)
    new = event.after
    updates: list[tuple[str, int]] = []
    if old is not None and old != new:
        updates.append((old, -1))
    if new is not None and old != new:
        updates.append((new, 1))
    return Applied(KeyState(new, event.position), tuple(updates))


def fold(state: KeyState | None, events: Iterable[ChangeEvent | None]) -> tuple[KeyState | None,
                                                                                 list[tuple[str, int]], int]:
    """Events of one key applied in order: ``(state, updates, redeliveries skipped)``."""
    updates: list[tuple[str, int]] = []
    skipped = 0
    for e in events:
        a = apply(state, e)
        state = a.state
        updates.extend(a.updates)
        skipped += a.skipped
    return state, updates, skipped
