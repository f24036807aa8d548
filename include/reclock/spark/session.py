"""Spark sessions Reclock starts itself: a session in this process on a master a setting names (a task with
``RECLOCK_SPARK_MASTER``, ``reclock cycle --spark-master``), or the driver session of a ``spark-submit`` job
(``spark_jobs/``), whose master and jars spark-submit gave.

Spark's Kafka connector is not in pyspark: its jars come from ``RECLOCK_SPARK_JARS`` (comma-separated paths,
globs like ``/opt/jars/*.jar`` or URLs), or from Spark's own ``spark.jars`` / ``spark.jars.packages``
(spark-submit's ``--jars`` / ``--packages``, ``spark-defaults.conf``), or from ``$SPARK_HOME/jars``. A session
that finds it nowhere is a ``SettingError`` before any query. Among those jars, Reclock's raw-floats jar
(``reclock-raw-floats.jar``, ``reclock.spark.jobs``: parquet-java's float writer without its NaN
canonicalisation) is put on the driver's and executors' classpath as well, ahead of the wheel's jars, where
it has to be (:func:`classpath_conf`). Nothing here binds to a particular address: the
dev stack and the tests add their loopback settings themselves.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

from reclock.errors import SettingError
from reclock.spark.jobs import RAW_FLOATS_JAR

SESSION_CONF = {
    # Spark 4.2's default less ``kafka``: a batch read of Kafka then goes through the V2 reader (the one
    # Structured Streaming uses), which makes each record's internal row directly. The V1 relation hands
    # every record to the plan as an external Row (a java.sql.Timestamp, a Java String for the topic) and
    # converts it back.
    "spark.sql.sources.useV1SourceList": "avro,csv,json,orc,parquet,text",
}
"""Spark SQL settings every session that runs ``write_batches`` gets: local sessions and the dev stack's
Spark Connect server at start, a shared Spark Connect session when a task attaches to it."""

REDACTION = r'(?i)key: "[^"]*(password|secret|token|jaas|keystore[.]key)[^"]*"\s*value: "(\\.|[^"\\])*"'
"""Spark's ``spark.sql.redaction.string.regex`` for Reclock's reads: in a plan's text (Spark Connect's
statement text, the SQL tab's plans) the value of every option whose key names a secret (a Kafka
connection's JAAS config and private key, a JDBC password) becomes ``*********(redacted)``. Spark's own
``spark.redaction.regex`` already redacts such settings and option maps by key."""

SPARK_CONF = {
    **SESSION_CONF,
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.redaction.string.regex": REDACTION,
}
"""What every Spark driver Reclock starts gets: local sessions, spark-submit jobs, the Spark Connect servers
of the dev stack and of ``docker-compose.yaml``."""

LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
}
"""And a session on a master a setting names (a short-lived driver inside a task or a command) on top."""

CONNECTOR = "spark-sql-kafka-0-10"
NO_CONNECTOR = ("Spark has no Kafka connector: set RECLOCK_SPARK_JARS to its jars, comma-separated "
                f"({CONNECTOR}_2.13-4.2.0.jar, spark-token-provider-kafka-0-10_2.13-4.2.0.jar, kafka-clients, "
                "commons-pool2; spark-avro_2.13 for Avro sources), or give spark-submit --jars or --packages")


def spark_jars() -> str | None:
    """``RECLOCK_SPARK_JARS``: the Kafka connector's jars for the sessions and jobs Reclock starts."""
    return os.environ.get("RECLOCK_SPARK_JARS") or None


def classpath_conf(jars: str | list[str], conf: dict[str, str] | None = None) -> dict[str, str]:
    """``spark.driver.extraClassPath`` and ``spark.executor.extraClassPath`` with the raw-floats jar among
    ``jars`` (comma-separated or a list of local paths) put first (ahead of what ``conf`` gives them already,
    and of the pyspark wheel's ``parquet-common``, whose class it replaces); empty when it is not among them.
    The driver's setting takes effect only where it starts the JVM (a new session, spark-submit)."""
    entries = jars.split(",") if isinstance(jars, str) else list(jars)
    found = [e.removeprefix("file:") for e in entries if Path(e.strip()).name == RAW_FLOATS_JAR]
    if not found:
        return {}
    out = {}
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        before = (conf or {}).get(key)
        out[key] = found[0].strip() + (os.pathsep + before if before and found[0].strip() not in before else "")
    return out


def driver_session(master: str | None = None, app: str = "reclock", conf: dict[str, str] | None = None):
    """A ``SparkSession`` in this process: on ``master`` with :data:`LOCAL_CONF` when given, else the one
    spark-submit configured (its master, its jars). :data:`SPARK_CONF`, then ``conf``, on top."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    settings = dict(SPARK_CONF)
    if master is not None and master.startswith("local"):
        # a local master's Python workers (a Kinesis source's reads run in them) are this interpreter, which
        # has reclock; pyspark's default is whatever `python3` the PATH finds
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is not None:
        # this process's Python runs the session's Python tasks (an S3 source's readers), not whatever
        # `python3` is on the PATH
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(master)
        settings.update(LOCAL_CONF)
    jars = spark_jars()
    if jars:
        settings["spark.jars"] = jars
    settings.update(conf or {})
    settings.update(classpath_conf(settings.get("spark.jars", ""), settings))
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if not has_kafka_connector(session):
        raise SettingError(NO_CONNECTOR)
    return session


def has_kafka_connector(session) -> bool:
    """Whether ``session`` was given the Kafka connector: among its jars (a local glob, as Spark allows, is
    expanded) or packages, or in ``$SPARK_HOME/jars``."""
    conf = session.sparkContext.getConf()
    given = conf.get("spark.jars", "").split(",") + conf.get("spark.jars.packages", "").split(",")
    for entry in given:
        local = entry.removeprefix("file:")
        names = glob.glob(local) if glob.has_magic(local) and "://" not in entry else [entry]
        if any(CONNECTOR in Path(name).name for name in names):
            return True
    home = os.environ.get("SPARK_HOME") or _pyspark_home()
    return any(Path(home, "jars").glob(f"{CONNECTOR}*.jar"))


def _pyspark_home() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent)
