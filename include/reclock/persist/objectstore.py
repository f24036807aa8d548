"""Object stores: the one module that maps blob URL schemes and holds the S3 settings.

A blob store URL ``s3://bucket/prefix`` (AWS S3, MinIO, any S3-compatible endpoint) is reached two ways::

    Python (append, reads, sinks, GC)  --fsspec / s3fs-->  s3://bucket/prefix/...   fsspec_options(settings)
    Spark (write_batches)              --hadoop-aws---->  s3a://bucket/prefix/...  spark_url(url),
                                                                                    spark_s3a_conf(settings)
    pyiceberg (the Iceberg export)     --pyarrow S3---->  s3://bucket/warehouse/... pyiceberg_options(settings)

:class:`S3Settings` says where the endpoint is and who we are there. The keys reach Python's client
directly, and Spark's JVMs (drivers, and the workers their executors inherit the environment of) through
the standard ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` variables (:func:`jvm_env`): never through
Spark or Hadoop settings, which Spark shows in its UI and logs. The secret is in no ``repr``, ``str`` or
error message.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping
from urllib.parse import urlsplit

from reclock.errors import ConfigError

ENV_PATH_STYLE = "RECLOCK_S3_PATH_STYLE"
"""``true``: address buckets as ``endpoint/bucket/key`` (MinIO, moto, most S3-compatible stores);
``false``: as ``bucket.endpoint/key`` (AWS). Default: path style when an endpoint is given."""

DEFAULT_REGION = "us-east-1"
"""The region of an S3-compatible endpoint that names none (the stores ignore it; the SDK signs with it)."""

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class S3Settings:
    """Where an S3 API lives and the keys to it. ``endpoint_url`` None: AWS's own endpoint for ``region``."""

    endpoint_url: str | None
    region: str
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)
    path_style: bool = False
    ca_bundle: str | None = None  # a PEM file of the CAs to trust for the endpoint (default: the system's)

    def __post_init__(self) -> None:
        if self.endpoint_url is not None:
            u = urlsplit(self.endpoint_url)
            if u.scheme not in ("http", "https") or not u.hostname or u.path.strip("/") or u.query:
                raise ConfigError(f"S3 endpoint {self.endpoint_url!r} must be http(s)://host[:port], "
                                  "without a path (the bucket comes from the blob URL)")
        if not self.region:
            raise ConfigError("S3 region is empty: set AWS_REGION (or the connection's region_name)")
        if not self.access_key or not self.secret_key:
            raise ConfigError("S3 credentials are incomplete: both an access key and a secret key are needed")

    @property
    def ssl(self) -> bool:
        """Whether the endpoint speaks TLS (AWS's own always does)."""
        return self.endpoint_url is None or self.endpoint_url.startswith("https://")

    def __repr__(self) -> str:
        return (f"S3Settings(endpoint_url={self.endpoint_url!r}, region={self.region!r}, "
                f"access_key={_masked(self.access_key)!r}, secret_key='***', path_style={self.path_style}, "
                f"ca_bundle={self.ca_bundle!r})")

    __str__ = __repr__


def _masked(key: str) -> str:
    return key[:4] + "..." if len(key) > 8 else "***"


def s3_settings_from_env(env: Mapping[str, str] | None = None) -> S3Settings:
    """The S3 settings in the standard AWS variables: ``AWS_ENDPOINT_URL_S3`` (else ``AWS_ENDPOINT_URL``;
    neither: AWS itself), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` (else
    ``AWS_DEFAULT_REGION``; required without an endpoint), ``AWS_CA_BUNDLE`` (the CAs to trust, botocore's
    variable) and :data:`ENV_PATH_STYLE`. A missing or malformed one raises ``ConfigError`` naming the
    variable."""
    env = os.environ if env is None else env
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not env.get(k)]
    if missing:
        raise ConfigError(f"an s3:// blob store needs credentials: {' and '.join(missing)} "
                          f"{'is' if len(missing) == 1 else 'are'} not set")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        if endpoint is None:
            raise ConfigError("an s3:// blob store on AWS needs a region: set AWS_REGION "
                              "(or AWS_ENDPOINT_URL_S3 for an S3-compatible endpoint)")
        region = DEFAULT_REGION
    return S3Settings(endpoint, region, env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                      path_style=parse_path_style(env.get(ENV_PATH_STYLE), endpoint, ENV_PATH_STYLE),
                      ca_bundle=env.get("AWS_CA_BUNDLE") or None)


def parse_path_style(value: object, endpoint_url: str | None, what: str) -> bool:
    """``value`` (a bool, or text such as ``true``/``false``) as a path-style switch; None: path style exactly
    when a custom endpoint is given."""
    if value is None or value == "":
        return endpoint_url is not None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{what} is {value!r}: expected true or false")


def is_s3(url: str) -> bool:
    return url.startswith(("s3://", "s3a://"))


def spark_url(url: str) -> str:
    """The URL Spark writes and reads: ``s3://`` becomes ``s3a://`` (hadoop-aws's scheme); others unchanged."""
    return "s3a://" + url[len("s3://"):] if url.startswith("s3://") else url


S3A_BOUNDS = {"fs.s3a.connection.timeout": "15s", "fs.s3a.connection.request.timeout": "20s",
              "fs.s3a.attempts.maximum": "1", "fs.s3a.retry.limit": "1"}
"""How long S3A waits on an endpoint that stops answering (a black-holed network, a hung proxy). Each S3A
operation is a few tries (S3A's own retries, ``fs.s3a.retry.limit``: here 2 tries; Hadoop's default 8) of
one AWS SDK call, and the SDK call is bounded as a whole by ``fs.s3a.connection.request.timeout`` (the SDK's
apiCallTimeout and apiCallAttemptTimeout: here 20 s; Hadoop's default 60 s), within which the SDK retries
once (``fs.s3a.attempts.maximum``) after 15 s of silence on a socket (``fs.s3a.connection.timeout``; 200 s).
So an operation gives up after about 40 s, where Hadoop's defaults take 8 minutes and the earlier bounds (30 s
socket, 2 + 2 retries) 3 minutes: a Spark write makes several S3A operations on the failing path (the
driver's existence check; a task's create, upload and abort; the job's abort), and at 3 minutes each a black
hole mid-write outlived the step bound of 300 s (the Connect server's stack: ``S3AFileSystem.exists`` in
``Invoker.retryUntranslated`` for 3 minutes). Uploads are PUTs of one part file each: a file must go up within
20 s (at least ~3 MB/s for a 64 MB multipart block); on a slower link raise the request timeout.
Throttling keeps its own retries (``fs.s3a.retry.throttle.limit``)."""

S3FS_BOUNDS = {"connect_timeout": 10, "read_timeout": 20, "retries": {"max_attempts": 3, "mode": "standard"}}
"""The same for the cycle's own S3 calls (botocore through s3fs): 20 s of silence, 3 attempts (botocore's
defaults: 60 s and 5), with s3fs's own :data:`S3FS_RETRIES` tries around them (``FsspecBlobStore`` sets them;
s3fs's default is 5): about 3 minutes at most."""

S3FS_RETRIES = 3


def spark_s3a_conf(settings: S3Settings) -> dict[str, str]:
    """Spark settings (``spark.hadoop.fs.s3a.*``) for ``s3a://`` on ``settings``'s endpoint, bounded by
    :data:`S3A_BOUNDS`. No keys: S3A takes them from the JVM's environment (:func:`jvm_env`). Spark's
    ``_SUCCESS`` markers stay on (the committer is the FileOutputCommitter: task output is renamed, i.e.
    copied, into place at commit)."""
    conf = {
        **S3A_BOUNDS,
        "fs.s3a.aws.credentials.provider":
            "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
        "fs.s3a.endpoint.region": settings.region,
        "fs.s3a.path.style.access": str(settings.path_style).lower(),
        "fs.s3a.connection.ssl.enabled": str(settings.ssl).lower(),
        "mapreduce.fileoutputcommitter.marksuccessfuljobs": "true",
    }
    if settings.endpoint_url is not None:
        conf["fs.s3a.endpoint"] = settings.endpoint_url
    return {f"spark.hadoop.{k}": v for k, v in conf.items()}


def jvm_trust_options(truststore: str) -> str:
    """The JVM options (``spark.driver.extraJavaOptions``, ``spark.executor.extraJavaOptions``) that make S3A
    trust the CAs in the PKCS#12 file ``truststore`` (S3A has no setting of its own for it: it uses the
    JVM's trust store; the file replaces the JDK's public CAs for that JVM)."""
    return f"-Djavax.net.ssl.trustStore={truststore} -Djavax.net.ssl.trustStoreType=PKCS12"


def jvm_env(settings: S3Settings) -> dict[str, str]:
    """Environment variables a Spark JVM (a driver; a standalone worker, whose executors inherit them) needs
    to reach the store: the keys for S3A's environment-variable credentials provider, and the region."""
    return {"AWS_ACCESS_KEY_ID": settings.access_key, "AWS_SECRET_ACCESS_KEY": settings.secret_key,
            "AWS_REGION": settings.region}


def fsspec_options(settings: S3Settings) -> dict:
    """``s3fs.S3FileSystem`` options for ``settings``, bounded by :data:`S3FS_BOUNDS`. Listings are never cached: a part Spark wrote after
    a listing must show in the next one (a stale listing would say "there was nothing")."""
    config: dict = {"region_name": settings.region, **S3FS_BOUNDS}
    if settings.path_style:
        config["s3"] = {"addressing_style": "path"}
    options = {"key": settings.access_key, "secret": settings.secret_key, "endpoint_url": settings.endpoint_url,
               "config_kwargs": config, "use_listings_cache": False}
    if settings.ca_bundle:
        options["client_kwargs"] = {"verify": settings.ca_bundle}
    return options


def pyiceberg_options(settings: S3Settings) -> dict[str, str]:
    """pyiceberg FileIO properties (``s3.*``) for ``settings``: an Iceberg warehouse on the same store."""
    props = {"s3.access-key-id": settings.access_key, "s3.secret-access-key": settings.secret_key,
             "s3.region": settings.region, "s3.force-virtual-addressing": str(not settings.path_style).lower()}
    if settings.endpoint_url is not None:
        props["s3.endpoint"] = settings.endpoint_url
    if settings.ca_bundle:
        from reclock.persist.pyarrow_tls import CA_BUNDLE

        props.update({"py-io-impl": "reclock.persist.pyarrow_tls.CaBundleFileIO", CA_BUNDLE: settings.ca_bundle})
    return props
