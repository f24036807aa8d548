"""A local S3 API endpoint for tests and benchmarks: moto's server (``moto_server``, the ``moto[server]``
package) on a free 127.0.0.1 port with one bucket, its objects in memory, gone when it stops.

It is a real HTTP endpoint: Spark's S3A and Python's s3fs and boto3 reach it exactly as they reach S3 or
MinIO (path-style addressing). One server serves every AWS API moto has on its port: S3, and SQS for the
S3 source's event notifications (:meth:`LocalS3.queue`, :meth:`LocalS3.notify`: moto delivers a bucket's
``ObjectCreated`` / ``ObjectRemoved`` events to the queue as S3 does). By default it checks no keys;
``auth=True`` makes it check them as AWS does (IAM: a user whose keys :meth:`LocalS3.settings` returns,
and any other keys refused), for the tests of wrong credentials.
With ``tls``, moto serves HTTPS itself (``--ssl-cert``/``--ssl-key``) with a certificate of the stack's CA
(``reclock.dev.tls``), and the settings name that CA as the bundle clients trust.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from reclock.dev import procs
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, StackState
from reclock.dev.tls import LocalCA
from reclock.errors import StackError
from reclock.persist.objectstore import S3Settings


@dataclass
class LocalS3(LocalServer):
    """``moto_server -H 127.0.0.1 -p PORT`` under ``state``'s ``s3`` folder, with the bucket ``bucket``."""

    state: StackState
    bucket: str = "reclock"
    tls: bool = False
    name: str = "s3"  # the state's folder and port name (a second server beside the first: another name)
    auth: bool = False
    _keys: tuple[str, str] | None = field(default=None, repr=False)

    process: ClassVar[str] = "moto"

    @property
    def endpoint_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{LOOPBACK}:{self.port}"

    def settings(self) -> S3Settings:
        """Settings for this endpoint: keys generated once per state folder (moto accepts any), or with
        ``auth`` the keys of the IAM user :meth:`start` created."""
        if self.auth:
            if self._keys is None:
                raise StackError("the S3 server with auth has no user yet: start it first")
            return S3Settings(self.endpoint_url, "us-east-1", *self._keys, path_style=True, ca_bundle=self._ca_bundle)
        return S3Settings(self.endpoint_url, "us-east-1", "reclock-" + self.state.secret("s3_access_key", 6),
                          self.state.secret("s3_secret_key"), path_style=True, ca_bundle=self._ca_bundle)

    @property
    def _ca_bundle(self) -> str | None:
        return str(LocalCA(self.state).cert) if self.tls else None

    def start(self, timeout: float = 60) -> float:
        t0 = time.monotonic()
        if not self.running():
            server = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
            if server is None:
                raise StackError("moto's server is not installed: pip install 'moto[server]' (the test extra)")
            tls: list[str] = []
            if self.tls:
                issued = LocalCA(self.state).issue(f"{self.name}-server", "s3")
                tls = ["--ssl-cert", str(issued.cert), "--ssl-key", str(issued.key)]
            env = None
            if self.auth:  # three requests without keys (the IAM user below), then every request is checked
                env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
            procs.spawn("moto", [server, "-H", LOOPBACK, "-p", str(self.port), *tls], log=self.log,
                        pidfile=self.pidfile, cwd=self.home, env=env)
        try:
            procs.wait_until("moto S3 server", lambda: procs.port_open(self.port), timeout, log=self.log,
                             alive=self.running)
            if self.auth and self._keys is None:
                self._create_user()
            self._ensure_bucket()
        except BaseException:
            self.stop()  # a server that cannot serve its bucket is no use, and nobody else would stop it
            raise
        return time.monotonic() - t0

    def _create_user(self) -> None:
        """An IAM user allowed everything, and its keys (the three requests moto takes without keys)."""
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint_url, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup", verify=self._ca_bundle)
        iam.create_user(UserName="reclock")
        iam.put_user_policy(UserName="reclock", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="reclock")["AccessKey"]
        self._keys = (key["AccessKeyId"], key["SecretAccessKey"])

    def client(self, service: str = "s3"):
        """A boto3 client of ``service`` (``s3``, ``sqs``) on this endpoint."""
        from reclock.sources.s3.client import boto_client

        return boto_client(service, self.settings())

    def _ensure_bucket(self) -> None:
        self.create_bucket(self.bucket)

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` if it does not exist; its ``s3://`` URL."""
        s3 = self.client()
        if name not in {b["Name"] for b in s3.list_buckets().get("Buckets", ())}:
            s3.create_bucket(Bucket=name)
        return f"s3://{name}/"

    def queue(self, name: str) -> tuple[str, str]:
        """Create SQS queue ``name`` (if it does not exist): its URL and ARN."""
        sqs = self.client("sqs")
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return url, arn

    def notify(self, bucket: str, prefix: str, queue_arn: str) -> None:
        """Send the ``ObjectCreated`` and ``ObjectRemoved`` events of keys under ``prefix`` in ``bucket`` to the
        queue ``queue_arn`` (S3's bucket notification configuration; replaces any before)."""
        self.client().put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={
            "QueueConfigurations": [{"QueueArn": queue_arn, "Events": ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
                                     "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}}}]})

    def url(self, prefix: str = "") -> str:
        """The blob store URL ``s3://<bucket>/<prefix>``."""
        return f"s3://{self.bucket}/{prefix}".rstrip("/")

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=10)
