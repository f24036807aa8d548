"""``ReclockTimetable``: a backfill over any range is one run over that range; on its own it runs as
``schedule=timedelta(...)`` does, or never."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.timetables.base import TimeRestriction
from airflow.timetables.interval import DeltaDataIntervalTimetable

from reclock.orchestration.timetables import ReclockTimetable

START = pendulum.datetime(2024, 1, 1, tz="UTC")


def _backfill(tt, earliest, latest) -> list:
    """What ``DAG.iter_dagrun_infos_between`` asks of the timetable for ``airflow backfill create``."""
    out, info = [], None
    restriction = TimeRestriction(earliest, latest, catchup=True)
    while (info := tt.next_dagrun_info_v2(last_dagrun_info=info, restriction=restriction)) is not None:
        out.append(info)
        assert len(out) < 1000
    return out


def test_a_backfill_is_one_run_over_its_range():
    now = pendulum.now("UTC")
    for tt in (ReclockTimetable(60), ReclockTimetable(1), ReclockTimetable()):
        a, b = now.subtract(days=3), now.subtract(hours=1)
        (info,) = _backfill(tt, a, b)
        assert (info.data_interval.start, info.data_interval.end) == (a, b)
        # a range reaching into the future ends before now (Airflow keeps only intervals that ended)
        (info,) = _backfill(tt, a, now.add(hours=1))
        assert a == info.data_interval.start and info.data_interval.end < now


def test_on_its_own_every_interval_as_a_timedelta_schedule_or_never():
    scheduler = TimeRestriction(START, None, catchup=False)
    delta = DeltaDataIntervalTimetable(timedelta(seconds=60))
    for last in (None, delta.infer_manual_data_interval(run_after=pendulum.now("UTC").subtract(minutes=5))):
        assert ReclockTimetable(60).next_dagrun_info(last_automated_data_interval=last, restriction=scheduler) == \
            delta.next_dagrun_info(last_automated_data_interval=last, restriction=scheduler)
    assert ReclockTimetable().next_dagrun_info(last_automated_data_interval=None, restriction=scheduler) is None


def test_serialization_round_trip():
    for tt in (ReclockTimetable(30.5), ReclockTimetable()):
        assert ReclockTimetable.deserialize(tt.serialize()) == tt
