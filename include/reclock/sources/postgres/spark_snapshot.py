"""A Postgres source's initial snapshot of a large table, read by Spark: partitioned JDBC reads under the
snapshot the task exported, written as Parquet parts by the executors (never through the driver).

::

    task (holds the exported snapshot open)          Spark executors, one JDBC session per partition
      count(*) under the snapshot  ->  expected       sessionInitStatement: the decoder's session styles,
      pages = pg_relation_size / block_size            BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
      partitions: ctid page ranges                     SET TRANSACTION SNAPSHOT '<name>'
                                                       SELECT col::text ... WHERE ctid in the partition's
                                                       pages (a TID Range Scan, Postgres 14+)
                                                       -> each column converted as the stream converts it
                                                       -> <prefix>/<shard>/snapshot/part-*.parquet, _SUCCESS

Every column is read as its text form (``col::text``, as the in-process ``COPY`` reads it; one of a
:data:`NATIVE` type as pgjdbc's value) and converted in Spark SQL to the Arrow type the stream's decoder gives it
(:func:`reclock.sources.postgres.pgoutput.arrow_type`), with the same refusals: a value the decoder would refuse (a BC or infinite date, a numeric beyond
``decimal(38, 10)`` in an unconstrained column, ``NaN``) fails the job naming the column. A table with a
column Spark cannot convert exactly (``numeric`` of more than 38 digits: ``decimal256``; two column names
equal but for case) is :func:`convertible` ``False`` and is read in the task instead.

The ctid ranges cover every page: the last range is open-ended, so a page added after the page count was
read is still read (the snapshot decides what rows are visible, not the ranges). Spark's task retries and
speculative attempts commit through its output committer, and the task proves the parts afterwards
(``reclock.sources.postgres.cdc.collect``: the ``_SUCCESS`` marker, every footer, rows equal to ``count(*)``
under the same snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from psycopg.conninfo import conninfo_to_dict

from reclock.errors import SettingError
from reclock.sources.postgres import pgoutput as po
from reclock.sources.postgres.upstream import SESSION, TableInfo, pg_ident, text_form
from reclock.spark.jobs import parts_writer, sql_ident, sql_string

SPLIT_BYTES = 32 << 20
"""Bytes of a table's heap each Spark partition reads (a partition is a range of whole pages)."""
MAX_PARTITIONS = 256
CTID = "reclock_ctid"
"""The subquery's name for the row's ``ctid``: every other column is ``c<i>``, so it cannot collide."""
NATIVE = {po.INT2: "SMALLINT", po.INT4: "INT", po.INT8: "BIGINT", po.FLOAT8: "DOUBLE", po.BOOL: "BOOLEAN"}
"""The types read as JDBC's values, not as text, with their Spark SQL types: pgjdbc parses each from the
server's text form (a ``long`` from its bytes; ``Double.parseDouble``, correctly rounded as Arrow's cast in the
stream's decoder is, so a ``float8`` the server writes shortest-exact, ``extra_float_digits = 3``, comes back
with its bits, ``-0``, ``NaN`` and the infinities too; ``t``/``f``), with no Spark string and no cast in Spark
after it. A ``float4`` stays text: the decoder reads it through a double, which Spark's casts repeat."""
DRIVER = "org.postgresql.Driver"
NO_DRIVER = ("Spark has no Postgres JDBC driver (org.postgresql:postgresql, in .reclock/jars/spark with "
             "`reclock dev install`; else give it to Spark Connect or spark-submit with --jars or --packages), "
             "which a Postgres source's snapshot of a large table needs; or set the source's "
             "`postgres.spark_snapshot_min_bytes: null` to read every snapshot in the task")


@dataclass(frozen=True)
class JdbcTarget:
    """Where Spark's JDBC reads reach the upstream: the URL and the connection properties (the DSN's
    ``host``, ``port``, ``dbname``, ``user``, ``password`` and ``sslmode``)."""

    url: str
    properties: dict[str, str]


def jdbc_target(dsn: str) -> JdbcTarget:
    """The JDBC URL and properties of a libpq DSN (URI or ``key=value``). A DSN Spark cannot follow (a Unix
    socket, several hosts, a service file) is a ``SettingError``: the executors connect over TCP."""
    d = conninfo_to_dict(dsn)
    host = d.get("host") or d.get("hostaddr")
    if not host or host.startswith("/") or "," in host or "service" in d:
        raise SettingError(f"the upstream DSN's host {host!r} is not one TCP host Spark's executors can reach "
                           "(a snapshot on Spark needs host=<name> port=<n> in the DSN)")
    props = {"driver": DRIVER, "user": d.get("user", ""), "password": d.get("password", ""), **jdbc_tls(d)}
    return JdbcTarget(f"jdbc:postgresql://{host}:{d.get('port', '5432')}/{d.get('dbname', d.get('user', ''))}",
                      props)


def jdbc_tls(d: dict) -> dict[str, str]:
    """pgjdbc's TLS properties for a libpq DSN's (``d``): the same ``sslmode``; for ``verify-ca`` and
    ``verify-full``, the root certificate (``sslrootcert``, else libpq's ``~/.postgresql/root.crt``) read
    here and given inline (``SingleCertValidatingFactory``), so executors on other hosts need no file of
    their own; a bundle of several certificates goes as its path (it must be there on every executor)."""
    mode = d.get("sslmode")
    if not mode:
        return {}
    props = {"sslmode": mode}
    if mode in ("verify-ca", "verify-full"):
        root = Path(d.get("sslrootcert") or Path.home() / ".postgresql" / "root.crt")
        try:
            pem = root.read_text()
        except OSError as e:
            raise SettingError(f"the upstream DSN asks for sslmode={mode}, but its root certificate {root} cannot "
                               f"be read ({e.strerror}); set sslrootcert to the CA's PEM file") from None
        if pem.count("-----BEGIN CERTIFICATE-----") == 1:
            props.update({"sslfactory": "org.postgresql.ssl.SingleCertValidatingFactory", "sslfactoryarg": pem})
        else:
            props["sslrootcert"] = str(root)
    for key in ("sslcert", "sslkey"):
        if d.get(key):
            props[key] = d[key]
    return props


def convertible(info: TableInfo) -> bool:
    """Whether every column of ``info`` converts exactly in Spark SQL (see the module)."""
    names = [n.lower() for n, _, _ in info.columns]
    if len(set(names)) != len(names):
        return False
    return all(_column_sql(f"c{i}", o, m, n) is not None for i, (n, o, m) in enumerate(info.columns))


def partition_predicates(pages: int, split_pages: int, slots: int | None = None) -> list[str]:
    """One predicate per Spark partition: ranges of at most ``split_pages`` pages over ``pages`` (unless that
    makes more than :data:`MAX_PARTITIONS`), their sizes one page apart at most, as many as a multiple of ``slots`` (the tasks Spark runs at once, if known: no last wave of one
    task while the other cores idle), the last one open-ended (every page of the table, however many there
    are when the read runs)."""
    count = -(-max(pages, 1) // max(split_pages, 1))
    if slots:
        count = -(-count // slots) * slots
    count = max(1, min(count, MAX_PARTITIONS, max(pages, 1)))
    bounds = [i * pages // count for i in range(count)]
    preds = [f"{CTID} >= '({lo},0)' AND {CTID} < '({hi},0)'" for lo, hi in zip(bounds, bounds[1:])]
    return preds + [f"{CTID} >= '({bounds[-1]},0)'"]


def task_slots(spark) -> int | None:
    """How many tasks ``spark`` runs at once (its default parallelism), or None where it does not say (a Spark
    Connect session without ``spark.default.parallelism``)."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        pass
    try:
        value = spark.conf.get("spark.default.parallelism", None)
    except Exception:  # noqa: BLE001 - a session that cannot say
        return None
    return int(value) if value and str(value).isdigit() else None


def session_init(snapshot: str) -> str:
    """What each JDBC session runs before its read: the decoder's session styles, then a read-only
    transaction on the exported ``snapshot``."""
    return "; ".join([*SESSION, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
                      f"SET TRANSACTION SNAPSHOT '{snapshot}'"])


def _column_sql(c: str, type_oid: int, typmod: int, name: str) -> str | None:
    """The Spark SQL expression converting text column ``c`` (table column ``name``) to its Arrow type as
    :func:`reclock.sources.postgres.pgoutput.convert` does; None if Spark cannot."""
    col = sql_ident(c)

    def refuse(cond: str, spark_type: str, why: str, value: str) -> str:
        msg = sql_string(f"column {name}: ")
        return (f"CASE WHEN {cond} THEN CAST(raise_error(concat({msg}, {col}, {sql_string(' ' + why)})) "
                f"AS {spark_type}) ELSE {value} END")

    # BC, infinite, or a year of five digits (ISO: a year is four digits and a '-', zero-padded): no regex per value
    out_of_arrow = f"(endswith({col}, ' BC') OR endswith({col}, 'infinity') OR substr({col}, 5, 1) <> '-')"
    if type_oid in NATIVE:  # read as JDBC's own value (NATIVE): a cast to the same type, or a widening
        return f"CAST({col} AS {NATIVE[type_oid]})"
    if type_oid == po.OID:
        return f"CAST({col} AS BIGINT)"
    if type_oid == po.FLOAT4:
        return f"CAST(CAST({col} AS DOUBLE) AS FLOAT)"
    if type_oid == po.BYTEA:
        return refuse(f"NOT startswith({col}, '\\\\x')", "BINARY",
                      "is not bytea in hex form", f"unhex(substr({col}, 3))")
    if type_oid == po.DATE:
        return refuse(f"({out_of_arrow} OR length({col}) <> 10)", "DATE",
                      "is outside what Arrow holds", f"CAST({col} AS DATE)")
    if type_oid == po.TIMESTAMP:
        return refuse(out_of_arrow, "TIMESTAMP_NTZ", "is outside what Arrow holds",
                      f"CAST({col} AS TIMESTAMP_NTZ)")
    if type_oid == po.TIMESTAMPTZ:
        return refuse(out_of_arrow, "TIMESTAMP", "is outside what Arrow holds", f"CAST({col} AS TIMESTAMP)")
    if type_oid == po.NUMERIC:
        t = po.arrow_type(type_oid, typmod)
        if t.precision > 38:
            return None
        spark_type = f"DECIMAL({t.precision},{t.scale})"
        if po.numeric_precision(typmod) is not None and 0 <= t.scale <= t.precision:
            # a declared numeric(p, s) holds only values of p digits, s of them fractional (Postgres applies
            # the typmod to every value it stores), and NaN; no regex per value
            return refuse(f"{col} = 'NaN'", spark_type, f"does not fit {t}", f"CAST({col} AS {spark_type})")
        # the decoder refuses a value with more fractional digits than the scale (Spark would round it),
        # more integer digits than precision - scale, and NaN or infinities
        fits = (f"{col} RLIKE '^-?[0-9]{{1,{max(t.precision - t.scale, 1)}}}(\\\\.[0-9]{{0,{t.scale}}})?$'"
                if t.precision > t.scale else f"{col} RLIKE '^-?0?(\\\\.[0-9]{{0,{t.scale}}})?$'")
        return refuse(f"NOT ({fits})", spark_type, f"does not fit {t} (give the column a declared numeric(p, s))",
                      f"CAST({col} AS {spark_type})")
    return col  # every other type is its text, as the decoder keeps it


def snapshot_query(info: TableInfo) -> str:
    """The JDBC subquery: the row's ``ctid`` and every published column as ``c<i>``, of the rows the
    publication's row filter passes (``ONLY``: a table's inheritance children are tables of their own): a
    column of a :data:`NATIVE` type as it is (pgjdbc parses its text form into the JVM's value, no string made),
    every other one as its text form (as pgoutput sends it: :func:`reclock.sources.postgres.upstream.text_form`)."""
    schema, _, name = info.table.partition(".")
    cols = ", ".join(f"{pg_ident(n) if o in NATIVE else text_form(n, o)} AS c{i}"
                     for i, (n, o, _) in enumerate(info.columns))
    where = "" if info.row_filter is None else f" WHERE ({info.row_filter})"
    return (f"(SELECT ctid AS {CTID}{', ' if cols else ''}{cols} FROM ONLY {pg_ident(schema)}.{pg_ident(name)}"
            f"{where}) reclock_snapshot")


UNIQUE_ENOUGH = 0.5
"""A column of at least this share of distinct values (Postgres's statistics, ``pg_stats.n_distinct``) is
written without a dictionary: parquet-java would build one for each row group only to give it up past its page
size (1 MiB), and the table's keys, UUIDs and free text are written plain in the end anyway."""


def plain_columns(conn, info: TableInfo) -> list[str]:
    """The columns of ``info`` whose statistics (the last ``ANALYZE``'s, read on ``conn``) say at least
    :data:`UNIQUE_ENOUGH` of their values are distinct; none for a table never analyzed."""
    schema, _, name = info.table.partition(".")
    rows = conn.execute("SELECT attname, n_distinct FROM pg_stats WHERE schemaname = %s AND tablename = %s "
                        "AND NOT inherited", (schema, name)).fetchall()
    published = {n for n, _, _ in info.columns}
    return sorted(a for a, d in rows if a in published and d is not None and -d >= UNIQUE_ENOUGH)


def snapshot_frame(spark, target: JdbcTarget, snapshot: str, info: TableInfo, ts: int, predicates: Sequence[str],
                   fetch_size: int = 10_000):
    """The rows ``info``'s table holds in ``snapshot`` as a DataFrame of ``(columns..., ts, 1)``, each column
    converted to the type the stream gives it (what :func:`write_table_snapshot` writes)."""
    props = {**target.properties, "sessionInitStatement": session_init(snapshot), "fetchsize": str(fetch_size)}
    df = spark.read.jdbc(target.url, snapshot_query(info), predicates=list(predicates), properties=props)
    exprs = [f"{_column_sql(f'c{i}', o, m, n)} AS {sql_ident(n)}" for i, (n, o, m) in enumerate(info.columns)]
    return df.selectExpr(*exprs, f"CAST({int(ts)} AS BIGINT) AS ts", "CAST(1 AS BIGINT) AS diff")


def write_table_snapshot(spark, target: JdbcTarget, snapshot: str, info: TableInfo, ts: int, url: str,
                         predicates: Sequence[str], fetch_size: int = 10_000, plain: Sequence[str] = ()) -> None:
    """One Spark job: every row ``info``'s table holds in ``snapshot`` as ``(columns..., ts, 1)`` Parquet parts under
    ``url`` (with Spark's ``_SUCCESS`` marker). The caller proves them (``reclock.sources.postgres.cdc.collect``)
    against ``count(*)`` under the same snapshot, which it keeps open for the whole job. The columns ``plain``
    (:func:`plain_columns`) are written without a dictionary: the same values, another encoding."""
    df = snapshot_frame(spark, target, snapshot, info, ts, predicates, fetch_size)
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key)
    spark.conf.set(key, "TIMESTAMP_MICROS")  # a timestamptz reads back as timestamp[us, UTC], as the stream's
    try:
        writer = parts_writer(df, url)
        for column in plain:
            writer = writer.option(f"parquet.enable.dictionary#{column}", "false")
        writer.parquet(url)
    except Exception as e:  # noqa: BLE001 - only a missing driver is told apart; the rest goes up as is
        if DRIVER in str(e) and ("ClassNotFound" in str(e) or "No suitable driver" in str(e)):
            raise SettingError(NO_DRIVER) from e
        raise
    finally:
        spark.conf.set(key, before)
