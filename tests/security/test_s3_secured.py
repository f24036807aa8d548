"""S3 over TLS to the local endpoint (moto's server with a certificate of the test's CA): Python's clients
(s3fs for parts, pyarrow for the Iceberg export's files) trust the CA bundle of the settings and refuse the
endpoint without it; plain HTTP gets nothing. (Spark's S3A over TLS, with the CA in a JVM trust store, runs
in tests/stack/test_secured_stack.py.)"""

from __future__ import annotations

import dataclasses

import pytest
import s3fs

from reclock.persist.objectstore import fsspec_options, pyiceberg_options


def test_python_clients_trust_the_ca_bundle_and_nothing_else(secured):
    settings = secured.s3.settings()
    assert settings.endpoint_url.startswith("https://") and settings.ca_bundle
    fs = s3fs.S3FileSystem(**fsspec_options(settings))
    fs.pipe(f"{secured.s3.bucket}/tls-check", b"over TLS")
    assert fs.cat(f"{secured.s3.bucket}/tls-check") == b"over TLS"

    untrusting = s3fs.S3FileSystem(**fsspec_options(dataclasses.replace(settings, ca_bundle=None)))
    with pytest.raises(Exception, match="(?i)certificate verify failed|SSL"):
        untrusting.cat(f"{secured.s3.bucket}/tls-check")
    plain = dataclasses.replace(settings, endpoint_url=settings.endpoint_url.replace("https://", "http://"),
                                ca_bundle=None)
    with pytest.raises(Exception):
        s3fs.S3FileSystem(**{**fsspec_options(plain), "config_kwargs": {"retries": {"max_attempts": 1}}}).cat(
            f"{secured.s3.bucket}/tls-check")


def test_the_iceberg_file_io_trusts_the_ca_bundle(secured):
    from pyiceberg.io import load_file_io

    settings = secured.s3.settings()
    io = load_file_io(pyiceberg_options(settings), f"s3://{secured.s3.bucket}/iceberg")
    with io.new_output(f"s3://{secured.s3.bucket}/iceberg/x.bin").create(overwrite=True) as f:
        f.write(b"iceberg over TLS")
    assert io.new_input(f"s3://{secured.s3.bucket}/iceberg/x.bin").open().read() == b"iceberg over TLS"
    plain = {k: v for k, v in pyiceberg_options(dataclasses.replace(settings, ca_bundle=None)).items()}
    with pytest.raises(Exception, match="(?i)SSL|certificate"):
        load_file_io(plain, f"s3://{secured.s3.bucket}/iceberg").new_input(
            f"s3://{secured.s3.bucket}/iceberg/x.bin").open().read()


def test_the_s3_sources_clients_trust_the_ca_bundle(secured):
    """The S3 source kind's boto3 clients (listing, ranged reads, SQS notifications) over TLS."""
    from botocore.exceptions import SSLError

    from reclock.sources.s3.client import boto_client

    settings = secured.s3.settings()
    s3 = boto_client("s3", settings)
    s3.put_object(Bucket=secured.s3.bucket, Key="source/a.jsonl", Body=b'{"id": 1}\n')
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=secured.s3.bucket, Prefix="source/")["Contents"]] == [
        "source/a.jsonl"]
    assert boto_client("sqs", settings).create_queue(QueueName="tls-check")["QueueUrl"]
    with pytest.raises(SSLError):
        boto_client("s3", dataclasses.replace(settings, ca_bundle=None)).list_objects_v2(
            Bucket=secured.s3.bucket, Prefix="source/")
