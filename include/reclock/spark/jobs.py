"""Pieces every kind's Spark job uses: Spark SQL literals, the ``Observation`` s that count what a job read
and wrote (the two sides of an accounted write: ``reclock.persist.staged`` checks the parts against them), and
the writer of parts."""

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


PARTS_COMMITTER_CONF = "spark.reclock.parts.committer"
"""A session setting: ``direct`` when the session has Reclock's direct committer on its classpath
(``jvm/committer``, in ``.reclock/jars/s3``; the dev sessions with S3 set it); otherwise Hadoop's."""
DIRECT_COMMITTER = "dev.reclock.spark.DirectOutputCommitter"
"""Writes each task's file straight at its final name; the job's commit writes ``_SUCCESS`` (jvm/committer)."""


def parts_writer(df, url: str):
    """``df.write`` for the parts of one job at ``url`` (a folder that must not exist yet). On ``s3a://`` with
    :data:`PARTS_COMMITTER_CONF` = ``direct``: the direct committer, one PUT per file instead of the
    FileOutputCommitter's ~36 requests and two copies (rename-based commit buys nothing for parts, which are
    referenced only once ``reclock.persist.staged`` has found ``_SUCCESS`` and proved every file's rows:
    a file a failed task attempt left makes the counts differ, loudly; see docs/deployment.md)."""
    w = df.write.mode("error")
    if url.startswith("s3a://") and df.sparkSession.conf.get(PARTS_COMMITTER_CONF, "hadoop") == "direct":
        w = w.option("spark.sql.parquet.output.committer.class", DIRECT_COMMITTER)
    return w
