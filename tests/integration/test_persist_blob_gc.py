"""Blob stores (a local folder, any fsspec URL) and garbage collection of unreferenced parts."""

from __future__ import annotations

import os
import re
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reclock.batch import BatchDescription, Part
from reclock.errors import ConfigError
from reclock.persist.blob import (BlobStore, FsspecBlobStore, LocalBlobStore, blob_store_from_url,
                                  new_part_path)
from reclock.persist.gc import collect_garbage
from reclock.persist.shards import Append, compare_and_append, register_shard

BAD_PATHS = ("../etc/passwd", "/abs", "a//b", "a/../../b", "a/./b", "", "s3://x/y")


@pytest.fixture(params=["local", "memory", "file_url", "s3"])
def store(request, tmp_path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    if request.param == "memory":
        return FsspecBlobStore(f"memory://reclock-{uuid.uuid4().hex}")
    if request.param == "s3":
        s3 = request.getfixturevalue("s3")
        return blob_store_from_url(s3.url(f"blobs-{uuid.uuid4().hex}"), s3.settings())
    return blob_store_from_url(f"file://{tmp_path / 'c'}")


def test_blob_store_basics(store):
    assert isinstance(store, BlobStore)
    assert store.list() == [] and store.list("x") == [] and not store.exists("x/y/z.parquet")
    store.put_bytes("x/y/z.parquet", b"abc")
    store.put_bytes("x/w.parquet", b"hello")
    store.put_bytes("xx/v.parquet", b"!")
    assert store.get_bytes("x/y/z.parquet") == b"abc" and store.exists("x/y/z.parquet")
    assert [(b.path, b.size) for b in store.list("x")] == [("x/w.parquet", 5), ("x/y/z.parquet", 3)]
    assert [b.path for b in store.list("x/")] == ["x/w.parquet", "x/y/z.parquet"]
    assert [b.path for b in store.list()] == ["x/w.parquet", "x/y/z.parquet", "xx/v.parquet"]
    assert all(abs(b.mtime - time.time()) < 600 for b in store.list())
    with store.open("x/y/z.parquet") as f:
        assert f.read() == b"abc"
    store.put_bytes("x/y/z.parquet", b"replaced")
    assert store.get_bytes("x/y/z.parquet") == b"replaced"
    store.delete("x/y/z.parquet")
    store.delete("x/y/z.parquet")  # deleting what is gone is fine
    assert not store.exists("x/y/z.parquet")
    for gone in ("x/y/z.parquet", "nowhere/at/all.json"):  # one error for "none there" in every store
        with pytest.raises(FileNotFoundError):
            store.get_bytes(gone)
    for bad in BAD_PATHS:
        with pytest.raises(ValueError, match="must be relative"):
            store.url(bad)
        with pytest.raises(ValueError):
            store.put_bytes(bad, b"x")


def test_local_store_writes_atomically_and_stays_inside_its_root(tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    store.put_bytes("s/0-10/a.parquet", b"x" * 1000)
    assert sorted(os.listdir(tmp_path / "blobs" / "s" / "0-10")) == ["a.parquet"]  # no temp file left
    assert store.url("s/0-10/a.parquet") == str(tmp_path / "blobs" / "s" / "0-10" / "a.parquet")
    assert not (tmp_path / "etc").exists()
    table = pa.table({"data": ["a", "b"], "ts": pa.array([3, 4], pa.int64()), "diff": pa.array([1, 1], pa.int64())})
    pq.write_table(table, store.url("s/0-10/b.parquet"))  # pyarrow writes straight to url()
    with store.open("s/0-10/b.parquet") as f:
        assert pq.read_table(f).equals(table)


def test_memory_store_urls():
    store = FsspecBlobStore("memory://bucket/prefix")
    assert store.url("s/p.parquet") == "memory://bucket/prefix/s/p.parquet"


def test_s3_store_urls_and_parquet_through_it(s3):
    store = blob_store_from_url(s3.url("prefix"), s3.settings())
    assert store.url("s/p.parquet") == f"s3a://{s3.bucket}/prefix/s/p.parquet"  # what Spark writes to
    assert repr(store) == f"FsspecBlobStore('s3://{s3.bucket}/prefix')"
    table = pa.table({"id": pa.array(range(1000), pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=100)
    store.put_bytes("s/p.parquet", sink.getvalue().to_pybytes())
    with store.open("s/p.parquet") as f:
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_row_groups == 10 and pf.read_row_group(3).column("id")[0].as_py() == 300
    store.fs.pipe_file(f"{store.root}/s/folder/", b"")  # a folder marker, as S3A's mkdirs leaves
    assert [b.path for b in store.list()] == ["s/p.parquet"]


def test_blob_store_from_url(tmp_path, monkeypatch):
    assert isinstance(blob_store_from_url(str(tmp_path / "a")), LocalBlobStore)
    assert isinstance(blob_store_from_url(f"file://{tmp_path / 'b'}"), LocalBlobStore)
    assert isinstance(blob_store_from_url("memory://x"), FsspecBlobStore)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set"):
        blob_store_from_url("s3://bucket/prefix")  # the settings come from the environment by default
    with pytest.raises(ValueError, match="write s3://bucket/prefix"):
        blob_store_from_url("s3a://bucket/prefix")


def test_new_part_path_is_fresh_and_under_the_shard():
    desc = BatchDescription(1700000000000, 1700000001000)
    paths = {new_part_path("orders_0", desc) for _ in range(100)}
    assert len(paths) == 100
    for p in paths:
        assert re.fullmatch(r"orders_0/1700000000000-1700000001000/[0-9a-f]{32}\.parquet", p)
    with pytest.raises(Exception, match="shard id"):
        new_part_path("../x", desc)


def _age(store, path: str, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(store.url(path), (t, t))


def test_gc_deletes_old_unreferenced_parts_only(conn, tmp_path):
    store = LocalBlobStore(tmp_path / "blobs")
    register_shard(conn, "s")
    register_shard(conn, "s_2")
    desc = BatchDescription(0, 10)
    kept, old_orphan, young_orphan = (new_part_path("s", desc) for _ in range(3))
    other_shard = new_part_path("s_2", desc)  # not under s/: never looked at when collecting s
    for p in (kept, old_orphan, young_orphan, other_shard):
        store.put_bytes(p, b"x" * 100)
    store.put_bytes("s/0-10/.tmp-crashed", b"y" * 7)  # a write that died half way
    compare_and_append(conn, [Append("s", desc, (Part(kept, 1, 100),))])
    for p in (kept, old_orphan, other_shard, "s/0-10/.tmp-crashed"):
        _age(store, p, 3600)
    report = collect_garbage(conn, store, "s", grace_seconds=600)
    assert (report.scanned, report.referenced, report.kept_young, report.deleted, report.deleted_bytes) == \
        (4, 1, 1, 2, 107)
    assert store.exists(kept) and store.exists(young_orphan) and store.exists(other_shard)
    assert not store.exists(old_orphan) and not store.exists("s/0-10/.tmp-crashed")
    # later, the young orphan ages out too; a referenced part never goes, however old
    report = collect_garbage(conn, store, "s", grace_seconds=600, now=time.time() + 7200)
    assert (report.deleted, report.referenced) == (1, 1)
    assert [b.path for b in store.list("s")] == [kept]


@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_gc_under_a_source_prefix_keeps_every_shards_parts(conn, kind, request):
    """The cycle writes the parts of all a source's shards under the source's folder."""
    if kind == "s3":
        s3 = request.getfixturevalue("s3")
        store = blob_store_from_url(s3.url(f"gc-{uuid.uuid4().hex}"), s3.settings())
    else:
        store = FsspecBlobStore(f"memory://reclock-{uuid.uuid4().hex}")
    register_shard(conn, "orders_data")
    register_shard(conn, "orders_errors")
    desc = BatchDescription(0, 10)
    data, errors, orphan = (f"orders/0-10/{uuid.uuid4().hex}/slice-0000/_output={i}/part-0.parquet" for i in range(3))
    folder_part = "orders/0-10/dir.parquet"  # a part written as a folder: its files count as referenced
    for p in (data, errors, orphan, f"{folder_part}/part-0.parquet", "orders_x/0-10/y.parquet"):
        store.put_bytes(p, b"z" * 10)
    compare_and_append(conn, [Append("orders_data", desc, (Part(data, 1, 10), Part(folder_part, 1, 10))),
                              Append("orders_errors", desc, (Part(errors, 1, 10),))])
    report = collect_garbage(conn, store, "orders/", grace_seconds=60, now=time.time() + 3600)
    assert (report.scanned, report.referenced, report.deleted) == (4, 3, 1)
    assert not store.exists(orphan) and store.exists("orders_x/0-10/y.parquet")
    assert all(store.exists(p) for p in (data, errors, f"{folder_part}/part-0.parquet"))
    with pytest.raises(ValueError):
        collect_garbage(conn, store, "../", grace_seconds=60)


def test_a_leased_folder_is_kept_however_old_until_its_lease_goes_stale(conn, tmp_path):
    """A long write leases its folder: GC keeps its parts past the grace period while the lease is renewed,
    and once the writer died (the lease not renewed for a grace period) they go like any garbage."""
    from reclock.persist.gc import lease_write, release_write
    from reclock.persist.remap_store import register_source

    store = LocalBlobStore(tmp_path / "blobs")
    register_source(conn, "orders")
    running, finished = "orders/0-10/aaa", "orders/0-10/bbb"
    for folder in (running, finished):
        store.put_bytes(f"{folder}/slice-0000/part-0.parquet", b"x" * 10)
        _age(store, f"{folder}/slice-0000/part-0.parquet", 7200)
        lease_write(conn, "orders", folder)
    release_write(conn, finished)
    report = collect_garbage(conn, store, "orders", grace_seconds=600)
    assert (report.kept_leased, report.deleted) == (1, 1)
    assert store.exists(f"{running}/slice-0000/part-0.parquet")
    # the writer died: two hours later its lease is stale, the parts go and so does the lease
    report = collect_garbage(conn, store, "orders", grace_seconds=600, now=time.time() + 7200)
    assert (report.kept_leased, report.deleted) == (0, 1)
    assert conn.execute("SELECT count(*) FROM reclock.write_leases").fetchone() == (0,)


def test_two_writes_taking_one_folder_hold_it_by_leases_of_their_own(conn, tmp_path):
    """Two writes that take the slice an earlier write left (a try a fault left running and its retry) each
    lease its folder by a key of its own: the first to release (its append failed, or it appended) leaves
    the other's lease, and GC keeps the files until that one is released too, then takes them."""
    from reclock.persist.gc import lease_key, lease_write, release_write
    from reclock.persist.remap_store import register_source

    store = LocalBlobStore(tmp_path / "blobs")
    register_source(conn, "orders")
    slice_files = "orders/0-10/earlier/slice-0000"
    store.put_bytes(f"{slice_files}/part-0.parquet", b"x" * 10)
    _age(store, f"{slice_files}/part-0.parquet", 7200)
    zombie, retry = "orders/0-10/zombie", "orders/0-10/retry"
    for holder in (zombie, retry):
        lease_write(conn, "orders", slice_files, holder=holder)
    assert lease_key(slice_files, zombie) != lease_key(slice_files, retry) != slice_files
    release_write(conn, lease_key(slice_files, zombie))
    report = collect_garbage(conn, store, "orders", grace_seconds=0)
    assert (report.kept_leased, report.deleted) == (1, 0) and store.exists(f"{slice_files}/part-0.parquet")
    release_write(conn, lease_key(slice_files, retry))
    report = collect_garbage(conn, store, "orders", grace_seconds=0)
    assert (report.kept_leased, report.deleted) == (0, 1)
    with pytest.raises(ValueError):  # a holder's key is never a blob path
        store.put_bytes(lease_key(slice_files, retry), b"")


def test_claim_gc_lets_one_caller_through_per_interval(conn):
    from reclock.persist.gc import claim_gc
    from reclock.persist.remap_store import register_source

    register_source(conn, "orders")
    assert claim_gc(conn, "orders", 300) and not claim_gc(conn, "orders", 300)
    assert claim_gc(conn, "orders", 0)
