"""The S3 source's upstream client against a real S3 API (moto's server, a separate process on 127.0.0.1)
and a local folder: the same listing order, reads pinned to what was recorded, S3 event notifications
delivered through SQS, and every way upstream can refuse, each named."""

from __future__ import annotations

import os
import uuid

import pytest

from reclock.errors import ObjectChanged, ObjectLost, S3Unavailable
from reclock.sources.s3.client import EventQueue, ObjectInfo, open_store, parse_location

KEYS = ["a.json", "a b.json", "ä/ü x.json", "b/2025/01/01.json", "b/2025/01/02.json", "b/2025-x.json", "b.json",
        "z/😀.json", "a/b.json", "a-b/c.json"]


@pytest.fixture
def bucket(s3):
    name = f"b{uuid.uuid4().hex[:10]}"
    s3.create_bucket(name)
    return name


def put(s3, bucket, key, body: bytes):
    s3.client().put_object(Bucket=bucket, Key=key, Body=body)


def test_listing_order_and_start_after_agree_between_s3_and_a_folder(s3, bucket, tmp_path):
    for k in KEYS:
        put(s3, bucket, "in/" + k, k.encode())
        path = tmp_path / k
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(k.encode())
    (tmp_path / ".hidden").write_text("x")
    (tmp_path / "_SUCCESS").write_text("")
    put(s3, bucket, "other/x.json", b"x")
    on_s3 = open_store("src", f"s3://{bucket}/in/", s3.settings())
    local = open_store("src", str(tmp_path), None)
    s3_keys = [o.key[len("in/"):] for o in on_s3.list()]
    assert s3_keys == sorted(KEYS, key=lambda k: k.encode())  # S3's order: UTF-8 bytes
    assert [o.key for o in local.list()] == s3_keys
    for after in ["", "a", "a b.json", "b/2025/", "b/2025/01/01.json", "b/2025-", "z", "zz"]:
        want = [k for k in s3_keys if k > after]
        assert [o.key[3:] for o in on_s3.list("in/" + after)] == want, after
        assert [o.key for o in local.list(after)] == want, after
    sizes = {o.key: o.size for o in local.list()}
    assert sizes["z/😀.json"] == len("z/😀.json".encode())


def test_reads_are_pinned_to_the_recorded_etag(s3, bucket):
    body = b"".join(b'{"n": %d}\n' % i for i in range(1000))
    put(s3, bucket, "k/one two ü.json", body)
    store = open_store("src", f"s3://{bucket}/k/", s3.settings())
    (obj,) = list(store.list())
    assert obj.size == len(body) and obj.etag and store.head(obj.key).etag == obj.etag
    assert b"".join(store.read(obj, 10, 5000, chunk=333)) == body[10:5000]
    put(s3, bucket, "k/one two ü.json", body + b'{"n": 1000}\n')  # overwritten
    with pytest.raises(ObjectChanged, match=r"one two ü.json was overwritten: it was recorded as ETag"):
        list(store.read(obj, 0, 100))
    s3.client().delete_object(Bucket=bucket, Key="k/one two ü.json")
    with pytest.raises(ObjectLost, match=r"one two ü.json: bytes \[0, 100\) are bound .* no longer exists"):
        list(store.read(obj, 0, 100))
    assert store.head(obj.key) is None


def test_a_missing_bucket_and_a_missing_folder_are_named(s3, tmp_path):
    store = open_store("src", "s3://no-such-bucket/x/", s3.settings())
    with pytest.raises(S3Unavailable, match="bucket 'no-such-bucket' does not exist"):
        store.check()
    with pytest.raises(S3Unavailable, match="bucket 'no-such-bucket' does not exist"):
        list(store.list())
    with pytest.raises(S3Unavailable, match="folder .*nowhere does not exist"):
        list(open_store("src", str(tmp_path / "nowhere"), None).list())


def test_wrong_credentials_are_refused_and_named(s3_auth):
    from dataclasses import replace

    good = s3_auth.settings()
    store = open_store("src", "s3://reclock/x/", good)
    store.check()
    for bad in (replace(good, secret_key="wrong-secret"), replace(good, access_key="AKIAWRONGWRONGWRONG")):
        store = open_store("src", "s3://reclock/x/", bad)
        with pytest.raises(S3Unavailable, match="credentials were refused .*(SignatureDoesNotMatch|InvalidAccessKeyId)"):
            store.check()
        assert "wrong-secret" not in repr(bad)


def test_event_notifications_reach_the_queue(s3, bucket):
    url, arn = s3.queue(f"q-{bucket}")
    s3.notify(bucket, "events/", arn)
    queue = EventQueue("src", url, s3.settings())
    put(s3, bucket, "events/a b ü.json", b"{}\n")
    put(s3, bucket, "elsewhere/x.json", b"{}\n")  # not under the prefix: no event
    s3.client().delete_object(Bucket=bucket, Key="events/a b ü.json")
    events = []
    for _ in range(5):
        msgs = queue.receive(wait_s=1)
        events += [e for m in msgs for e in m.events]
        queue.delete([m.receipt for m in msgs])
        if len(events) >= 2:
            break
    assert [(e.key, e.created, e.size) for e in events] == [("events/a b ü.json", True, 3),
                                                           ("events/a b ü.json", False, 3)]
    assert events[0].etag and events[0].bucket == bucket
    assert queue.retention_s() > 0 and queue.depth() == 0
    with pytest.raises(S3Unavailable, match="does not exist"):
        EventQueue("src", url + "-gone", s3.settings()).receive()


def test_local_files_are_read_by_identity(tmp_path):
    f = tmp_path / "log.txt"
    f.write_bytes(b"one\ntwo\n")
    store = open_store("src", tmp_path.as_uri(), None)
    (obj,) = list(store.list())
    with open(f, "ab") as out:
        out.write(b"three\n")  # appended: the same file, read on
    assert b"".join(store.read(obj, 4, 14)) == b"two\nthree\n"
    os.replace(tmp_path / "log.txt", tmp_path / "old")
    f.write_bytes(b"one\ntwo\nthree\n")  # a new file under the same name
    with pytest.raises(ObjectChanged, match="was overwritten"):
        list(store.read(obj, 0, 4))
    f.unlink()
    with pytest.raises(ObjectLost):
        list(store.read(obj, 0, 4))
    with pytest.raises(ObjectChanged, match="truncated"):
        list(store.read(ObjectInfo("old", 0, obj.etag, 0), 0, 100))


def test_parse_location():
    assert parse_location("s3://b/p/").bucket == "b"
    assert parse_location("file:///data/x%20y").root.as_posix() == "/data/x y"
    with pytest.raises(Exception, match="absolute"):
        parse_location("data/x")
