"""The S3 source's upstream client: list, describe and read the objects under an ``s3://bucket/prefix/``
(any S3 API: AWS, MinIO, moto) or a local folder, through one interface, and receive S3 event
notifications from an SQS queue.

::

    ObjectStore.list(start_after)     ListObjectsV2 (Prefix, StartAfter), in key order  | a sorted walk
    ObjectStore.head(key)             HeadObject                                        | stat
    ObjectStore.read(obj, start, end) GetObject Range + If-Match (the ETag bound)       | open + identity check
    EventQueue.receive() / delete()   SQS ReceiveMessage / DeleteMessageBatch of S3 event notifications

An object is known by its key and its identity: the ETag (S3; quotes stripped) or, for a local file,
``<device>:<inode>``. Every read is pinned to the identity the source recorded: on S3 with ``If-Match``, so
an object overwritten since is never read as if it were the one bound (:class:`~reclock.errors.ObjectChanged`),
and one deleted is :class:`~reclock.errors.ObjectLost`. A local file may grow (appended to) under the same
identity; a file shorter than what was bound is changed.

Keys are compared as S3 orders them (UTF-8 bytes, which is Python's code point order); a local folder is
walked in that same order, skipping whole directories at or before ``start_after``, so a listing after a
key frontier costs what lies after it, not the folder's history.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol
from urllib.parse import unquote, unquote_plus, urlsplit

from reclock.errors import ConfigError, ObjectChanged, ObjectLost, S3Unavailable
from reclock.persist.objectstore import S3Settings

READ_CHUNK = 16 << 20
"""Bytes per ranged GET (and per local read): a reader holds at most about this much of an object."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object as upstream describes it: ``key`` (in the bucket; for a folder, the path under it with
    ``/``), ``size`` in bytes, ``etag`` its identity, ``modified_ms`` its last modification (ms since the
    epoch), ``version`` its version id on a versioned bucket (else None)."""

    key: str
    size: int
    etag: str
    modified_ms: int
    version: str | None = None


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or ending with "/" unless the user gave a key prefix on purpose

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


@dataclass(frozen=True)
class FolderLocation:
    root: Path

    def url(self, key: str = "") -> str:
        return (self.root / key).as_uri() if key else self.root.as_uri()


def parse_location(url: str) -> S3Location | FolderLocation:
    """``s3://bucket/prefix/`` (or ``s3a://``), else a local folder: ``file:///path`` or an absolute path."""
    if url.startswith(("s3://", "s3a://")):
        u = urlsplit(url)
        if not u.netloc:
            raise ConfigError(f"S3 url {url!r} names no bucket (s3://bucket/prefix/)")
        return S3Location(u.netloc, u.path.lstrip("/"))
    if url.startswith("file://"):
        path = Path(unquote(urlsplit(url).path))
    else:
        path = Path(url)
    if not path.is_absolute():
        raise ConfigError(f"folder {url!r} must be an absolute path (or file:///path, or s3://bucket/prefix/)")
    return FolderLocation(path)


class ObjectStore(Protocol):
    """What the S3 source needs of where its objects live."""

    source: str

    def url(self, key: str) -> str: ...

    def list(self, start_after: str | None = None) -> Iterator[ObjectInfo]: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def read(self, obj: ObjectInfo, start: int, end: int, chunk: int = READ_CHUNK) -> Iterator[bytes]: ...

    def check(self) -> None: ...


def open_store(source: str, url: str, settings: S3Settings | None) -> ObjectStore:
    """The store at ``url``: an :class:`S3Objects` (``settings`` required) or a :class:`FolderObjects`."""
    loc = parse_location(url)
    if isinstance(loc, S3Location):
        if settings is None:
            raise ConfigError(f"source {source}: {url} is on S3 and needs S3 settings (its `connection:`)")
        return S3Objects(source, loc, settings)
    return FolderObjects(source, loc)


def _client_error(e) -> tuple[str, int]:
    err = getattr(e, "response", {}) or {}
    return (str(err.get("Error", {}).get("Code", "")),
            int(err.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0))


DENIED = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId",
          "UnrecognizedClientException", "ExpiredToken", "InvalidToken", "403")


def boto_client(service: str, settings: S3Settings, pool: int = 16):
    """A boto3 client of ``service`` (``s3``, ``sqs``) on ``settings``'s endpoint and keys (standard
    retries; path-style addressing when the settings say so; TLS verified against the settings' CA bundle when
    they name one)."""
    import boto3
    from botocore.config import Config

    cfg = Config(region_name=settings.region, retries={"max_attempts": 5, "mode": "standard"},
                 connect_timeout=5, read_timeout=60, max_pool_connections=pool,
                 s3={"addressing_style": "path" if settings.path_style else "auto"})
    return boto3.session.Session().client(service, endpoint_url=settings.endpoint_url,
                                          aws_access_key_id=settings.access_key,
                                          aws_secret_access_key=settings.secret_key, config=cfg,
                                          verify=settings.ca_bundle or None)


@dataclass
class S3Objects:
    """The objects under ``s3://bucket/prefix`` on an S3 API."""

    source: str
    location: S3Location
    settings: S3Settings = field(repr=False)
    _client: object | None = field(default=None, init=False, repr=False)

    @property
    def client(self):
        if self._client is None:
            self._client = boto_client("s3", self.settings)
        return self._client

    def url(self, key: str) -> str:
        return self.location.url(key)

    def _unavailable(self, e, what: str) -> Exception:
        code, status = _client_error(e)
        where = f"source {self.source}: {what} s3://{self.location.bucket}/{self.location.prefix}"
        if code == "NoSuchBucket":
            return S3Unavailable(f"{where}: bucket {self.location.bucket!r} does not exist at "
                                 f"{self.settings.endpoint_url or 'AWS'} (create it, or fix the source's `url:`)")
        if code in DENIED or status == 403:
            return S3Unavailable(f"{where}: the credentials were refused ({code or status}: "
                                 f"{getattr(e, 'response', {}).get('Error', {}).get('Message', e)}); check the keys of "
                                 "the source's `connection:` and that they may list and read the bucket")
        return S3Unavailable(f"{where}: {e}")

    def check(self) -> None:
        """Raise :class:`S3Unavailable` unless the bucket exists and the keys may list it."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.list_objects_v2(Bucket=self.location.bucket, Prefix=self.location.prefix, MaxKeys=1)
        except ClientError as e:
            raise self._unavailable(e, "listing") from None
        except BotoCoreError as e:
            raise S3Unavailable(f"source {self.source}: S3 endpoint {self.settings.endpoint_url or 'AWS'} does not "
                                f"answer: {e}") from None

    def list(self, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every object under the prefix with a key after ``start_after``, in key order (ListObjectsV2
        pages of 1000). A key that is a folder marker (ends with ``/``) is not an object of the source."""
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs = {"Bucket": self.location.bucket, "Prefix": self.location.prefix}
        if start_after and start_after > self.location.prefix:
            kwargs["StartAfter"] = start_after
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(**kwargs):
                for o in page.get("Contents", ()):
                    if o["Key"].endswith("/"):
                        continue
                    yield ObjectInfo(o["Key"], int(o["Size"]), o["ETag"].strip('"'),
                                     int(o["LastModified"].timestamp() * 1000))
        except ClientError as e:
            raise self._unavailable(e, "listing") from None
        except BotoCoreError as e:
            raise S3Unavailable(f"source {self.source}: listing {self.url(self.location.prefix)} failed: {e}") from None

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import ClientError

        try:
            r = self.client.head_object(Bucket=self.location.bucket, Key=key)
        except ClientError as e:
            code, status = _client_error(e)
            if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._unavailable(e, f"describing {key!r} in") from None
        return ObjectInfo(key, int(r["ContentLength"]), r["ETag"].strip('"'), int(r["LastModified"].timestamp() * 1000),
                          r.get("VersionId"))

    def read(self, obj: ObjectInfo, start: int, end: int, chunk: int = READ_CHUNK) -> Iterator[bytes]:
        """Bytes ``[start, end)`` of ``obj``, in ranged GETs of at most ``chunk`` bytes, each pinned to the
        recorded ETag (``If-Match``; and ``VersionId`` when recorded). A consumer may stop early."""
        from botocore.exceptions import ClientError

        at = start
        while at < end:
            upto = min(end, at + chunk)
            kwargs = {"Bucket": self.location.bucket, "Key": obj.key, "Range": f"bytes={at}-{upto - 1}",
                      "IfMatch": f'"{obj.etag}"'}
            if obj.version:
                kwargs["VersionId"] = obj.version
            try:
                body = self.client.get_object(**kwargs)["Body"]
                data = body.read()
            except ClientError as e:
                raise self._read_error(e, obj, start, end) from None
            if len(data) != upto - at:
                raise ObjectChanged(self.source, self.url(obj.key), f"at least {end} bytes (ETag {obj.etag})",
                                    f"{at + len(data)} bytes long", "its bytes cannot be read as they were bound")
            yield data
            at = upto

    def _read_error(self, e, obj: ObjectInfo, start: int, end: int) -> Exception:
        code, status = _client_error(e)
        url = self.url(obj.key)
        if status == 404 or code in ("NoSuchKey", "NoSuchVersion"):
            return ObjectLost(self.source, url, start, end)
        if status == 412 or code == "PreconditionFailed":
            now = self.head(obj.key)
            found = "gone" if now is None else f"ETag {now.etag}, {now.size} bytes"
            if now is None:
                return ObjectLost(self.source, url, start, end)
            return ObjectChanged(self.source, url, f"ETag {obj.etag}, {obj.size} bytes", found,
                                 "the version that was bound is no longer there to read (see docs/s3.md, "
                                 "'Overwritten objects')")
        if status == 416 or code == "InvalidRange":
            return ObjectChanged(self.source, url, f"at least {end} bytes (ETag {obj.etag})", "shorter",
                                 "its bytes cannot be read as they were bound")
        return self._unavailable(e, f"reading {obj.key!r} from")


def _s3_sort_key(name: str, is_dir: bool) -> str:
    return name + "/" if is_dir else name


@dataclass
class FolderObjects:
    """The files under a local folder (recursively), as objects: key = the path under the folder with
    ``/``; identity ``<device>:<inode>``; hidden files (a name starting with ``.`` or ``_``, like Spark's
    file sources skip) are not objects."""

    source: str
    location: FolderLocation

    def url(self, key: str) -> str:
        return self.location.url(key)

    def check(self) -> None:
        if not self.location.root.is_dir():
            raise S3Unavailable(f"source {self.source}: folder {self.location.root} does not exist (create it, or fix "
                                "the source's `url:`)")

    @staticmethod
    def _info(key: str, st: os.stat_result) -> ObjectInfo:
        return ObjectInfo(key, st.st_size, f"{st.st_dev:x}:{st.st_ino:x}", st.st_mtime_ns // 1_000_000)

    def list(self, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every file after ``start_after``, in key order; a directory all of whose keys come at or before
        ``start_after`` is not entered."""
        self.check()
        yield from self._walk(self.location.root, "", start_after or "")

    def _walk(self, folder: Path, base: str, after: str) -> Iterator[ObjectInfo]:
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return  # removed while walking: its files are not listed (a bound one is then ObjectLost)
        named = []
        for e in entries:
            if e.name.startswith((".", "_")):
                continue
            try:
                is_dir = e.is_dir(follow_symlinks=True)
            except OSError:
                continue
            named.append((_s3_sort_key(base + e.name, is_dir), e, is_dir))
        for key, e, is_dir in sorted(named, key=lambda t: t[0]):
            if is_dir:
                if key <= after and not after.startswith(key):
                    continue  # every key below it is at or before `after`
                yield from self._walk(Path(e.path), key, after)
            elif key > after:
                try:
                    st = e.stat(follow_symlinks=True)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield self._info(key, st)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            st = os.stat(self.location.root / key)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return self._info(key, st)

    def read(self, obj: ObjectInfo, start: int, end: int, chunk: int = READ_CHUNK) -> Iterator[bytes]:
        url = self.url(obj.key)
        try:
            f = open(self.location.root / obj.key, "rb")
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectLost(self.source, url, start, end) from None
        with f:
            now = self._info(obj.key, os.fstat(f.fileno()))
            if now.etag != obj.etag:
                raise ObjectChanged(self.source, url, f"file {obj.etag}", f"file {now.etag} (replaced)",
                                    "the file that was bound is no longer there to read (see docs/s3.md, "
                                    "'Overwritten objects')")
            if now.size < end:
                raise ObjectChanged(self.source, url, f"at least {end} bytes", f"{now.size} bytes (truncated)",
                                    "its bytes cannot be read as they were bound")
            f.seek(start)
            at = start
            while at < end:
                data = f.read(min(chunk, end - at))
                if not data:
                    raise ObjectChanged(self.source, url, f"at least {end} bytes", f"{at} bytes (truncated)",
                                        "its bytes cannot be read as they were bound")
                yield data
                at += len(data)


# -- S3 event notifications through SQS ----------------------------------------------------------------


@dataclass(frozen=True)
class ObjectEvent:
    """One S3 event notification: ``created`` (``ObjectCreated:*``) or not (``ObjectRemoved:*``)."""

    bucket: str
    key: str
    created: bool
    size: int
    etag: str
    version: str | None
    sequencer: str | None
    name: str  # the event name, e.g. ObjectCreated:Put


@dataclass(frozen=True)
class QueueMessage:
    receipt: str
    events: tuple[ObjectEvent, ...]
    message_id: str = ""  # SQS's id of the message: the same each time it is delivered (its receipt is not)


def parse_events(body: str) -> tuple[ObjectEvent, ...]:
    """The S3 events in one SQS message body: S3's own notification (``Records``), the same wrapped by SNS
    (``Type: Notification``, ``Message``), or S3's test event (no events). Anything else is a ``ValueError``:
    a message the source does not understand is not taken for "no objects"."""
    doc = json.loads(body)
    if isinstance(doc, dict) and doc.get("Type") == "Notification" and "Message" in doc:
        doc = json.loads(doc["Message"])
    if isinstance(doc, dict) and doc.get("Event") == "s3:TestEvent":
        return ()
    if not isinstance(doc, dict) or not isinstance(doc.get("Records"), list):
        raise ValueError(f"not an S3 event notification: {body[:200]!r}")
    out = []
    for r in doc["Records"]:
        name = str(r.get("eventName", ""))
        s3 = r.get("s3") or {}
        obj = s3.get("object") or {}
        if not name.startswith(("ObjectCreated:", "ObjectRemoved:")):
            continue  # restore, tagging, ACL, replication events do not change an object's bytes
        out.append(ObjectEvent(bucket=s3.get("bucket", {}).get("name", ""), key=unquote_plus(obj.get("key", "")),
                               created=name.startswith("ObjectCreated:"), size=int(obj.get("size", 0) or 0),
                               etag=str(obj.get("eTag", "") or "").strip('"'), version=obj.get("versionId"),
                               sequencer=obj.get("sequencer"), name=name))
    return tuple(out)


VISIBILITY_S = 30
"""How long a received message stays hidden from other receivers: longer than a discovery takes from receiving
to deleting (a cycle that died in between leaves its messages to the next one after this long)."""

RECEIVE_S = VISIBILITY_S / 3
"""How long a discovery goes on receiving before it records what it has and deletes it: well within
:data:`VISIBILITY_S`, so the messages are deleted while still hidden. A discovery that received until the
queue was empty never ended while objects arrived faster than it received them (a slow endpoint, a busy
bucket): once its first messages were visible again it received them again, named no new object and went on
(issue 37's stalled ``evn``); the rest of the queue is the next cycle's."""


@dataclass
class EventQueue:
    """The SQS queue S3 sends a bucket's event notifications to (``queue_url``: its URL, or its name on the
    settings' endpoint and region)."""

    source: str
    queue_url: str
    settings: S3Settings = field(repr=False)
    _client: object | None = field(default=None, init=False, repr=False)

    @property
    def client(self):
        if self._client is None:
            self._client = boto_client("sqs", self.settings)
            if not self.queue_url.startswith(("https://", "http://")):  # a queue's name: its URL on the endpoint
                from botocore.exceptions import ClientError

                try:
                    self.queue_url = self._client.get_queue_url(QueueName=self.queue_url)["QueueUrl"]
                except ClientError as e:
                    raise self._unavailable(e) from None
        return self._client

    def _unavailable(self, e) -> Exception:
        code, status = _client_error(e)
        if code in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"):
            return S3Unavailable(f"source {self.source}: SQS queue {self.queue_url} does not exist (create it and "
                                 "point the bucket's event notifications at it; see docs/s3.md)")
        if code in DENIED or status == 403:
            return S3Unavailable(f"source {self.source}: SQS queue {self.queue_url}: the credentials were refused "
                                 f"({code or status})")
        return S3Unavailable(f"source {self.source}: SQS queue {self.queue_url}: {e}")

    def receive(self, max_messages: int = 10, wait_s: int = 0, visibility_s: int = VISIBILITY_S) -> list[QueueMessage]:
        """Up to ``max_messages`` (at most 10, SQS's limit) messages, hidden from other receivers for
        ``visibility_s``; ``wait_s`` > 0 long-polls. A body that is not an S3 event is a ``ValueError``."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            r = self.client.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=min(10, max_messages),
                                            WaitTimeSeconds=wait_s, VisibilityTimeout=visibility_s)
        except ClientError as e:
            raise self._unavailable(e) from None
        except BotoCoreError as e:
            raise S3Unavailable(f"source {self.source}: SQS queue {self.queue_url}: {e}") from None
        out = []
        for m in r.get("Messages", ()):
            try:
                events = parse_events(m["Body"])
            except ValueError as e:
                raise ValueError(f"source {self.source}: SQS queue {self.queue_url}: {e}") from None
            out.append(QueueMessage(m["ReceiptHandle"], events, m.get("MessageId", "")))
        return out

    def delete(self, receipts: list[str]) -> None:
        """Delete received messages (in batches of 10); a receipt SQS refuses is an error."""
        from botocore.exceptions import ClientError

        for i in range(0, len(receipts), 10):
            batch = [{"Id": str(k), "ReceiptHandle": h} for k, h in enumerate(receipts[i:i + 10])]
            try:
                r = self.client.delete_message_batch(QueueUrl=self.queue_url, Entries=batch)
            except ClientError as e:
                raise self._unavailable(e) from None
            if r.get("Failed"):
                raise S3Unavailable(f"source {self.source}: SQS queue {self.queue_url}: deleting messages failed: "
                                    f"{r['Failed'][:3]}")

    def retention_s(self) -> int:
        """How long the queue keeps a message (``MessageRetentionPeriod``): the horizon within which a
        message can be delivered again."""
        from botocore.exceptions import ClientError

        try:
            attrs = self.client.get_queue_attributes(QueueUrl=self.queue_url,
                                                     AttributeNames=["MessageRetentionPeriod"])["Attributes"]
        except ClientError as e:
            raise self._unavailable(e) from None
        return int(attrs.get("MessageRetentionPeriod", 345600))

    def depth(self) -> int:
        """Messages waiting (visible and in flight): what a notification-driven source still has to see."""
        from botocore.exceptions import ClientError

        try:
            attrs = self.client.get_queue_attributes(
                QueueUrl=self.queue_url,
                AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        except ClientError as e:
            raise self._unavailable(e) from None
        return int(attrs.get("ApproximateNumberOfMessages", 0)) + int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0))
