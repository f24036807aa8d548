"""KCL-compatible checkpoints in a DynamoDB lease table (the local moto server's DynamoDB)."""

from __future__ import annotations

import uuid

from reclock.sources.kinesis.checkpoints import CheckpointTable, ensure_table, read_checkpoints, write_checkpoints
from reclock.sources.kinesis.lineage import FINISHED, ShardInfo, position_of_checkpoint


def test_checkpoints_follow_the_frontier_and_never_go_back(s3):
    table = CheckpointTable(f"kcl-{uuid.uuid4().hex[:8]}", "us-east-1", s3.endpoint_url)
    ensure_table(table)
    ensure_table(table)  # idempotent
    shards = [ShardInfo(0, (), 10 ** 55, 10 ** 55 + 900), ShardInfo(1, (0,), 10 ** 55 + 1000),
              ShardInfo(2, (0,), 10 ** 55 + 1001)]
    assert write_checkpoints(table, "src", 100, shards, {0: 10 ** 55 + 41}) == 3
    assert read_checkpoints(table) == {"shardId-000000000000": str(10 ** 55 + 40),
                                       "shardId-000000000001": "TRIM_HORIZON", "shardId-000000000002": "TRIM_HORIZON"}
    later = {0: FINISHED, 1: 10 ** 55 + 1000, 2: 10 ** 55 + 1501}
    assert write_checkpoints(table, "src", 200, shards, later) == 3
    assert write_checkpoints(table, "src", 150, shards, {0: 10 ** 55 + 41}) == 0  # an older resume: refused
    got = read_checkpoints(table)
    assert got == {"shardId-000000000000": "SHARD_END", "shardId-000000000001": "TRIM_HORIZON",
                   "shardId-000000000002": str(10 ** 55 + 1500)}
    assert {k: position_of_checkpoint(v) for k, v in got.items()} == {
        "shardId-000000000000": FINISHED, "shardId-000000000001": 0, "shardId-000000000002": 10 ** 55 + 1501}
    item = table.client().get_item(TableName=table.table, Key={"leaseKey": {"S": "shardId-000000000002"}})["Item"]
    assert item["parentShardIds"] == {"SS": ["shardId-000000000000"]} and item["leaseCounter"] == {"N": "2"}
    assert item["leaseOwner"] == {"S": "reclock-src"}
