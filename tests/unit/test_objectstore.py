"""S3 settings: from the environment and from an Airflow connection, what Spark and fsspec get, and the
secret kept out of every repr, str and error."""

from __future__ import annotations

import json
import logging

import pytest

from reclock.errors import ConfigError
from reclock.persist.objectstore import (S3FS_BOUNDS, S3Settings, fsspec_options, jvm_env, s3_settings_from_env,
                                         spark_s3a_conf, spark_url)

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ENV = {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET}


def test_settings_from_env_for_an_s3_compatible_endpoint():
    s = s3_settings_from_env({**ENV, "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    assert (s.endpoint_url, s.region, s.path_style, s.ssl) == ("http://127.0.0.1:9000", "us-east-1", True, False)
    s = s3_settings_from_env({**ENV, "AWS_ENDPOINT_URL": "http://other:1", "AWS_ENDPOINT_URL_S3": "https://minio:9000",
                              "AWS_DEFAULT_REGION": "eu-west-1", "RECLOCK_S3_PATH_STYLE": "false"})
    assert (s.endpoint_url, s.region, s.path_style, s.ssl) == ("https://minio:9000", "eu-west-1", False, True)
    assert s3_settings_from_env({**ENV, "AWS_REGION": "eu-north-1", "AWS_DEFAULT_REGION": "x"}).region == "eu-north-1"


def test_settings_from_env_for_aws():
    s = s3_settings_from_env({**ENV, "AWS_REGION": "eu-central-1"})
    assert (s.endpoint_url, s.region, s.path_style, s.ssl) == (None, "eu-central-1", False, True)


@pytest.mark.parametrize("env, message", [
    ({}, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set"),
    ({"AWS_ACCESS_KEY_ID": "AKIA", "AWS_REGION": "x"}, "AWS_SECRET_ACCESS_KEY is not set"),
    (ENV, "needs a region: set AWS_REGION"),
    ({**ENV, "AWS_ENDPOINT_URL": "127.0.0.1:9000"}, r"must be http\(s\)://host\[:port\]"),
    ({**ENV, "AWS_ENDPOINT_URL": "http://minio:9000/bucket"}, "without a path"),
    ({**ENV, "AWS_ENDPOINT_URL": "http://minio:9000", "RECLOCK_S3_PATH_STYLE": "maybe"},
     "RECLOCK_S3_PATH_STYLE is 'maybe': expected true or false"),
])
def test_a_missing_or_wrong_setting_says_which(env, message):
    with pytest.raises(ConfigError, match=message) as e:
        s3_settings_from_env(env)
    assert SECRET not in str(e.value)


def test_the_secret_is_in_no_repr_str_or_log(caplog):
    s = s3_settings_from_env({**ENV, "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    for text in (repr(s), str(s), f"{s}", repr([s])):
        assert SECRET not in text and "AKIAIOSFODNN7EXAMPLE" not in text and "secret_key='***'" in text
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("reclock.test").info("settings %s", s)
    assert SECRET not in caplog.text
    assert s == S3Settings("http://127.0.0.1:9000", "us-east-1", "AKIAIOSFODNN7EXAMPLE", SECRET, True)


def test_spark_gets_s3a_settings_and_no_keys():
    s = S3Settings("http://127.0.0.1:9000", "us-east-1", "AKIAIOSFODNN7EXAMPLE", SECRET, path_style=True)
    conf = spark_s3a_conf(s)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith("EnvironmentVariableCredentialsProvider")
    assert conf["spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs"] == "true"  # _SUCCESS markers
    assert conf["spark.hadoop.fs.s3a.connection.timeout"] == "15s"  # a silent endpoint fails a task, not hangs it
    assert conf["spark.hadoop.fs.s3a.connection.request.timeout"] == "20s"  # the SDK call as a whole
    assert (conf["spark.hadoop.fs.s3a.attempts.maximum"], conf["spark.hadoop.fs.s3a.retry.limit"]) == ("1", "1")
    assert all(k.startswith("spark.hadoop.") for k in conf)
    assert SECRET not in json.dumps(conf) and "AKIAIOSFODNN7EXAMPLE" not in json.dumps(conf)
    assert jvm_env(s) == {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET,
                          "AWS_REGION": "us-east-1"}
    aws = spark_s3a_conf(S3Settings(None, "eu-west-1", "a" * 20, "b" * 40))
    assert "spark.hadoop.fs.s3a.endpoint" not in aws and aws["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_fsspec_options_and_spark_urls():
    s = S3Settings("http://127.0.0.1:9000", "us-east-1", "AKIAIOSFODNN7EXAMPLE", SECRET, path_style=True)
    opts = fsspec_options(s)
    assert (opts["key"], opts["secret"], opts["endpoint_url"]) == ("AKIAIOSFODNN7EXAMPLE", SECRET, s.endpoint_url)
    assert opts["config_kwargs"] == {"region_name": "us-east-1", "s3": {"addressing_style": "path"}, **S3FS_BOUNDS}
    assert opts["config_kwargs"]["read_timeout"] <= 30  # a silent endpoint fails the call
    assert opts["use_listings_cache"] is False  # a part Spark wrote after a listing shows in the next one
    assert spark_url("s3://b/p/x.parquet") == "s3a://b/p/x.parquet"
    assert spark_url("/tmp/x") == "/tmp/x" and spark_url("memory://x") == "memory://x"


def _connection(monkeypatch, **conn) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_S3", json.dumps({"conn_type": "aws", **conn}))


def test_settings_from_the_airflow_connection(monkeypatch):
    from reclock.connections import s3_settings

    _connection(monkeypatch, login="AKIAIOSFODNN7EXAMPLE", password=SECRET,
                extra={"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"})
    s = s3_settings()
    assert (s.endpoint_url, s.region, s.access_key, s.secret_key, s.path_style) == \
        ("http://127.0.0.1:9000", "eu-west-1", "AKIAIOSFODNN7EXAMPLE", SECRET, True)
    _connection(monkeypatch, login="AKIAIOSFODNN7EXAMPLE", password=SECRET, extra={"region_name": "eu-west-1"})
    assert (s3_settings().endpoint_url, s3_settings().path_style) == (None, False)


@pytest.mark.parametrize("conn, message", [
    ({"login": "AKIA", "extra": {"endpoint_url": "http://x:1"}}, "password \\(the secret key\\) not set"),
    ({"login": "AKIA", "password": SECRET}, "extra region_name is not set"),
    ({"login": "AKIA", "password": SECRET, "extra": {"endpoint_url": "x:1"}}, "connection reclock_s3: S3 endpoint"),
    ({"conn_type": "generic", "login": "AKIA", "password": SECRET}, "type is 'generic', expected 'aws'"),
])
def test_a_wrong_connection_says_what(monkeypatch, conn, message):
    from reclock.connections import s3_settings

    _connection(monkeypatch, **conn)
    with pytest.raises(ConfigError, match=message) as e:
        s3_settings()
    assert SECRET not in str(e.value)


def test_a_task_finds_its_s3_store_in_the_environment_else_the_connection(monkeypatch):
    from reclock.errors import SettingError
    from reclock.settings import find_blob_store

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                "AWS_REGION", "AWS_DEFAULT_REGION", "AIRFLOW_CONN_RECLOCK_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RECLOCK_BLOB_URL", "s3://bucket/parts")
    with pytest.raises(SettingError, match="s3:// blob store needs its keys: set AWS_ACCESS_KEY_ID .* reclock_s3"):
        find_blob_store()
    _connection(monkeypatch, login="AKIAIOSFODNN7EXAMPLE", password=SECRET,
                extra={"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"})
    store = find_blob_store()
    assert store.url("a/b.parquet") == "s3a://bucket/parts/a/b.parquet"
    assert store.fs.endpoint_url == "http://127.0.0.1:9000" and SECRET not in repr(store.__dict__)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9100")
    assert find_blob_store().fs.endpoint_url == "http://127.0.0.1:9100"  # the environment comes first
