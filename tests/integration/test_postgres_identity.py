"""Primary keys instead of ``REPLICA IDENTITY FULL`` (issue 33 part 2), against a real upstream Postgres 15:
a table of ``DEFAULT`` identity (its primary key) and one of ``USING INDEX`` identity, whose updates and
deletes carry only the old row's key (or nothing, for an update that keeps it) and whose unchanged TOASTed
values come as ``u``, land exactly: every binding's contents equal the tables as of its LSN (the bindings
below the first snapshot's LSN: the tables as of that LSN), with key changes, unchanged TOAST, deletes and a
TRUNCATE, while a writer writes and cycles crash at random step boundaries. ``NOTHING`` and ``DEFAULT``
without a primary key are refused naming the ``ALTER TABLE``."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest
from pg_support import (WriterThread, bindings, commit_lsns, contents, make_ctx, source_name, upstream_database,
                        writer)

from reclock import cycle, failpoints
from reclock.errors import ReplicaIdentityMissing, TruncatedUnderSnapshot
from reclock.persist import connect


@pytest.fixture
def upstream(postgres):
    with upstream_database(postgres) as dsn:
        yield dsn


DDL = ("CREATE TABLE k (id int8 PRIMARY KEY, v text, big text, n float8, txid int8)",
       "ALTER TABLE k ALTER COLUMN big SET STORAGE EXTERNAL",  # out of line from 2 kB: unchanged, it comes as 'u'
       "CREATE TABLE u (id int8 NOT NULL, code text NOT NULL, v text, txid int8)",
       "CREATE UNIQUE INDEX u_code ON u (code)", "ALTER TABLE u REPLICA IDENTITY USING INDEX u_code",
       "CREATE PUBLICATION pub FOR TABLE k, u")


class KeyWriter(WriterThread):
    """One writer over ``k`` (key ``id``) and ``u`` (key ``code``), logging each transaction's xid and the
    rows it leaves per key: inserts, updates keeping the key (the TOASTed ``big`` unchanged, or changed),
    key changes, deletes, and one ``TRUNCATE k``."""

    def __init__(self, dsn: str, stop: threading.Event) -> None:
        super().__init__(dsn, stop, random.Random(33))
        self.log: list[tuple[int, dict[str, dict]]] = []  # (xid, table -> the rows after it)
        self.live: dict[str, dict] = {"k": {}, "u": {}}
        self.fresh, self.truncated = 0, False

    def step(self, conn, n: int) -> None:
        self.transaction(conn, truncate=n == 40)

    def _key(self) -> int:
        self.fresh += 1
        return self.fresh

    def transaction(self, conn, truncate: bool = False) -> None:
        rng, k, u = self.rng, self.live["k"], self.live["u"]
        with conn.transaction():
            xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0]
            if truncate:
                conn.execute("TRUNCATE k")
                k.clear()
                self.truncated = True
            for _ in range(rng.randint(1, 6)):
                op = rng.choice(["insert", "update", "update", "rekey", "big", "delete"] if len(k) > 3 else ["insert"])
                if op == "insert":
                    key, row = self._key(), (f"v{rng.randint(0, 99)}", str(self.fresh) * 1500, rng.random() - 0.5, xid)
                    conn.execute("INSERT INTO k VALUES (%s, %s, %s, %s, %s)", (key, *row))
                    k[key] = row
                    code = f"c{key}"
                    conn.execute("INSERT INTO u VALUES (%s, %s, %s, %s)", (key, code, row[0], xid))
                    u[code] = (key, row[0], xid)
                    continue
                key = rng.choice(sorted(k))
                v, big, n, _ = k.pop(key)
                if op == "delete":
                    conn.execute("DELETE FROM k WHERE id = %s", (key,))
                    code = rng.choice(sorted(u))
                    conn.execute("DELETE FROM u WHERE code = %s", (code,))
                    u.pop(code)
                    continue
                new_key, v = (self._key() if op == "rekey" else key), f"u{rng.randint(0, 99)}"
                if op == "big":
                    big = f"b{rng.randint(0, 9)}" * 1200
                conn.execute("UPDATE k SET id = %s, v = %s, big = %s, txid = %s WHERE id = %s" if op == "big" else
                             "UPDATE k SET id = %s, v = %s, txid = %s WHERE id = %s",
                             (new_key, v, big, xid, key) if op == "big" else (new_key, v, xid, key))
                k[new_key] = (v, big, n, xid)
                code = rng.choice(sorted(u))
                new_code = f"r{self._key()}" if op == "rekey" else code
                uid, _, _ = u.pop(code)
                conn.execute("UPDATE u SET code = %s, v = %s, txid = %s WHERE code = %s", (new_code, v, xid, code))
                u[new_code] = (uid, v, xid)
        self.log.append((xid, {t: dict(rows) for t, rows in self.live.items()}))


def _at(w: KeyWriter, lsns: dict[int, int], lsn: int, before: dict) -> dict:
    state = before
    for xid, after in w.log:
        if lsns[xid] < lsn:
            state = after
    return state


def test_key_identities_land_every_binding_exactly_with_key_changes_toast_truncate_and_crashes(db, upstream,
                                                                                              tmp_path):
    with writer(upstream) as conn:
        for ddl in DDL:
            conn.execute(ddl)
        conn.execute("SELECT pg_create_logical_replication_slot('observer', 'pgoutput')")
    stop = threading.Event()
    w = KeyWriter(upstream, stop)
    with writer(upstream) as conn:
        for _ in range(20):
            w.transaction(conn)
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["k", "u"], max_records=40)
    w.start()
    time.sleep(0.2)
    points = ["mint:after_binding", "write_batches:before_job", "write_batches:after_slice", "append:in_transaction",
              "resume:after_commit"]
    rng = random.Random(7)
    try:
        try:  # the snapshot, while the writer writes
            cycle.run_cycle(ctx)
        except TruncatedUnderSnapshot:  # the TRUNCATE came between its export and its read: taken again
            cycle.run_cycle(ctx)
        for i in range(5):  # then a crash at a random step boundary every other cycle
            if i % 2 == 0:
                with failpoints.enabled(rng.choice(points)), pytest.raises(failpoints.FailpointHit):
                    cycle.run_cycle(ctx)
            cycle.run_cycle(ctx)
            time.sleep(0.1)
    finally:
        stop.set()
        w.join(60)
    assert w.error is None, w.error
    cycle.run_cycle(ctx)
    assert len(w.log) > 60 and w.truncated, "the writer wrote, and truncated"
    lsns = commit_lsns(upstream)
    with connect(ctx.dsn) as conn:
        snap, = conn.execute("SELECT array_agg(DISTINCT (metrics ->> 'snapshot_lsn')::int8) FROM "
                                "reclock.statistics WHERE name = %s AND metrics ? 'snapshot_lsn'",
                                (ctx.spec.name,)).fetchone()
    assert len(snap) == 1, "one snapshot"
    name, bs = ctx.spec.name, bindings(ctx)
    assert len(bs) >= 6
    for ts, lsn in bs:
        want = _at(w, lsns, max(lsn, snap[0]), {"k": {}, "u": {}})
        got = {i: (r["v"], r["big"], r["n"], r["txid"]) for i, r in contents(ctx, f"{name}__k", ts).items()}
        assert got == want["k"], f"k AS OF {ts} (LSN {lsn:X})"
        got = {r["code"]: (r["id"], r["v"], r["txid"]) for r in contents(ctx, f"{name}__u", ts, "code").values()}
        assert got == want["u"], f"u AS OF {ts} (LSN {lsn:X})"
    with writer(upstream) as conn:  # and the last binding is the tables themselves
        assert {r[0]: r[1:] for r in conn.execute("SELECT * FROM k").fetchall()} == \
            {i: tuple(r.values())[1:] for i, r in contents(ctx, f"{name}__k", bs[-1][0]).items()}


@pytest.mark.parametrize("ddl,identity", [
    ("ALTER TABLE t REPLICA IDENTITY NOTHING", "NOTHING"),
    ("ALTER TABLE t DROP CONSTRAINT t_pkey", "DEFAULT without a primary key"),
])
def test_a_table_whose_changes_name_no_old_row_is_refused_with_the_alter_to_run(db, upstream, tmp_path, ddl,
                                                                                 identity):
    with writer(upstream) as conn:
        conn.execute("CREATE TABLE t (id int8 PRIMARY KEY, v text)")
        conn.execute(ddl)
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    ctx = make_ctx(db, upstream, tmp_path, source_name(), ["t"])
    with pytest.raises(ReplicaIdentityMissing, match=rf'table public\.t: replica identity is {identity}: .*give it a '
                       r'primary key .*run: ALTER TABLE "public"\."t" REPLICA IDENTITY FULL;'):
        cycle.run_cycle(ctx)
