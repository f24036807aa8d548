"""The pgoutput decoder on what a real Postgres (``wal_level=logical``) sends through
``pg_logical_slot_peek_binary_changes``: every message kind, unchanged TOAST, and every converted type."""

from __future__ import annotations

import datetime as dt
import decimal

import psycopg

from reclock.sources.postgres import pgoutput as po

PEEK = ("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
        "'publication_names', 'pub')")


def _session(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    for s in ("SET DateStyle = ISO", "SET TimeZone = UTC", "SET bytea_output = hex"):
        conn.execute(s)
    return conn


def test_every_message_kind_from_real_postgres(fresh_db):
    with _session(fresh_db) as conn:
        conn.execute("CREATE TABLE t (id int8 PRIMARY KEY, b bool, s int2, i int4, n numeric(12,2), f4 float4, "
                     "f8 float8, txt text, vc varchar(20), ts timestamp, tz timestamptz, d date, j jsonb, "
                     "js json, u uuid, by bytea, big text)")
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
        conn.execute("ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")  # out of line, uncompressed
        conn.execute("CREATE TABLE k (id int PRIMARY KEY, v text)")  # default identity: key-only old tuples
        conn.execute("CREATE PUBLICATION pub FOR TABLE t, k")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        big = "x" * 100_000  # TOASTed
        conn.execute("INSERT INTO t VALUES (1, true, -5, 7, -1234.50, 1.5, 'NaN', 'héllo', 'v', "
                     "'2024-01-02 03:04:05.123456', '2024-01-02 03:04:05+02', '2024-02-29', '{\"a\": [1]}', "
                     "'{\"b\":2}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff', %s)", (big,))
        with conn.transaction():
            conn.execute("UPDATE t SET i = 8 WHERE id = 1")  # big unchanged: 'u' in the new tuple
            conn.execute("INSERT INTO k VALUES (1, 'a')")
            conn.execute("UPDATE k SET v = 'b' WHERE id = 1")  # key unchanged: no old tuple
            conn.execute("UPDATE k SET id = 2 WHERE id = 1")  # key changed: K old tuple
            conn.execute("DELETE FROM k WHERE id = 2")
        conn.execute("DELETE FROM t WHERE id = 1")
        conn.execute("TRUNCATE k")
        rows = [po.decode(r[0]) for r in conn.execute(PEEK, ("s",)).fetchall()]
        types = {r[0]: r[1] for r in conn.execute(
            "SELECT a.attname, a.atttypid::int FROM pg_attribute a WHERE a.attrelid = 't'::regclass AND a.attnum > 0")}
        relid_t = conn.execute("SELECT 't'::regclass::oid::int").fetchone()[0]
        conn.execute("SELECT pg_drop_replication_slot('s')")

    kinds = [type(m).__name__ for m in rows]
    assert kinds.count("Begin") == kinds.count("Commit") == 4
    rel_t = next(m for m in rows if isinstance(m, po.Relation) and m.name == "t")
    assert rel_t.relid == relid_t and rel_t.namespace == "public" and rel_t.replica_identity == "f"
    assert {c.name: c.type_oid for c in rel_t.columns} == types
    assert next(c for c in rel_t.columns if c.name == "n").typmod == (12 << 16 | 2) + 4
    rel_k = next(m for m in rows if isinstance(m, po.Relation) and m.name == "k")
    assert rel_k.replica_identity == "d" and [c.flags for c in rel_k.columns] == [1, 0]

    ins = next(m for m in rows if isinstance(m, po.Insert) and m.relid == relid_t)
    values = {c.name: po.convert(c.type_oid, c.typmod, v, c.name) for c, v in zip(rel_t.columns, ins.new)}
    assert values == {
        "id": 1, "b": True, "s": -5, "i": 7, "n": decimal.Decimal("-1234.50"), "f4": 1.5, "f8": values["f8"],
        "txt": "héllo", "vc": "v", "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
        "tz": dt.datetime(2024, 1, 2, 1, 4, 5, tzinfo=dt.timezone.utc), "d": dt.date(2024, 2, 29),
        "j": '{"a": [1]}', "js": '{"b":2}', "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "by": b"\x00\xff",
        "big": big}
    assert values["f8"] != values["f8"]  # NaN

    upd_t = next(m for m in rows if isinstance(m, po.Update) and m.relid == relid_t)
    assert upd_t.old_kind == "O" and upd_t.old[-1] == big.encode()  # identity full: the whole old row
    assert upd_t.new[-1] is po.UNCHANGED_TOAST and upd_t.new[3] == b"8"
    upd_k = [m for m in rows if isinstance(m, po.Update) and m.relid == rel_k.relid]
    assert [u.old_kind for u in upd_k] == [None, "K"] and upd_k[1].old == (b"1", None)
    del_k = next(m for m in rows if isinstance(m, po.Delete) and m.relid == rel_k.relid)
    assert del_k.old_kind == "K"
    del_t = next(m for m in rows if isinstance(m, po.Delete) and m.relid == relid_t)
    assert del_t.old_kind == "O" and del_t.old[0] == b"1"
    trunc = next(m for m in rows if isinstance(m, po.Truncate))
    assert trunc.relids == (rel_k.relid,)

    # every Begin's final LSN is its Commit's commit LSN, and commits come in LSN order
    begins = [m for m in rows if isinstance(m, po.Begin)]
    commits = [m for m in rows if isinstance(m, po.Commit)]
    assert [b.final_lsn for b in begins] == [c.commit_lsn for c in commits]
    assert [c.commit_lsn for c in commits] == sorted(c.commit_lsn for c in commits)
    assert all(c.commit_lsn < c.end_lsn for c in commits)
