"""JVM jars from Maven Central, resolved by the repo's ``pom.xml`` into ``.reclock/jars/``."""

from __future__ import annotations

import shutil
from pathlib import Path

from reclock.dev.procs import run
from reclock.dev.state import REPO_ROOT, StackState
from reclock.errors import StackError
from reclock.spark.jobs import RAW_FLOATS_JAR

# how many jars each profile yields at least (a partial copy from an interrupted run is redone)
_EXPECTED = {"kafka": 40, "spark": 6, "s3": 35, "connect": 81}
_MAVEN_PROFILE = {"kafka": "broker", "spark": "spark", "s3": "s3", "connect": "connect"}
PROFILES = ("kafka", "spark", "s3", "registry", "connect")
"""The folders of ``.reclock/jars`` that ``reclock dev install`` resolves (``connect``: the suite's Debezium
test runs a ``reclock.dev.connect`` worker; 81 jars, ~45 MB with Apicurio's Avro converter)."""

COMMITTER_PROJECT = REPO_ROOT / "jvm" / "committer"
"""The Maven project of Reclock's direct output committer for parts on S3 (one class, see its pom.xml)."""
COMMITTER_JAR = "reclock-direct-committer.jar"
RAW_FLOATS_PROJECT = REPO_ROOT / "jvm" / "rawfloats"
"""The Maven project of Reclock's raw-floats jar: parquet-java's float writer keeping NaN payloads (see its
pom.xml and ``reclock.spark.jobs``)."""
DBZ_EMBEDDED_PROJECT = REPO_ROOT / "jvm" / "dbzembedded"
"""The Maven project of the Debezium embedded engine's benchmark main (``benchmarks.pg_debezium``, see its pom.xml)."""
DBZ_EMBEDDED_JAR = "reclock-dbz-embedded.jar"
REGISTRY_PROJECT = REPO_ROOT / "jvm" / "registry"
"""The Maven project that builds the Schema Registry for tests (Apicurio Registry, see its pom.xml)."""
REGISTRY_RUNNER = "reclock-registry-runner.jar"
_REGISTRY_LIBS = 250  # the registry's lib/ holds ~290 jars


def ensure_jars(state: StackState, profile: str) -> Path:
    """Return ``.reclock/jars/<profile>``, running ``mvn -P <profile> dependency:copy-dependencies`` if the
    folder is missing or incomplete. ``profile`` is ``kafka`` (the broker), ``spark`` (Spark's Kafka connector)
    ``s3`` (S3A: hadoop-aws and the few AWS SDK modules it uses, see ``pom.xml``) or ``connect`` (Kafka
    Connect with Debezium's Postgres connector, ``reclock.dev.connect``)."""
    if profile == "registry":
        return ensure_registry(state)
    folder = state.jars / profile
    if folder.is_dir() and len([p for p in folder.glob("*.jar") if p.name != COMMITTER_JAR]) >= _EXPECTED[profile]:
        return _with_committer(state, folder) if profile == "s3" else folder
    if shutil.which("mvn") is None:
        raise StackError("Maven (`mvn`) is needed to fetch the JVM jars; install Debian's `maven` package")
    maven_profile = _MAVEN_PROFILE[profile]
    run(["mvn", "-q", "-B", "-P", maven_profile, "dependency:copy-dependencies",
         f"-Djars.dir={state.jars}"], f"resolve {profile} jars with Maven", cwd=REPO_ROOT, timeout=900)
    if len(list(folder.glob("*.jar"))) < _EXPECTED[profile]:
        raise StackError(f"Maven finished but {folder} holds too few jars")
    return _with_committer(state, folder) if profile == "s3" else folder


def raw_floats_jar(state: StackState) -> str:
    """``.reclock/jars/rawfloats/reclock-raw-floats.jar``, built by ``mvn package`` over ``jvm/rawfloats`` when
    missing or older than a file of that project (two classes, no dependency to fetch but slf4j's API)."""
    return str(_maven_jar(state, RAW_FLOATS_PROJECT, state.jars / "rawfloats" / RAW_FLOATS_JAR,
                          "Reclock's raw-floats jar"))


def _maven_jar(state: StackState, project: Path, jar: Path, what: str) -> Path:
    """``jar``, built by ``mvn package`` over ``project`` (whose pom writes it under ``-Djars.dir``) when
    missing or older than a file of that project."""
    if jar.is_file() and all(p.stat().st_mtime <= jar.stat().st_mtime for p in project.rglob("*") if p.is_file()):
        return jar
    if shutil.which("mvn") is None:
        raise StackError(f"Maven (`mvn`) is needed to build {what}; install Debian's `maven` package")
    run(["mvn", "-q", "-B", "-f", str(project / "pom.xml"), "package", f"-Djars.dir={state.jars}"],
        f"build {what} with Maven", cwd=project, timeout=900)
    if not jar.is_file():
        raise StackError(f"Maven finished but {jar} is not there")
    return jar


def dbz_embedded_jars(state: StackState) -> Path:
    """``.reclock/jars/dbzembedded``: ``reclock-dbz-embedded.jar`` (``dev.reclock.bench.EmbeddedCount``) and
    its dependencies (Debezium's embedded engine and Postgres connector 3.6.1.Final, ~70 jars), built by
    ``mvn package dependency:copy-dependencies`` over ``jvm/dbzembedded`` when missing or older than a file of
    that project."""
    folder = state.jars / "dbzembedded"
    jar = folder / DBZ_EMBEDDED_JAR
    project = DBZ_EMBEDDED_PROJECT
    if (jar.is_file() and len(list(folder.glob("*.jar"))) >= 60
            and all(p.stat().st_mtime <= jar.stat().st_mtime for p in project.rglob("*") if p.is_file())):
        return folder
    if shutil.which("mvn") is None:
        raise StackError("Maven (`mvn`) is needed to build the Debezium embedded engine's benchmark; install "
                         "Debian's `maven` package")
    run(["mvn", "-q", "-B", "-f", str(project / "pom.xml"), "package", "dependency:copy-dependencies",
         f"-Djars.dir={state.jars}"], "build the Debezium embedded engine's benchmark with Maven", cwd=project,
        timeout=900)
    if not jar.is_file():
        raise StackError(f"Maven finished but {jar} is not there")
    return folder


def _with_committer(state: StackState, folder: Path) -> Path:
    """``folder`` (the S3 jars) with Reclock's direct committer in it, built by ``mvn package`` over
    ``jvm/committer`` when missing or older than a file of that project (a few seconds; Hadoop's API is
    ``provided``)."""
    _maven_jar(state, COMMITTER_PROJECT, folder / COMMITTER_JAR, "Reclock's committer")
    return folder


def ensure_registry(state: StackState) -> Path:
    """Return ``.reclock/jars/registry`` (``reclock-registry-runner.jar`` and its ``lib/``), building it with
    ``mvn package`` over ``jvm/registry/pom.xml`` when missing: Apicurio Registry's app from Maven Central,
    made runnable by Quarkus's build (a few minutes the first time, ~130 MB)."""
    folder = state.jars / "registry"
    if (folder / REGISTRY_RUNNER).is_file() and len(list((folder / "lib").glob("*.jar"))) >= _REGISTRY_LIBS:
        return folder
    if shutil.which("mvn") is None:
        raise StackError("Maven (`mvn`) is needed to build the Schema Registry; install Debian's `maven` package")
    (folder / REGISTRY_RUNNER).unlink(missing_ok=True)
    run(["mvn", "-q", "-B", "-gs", str(REGISTRY_PROJECT / "settings.xml"), "-f", str(REGISTRY_PROJECT / "pom.xml"),
         "package", f"-Dregistry.dir={folder}"], "build the Schema Registry (Apicurio) with Maven",
        cwd=REGISTRY_PROJECT, timeout=1800)
    if not (folder / REGISTRY_RUNNER).is_file():
        raise StackError(f"Maven finished but {folder / REGISTRY_RUNNER} is not there")
    # what the build leaves beside the runner and lib/ is not needed to run it (the app's classes twice)
    for leftover in ("classes", "maven-archiver", "dependency-maven-plugin-markers"):
        shutil.rmtree(folder / leftover, ignore_errors=True)
    (folder / "reclock-registry.jar").unlink(missing_ok=True)
    return folder


def spark_kafka_jars(state: StackState) -> list[str]:
    """The jars Spark's Kafka source (and ``from_avro``, and a Postgres snapshot's JDBC reads) need beyond the
    pyspark wheel, as absolute paths; and Reclock's raw-floats jar (which ``reclock.spark.session.
    classpath_conf`` puts first on the classpath too)."""
    return sorted(str(p) for p in ensure_jars(state, "spark").glob("*.jar")) + [raw_floats_jar(state)]


def spark_s3a_jars(state: StackState) -> list[str]:
    """The jars Spark needs to read and write ``s3a://`` (beyond the pyspark wheel), as absolute paths."""
    return sorted(str(p) for p in ensure_jars(state, "s3").glob("*.jar"))
