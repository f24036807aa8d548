"""Airflow Assets: one per shard (``reclock://<shard>``). An ingest or rebuild run updates its source's
shards' assets; a sink's DAG is scheduled on its collection's asset, so it runs when appends land."""

from __future__ import annotations


def shard_asset_uri(shard: str) -> str:
    return f"reclock://{shard}"


def shard_assets(shards: tuple[str, ...]) -> list:
    """The Assets of ``shards`` (a task's outlets)."""
    from airflow.sdk import Asset

    return [Asset(shard_asset_uri(s)) for s in shards]
