"""KCL-compatible checkpoints: the resumption frontier of a Kinesis source, written to a DynamoDB lease table
in the shape the Kinesis Client Library keeps, so the tools a team already uses on KCL applications (the
table itself, dashboards over it, a KCL application started from it) see how far Reclock has read.

Reclock's own frontier (the remap collection in Postgres) stays the truth: the table is written after it
(in ``resume``), never read back to decide anything. One item per shard, keyed ``leaseKey`` = the shard id:

==============================  =====================================================================
attribute                       value
==============================  =====================================================================
``checkpoint`` (S)              ``TRIM_HORIZON`` (nothing read), ``SHARD_END`` (a closed shard read to its
                                end), else the sequence number of the last record below the frontier: a
                                KCL worker resumes ``AFTER_SEQUENCE_NUMBER`` it (``lineage.kcl_checkpoint``)
``checkpointSubSequenceNumber``  0 (Reclock reads records whole; aggregated KPL records are not split)
``leaseOwner`` (S)              ``reclock-<source>``
``leaseCounter`` (N)            incremented on every write (a KCL worker sees the lease is held)
``ownerSwitchesSinceCheckpoint``  0
``parentShardIds`` (SS)         the shard's parents, when it has any
``reclockResumption`` (N)       the resumption frontier (a timestamp) the checkpoint stands for: a write
                                for an older one than the item holds is refused, so the table never goes
                                backwards when two resumes race
==============================  =====================================================================

The table is created (on demand billing, hash key ``leaseKey``) when it does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from reclock.sources.kinesis.lineage import ShardInfo, kcl_checkpoint
from reclock.sources.kinesis.sequence import shard_id


@dataclass(frozen=True)
class CheckpointTable:
    """Where the lease table is: its name, region and (for a non-AWS endpoint) endpoint URL."""

    table: str
    region: str
    endpoint_url: str | None = None

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("dynamodb", region_name=self.region, endpoint_url=self.endpoint_url,
                            config=Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5,
                                          read_timeout=30))


def ensure_table(table: CheckpointTable, client=None) -> None:
    """Create the lease table if it does not exist, and wait until it is active."""
    c = client or table.client()
    try:
        c.describe_table(TableName=table.table)
        return
    except c.exceptions.ResourceNotFoundException:
        pass
    try:
        c.create_table(TableName=table.table, KeySchema=[{"AttributeName": "leaseKey", "KeyType": "HASH"}],
                       AttributeDefinitions=[{"AttributeName": "leaseKey", "AttributeType": "S"}],
                       BillingMode="PAY_PER_REQUEST")
    except c.exceptions.ResourceInUseException:
        pass  # created meanwhile
    c.get_waiter("table_exists").wait(TableName=table.table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})


def checkpoints(shards: Sequence[ShardInfo], positions: Mapping[int, int]) -> dict[str, str]:
    """Shard id -> the KCL checkpoint of each listed shard under ``positions`` (the offset resumption
    frontier, shards done through their children already at ``FINISHED``)."""
    return {shard_id(s.number): kcl_checkpoint(s, positions.get(s.number, 0)) for s in shards}


def write_checkpoints(table: CheckpointTable, source: str, resumption: int, shards: Sequence[ShardInfo],
                      positions: Mapping[int, int], client=None) -> int:
    """Write each listed shard's checkpoint for the resumption frontier ``resumption``; returns how many items
    were written (an item already at a newer resumption is left alone)."""
    c = client or table.client()
    written = 0
    parents = {s.number: s.parents for s in shards}
    for sid, checkpoint in checkpoints(shards, positions).items():
        n = int(sid.split("-")[1])
        values = {":c": {"S": checkpoint}, ":z": {"N": "0"}, ":one": {"N": "1"}, ":o": {"S": f"reclock-{source}"},
                  ":r": {"N": str(resumption)}}
        update = ("SET checkpoint = :c, checkpointSubSequenceNumber = :z, leaseOwner = :o, "
                  "ownerSwitchesSinceCheckpoint = :z, reclockResumption = :r, "
                  "leaseCounter = if_not_exists(leaseCounter, :z) + :one")
        if parents[n]:
            update += ", parentShardIds = :p"
            values[":p"] = {"SS": [shard_id(p) for p in parents[n]]}
        try:
            c.update_item(TableName=table.table, Key={"leaseKey": {"S": sid}}, UpdateExpression=update,
                          ConditionExpression="attribute_not_exists(reclockResumption) OR reclockResumption <= :r",
                          ExpressionAttributeValues=values)
            written += 1
        except c.exceptions.ConditionalCheckFailedException:
            pass  # a newer resume wrote it first
    return written


def read_checkpoints(table: CheckpointTable, client=None) -> dict[str, str]:
    """Shard id -> checkpoint, as the table holds them (what a KCL worker would resume from)."""
    c = client or table.client()
    out: dict[str, str] = {}
    for page in c.get_paginator("scan").paginate(TableName=table.table, ConsistentRead=True):
        for item in page["Items"]:
            out[item["leaseKey"]["S"]] = item["checkpoint"]["S"]
    return out
