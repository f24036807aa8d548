"""Pieces every kind's Spark job uses: Spark SQL literals, the ``Observation`` s that count what a job read
and wrote (the two sides of an accounted write: ``reclock.persist.staged`` checks the parts against them), and
the writer of parts, which keeps every float's bits (NaN payloads too) or refuses the batch.

NaN payloads. Spark's rows, Arrow and Parquet's bytes carry a float's 32 and a double's 64 bits as they are,
NaN payloads, sign bits and signalling NaNs included, and so do Reclock's readers. parquet-java does not:
its ``LittleEndianDataOutputStream`` (every plain and dictionary page of a ``FLOAT`` or ``DOUBLE`` column)
writes ``Float.floatToIntBits`` / ``Double.doubleToLongBits``, which turn every NaN into the canonical one,
and its float dictionaries merge all NaNs into the first one seen (fastutil's maps compare by those bits).
So :func:`parts_writer`

- turns dictionary encoding off for every float and double leaf of the parts (:func:`float_column_paths`:
  ``parquet.enable.dictionary#<path>``; floats rarely repeat, so it costs little);
- relies on Reclock's raw-floats jar (``jvm/rawfloats``: the same class writing ``floatToRawIntBits`` /
  ``doubleToRawLongBits``) being first on the classpath of the session's driver and executors
  (:data:`RAW_FLOATS_JAR`; ``reclock.spark.session.classpath_conf``), which :func:`keeps_nan_payloads`
  probes once per session on an executor;
- and where the probe fails (a user's own Spark without the jar), refuses loudly: the job fails on the first
  NaN of other bits than the canonical one, naming the column and the fix (:class:`~reclock.errors.
  NaNPayloadsNotKept`); no ``_SUCCESS`` is written, so nothing is appended. Batches without such a NaN are
  written as ever (JSON, CSV and Postgres's text forms cannot even carry one).
"""

from __future__ import annotations

from typing import Any, Sequence

from reclock.bitexact import CANONICAL_NAN_BITS, spark_raw_bits


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


RAW_FLOATS_JAR = "reclock-raw-floats.jar"
"""The jar of ``jvm/rawfloats`` (parquet-java's ``LittleEndianDataOutputStream`` writing raw bits, and the
probe class :data:`RAW_FLOATS_PROBE` calls); it works only ahead of the wheel's ``parquet-common`` on the
classpath (``spark.driver.extraClassPath``, ``spark.executor.extraClassPath``)."""
RAW_FLOATS_PROBE = "java_method('dev.reclock.parquet.RawFloats', 'keepsNaNPayloads')"
"""Spark SQL that is ``'true'`` where the executor writes Parquet floats by their raw bits; it fails (class not
found) in a JVM without the jar."""
_PROBED = "_reclock_keeps_nan_payloads"


def keeps_nan_payloads(spark) -> bool:
    """Whether the session's executors write Parquet floats by their raw bits (:data:`RAW_FLOATS_JAR` first on
    their classpath): one probe job per session, remembered on the session object."""
    known = getattr(spark, _PROBED, None)
    if known is not None:
        return known
    try:
        value = spark.range(1).selectExpr(f"{RAW_FLOATS_PROBE} AS k").first()[0]
        keeps = str(value).lower() == "true"
    except Exception as e:  # noqa: BLE001 - only "no such class" is an answer; anything else goes up
        if "RawFloats" not in str(e):
            raise
        keeps = False
    try:
        setattr(spark, _PROBED, keeps)
    except AttributeError:  # a session type that takes no attribute: probe again next time
        pass
    return keeps


def float_column_paths(schema: Any) -> list[str]:
    """The Parquet column paths (dot-joined, as ``parquet.enable.dictionary#<path>`` takes them) of every
    float and double leaf of the Spark ``StructType`` ``schema``, as Spark writes them: a struct's fields
    ``s.x``, an array's elements ``a.list.element``, a map's ``m.key_value.key`` / ``m.key_value.value``."""
    from pyspark.sql import types as T

    out: list[str] = []

    def walk(dtype: Any, path: str) -> None:
        if isinstance(dtype, (T.FloatType, T.DoubleType)):
            out.append(path)
        elif isinstance(dtype, T.StructType):
            for f in dtype.fields:
                walk(f.dataType, f"{path}.{f.name}" if path else f.name)
        elif isinstance(dtype, T.ArrayType):
            walk(dtype.elementType, f"{path}.list.element")
        elif isinstance(dtype, T.MapType):
            walk(dtype.keyType, f"{path}.key_value.key")
            walk(dtype.valueType, f"{path}.key_value.value")

    walk(schema, "")
    return out


def _noncanonical_nan(col: Any, dtype: Any) -> Any | None:
    """A boolean ``Column``: ``col`` (of Spark type ``dtype``) holds, at any depth, a NaN of other bits than
    the canonical NaN (never null); None when it holds no float. The reflective call to the raw bits runs
    only on NaNs (:func:`reclock.bitexact.spark_raw_bits`)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        canonical = CANONICAL_NAN_BITS[64 if isinstance(dtype, T.DoubleType) else 32]
        return F.when(F.isnan(col), spark_raw_bits(col, dtype) != F.lit(str(canonical))).otherwise(F.lit(False))
    if isinstance(dtype, T.StructType):
        parts = [p for p in (_noncanonical_nan(col[f.name], f.dataType) for f in dtype.fields) if p is not None]
        return None if not parts else F.coalesce(_any(parts), F.lit(False))
    if isinstance(dtype, T.ArrayType):
        if not float_column_paths(T.StructType([T.StructField("e", dtype.elementType)])):
            return None
        return F.coalesce(F.exists(col, lambda x: _noncanonical_nan(x, dtype.elementType)), F.lit(False))
    if isinstance(dtype, T.MapType):
        parts = [F.exists(entries(col), _checker(t))
                 for entries, t in ((F.map_keys, dtype.keyType), (F.map_values, dtype.valueType))
                 if float_column_paths(T.StructType([T.StructField("e", t)]))]
        return None if not parts else F.coalesce(_any(parts), F.lit(False))
    return None


def _checker(dtype: Any) -> Any:
    """A one-argument function for ``exists`` (Spark reads its arity: no default arguments)."""
    return lambda x: _noncanonical_nan(x, dtype)


def _any(parts: list) -> Any:
    out = parts[0]
    for p in parts[1:]:
        out = out | p
    return out


NAN_GUARD_MARK = "RECLOCK_NAN_PAYLOAD"
"""Begins the message a refused batch's job fails with (:func:`parts_writer` tells it apart by it)."""


def _nan_guard(df, url: str):
    """``df`` with a filter that keeps every row and fails the job on the first non-canonical NaN, naming its
    column (what a session without the raw-floats writer would have canonicalised); ``df`` itself when it
    holds no float."""
    from pyspark.sql import functions as F

    checks = [(f.name, _noncanonical_nan(F.col(sql_ident(f.name)), f.dataType)) for f in df.schema.fields]
    checks = [(name, c) for name, c in checks if c is not None]
    if not checks:
        return df
    fail = None
    for name, c in checks:
        msg = F.lit(f"{NAN_GUARD_MARK} column {name}: {url}")
        fail = F.when(c, F.raise_error(msg)) if fail is None else fail.when(c, F.raise_error(msg))
    return df.where(fail.isNull())


class PartsWriter:
    """``df.write`` for parts (:func:`parts_writer`): ``partitionBy``, ``option`` and ``parquet`` as Spark's;
    ``parquet`` raises :class:`~reclock.errors.NaNPayloadsNotKept` for a batch the session would change."""

    def __init__(self, writer, url: str) -> None:
        self._writer = writer
        self._url = url

    def partitionBy(self, *cols: str) -> "PartsWriter":  # noqa: N802 - Spark's name
        return PartsWriter(self._writer.partitionBy(*cols), self._url)

    def option(self, key: str, value: str) -> "PartsWriter":
        return PartsWriter(self._writer.option(key, value), self._url)

    def parquet(self, path: str) -> None:
        from reclock.errors import NaNPayloadsNotKept

        try:
            self._writer.parquet(path)
        except Exception as e:
            text = str(e)
            if NAN_GUARD_MARK not in text:
                raise
            column = text.split(NAN_GUARD_MARK + " column ", 1)[1].split(":", 1)[0]
            raise NaNPayloadsNotKept(path, column) from None


def parts_writer(df, url: str) -> PartsWriter:
    """``df.write`` for the parts of one job at ``url`` (a folder that must not exist yet). On ``s3a://`` with
    :data:`PARTS_COMMITTER_CONF` = ``direct``: the direct committer, one PUT per file instead of the
    FileOutputCommitter's ~36 requests and two copies (rename-based commit buys nothing for parts, which are
    referenced only once ``reclock.persist.staged`` has found ``_SUCCESS`` and proved every file's rows:
    a file a failed task attempt left makes the counts differ, loudly; see docs/deployment.md).

    Every float keeps its bits: no dictionary for float columns, and a session whose executors would
    canonicalise NaNs (:func:`keeps_nan_payloads` false) gets a guard that fails the job on a NaN of other
    bits than the canonical one (see the module's docstring)."""
    paths = float_column_paths(df.schema)
    if paths and not keeps_nan_payloads(df.sparkSession):
        df = _nan_guard(df, url)
    w = df.write.mode("error")
    for path in paths:  # parquet-java's float dictionaries merge every NaN into one
        w = w.option(f"parquet.enable.dictionary#{path}", "false")
    if url.startswith("s3a://") and df.sparkSession.conf.get(PARTS_COMMITTER_CONF, "hadoop") == "direct":
        w = w.option("spark.sql.parquet.output.committer.class", DIRECT_COMMITTER)
    return PartsWriter(w, url)
