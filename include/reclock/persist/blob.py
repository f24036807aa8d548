"""The blob store: where immutable Parquet parts live. A local folder by default; any ``fsspec`` URL
(``s3://bucket/prefix``, ``memory://``, ``file://``) by configuration. ``s3://`` URLs and their settings are
``reclock.persist.objectstore``'s business (Spark writes them as ``s3a://``).

Paths are relative to the store's root and '/'-separated (``<shard>/<lower>-<upper>/<uuid>.parquet``);
absolute paths, ``..`` and empty segments are refused, so nothing outside the root is ever touched.
Parts are immutable: written once under a fresh path, never rewritten, deleted only by GC.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

import pyarrow as pa

from reclock.batch import BatchDescription
from reclock.persist import objectstore
from reclock.persist.objectstore import S3Settings


@dataclass(frozen=True)
class BlobInfo:
    path: str  # relative to the store's root, '/'-separated
    size: int
    mtime: float  # seconds since the epoch


def _check_rel(path: str) -> str:
    if (not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "://" in path
            or any(p in ("..", ".", "") for p in path.split("/"))):
        raise ValueError(f"blob path {path!r} must be relative, '/'-separated, without '..' or empty parts")
    return path


def native_file(path: str | os.PathLike) -> BinaryIO:
    """The local file at ``path``, opened for reading as an Arrow native file (``pyarrow.OSFile``: ``read``,
    ``seek``, ``tell``, ``close``; :class:`FileNotFoundError` when it is not there).

    Not a Python file object: pyarrow reads one of those from its own threads through the interpreter,
    and a thread that drops the last reference to it after the read has returned may do so while the
    process exits. It then needs the interpreter that is being torn down, and the process aborts
    (``terminate called without an active exception``, exit -6) after its work was done; about half of
    the short scripts that read a part so crash (apache/arrow#34314, #39862). A native file needs no
    interpreter: its reads also run without the GIL."""
    return pa.OSFile(os.fspath(path), "r")


@runtime_checkable
class BlobStore(Protocol):
    """Where parts live. Every ``path`` is relative to the store's root."""

    def url(self, path: str) -> str:
        """A URL (or absolute local path) Spark and pyarrow can read and write."""

    def put_bytes(self, path: str, data: bytes) -> None:
        """Write the whole blob; a reader never sees part of it."""

    def get_bytes(self, path: str) -> bytes:
        """The whole blob; :class:`FileNotFoundError` when there is none at ``path``."""

    def open(self, path: str) -> BinaryIO:
        """Open the blob for reading (binary): a file object with ``read``, ``seek`` and ``close``. pyarrow
        reads it as given (:func:`native_file`)."""

    def exists(self, path: str) -> bool: ...

    def delete(self, path: str) -> None:
        """Delete the blob; deleting one that is not there is fine."""

    def list(self, prefix: str = "") -> list[BlobInfo]:
        """Every blob under the folder ``prefix`` (all of them for ``""``), sorted by path."""

    def rename(self, path: str, to: str) -> None:
        """Move the blob ``path`` to ``to`` (a rename on a local disk, a copy and a delete on an object
        store); ``to`` must not exist."""


class LocalBlobStore:
    """Parts under a local folder; writes are atomic (temp file + rename)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _p(self, path: str) -> Path:
        return self.root / _check_rel(path)

    def url(self, path: str) -> str:
        return str(self._p(path))

    def put_bytes(self, path: str, data: bytes) -> None:
        target = self._p(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)  # readers see the whole blob or none of it
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get_bytes(self, path: str) -> bytes:
        return self._p(path).read_bytes()

    def open(self, path: str) -> BinaryIO:
        return native_file(self._p(path))

    def exists(self, path: str) -> bool:
        return self._p(path).exists()

    def delete(self, path: str) -> None:
        self._p(path).unlink(missing_ok=True)

    def rename(self, path: str, to: str) -> None:
        target = self._p(to)
        if target.exists():
            raise FileExistsError(f"{target} exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self._p(path), target)

    def list(self, prefix: str = "") -> list[BlobInfo]:
        prefix = prefix.rstrip("/")
        base = self._p(prefix) if prefix else self.root
        if not base.exists():
            return []
        out = []
        for dirpath, _, files in os.walk(base):
            for name in files:
                full = Path(dirpath) / name
                st = full.stat()
                out.append(BlobInfo(full.relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return sorted(out, key=lambda b: b.path)


class FsspecBlobStore:
    """Parts under any fsspec URL; ``options`` are the filesystem's (for ``s3://``:
    :func:`~reclock.persist.objectstore.fsspec_options`, through ``s3fs``)."""

    def __init__(self, url: str, options: dict | None = None) -> None:
        import fsspec

        self.base = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.base, **(options or {}))
        self.protocol = self.base.split("://", 1)[0]
        if self.protocol == "s3":
            self.fs.retries = objectstore.S3FS_RETRIES  # s3fs's tries around botocore's (its default: 5)

    def __repr__(self) -> str:
        return f"FsspecBlobStore({self.base!r})"

    def _p(self, path: str) -> str:
        return posixpath.join(self.root, _check_rel(path))

    def url(self, path: str) -> str:
        return objectstore.spark_url(f"{self.base}/{_check_rel(path)}")

    def put_bytes(self, path: str, data: bytes) -> None:
        self.fs.pipe_file(self._p(path), data)

    def get_bytes(self, path: str) -> bytes:
        return self.fs.cat_file(self._p(path))

    def open(self, path: str) -> BinaryIO:
        if self.protocol == "file":
            return native_file(self._p(path))
        # an object store's file is a Python one (see native_file): Airflow's task processes, the ``reclock``
        # command and the Spark jobs end without tearing the interpreter down (``reclock.exiting.leave``), so
        # its reads cannot abort them
        return self.fs.open(self._p(path), "rb")

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._p(path))

    def delete(self, path: str) -> None:
        if self.fs.exists(self._p(path)):
            self.fs.rm_file(self._p(path))

    def rename(self, path: str, to: str) -> None:
        if self.fs.exists(self._p(to)):
            raise FileExistsError(f"{self.url(to)} exists")
        self.fs.copy(self._p(path), self._p(to))
        self.fs.rm_file(self._p(path))

    def list(self, prefix: str = "") -> list[BlobInfo]:
        prefix = prefix.rstrip("/")
        base = self._p(prefix) if prefix else self.root
        if not self.fs.exists(base):
            return []
        out = []
        for full, info in self.fs.find(base, detail=True).items():
            if full.endswith("/") or info.get("type") == "directory":
                continue  # an object store's folder marker (S3A leaves some): no blob
            mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
            if hasattr(mtime, "timestamp"):
                mtime = mtime.timestamp()
            rel = full[len(self.root):].lstrip("/") if full.startswith(self.root) else full
            out.append(BlobInfo(rel, int(info.get("size") or 0), float(mtime)))
        return sorted(out, key=lambda b: b.path)


def blob_store_from_url(url: str, s3: S3Settings | None = None) -> BlobStore:
    """``/a/path`` or ``file:///a/path`` -> LocalBlobStore; ``s3://bucket/prefix`` -> FsspecBlobStore on
    ``s3`` (default: :func:`~reclock.persist.objectstore.s3_settings_from_env`, which raises
    ``ConfigError`` naming what is missing); any other fsspec URL -> FsspecBlobStore."""
    if "://" not in url:
        return LocalBlobStore(url)
    if url.startswith("file://"):
        return LocalBlobStore(url[len("file://"):])
    if objectstore.is_s3(url):
        if url.startswith("s3a://"):
            raise ValueError(f"blob URL {url!r}: write s3://bucket/prefix (s3a:// is Spark's name for it)")
        bucket = url[len("s3://"):].split("/", 1)[0]
        if not bucket:
            raise ValueError(f"blob URL {url!r} names no bucket: write s3://bucket/prefix")
        return FsspecBlobStore(url, objectstore.fsspec_options(s3 or objectstore.s3_settings_from_env()))
    return FsspecBlobStore(url)


def new_part_path(shard: str, desc: BatchDescription) -> str:
    """A fresh, unique path for a part of ``shard`` written for ``desc``:
    ``<shard>/<lower>-<upper>/<uuid>.parquet``."""
    from reclock.persist.names import validate_shard_id

    validate_shard_id(shard)
    return f"{shard}/{desc.lower}-{desc.upper}/{uuid.uuid4().hex}.parquet"
