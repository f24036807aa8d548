"""Airflow Assets: one per shard (``reclock://<shard>``), and an event only when data moved.

An ingest task declares the alias ``reclock_appends__<source>`` as its outlet (not the shards' assets, whose
events Airflow would emit on every successful run, cycles that added nothing included) and emits, through
it, one event per shard that an append of the run added updates to (``reclock.cycle.Added``), its extra the
range of the new updates::

    {"lower": L, "upper": U, "rows": N}     updates at L <= ts < U are new (N of them)

so a sink's DAG, scheduled on the collection's asset, runs only when the collection changed, and a
downstream task reads exactly what is new (``reclock.tables.spark_updates(spark, collection, L, U)``; a run
that several events triggered reads from the least ``lower`` to the greatest ``upper``). A rebuild appends
nothing and moves no upper: it emits no event (its run's result names the window it re-derived).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def shard_asset_uri(shard: str) -> str:
    return f"reclock://{shard}"


def appends_alias_name(source: str) -> str:
    return f"reclock_appends__{source}"


def shard_assets(shards: tuple[str, ...]) -> list:
    """The Assets of ``shards`` (a DAG's schedule)."""
    from airflow.sdk import Asset

    return [Asset(shard_asset_uri(s)) for s in shards]


def appends_alias(source: str):
    """The outlet of a task that appends ``source``'s shards (events through it: :func:`emit_added`)."""
    from airflow.sdk import AssetAlias

    return AssetAlias(appends_alias_name(source))


def event_extra(added) -> dict[str, Any]:
    """The extra of an asset event for a ``reclock.cycle.Added``."""
    return {"lower": added.lower, "upper": added.upper, "rows": added.rows}


def emit_added(source: str, added: Mapping[str, Any]) -> list[str]:
    """Emit, in the running task, one event per shard in ``added`` (``shard -> Added``, merged:
    ``reclock.cycle.merge_added``) through ``source``'s alias; returns the shards emitted for."""
    from airflow.sdk import Asset, get_current_context

    events = get_current_context()["outlet_events"][appends_alias(source)]
    for shard, a in sorted(added.items()):
        events.add(Asset(shard_asset_uri(shard)), extra=event_extra(a))
    return sorted(added)


def new_range(events: Iterable[Any]) -> tuple[int, int] | None:
    """The range of updates new to a run that the asset ``events`` triggered (each with the extra
    :func:`emit_added` gives): ``(least lower, greatest upper)``, or None if no event carries a range."""
    ranges = [(e.extra["lower"], e.extra["upper"]) for e in events
              if isinstance(getattr(e, "extra", None), Mapping) and {"lower", "upper"} <= set(e.extra)]
    if not ranges:
        return None
    return min(lo for lo, _ in ranges), max(up for _, up in ranges)
