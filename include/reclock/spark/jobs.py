"""Pieces every kind's Spark job uses: Spark SQL literals, and the ``Observation`` s that count what a job read
and wrote (the two sides of an accounted write: ``reclock.persist.staged`` checks the parts against them)."""

from __future__ import annotations

from typing import Sequence


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_ident(name: str) -> str:
    """``name`` as a Spark SQL identifier (backquoted)."""
    return "`" + name.replace("`", "``") + "`"


def observation(spark):
    """A new ``Observation`` of the session's kind: a process may hold a classic session and a Spark
    Connect one, and each DataFrame takes only its own kind."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        from pyspark.sql.connect.observation import Observation
    else:
        from pyspark.sql.observation import Observation
    return Observation()


def observed(obs, source: str, url: str, names: Sequence[str]) -> dict[str, int]:
    """The metrics ``names`` of a finished job's ``Observation``; a job that reports none fails the step
    (its write cannot be accounted for)."""
    from reclock.errors import UnaccountedWrite

    got = obs.get or {}
    if any(got.get(n) is None for n in names):
        raise UnaccountedWrite(source, url, url, f"Spark reported no {', '.join(names)} for its job "
                               f"(metrics: {got}); the write cannot be accounted for")
    return {n: int(got[n]) for n in names}
