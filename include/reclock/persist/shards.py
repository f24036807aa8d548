"""Shards in Postgres: ``upper``, ``since``, batches of immutable parts, read holds, and
``compare_and_append`` over several shards in one transaction.

``compare_and_append`` when a shard's upper is not the description's ``lower`` (DESIGN.md, "append"):

=======================  ===============================================  ==============================
shard's actual upper     meaning                                          outcome
=======================  ===============================================  ==============================
``>= upper``             another run already wrote this range (replays    ``already_present``: no-op
                         are deterministic: the same data)
``lower < u < upper``    another run wrote part of it                     ``UpperMismatch``; nothing changes
``< lower``              the shard was modified under us                  ``ShardModified``; nothing changes
=======================  ===============================================  ==============================
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from reclock.batch import BatchDescription, Part
from reclock.errors import ShardModified, SinceViolation, UpperMismatch
from reclock.persist.names import validate_name


class UnknownShard(LookupError):
    pass


@dataclass(frozen=True)
class ShardInfo:
    shard: str
    upper: int
    since: int
    source: str | None = None
    output: int = 0


@dataclass(frozen=True)
class Append:
    shard: str
    desc: BatchDescription
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class AppendOutcome:
    shard: str
    status: str  # "appended" | "already_present"
    upper: int

    def __str__(self) -> str:
        return f"{self.shard}: {self.status} (upper {self.upper})"


@dataclass(frozen=True)
class BatchRow:
    shard: str
    lower: int
    upper: int
    path: str
    rows: int
    bytes: int
    min_ts: int | None
    max_ts: int | None


@dataclass(frozen=True)
class ReadHold:
    shard: str
    holder: str
    ts: int
    updated_at: datetime


def register_shard(conn, shard: str, source: str | None = None, output: int = 0) -> ShardInfo:
    validate_name(shard, "shard id")
    with conn.transaction():
        conn.execute("INSERT INTO reclock.shards (id, source, output) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                     (shard, source, output))
    return shard_info(conn, shard)


def shard_info(conn, shard: str) -> ShardInfo:
    row = conn.execute("SELECT upper, since, source, output FROM reclock.shards WHERE id = %s", (shard,)).fetchone()
    if row is None:
        raise UnknownShard(f"shard {shard}: no such shard")
    return ShardInfo(shard, *row)


def compare_and_append(conn, appends: Sequence[Append]) -> list[AppendOutcome]:
    """Atomically apply every append (several shards, in one transaction), or none of them."""
    outcomes: list[AppendOutcome] = []
    with conn.transaction():
        ids = sorted({a.shard for a in appends})
        # lock in a fixed order, so concurrent appenders over the same shards never deadlock
        rows = conn.execute("SELECT id, upper FROM reclock.shards WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
                            (ids,)).fetchall()
        uppers = dict(rows)
        missing = set(ids) - set(uppers)
        if missing:
            raise UnknownShard(f"shard {sorted(missing)[0]}: no such shard")
        new_rows = []
        for a in appends:
            actual = uppers[a.shard]
            if actual == a.desc.lower:
                uppers[a.shard] = a.desc.upper
                new_rows += [(a.shard, a.desc.lower, a.desc.upper, p.path, p.rows, p.bytes, p.min_ts, p.max_ts)
                             for p in a.parts]
                outcomes.append(AppendOutcome(a.shard, "appended", a.desc.upper))
            elif actual >= a.desc.upper:
                outcomes.append(AppendOutcome(a.shard, "already_present", actual))
            elif actual > a.desc.lower:
                raise UpperMismatch(a.shard, a.desc.lower, actual,
                                    "another writer advanced it part of the way; the cycle will re-mint")
            else:
                raise ShardModified(a.shard, a.desc.lower, actual,
                                    "the shard is behind the description: it was modified under us")
        if new_rows:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO reclock.shard_batches (shard, lower, upper, path, rows, bytes, "
                                "min_ts, max_ts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", new_rows)
        for shard in ids:
            conn.execute("UPDATE reclock.shards SET upper = %s WHERE id = %s", (uppers[shard], shard))
    return outcomes


def batches(conn, shard: str, as_of: int | None = None) -> list[BatchRow]:
    """The parts of ``shard`` (for a read AS OF ``t``: those that can hold updates at ``ts <= t``;
    ``since <= t < upper`` is required)."""
    info = shard_info(conn, shard)
    params: list = [shard]
    where = "shard = %s"
    if as_of is not None:
        if as_of < info.since:
            raise SinceViolation(shard, as_of, info.since)
        if as_of >= info.upper:
            raise ValueError(f"shard {shard}: time {as_of} is not complete (upper is {info.upper})")
        where += " AND lower <= %s"
        params.append(as_of)
    rows = conn.execute(f"SELECT shard, lower, upper, path, rows, bytes, min_ts, max_ts FROM reclock.shard_batches "
                        f"WHERE {where} ORDER BY lower, path", params).fetchall()
    return [BatchRow(*r) for r in rows]


def acquire_read_hold(conn, shard: str, holder: str, ts: int) -> ReadHold:
    """Pin ``shard``'s since at or below ``ts`` for ``holder`` (``ts >= since`` is required)."""
    with conn.transaction():
        since = conn.execute("SELECT since FROM reclock.shards WHERE id = %s FOR UPDATE", (shard,)).fetchone()
        if since is None:
            raise UnknownShard(f"shard {shard}: no such shard")
        if ts < since[0]:
            raise SinceViolation(shard, ts, since[0])
        conn.execute("INSERT INTO reclock.read_holds (shard, holder, ts) VALUES (%s, %s, %s) "
                     "ON CONFLICT (shard, holder) DO UPDATE SET ts = excluded.ts, updated_at = now()",
                     (shard, holder, ts))
    return next(h for h in read_holds(conn, shard) if h.holder == holder)


def downgrade_read_hold(conn, shard: str, holder: str, ts: int) -> None:
    """Move a hold forward (never backwards: a hold that moved back could point below since)."""
    with conn.transaction():
        cur = conn.execute("UPDATE reclock.read_holds SET ts = GREATEST(ts, %s), updated_at = now() "
                           "WHERE shard = %s AND holder = %s", (ts, shard, holder))
        if cur.rowcount == 0:
            raise LookupError(f"shard {shard}: {holder} holds no read hold")


def release_read_hold(conn, shard: str, holder: str) -> None:
    with conn.transaction():
        conn.execute("DELETE FROM reclock.read_holds WHERE shard = %s AND holder = %s", (shard, holder))


def read_holds(conn, shard: str) -> list[ReadHold]:
    return [ReadHold(*r) for r in conn.execute(
        "SELECT shard, holder, ts, updated_at FROM reclock.read_holds WHERE shard = %s ORDER BY holder", (shard,))]


def advance_since(conn, shard: str, since: int) -> int:
    """Set since to ``min(since, every hold)``, never backwards, never beyond ``upper``; return it."""
    with conn.transaction():
        row = conn.execute("SELECT upper, since FROM reclock.shards WHERE id = %s FOR UPDATE", (shard,)).fetchone()
        if row is None:
            raise UnknownShard(f"shard {shard}: no such shard")
        upper, current = row
        (hold,) = conn.execute("SELECT min(ts) FROM reclock.read_holds WHERE shard = %s", (shard,)).fetchone()
        target = min(since, upper)
        if hold is not None:
            target = min(target, hold)
        target = max(target, current)
        if target != current:
            conn.execute("UPDATE reclock.shards SET since = %s WHERE id = %s", (target, shard))
    return target
