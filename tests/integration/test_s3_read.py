"""The S3 source's Spark read (``reclock.sources.s3.read``) against moto's S3 and a local folder: the bound
byte ranges of each object, split over tasks, land exactly once with their binding's ts; problems become
error rows; a gone or changed object fails the job naming it."""

from __future__ import annotations

import gzip
import uuid

import pyarrow.parquet as pq
import pytest

from reclock.errors import ObjectChanged, ObjectLost
from reclock.part_layout import REJECTED_COLUMN
from reclock.sources.s3.client import open_store
from reclock.sources.s3.discovery import Known, OnOverwrite, State
from reclock.sources.s3.log import BoundRange
from reclock.sources.s3.read import ReaderConf, units_for, write_slice
from reclock.sources.s3.spec import S3Spec
from reclock.specs import FormatSpec, SourceSpec

SPEC = SourceSpec(name="ev", upstream=S3Spec(url="s3://unused/ev/"), format=FormatSpec("json", schema="n BIGINT, s STRING"))


def lines(n: int, base: int = 0) -> bytes:
    return b"".join(b'{"n": %d, "s": "v%d"}\n' % (base + i, base + i) for i in range(n))


def known(store, i: int, key: str, state=State.SEALED) -> Known:
    o = store.head(key)
    return Known(i, key, o.etag, o.size, o.modified_ms, 0, state, o.size)


def read_back(path) -> list[dict]:
    t = pq.read_table(str(path))
    return sorted(t.to_pylist(), key=lambda r: (r["ts"], r["_offset"] if "_offset" in r else 0, r.get("n") or 0))


@pytest.fixture
def bucket(s3):
    name = f"r{uuid.uuid4().hex[:10]}"
    s3.create_bucket(name)
    return name


def test_ranges_of_objects_split_over_tasks_land_once_with_their_ts(spark, s3, bucket, tmp_path):
    c = s3.client()
    body = lines(3000)
    c.put_object(Bucket=bucket, Key="in/a b ü.json", Body=body)
    c.put_object(Bucket=bucket, Key="in/z.json.gz", Body=gzip.compress(lines(50, 10_000)))
    c.put_object(Bucket=bucket, Key="in/empty.json", Body=b"")
    conf = ReaderConf("ev", f"s3://{bucket}/in/", s3.settings(), "json")
    store = open_store("ev", conf.url, conf.settings)
    rows = {1: known(store, 1, "in/a b ü.json"), 2: known(store, 2, "in/z.json.gz"), 3: known(store, 3, "in/empty.json")}
    cut = body.index(b"\n", 40_000) + 1  # a binding boundary at a line end
    bound = [BoundRange(1, 0, cut, 100), BoundRange(1, cut, len(body), 200, True),
             BoundRange(2, 0, rows[2].size, 200, True), BoundRange(3, 0, 0, 200, True)]
    units = units_for(bound, rows, conf, split_bytes=7_777)
    assert len(units) > 10 and all(u.key != "in/empty.json" for u in units)
    w = write_slice(spark, SPEC, conf, units, ("key", "offset"), str(tmp_path / "out"))
    got = read_back(tmp_path / "out")
    assert w.records_read == 3050 and w.rows == {0: 3050, 1: 0}
    assert [r["n"] for r in got if r["_key"] == "in/a b ü.json"] == list(range(3000))
    offsets = [0] + [i + 1 for i, ch in enumerate(body) if ch == 0x0A][:-1]
    assert [r["_offset"] for r in got if r["_key"] == "in/a b ü.json"] == offsets
    assert {r["ts"] for r in got if r["_key"] == "in/a b ü.json" and r["_offset"] < cut} == {100}
    assert {r["ts"] for r in got if r["_key"] == "in/a b ü.json" and r["_offset"] >= cut} == {200}
    assert sorted(r["n"] for r in got if r["_key"] == "in/z.json.gz") == list(range(10_000, 10_050))
    assert all(r[REJECTED_COLUMN] is None for r in got)


def test_problems_are_error_rows_and_gone_objects_fail_naming_them(spark, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "bad.json").write_bytes(b'{"n": 1}\nnot json\n{"n": 3}\n')
    (src / "cut.json.gz").write_bytes(gzip.compress(lines(100))[:-30])
    conf = ReaderConf("ev", str(src), None, "json", on_overwrite=OnOverwrite.COLLECT)
    store = open_store("ev", conf.url, None)
    rows = {1: known(store, 1, "bad.json"), 2: known(store, 2, "cut.json.gz")}
    rows[3] = Known(3, "bad.json", "newetag", 5, 0, 0, State.OVERWRITE, 0, previous_etag=rows[1].etag)
    bound = [BoundRange(1, 0, rows[1].size, 7, True), BoundRange(2, 0, rows[2].size, 7, True),
             BoundRange(3, 0, 0, 7, True)]
    w = write_slice(spark, SPEC, conf, units_for(bound, rows, conf), ("key",), str(tmp_path / "out"))
    got = read_back(tmp_path / "out")
    errors = [r for r in got if r[REJECTED_COLUMN] is not None]
    good = [r for r in got if r[REJECTED_COLUMN] is None]
    assert w.records_read == len(got) and w.rows[1] == len(errors)
    reasons = sorted(e[REJECTED_COLUMN] for e in errors)
    assert len(errors) == 3, reasons
    assert any("does not parse as JSON" in r for r in reasons)
    assert any("cut.json.gz" in r and "ends early" in r for r in reasons)
    assert any("was overwritten after it was ingested" in r for r in reasons)
    assert [r["n"] for r in good if r["_key"] == "bad.json"] == [1, 3]
    assert 90 < len([r for r in good if r["_key"] == "cut.json.gz"]) < 100

    (src / "bad.json").unlink()
    with pytest.raises(ObjectLost, match="bad.json: bytes"):
        write_slice(spark, SPEC, conf, units_for(bound[:1], rows, conf), (), str(tmp_path / "out2"))
