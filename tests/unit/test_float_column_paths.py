"""The Parquet paths of a schema's float leaves, for which ``parts_writer`` turns dictionaries off (parquet-java's
float dictionaries merge NaNs; tests/integration/test_nan_payloads.py checks the files)."""

from pyspark.sql import types as T

from reclock.spark.jobs import float_column_paths


def test_float_column_paths_name_every_parquet_leaf():
    d, f = T.DoubleType(), T.FloatType()
    schema = T.StructType([
        T.StructField("a", d), T.StructField("b", T.StringType()), T.StructField("c", T.ArrayType(f)),
        T.StructField("s", T.StructType([T.StructField("x", f), T.StructField("y", T.IntegerType()),
                                         T.StructField("z", T.StructType([T.StructField("w", d)]))])),
        T.StructField("m", T.MapType(T.StringType(), d)), T.StructField("n", T.MapType(d, T.ArrayType(d))),
        T.StructField("i", T.LongType())])
    assert float_column_paths(schema) == ["a", "c.list.element", "s.x", "s.z.w", "m.key_value.value",
                                          "n.key_value.key", "n.key_value.value.list.element"]
    assert float_column_paths(T.StructType([T.StructField("i", T.LongType())])) == []


def test_the_raw_floats_jar_among_a_sessions_jars_goes_first_on_the_classpath():
    from reclock.spark.session import classpath_conf

    jars = "/j/spark-sql-kafka-0-10_2.13-4.2.0.jar,file:/opt/reclock/reclock-raw-floats.jar"
    assert classpath_conf(jars) == {"spark.driver.extraClassPath": "/opt/reclock/reclock-raw-floats.jar",
                                    "spark.executor.extraClassPath": "/opt/reclock/reclock-raw-floats.jar"}
    got = classpath_conf(jars.split(","), {"spark.executor.extraClassPath": "/x.jar"})
    assert got["spark.executor.extraClassPath"] == "/opt/reclock/reclock-raw-floats.jar:/x.jar"
    assert classpath_conf("/j/other.jar") == {}
