"""A Kinesis source's ``kinesis:`` section, and where its stream is found.

.. code-block:: yaml

    kinesis:
      stream: orders                 # required
      region: eu-west-1              # else AWS_REGION / AWS_DEFAULT_REGION
      endpoint_url: http://...       # a non-AWS endpoint; else RECLOCK_KINESIS_ENDPOINT / AWS_ENDPOINT_URL_KINESIS
      checkpoints: {table: orders-app}   # KCL lease table in DynamoDB (optional; region / endpoint_url too)
      task_records: 100000           # records a Spark task reads at most (a shard's range is split)
      count_every: 10000             # records between the points a scan counts (where tasks may split)
      scan_max_records: 10000000     # records one mint scans at most (the rest: the next mint)

Credentials come from the standard AWS chain of each process (environment, profile, instance role): the
cycle's and the Spark executors' (``reclock.sources.kinesis.client``). None is ever in the config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from reclock.errors import ConfigError, SettingError
from reclock.sources.kinesis.checkpoints import CheckpointTable
from reclock.sources.kinesis.client import StreamAddress

METADATA = ("shard_id", "sequence_number", "partition_key", "arrival")
"""Metadata columns a Kinesis source may include (``include:``): ``_shard_id``, ``_sequence_number`` (the
decimal, a string), ``_partition_key``, ``_arrival`` (``ApproximateArrivalTimestamp``)."""


@dataclass(frozen=True)
class KinesisSpec:
    """A Kinesis source's ``kinesis:`` section, validated (:func:`parse_kinesis`)."""

    kind: ClassVar[str] = "kinesis"
    stream: str
    region: str | None = None
    endpoint_url: str | None = None
    checkpoints: CheckpointTable | None = None
    task_records: int = 100_000
    count_every: int = 10_000
    scan_max_records: int = 10_000_000

    @property
    def stride(self) -> int:
        return self.count_every

    def shards(self, source) -> tuple[str, ...]:
        """The source's collection (output 0) and its error collection."""
        return (source.data_shard, source.errors_shard)


def _positive(k: dict, key: str, default: int, what: str) -> int:
    v = k.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ConfigError(f"{what}: `{key}` must be a positive integer, got {v!r}")
    return v


def _region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


def parse_kinesis(raw: Any, what: str) -> KinesisSpec:
    """A source's ``kinesis:`` section, validated (an unknown key or a bad value names itself)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{what}: must be a mapping with at least `stream:`")
    unknown = set(raw) - {"stream", "region", "endpoint_url", "checkpoints", "task_records", "count_every",
                          "scan_max_records"}
    if unknown:
        raise ConfigError(f"{what}: unknown key(s) {', '.join(sorted(unknown))}")
    stream = raw.get("stream")
    if not isinstance(stream, str) or not stream:
        raise ConfigError(f"{what}: `stream` is required (the Kinesis stream's name)")
    for key in ("region", "endpoint_url"):
        if key in raw and not isinstance(raw[key], str):
            raise ConfigError(f"{what}: `{key}` must be a string")
    checkpoints = None
    if raw.get("checkpoints") is not None:
        c = raw["checkpoints"]
        if not isinstance(c, dict) or not isinstance(c.get("table"), str) or not c["table"]:
            raise ConfigError(f"{what}.checkpoints: needs `table:` (the DynamoDB lease table's name)")
        bad = set(c) - {"table", "region", "endpoint_url"}
        if bad:
            raise ConfigError(f"{what}.checkpoints: unknown key(s) {', '.join(sorted(bad))}")
        checkpoints = CheckpointTable(c["table"], c.get("region") or raw.get("region") or _region() or "",
                                      c.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_DYNAMODB"))
    spec = KinesisSpec(stream=stream, region=raw.get("region"), endpoint_url=raw.get("endpoint_url"),
                       checkpoints=checkpoints, task_records=_positive(raw, "task_records", 100_000, what),
                       count_every=_positive(raw, "count_every", 10_000, what),
                       scan_max_records=_positive(raw, "scan_max_records", 10_000_000, what))
    return spec


def find_stream(spec: KinesisSpec, what: str, given: str | None = None) -> StreamAddress:
    """Where ``what``'s stream is: the endpoint ``given`` (a command's option), else
    ``RECLOCK_KINESIS_ENDPOINT`` or ``AWS_ENDPOINT_URL_KINESIS``, else its ``endpoint_url:``, else AWS's own
    endpoint of its region (``region:``, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION``)."""
    endpoint = (given or os.environ.get("RECLOCK_KINESIS_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL_KINESIS")
                or spec.endpoint_url)
    region = spec.region or _region()
    if not region:
        raise SettingError(f"{what}: no AWS region for Kinesis stream {spec.stream!r}: give the source "
                           "`kinesis.region:`, or set AWS_REGION (or AWS_DEFAULT_REGION)")
    if spec.checkpoints is not None and not spec.checkpoints.region:
        raise SettingError(f"{what}: no AWS region for its checkpoint table {spec.checkpoints.table!r}: give "
                           "`kinesis.checkpoints.region:` or `kinesis.region:`, or set AWS_REGION")
    return StreamAddress(spec.stream, region, endpoint or None)
