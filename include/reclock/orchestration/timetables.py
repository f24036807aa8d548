"""Reclock's Airflow timetable: when a DAG runs on its own, and what ``airflow backfill create`` makes of it.

A cycle never mints a binding in the past, so N backfill runs of ``ingest__<source>`` over N past intervals
would be N cycles at the current time: the first catches up, the others find nothing (and, run at once under
the backfill's own ``max_active_runs``, write the same range N times to be told ``already_present``). So every
Reclock DAG runs on :class:`ReclockTimetable`, whose answer to a backfill over ``[A, B]`` is **one** run with
the data interval ``[A, B]``, whatever the backfill's ``max_active_runs``:

=====================  ===========================================================================
DAG                    one backfill run over ``[A, B]`` is
=====================  ===========================================================================
``ingest__<source>``   one catch-up cycle at the current time (the run's log says so, and names
                       ``rebuild__<source>`` for re-deriving ``[A, B)``)
``sink__<name>``       one run of the sink: it writes everything complete, once
``rebuild__<source>``  a rebuild of the bindings at ``A <= ts < B`` with today's decode, swapped in
                       while cycles go on (``reclock.cycle.rebuild``)
=====================  ===========================================================================

On its own the timetable runs every ``every_s`` seconds (``interval`` schedules, continuous leases) exactly
as ``schedule=timedelta(...)`` does, or never (``every_s=None``: DAGs scheduled on Assets wrap it in
``AssetOrTimeSchedule``, the rebuild DAG runs on triggers and backfills only). Airflow tells a backfill's
enumeration from the scheduler's by its restriction: a backfill asks with ``catchup=True`` and a latest
date, the scheduler with the DAG's own ``catchup=False`` and no end date (every Reclock DAG has both).

The class lives in the library and is registered by the Reclock plugin (``plugins/reclock_status.py``):
Airflow deserializes a custom timetable only through a plugin's ``timetables``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.timetables.base import DagRunInfo, DataInterval, TimeRestriction, Timetable
from airflow.timetables.interval import DeltaDataIntervalTimetable


def is_backfill(restriction: TimeRestriction) -> bool:
    """Whether Airflow asks on behalf of a backfill (``iter_dagrun_infos_between``): catch-up on and a latest
    date. Reclock's DAGs are ``catchup=False`` with no end date, so the scheduler never asks that way."""
    return bool(restriction.catchup) and restriction.latest is not None


class ReclockTimetable(Timetable):
    """Every ``every_s`` seconds (None: never on its own); a backfill is one run over its whole range."""

    periodic = True  # a backfill is allowed (Airflow refuses one for non-periodic timetables)
    can_be_scheduled = True

    def __init__(self, every_s: float | None = None) -> None:
        if every_s is not None and every_s <= 0:
            raise ValueError(f"ReclockTimetable: every_s must be positive, got {every_s}")
        self.every_s = every_s
        self._delta = DeltaDataIntervalTimetable(timedelta(seconds=every_s)) if every_s is not None else None
        self.description = (f"every {every_s:g}s" if every_s is not None else "on events and triggers") + \
            "; a backfill is one run"

    @property
    def summary(self) -> str:
        return f"every {self.every_s:g}s" if self.every_s is not None else "Reclock: triggers and backfills"

    @classmethod
    def deserialize(cls, data: dict[str, Any]) -> Timetable:
        return cls(data.get("every_s"))

    def serialize(self) -> dict[str, Any]:
        return {"every_s": self.every_s}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReclockTimetable) and other.every_s == self.every_s

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.every_s))

    def infer_manual_data_interval(self, *, run_after) -> DataInterval:
        if self._delta is not None:
            return self._delta.infer_manual_data_interval(run_after=run_after)
        return DataInterval.exact(run_after)

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        if is_backfill(restriction):
            if last_automated_data_interval is not None:
                return None  # one run per backfill
            # Airflow keeps the runs whose interval ended before the moment it began to ask: end a second earlier
            end = min(restriction.latest, pendulum.now("UTC").subtract(seconds=1).replace(microsecond=0))
            start = restriction.earliest if restriction.earliest is not None else end
            return DagRunInfo.interval(start=min(start, end), end=end)
        if self._delta is None:
            return None
        return self._delta.next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                            restriction=restriction)
