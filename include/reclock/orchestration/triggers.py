"""Event-driven cycles: ``ingest__<source>`` runs when its upstream moves, not on a clock.

A source with ``schedule: upstream`` is scheduled on an Asset (``reclock-upstream://<source>``) with a
watcher whose trigger fires when the source has something to do: its kind's trigger
(``SourceKind.upstream_trigger``; Kafka: ``reclock.sources.kafka.trigger.UpstreamMoved``, Postgres:
``reclock.sources.postgres.trigger.PublicationChanged``; what they share: ``reclock.sources.trigger``).
"""

from __future__ import annotations

from typing import Any

from reclock.sources.registry import kind_of


def upstream_asset_uri(source: str) -> str:
    return f"reclock-upstream://{source}"



def upstream_asset(spec) -> Any:
    """The Asset ``ingest__<source>`` is scheduled on when the source's schedule is ``upstream``."""
    from airflow.sdk import Asset, AssetWatcher

    trigger = kind_of(spec).upstream_trigger(spec)
    return Asset(name=f"upstream__{spec.name}", uri=upstream_asset_uri(spec.name),
                 watchers=[AssetWatcher(name=f"upstream__{spec.name}", trigger=trigger)])
