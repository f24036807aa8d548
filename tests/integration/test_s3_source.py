"""The S3 source through the real cycle (mint, write_batches, append, resume) against moto's S3 and SQS and
local folders: exactly once as objects arrive, bounded state, and every bad input landing, collected or
failing loudly with the object named."""

from __future__ import annotations

import collections
import os
import time

import pytest

from reclock import cycle
from reclock.errors import DecodeError, ObjectChanged, ObjectLost, S3Unavailable
from reclock.persist import connect
from reclock.persist.remap_store import load_remap
from reclock.sources.s3 import catalog

from s3_support import body, collection, make_ctx, new_bucket, oracle_s3, upper


def ns_of(rows) -> list[int]:
    return sorted(r["n"] for r in rows)


def as_of_rows(ctx, shard=None) -> list[tuple]:
    """The collection AS OF its last complete time, consolidated, as sorted tuples."""
    from reclock.read import read_as_of

    with connect(ctx.dsn) as conn:
        t = read_as_of(conn, ctx.blob, shard or ctx.spec.data_shard, upper(ctx) - 1)
    return sorted(tuple(sorted(r.items())) for r in t.to_pylist())


def test_objects_land_exactly_once_with_the_progress_relation(db, spark, s3, tmp_path):
    bucket = new_bucket(s3)
    c = s3.client()
    c.put_object(Bucket=bucket, Key="ev/2025/01/a b ü.json", Body=body(range(0, 100)))
    c.put_object(Bucket=bucket, Key="ev/2025/01/b.json.gz", Body=body(range(100, 150), gz=True))
    c.put_object(Bucket=bucket, Key="ev/2025/01/empty.json", Body=b"")
    c.put_object(Bucket=bucket, Key="other/x.json", Body=body(range(999, 1000)))
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings())
    first = cycle.run_cycle(ctx)
    assert first["minted"] is not None
    rows = collection(ctx)
    assert ns_of(rows) == oracle_s3(s3, bucket, "ev/") == list(range(150))
    assert {r["_key"] for r in rows} == {"ev/2025/01/a b ü.json", "ev/2025/01/b.json.gz"}
    assert len({r["ts"] for r in rows}) == 1  # the first binding covers everything there was
    c.put_object(Bucket=bucket, Key="ev/2025/01/c.json", Body=body(range(150, 160)))
    cycle.run_cycle(ctx)
    assert cycle.run_cycle(ctx)["minted"] is None  # nothing new: no binding
    rows = collection(ctx)
    assert ns_of(rows) == oracle_s3(s3, bucket, "ev/") and len(rows) == 160
    with connect(db) as conn:
        progress = conn.execute('SELECT ts, key, byte_offset FROM reclock."ev_progress" ORDER BY ts').fetchall()
        rc = load_remap(conn, "ev")
    assert progress[-1][1] == "ev/2025/01/c.json" and progress[-1][2] == len(body(range(150, 160)))
    assert all(len(b.frontier) == 1 for b in rc.bindings)  # one row per binding, whatever the objects
    assert collection(ctx, ctx.spec.errors_shard) == []


def test_increasing_keys_stay_bounded_and_late_keys_within_the_lookback_land(db, spark, s3, tmp_path):
    bucket = new_bucket(s3)
    c = s3.client()
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings(),
                   s3={"keys": "increasing", "lookback": "5s"}, clock=lambda: int(time.time() * 1000))
    expected = []
    for wave in range(4):
        for i in range(5):
            n = wave * 10 + i
            c.put_object(Bucket=bucket, Key=f"ev/{n:04d}.json", Body=body([n]))
            expected.append(n)
        if wave == 2:  # late, below keys already ingested, but within the lookback
            c.put_object(Bucket=bucket, Key="ev/0015x.json", Body=body([1015]))
            expected.append(1015)
        cycle.run_cycle(ctx)
        time.sleep(2)
    time.sleep(4)
    cycle.run_cycle(ctx)  # everything is past the lookback now
    cycle.run_cycle(ctx)
    assert ns_of(collection(ctx)) == sorted(expected) == oracle_s3(s3, bucket, "ev/")
    with connect(db) as conn:
        row = catalog.source_row(conn, "ev")
        left = catalog.rows(conn, "ev")
    assert row.start_after == "ev/0034.json" and row.forgotten == len(expected) and not left
    before = as_of_rows(ctx)
    cycle.rebuild(ctx)  # the forgotten objects found again by listing, checked against what was forgotten
    assert as_of_rows(ctx) == before
    c.delete_object(Bucket=bucket, Key="ev/0003.json")
    with pytest.raises(ObjectLost, match="not what the bucket holds there now"):
        cycle.rebuild(ctx)
    assert as_of_rows(ctx) == before  # nothing swapped


def test_a_growing_file_is_read_on_and_only_complete_lines_are_bound(db, spark, tmp_path):
    folder = tmp_path / "landing"
    (folder / "2025").mkdir(parents=True)
    log = folder / "2025" / "app.log.json"
    t = [1_700_000_000_000]
    ctx = make_ctx(db, spark, tmp_path, str(folder), s3={"settle": "60s"}, clock=lambda: t[0])
    os.utime(folder, None)
    log.write_bytes(body(range(3)) + b'{"n": 3, "s": "par')  # a line still being written
    os.utime(log, ns=(t[0] * 1_000_000, t[0] * 1_000_000))
    t[0] += 1000
    cycle.run_cycle(ctx)
    assert ns_of(collection(ctx)) == [0, 1, 2]
    with open(log, "ab") as f:
        f.write(b'tial"}\n' + body(range(4, 6)) + b'{"n": 6, "s": "no line end"}')
    os.utime(log, ns=(t[0] * 1_000_000, t[0] * 1_000_000))
    t[0] += 1000
    cycle.run_cycle(ctx)
    assert ns_of(collection(ctx)) == [0, 1, 2, 3, 4, 5]
    t[0] += 61_000  # unchanged for longer than `settle`: complete, its last line too
    cycle.run_cycle(ctx)
    rows = collection(ctx)
    assert ns_of(rows) == list(range(7)) and len({r["ts"] for r in rows}) == 3
    with connect(db) as conn:
        progress = conn.execute('SELECT key, byte_offset FROM reclock."ev_progress" ORDER BY ts').fetchall()
    assert progress[-1] == ("2025/app.log.json", log.stat().st_size)
    before = as_of_rows(ctx)
    cycle.rebuild(ctx)  # the same lines at the same timestamps, from the file's own partition
    assert as_of_rows(ctx) == before
    with open(log, "ab") as f:  # appended after it was sealed: an overwrite, loudly (on_overwrite: stall)
        f.write(b"\n")
    t[0] += 1000
    with pytest.raises(ObjectChanged, match="app.log.json was overwritten"):
        cycle.run_cycle(ctx)


def test_notifications_through_sqs_deliver_once_even_when_delivered_twice(db, spark, s3, tmp_path):
    bucket = new_bucket(s3)
    c = s3.client()
    c.put_object(Bucket=bucket, Key="ev/before.json", Body=body(range(0, 5)))  # before the queue: backfilled
    url, arn = s3.queue(f"q{bucket}")
    s3.notify(bucket, "ev/", arn)
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings(),
                   s3={"discovery": "notifications", "queue": url})
    for i in range(3):
        c.put_object(Bucket=bucket, Key=f"ev/{i} ü.json", Body=body(range(10 * (i + 1), 10 * (i + 1) + 5)))
    cycle.run_cycle(ctx)
    sqs = s3.client("sqs")
    msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert not msgs  # every message was deleted once its objects were recorded
    # the same event again (SQS delivers at least once), and an event for an object changed since
    c.put_object(Bucket=bucket, Key="ev/3.json", Body=body(range(40, 45)))
    again = {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": bucket},
                                                                   "object": {"key": "ev/1+%C3%BC.json", "size": 1,
                                                                              "eTag": "0" * 32}}}]}
    import json
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(again))
    cycle.run_cycle(ctx)
    assert ns_of(collection(ctx)) == oracle_s3(s3, bucket, "ev/")
    assert collection(ctx, ctx.spec.errors_shard) == []


def test_notified_objects_carry_the_last_modified_s3_gives_them(db, spark, s3, tmp_path):
    """An event has no LastModified: with ``include: [last_modified]`` each notified object is described by
    a HEAD, so ``_last_modified`` is S3's (the test clock is years away from it)."""
    bucket = new_bucket(s3)
    c = s3.client()
    url, arn = s3.queue(f"q{bucket}")
    s3.notify(bucket, "ev/", arn)
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings(),
                   s3={"discovery": "notifications", "queue": url, "backfill": False},
                   include=["key", "offset", "last_modified"])
    for i in range(2):
        c.put_object(Bucket=bucket, Key=f"ev/{i}.json", Body=body(range(3 * i, 3 * i + 3)))
    cycle.run_cycle(ctx)
    rows = collection(ctx)
    assert ns_of(rows) == oracle_s3(s3, bucket, "ev/")
    for r in rows:
        s3_time = c.head_object(Bucket=bucket, Key=r["_key"])["LastModified"]
        assert abs(r["_last_modified"].timestamp() - s3_time.timestamp()) < 1, (r, s3_time)


def test_bad_input_each_lands_is_collected_or_fails_naming_the_object(db, spark, s3, tmp_path):
    bucket = new_bucket(s3)
    c = s3.client()
    c.put_object(Bucket=bucket, Key="ev/ok.json", Body=body(range(5)))
    c.put_object(Bucket=bucket, Key="ev/cut.json.gz", Body=body(range(100, 300), gz=True)[:-40])
    c.put_object(Bucket=bucket, Key="ev/bad line.json", Body=b'{"n": 7}\n{not json\n')
    c.put_object(Bucket=bucket, Key="ev/zero.json", Body=b"")
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings(), s3={"on_overwrite": "collect"})
    cycle.run_cycle(ctx)
    rows, errors = collection(ctx), collection(ctx, ctx.spec.errors_shard)
    reasons = collections.Counter()
    for e in errors:
        key = e["key"].decode()
        reasons[key] += 1
        assert e["reason"]
    assert reasons == {"ev/cut.json.gz": 1, "ev/bad line.json": 1}
    cut = [r["n"] for r in rows if r["_key"] == "ev/cut.json.gz"]
    assert cut == list(range(100, 100 + len(cut))) and 0 < len(cut) < 200  # the lines before the damage
    assert sorted(r["n"] for r in rows if r["_key"] != "ev/cut.json.gz") == [0, 1, 2, 3, 4, 7]

    c.put_object(Bucket=bucket, Key="ev/ok.json", Body=body(range(50, 55)))  # overwritten after it was ingested
    cycle.run_cycle(ctx)
    errors = collection(ctx, ctx.spec.errors_shard)
    over = [e for e in errors if "overwritten" in e["reason"]]
    assert len(over) == 1 and over[0]["key"] == b"ev/ok.json" and "on_overwrite: collect" in over[0]["reason"]
    assert 50 not in ns_of(collection(ctx))
    before = as_of_rows(ctx), as_of_rows(ctx, ctx.spec.errors_shard)
    c.put_object(Bucket=bucket, Key="ev/ok.json", Body=body(range(5)))  # the bytes that were ingested, again
    cycle.rebuild(ctx)  # error rows too: the same rows (an error row names its object by key, not by id)
    assert (as_of_rows(ctx), as_of_rows(ctx, ctx.spec.errors_shard)) == before

    stall = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings(), name="ev2",
                     on_decode_error="stall")
    with pytest.raises(DecodeError, match="bad line.json.*does not parse"):
        cycle.run_cycle(stall)


def test_an_object_deleted_before_it_was_read_is_upstream_data_lost(db, spark, s3, tmp_path):
    bucket = new_bucket(s3)
    c = s3.client()
    c.put_object(Bucket=bucket, Key="ev/gone soon.json", Body=body(range(5)))
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings())
    minted = cycle.mint(ctx)
    c.delete_object(Bucket=bucket, Key="ev/gone soon.json")
    with pytest.raises(ObjectLost, match=r"gone soon.json: bytes \[0, \d+\) are bound .* no longer exists"):
        cycle.write_batches(ctx, minted.descriptions[0])
    assert upper(ctx) == 0


def test_overwritten_before_it_was_read_stalls_by_default(db, spark, s3, tmp_path):
    bucket = new_bucket(s3)
    c = s3.client()
    c.put_object(Bucket=bucket, Key="ev/a.json", Body=body(range(5)))
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings())
    minted = cycle.mint(ctx)
    c.put_object(Bucket=bucket, Key="ev/a.json", Body=body(range(5, 9)))
    with pytest.raises(ObjectChanged, match="a.json was overwritten.*on_overwrite"):
        cycle.write_batches(ctx, minted.descriptions[0])
    with pytest.raises(ObjectChanged, match="a.json was overwritten"):
        cycle.mint(ctx)  # and discovery says so too, every cycle, until the policy or the object changes


def test_a_missing_bucket_and_wrong_credentials_fail_the_cycle_naming_them(db, spark, s3, s3_auth, tmp_path):
    from dataclasses import replace

    def last_status(name):
        with connect(db) as conn:
            return conn.execute("SELECT status, error FROM reclock.status_history WHERE name = %s "
                                "ORDER BY id DESC LIMIT 1", (name,)).fetchone()

    ctx = make_ctx(db, spark, tmp_path, "s3://no-such-bucket-here/ev/", s3.settings())
    with pytest.raises(S3Unavailable, match="bucket 'no-such-bucket-here' does not exist"):
        cycle.run_cycle(ctx)
    assert last_status("ev")[0] == "stalled" and "no-such-bucket-here" in last_status("ev")[1]
    s3_auth.client().put_object(Bucket="reclock", Key="ev/a.json", Body=body(range(3)))
    wrong = replace(s3_auth.settings(), secret_key="not-the-secret")
    ctx = make_ctx(db, spark, tmp_path, "s3://reclock/ev/", wrong, name="ev_denied")
    with pytest.raises(S3Unavailable, match="credentials were refused .*SignatureDoesNotMatch"):
        cycle.run_cycle(ctx)
    assert "credentials were refused" in last_status("ev_denied")[1] and "not-the-secret" not in last_status("ev_denied")[1]
    ok = make_ctx(db, spark, tmp_path, "s3://reclock/ev/", s3_auth.settings(), name="ev_allowed")
    cycle.run_cycle(ok)
    assert ns_of(collection(ok)) == [0, 1, 2]


def _parquet(path_or_buf, table):
    import pyarrow.parquet as pq

    pq.write_table(table, path_or_buf, row_group_size=40)


def test_parquet_files_one_increment_each_and_a_schema_that_differs_is_named(db, spark, tmp_path):
    import pyarrow as pa

    folder = tmp_path / "pq"
    folder.mkdir()
    good = pa.table({"n": pa.array(range(100), pa.int32()), "s": [f"v{i}" for i in range(100)]})  # int -> bigint
    _parquet(folder / "a.parquet", good)
    _parquet(folder / "b.parquet", pa.table({"n": pa.array([1.5]), "s": ["x"]}))  # double does not fit bigint
    _parquet(folder / "c.parquet", pa.table({"n": pa.array([1], pa.int64()), "s": ["x"], "extra": [1]}))
    (folder / "d.parquet").write_bytes(b"")
    (folder / "e.parquet").write_bytes(b"PAR1 not really")
    for p in folder.iterdir():
        os.utime(p, (1_600_000_000, 1_600_000_000))  # settled long ago
    ctx = make_ctx(db, spark, tmp_path, str(folder), format={"type": "parquet", "schema": "n BIGINT, s STRING"})
    cycle.run_cycle(ctx)
    rows = collection(ctx)
    assert sorted(r["n"] for r in rows) == list(range(100)) and {r["_key"] for r in rows} == {"a.parquet"}
    assert sorted(r["_offset"] for r in rows) == list(range(100))  # a row's offset: its index in the file
    errors = {e["key"].decode(): e["reason"] for e in collection(ctx, ctx.spec.errors_shard)}
    assert set(errors) == {"b.parquet", "c.parquet", "d.parquet", "e.parquet"}
    assert "column n: double does not convert exactly to int64" in errors["b.parquet"]
    assert "column(s) extra are not in the declared schema" in errors["c.parquet"]
    assert "zero-byte" in errors["d.parquet"] and "not a readable Parquet file" in errors["e.parquet"]


def test_avro_container_files_resolve_to_the_declared_schema(db, spark, s3, tmp_path):
    import io
    import json

    import fastavro

    bucket = new_bucket(s3)
    writer = {"type": "record", "name": "E", "fields": [{"name": "n", "type": "int"}, {"name": "s", "type": "string"}]}
    reader = {"type": "record", "name": "E", "fields": [{"name": "n", "type": "long"}, {"name": "s", "type": "string"},
                                                        {"name": "note", "type": ["null", "string"], "default": None}]}
    buf = io.BytesIO()
    fastavro.writer(buf, writer, [{"n": i, "s": f"v{i}"} for i in range(30)])
    s3.client().put_object(Bucket=bucket, Key="av/one.avro", Body=buf.getvalue())
    s3.client().put_object(Bucket=bucket, Key="av/cut.avro", Body=buf.getvalue()[:-20])
    (tmp_path / "e.avsc").write_text(json.dumps(reader))
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/av/", s3.settings(),
                   format={"type": "avro", "schema_file": str(tmp_path / "e.avsc")})
    cycle.run_cycle(ctx)
    rows = [r for r in collection(ctx) if r["_key"] == "av/one.avro"]
    assert sorted(r["n"] for r in rows) == list(range(30)) and all(r["note"] is None for r in rows)
    errors = collection(ctx, ctx.spec.errors_shard)
    assert [e["key"] for e in errors] == [b"av/cut.avro"]
    assert "do not read" in errors[0]["reason"] or "not a readable Avro" in errors[0]["reason"]


def test_a_large_object_is_read_in_budget_sized_ranges(db, spark, s3, tmp_path):
    """The suite's version of the 5 GB object (benchmarks/s3_big_object.py streams 5 GB with flat memory):
    one object several times the budget is read by several jobs, each a budget's bytes, every line once."""
    bucket = new_bucket(s3)
    line = b'{"n": %d, "s": "' + b"x" * 200 + b'"}\n'
    n = 120_000  # ~26 MB
    data = b"".join(line % i for i in range(n))
    s3.client().put_object(Bucket=bucket, Key="big/one.json", Body=data)
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/big/", s3.settings(), budget={"max_bytes": "8MB"})
    minted = cycle.mint(ctx)
    assert len(minted.descriptions) == 1  # one binding, one object
    written = cycle.write_batches(ctx, minted.descriptions[0])
    cycle.append(ctx, written)
    with connect(db) as conn:
        stats = conn.execute("SELECT metrics FROM reclock.statistics WHERE name = 'ev' AND step = 'write_batches' "
                             "ORDER BY id DESC LIMIT 1").fetchone()[0]
    assert stats["slices"] == 4 and stats["bytes_read"] == len(data) and stats["records_read"] == n
    rows = collection(ctx)
    assert len(rows) == n and ns_of(rows) == list(range(n))


def test_status_shows_the_lag_in_objects_and_bytes(db, spark, s3, tmp_path, monkeypatch):
    from reclock import status_report as sr
    from reclock.config import Config

    bucket = new_bucket(s3)
    c = s3.client()
    c.put_object(Bucket=bucket, Key="ev/a.json", Body=body(range(5)))
    ctx = make_ctx(db, spark, tmp_path, f"s3://{bucket}/ev/", s3.settings())
    cycle.run_cycle(ctx)
    late = body(range(5, 9))
    c.put_object(Bucket=bucket, Key="ev/b.json", Body=late)
    st = s3.settings()  # the probe finds the keys as a task does: here, the AWS environment
    monkeypatch.delenv("AIRFLOW_CONN_RECLOCK_S3", raising=False)
    for var, value in (("AWS_ACCESS_KEY_ID", st.access_key), ("AWS_SECRET_ACCESS_KEY", st.secret_key),
                       ("AWS_ENDPOINT_URL", st.endpoint_url), ("AWS_REGION", st.region)):
        monkeypatch.setenv(var, value)
    lag = sr.lag_probe(Config({"ev": ctx.spec}), dsn=db)
    with sr.open_readonly(db) as conn:
        ov = sr.overview(conn, Config({"ev": ctx.spec}), lag)
    (src,) = ov.sources
    assert src.kind == "s3" and src.lag.value == 1 and src.lag.unit == "objects"
    assert f"1 object(s), {len(late)} byte(s) not yet ingested" in src.lag.detail
    assert f"lag: 1 object ({src.lag.detail})" in "\n".join(sr.report_lines(ov))
    cycle.run_cycle(ctx)
    assert lag("ev").value == 0
    with connect(db) as conn:  # the bindings in the kind's columns: the object's key and its bytes
        detail = sr.source_detail(conn, "ev", Config({"ev": ctx.spec}), lag)
    assert detail.columns == ("ts", "key", "byte_offset")
    assert detail.bindings[0].cells == ("ev/b.json", str(len(late)))
    assert "log position" not in "\n".join(sr.detail_lines(detail))


class _EndlessQueue:
    """A queue that is never empty: ``redeliver`` hands out the same ten messages again and again (their
    visibility ran out before the discovery deleted them), else ten messages of new objects each time (objects
    arriving faster than they are received). It stops a discovery that would never end after 300 receives."""

    def __init__(self, bucket: str, redeliver: bool) -> None:
        self.bucket, self.redeliver = bucket, redeliver
        self.receives = 0
        self.deleted: list[str] = []

    def receive(self, max_messages: int = 10, wait_s: int = 0, visibility_s: int = 30):
        from reclock.sources.s3.client import ObjectEvent, QueueMessage

        self.receives += 1
        assert self.receives <= 300, "the discovery went on receiving from a queue that never empties"
        time.sleep(0.01)
        first = 0 if self.redeliver else 10 * (self.receives - 1)
        return [QueueMessage(f"r{self.receives}-{i}", (ObjectEvent(self.bucket, f"ev/{i}.json", True, 10, "e" * 32,
                                                                   None, None, "ObjectCreated:Put"),), f"m{i}")
                for i in range(first, first + 10)]

    def delete(self, receipts: list[str]) -> None:
        self.deleted += receipts


@pytest.mark.parametrize("redeliver", [True, False], ids=["redelivered", "arriving"])
def test_a_notified_discovery_ends_while_the_queue_never_empties(db, s3, tmp_path, monkeypatch, redeliver):
    """Issue 37's stalled ``evn``: receiving until the queue was empty never ended when objects arrived faster
    than a slow endpoint gave them (its first messages came back once their visibility ran out, naming no new
    object). The discovery stops at a message it already has, or after RECEIVE_S, and deletes each message it
    recorded once, by its newest receipt."""
    from reclock.sources.s3 import kind

    monkeypatch.setattr(kind, "RECEIVE_S", 0.5)
    bucket = new_bucket(s3)
    ctx = make_ctx(db, None, tmp_path, f"s3://{bucket}/ev/", s3.settings(),
                   s3={"discovery": "notifications", "queue": "http://127.0.0.1:1/q", "backfill": False})
    src = ctx.source()
    src.register()
    queue = src._queue = _EndlessQueue(bucket, redeliver)
    src.probe_upper()
    with connect(db) as conn:
        keys = sorted(r.key for r in catalog.rows(conn, "ev"))
    received = range(10) if redeliver else range(10 * queue.receives)
    assert keys == sorted(f"ev/{i}.json" for i in received)
    assert sorted(queue.deleted) == sorted(f"r{queue.receives}-{i}" if redeliver else f"r{i // 10 + 1}-{i}"
                                           for i in received)
    if redeliver:
        assert queue.receives == 2
