"""``docker-compose.yaml`` against the code (Docker does not run here): image versions are the project's pins,
every service is on one network with a healthcheck, the Spark Connect server and the Airflow containers' Spark
get the library's Spark settings, every Airflow connection the code reads is defined, no secret is literal."""

from __future__ import annotations

import json
import re
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from reclock.config import load_config
from reclock.connections import CONNECTIONS
from reclock.dev.spark import ORPHANS_CONF
from reclock.persist.objectstore import S3Settings, spark_s3a_conf
from reclock.spark.session import SESSION_CONF
from reclock.spark.session import SPARK_CONF

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
SERVICES: dict = COMPOSE["services"]
AIRFLOW = ("airflow-init", "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
SPARK = ("spark-master", "spark-worker-1", "spark-worker-2", "spark-connect")
SPARK_DEFAULTS = REPO / "docker" / "spark-defaults.conf"

MINIO = S3Settings("https://minio:9000", "us-east-1", "key", "secret", path_style=True)
S3A = spark_s3a_conf(MINIO)
"""The s3a settings the library gives a Spark driver for the parts on the compose file's MinIO (what the
cluster tests run with, on moto's endpoint)."""

SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY\b|_KEY_ID\b", re.I)
REFERENCE = re.compile(r"^\$\{([A-Z0-9_]+):\?[^}]+\}$")


def _pins() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {re.split(r"[\[=<>]", d)[0]: d.split("==")[1] for d in deps if "==" in d}
    props = ET.parse(REPO / "pom.xml").getroot().find("{http://maven.apache.org/POM/4.0.0}properties")
    pins.update({el.tag.split("}")[1]: el.text for el in props})
    import pyspark

    (client,) = (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")
    pins["hadoop"] = re.search(r"hadoop-client-api-(.+)\.jar", client.name).group(1)  # Spark's own Hadoop
    return pins


PINS = _pins()


def _env(service: str) -> dict[str, str]:
    env = SERVICES[service].get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def _confs(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")


def _spark_defaults() -> dict[str, str]:
    """spark-defaults.conf as Spark reads it (a Java properties file: a backslash escapes the next character)."""
    lines = [line.split(None, 1) for line in SPARK_DEFAULTS.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {k: re.sub(r"\\(.)", r"\1", v.strip()) for k, v in lines}


def test_images_are_the_projects_pins():
    assert (PINS["apache-airflow"], PINS["pyspark"], PINS["kafka.version"]) == ("3.3.2", "4.2.0", "4.1.1")
    for name in AIRFLOW:
        assert SERVICES[name]["build"]["args"]["AIRFLOW_VERSION"] == PINS["apache-airflow"], name
        assert SERVICES[name]["image"].endswith(":" + PINS["apache-airflow"]), name
    dockerfile = (REPO / SERVICES["airflow-scheduler"]["build"]["dockerfile"]).read_text()
    assert f"ARG AIRFLOW_VERSION={PINS['apache-airflow']}" in dockerfile
    assert "FROM apache/airflow:${AIRFLOW_VERSION}" in dockerfile
    for name in SPARK:
        assert SERVICES[name]["image"] == f"apache/spark:{PINS['pyspark']}", name
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{PINS['kafka.version']}"
    packages = {
        "connect": _confs(["--conf", "spark.jars.packages=" + _after(SERVICES["spark-connect"]["command"], "--packages")]),
        "airflow": _spark_defaults(),
    }
    for where, conf in packages.items():
        coordinates = conf["spark.jars.packages"].split(",")
        assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{PINS['spark.version']}" in coordinates, where
        assert f"org.apache.hadoop:hadoop-aws:{PINS['hadoop']}" in coordinates, where
        assert f"org.postgresql:postgresql:{PINS['postgresql.jdbc.version']}" in coordinates, where  # Postgres snapshots on Spark
    assert PINS["spark.version"] == PINS["pyspark"] and PINS["hadoop"] == "3.5.0"


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_every_service_is_on_the_network_with_a_healthcheck_and_waits_on_conditions():
    (network,) = COMPOSE["networks"]
    for name, service in SERVICES.items():
        assert service.get("networks") == [network], name
        one_shot = name.endswith("-init")
        assert one_shot or "healthcheck" in service, name
        for dep, cond in (service.get("depends_on") or {}).items():
            assert dep in SERVICES and cond["condition"] in (
                "service_healthy", "service_completed_successfully"), (name, dep)
            assert cond["condition"] == ("service_completed_successfully" if dep.endswith("-init")
                                         else "service_healthy"), (name, dep)
    for port in (p for s in SERVICES.values() for p in s.get("ports", [])):
        assert port.startswith("127.0.0.1:"), port


def test_spark_gets_the_librarys_session_settings_and_s3a():
    assert set(SESSION_CONF.items()) <= set(SPARK_CONF.items())
    connect = _confs(SERVICES["spark-connect"]["command"])
    assert set(SPARK_CONF.items()) <= set(connect.items())
    assert set(ORPHANS_CONF.items()) <= set(connect.items())  # a killed task's jobs end within a minute
    defaults = _spark_defaults()
    for conf in (connect, defaults):
        assert set(S3A.items()) <= set(conf.items()), {k: v for k, v in S3A.items() if conf.get(k) != v}
    for name in (*SPARK[1:], *AIRFLOW):  # executors and drivers sign with the environment's credentials
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(_env(name)), name
    for name in AIRFLOW:
        assert _env(name)["SPARK_CONF_DIR"] + "/spark-defaults.conf" in {
            v.split(":")[1] for v in SERVICES[name]["volumes"]}, name


def test_every_connection_the_code_reads_is_defined():
    for name in AIRFLOW:
        env = _env(name)
        conns = {k[len("AIRFLOW_CONN_"):].lower(): json.loads(v) for k, v in env.items()
                 if k.startswith("AIRFLOW_CONN_")}
        assert set(CONNECTIONS) | {"reclock_s3"} <= set(conns), name
        named = {spec.upstream.connection for spec in load_config(REPO / "include" / "reclock.yaml").sources.values()
                 if spec.kind == "postgres" and spec.upstream.connection}
        assert named and all(conns[c]["conn_type"] == "postgres" for c in named), (name, named)  # demo_shop's
        assert conns["reclock_spark"]["conn_type"] == "spark_connect"
        assert conns["reclock_spark_submit"]["conn_type"] == "spark"
        assert conns["reclock_s3"]["conn_type"] == "aws" and conns["reclock_s3"]["extra"]["endpoint_url"]
        assert env["RECLOCK_BLOB_URL"] == "s3://reclock/parts"
        assert env["RECLOCK_CONFIG"].startswith("/opt/airflow/include/")
    bucket = "s3://reclock/parts".split("/")[2]
    assert f"mb --ignore-existing reclock/{bucket}" in " ".join(SERVICES["minio-init"]["command"])
    assert "-c wal_level=logical" in " ".join(SERVICES["postgres"]["command"])


def _references(value: str) -> list[str]:
    return re.findall(r"\$\{[^}]*\}", value)


def _secrets(name: str, value: str):
    """The secret values in one environment entry: by the variable's name, in a JSON connection, in a URL."""
    if SECRET_NAME.search(name) and not name.endswith("_FILE"):  # a file's path is not its content
        yield name, value
    if name.startswith("AIRFLOW_CONN_"):
        conn = json.loads(value)
        if "password" in conn:
            yield f"{name}.password", conn["password"]
    for userinfo in re.findall(r"://[^/:@\s]+:([^@\s]+)@", value):
        yield f"{name} (URL)", userinfo


def test_no_secret_is_literal_and_env_example_names_them_all():
    example = dict(line.split("=", 1) for line in (REPO / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    found = 0
    for service in SERVICES:
        for name, value in _env(service).items():
            for what, secret in _secrets(name, value):
                found += 1
                assert REFERENCE.match(secret), f"{service}: {what} is not a ${{VAR:?...}} reference"
            for ref in _references(value):
                var = re.match(r"\$\{([A-Z0-9_]+)", ref).group(1)
                assert ":?" in ref and var in example, (service, name, ref)
    assert found >= 20
    assert all(v in ("replace-me", "reclock") for v in example.values())  # placeholders only
    text = (REPO / "docker-compose.yaml").read_text()
    for var, placeholder in example.items():
        assert f"${{{var}:?" in text, var


@pytest.mark.parametrize("folder", ["dags", "plugins", "include", "spark_jobs"])
def test_the_project_folders_are_mounted(folder):
    assert (REPO / folder).is_dir()
    for name in AIRFLOW:
        assert f"./{folder}:/opt/airflow/{folder}" in SERVICES[name]["volumes"], name
    assert (REPO / "include" / "reclock.yaml").is_file() and (REPO / "spark_jobs" / "rebuild.py").is_file()


def test_every_airflow_service_retries_as_the_dev_stack_and_the_docs_say():
    from reclock.orchestration.deployment import AIRFLOW_ENV, TASK_RETRIES, TASK_RETRY_DELAY_S

    for service in AIRFLOW:
        env = _env(service)
        assert {k: env.get(k) for k in AIRFLOW_ENV} == AIRFLOW_ENV, service
    ops = (REPO / "docs" / "operations.md").read_text()
    assert f"set {TASK_RETRIES} retries {TASK_RETRY_DELAY_S} s apart" in ops


# -- security: every service authenticated and encrypted, each principal with exactly what it needs -------------

CERTS = "/etc/reclock/certs/"


def _conns(service: str = "airflow-scheduler") -> dict[str, dict]:
    return {k[len("AIRFLOW_CONN_"):].lower(): json.loads(v) for k, v in _env(service).items()
            if k.startswith("AIRFLOW_CONN_")}


def test_every_connection_is_authenticated_and_encrypted():
    conns = _conns()
    for name in ("reclock_postgres", "reclock_demo_shop"):
        assert conns[name]["extra"] == {"sslmode": "verify-full", "sslrootcert": CERTS + "ca.pem"}, name
    assert (conns["reclock_postgres"]["login"], conns["reclock_demo_shop"]["login"]) == ("reclock_app", "reclock_cdc")
    kafka = conns["reclock_kafka"]
    assert kafka["extra"]["security.protocol"] == "SASL_SSL" and kafka["extra"]["sasl.mechanism"] == "SCRAM-SHA-512"
    assert kafka["login"] == "reclock" and kafka["extra"]["ssl.ca.location"] == CERTS + "ca.pem"
    from reclock.kafka_client import SECURITY_KEYS

    assert set(kafka["extra"]) <= SECURITY_KEYS | {"bootstrap.servers"}  # what reclock.kafka_client reads
    spark = conns["reclock_spark"]
    assert spark["extra"] == {"use_ssl": True} and spark["password"].startswith("${SPARK_CONNECT_TOKEN:?")
    assert conns["reclock_s3"]["extra"]["endpoint_url"].startswith("https://")
    assert conns["reclock_s3"]["extra"]["verify"] == CERTS + "ca.pem"
    env = _env("airflow-scheduler")
    assert "sslmode=verify-full&sslrootcert=" + CERTS + "ca.pem" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    from reclock.orchestration.deployment import metadata_db_env

    pw = "${AIRFLOW_DB_PASSWORD:?set AIRFLOW_DB_PASSWORD in .env}"  # the URLs with the password's placeholder
    db = metadata_db_env(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace(pw, "PW"))  # the async URL too
    assert {k: (env.get(k) or "").replace(pw, "PW") for k in db} == db
    assert env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] == CERTS + "ca.pem" and env["AWS_CA_BUNDLE"] == CERTS + "ca.pem"
    assert "reclock_kafka_admin" not in conns  # the admin certificate is kafka-init's alone
    assert not any("admin.key" in v for v in SERVICES["airflow-scheduler"]["volumes"])


def test_postgres_accepts_only_tls_and_its_roles_have_exactly_the_grants():
    from reclock.grants import cdc_grants, consensus_grants

    hba = [line.split() for line in (REPO / "docker" / "postgres" / "pg_hba.conf").read_text().splitlines()
           if line.strip() and not line.startswith("#")]
    assert all(kind in ("local", "hostssl") or method == "reject" for kind, *_, method in hba)
    command = " ".join(SERVICES["postgres"]["command"])
    assert "-c ssl=on" in command and "-c hba_file=/etc/reclock/pg_hba.conf" in command
    init = (REPO / "docker" / "postgres-init.sh").read_text()
    statements = {s.strip() for s in init.split(";")}
    config = load_config(REPO / "include" / "reclock.yaml")
    shop = config.source("demo_shop").upstream
    for sql in (*consensus_grants("reclock_app", "reclock"), *cdc_grants("reclock_cdc", shop.tables, "demo_shop")):
        assert any(s.endswith(sql) for s in statements), sql
    assert f"CREATE PUBLICATION {shop.publication} FOR TABLE {', '.join(shop.tables)}" in init
    for word in ("SUPERUSER", "CREATEDB", "CREATEROLE", "GRANT ALL"):
        assert word not in init
    assert "\\getenv" in init and "-v reclock_password" not in init  # passwords never on psql's command line


def test_kafka_has_no_plaintext_listener_and_an_authorizer():
    props = dict(line.split("=", 1) for line in (REPO / "docker" / "kafka" / "server.properties").read_text().splitlines()
                 if line and not line.startswith("#"))
    assert "PLAINTEXT" not in props["listener.security.protocol.map"]
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:broker;User:admin"
    assert props["ssl.keystore.password"] == "${env:KAFKA_KEYSTORE_PASSWORD}"
    init = " ".join(SERVICES["kafka-init"]["command"])
    assert "reclock grants --apply-kafka reclock_kafka_admin" in init and "--scram-password-env" in init
    assert SERVICES["airflow-scheduler"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"


def test_spark_connect_asks_for_a_token_behind_tls():
    assert _env("spark-connect")["SPARK_CONNECT_AUTHENTICATE_TOKEN"].startswith("${SPARK_CONNECT_TOKEN:?")
    tls = (REPO / "docker" / "spark-connect-tls.conf").read_text()
    assert "listen 15443 ssl;" in tls and "grpc_pass grpc://spark-connect:15002;" in tls
    assert _env("spark-connect")["AWS_ENDPOINT_URL"].startswith("https://")


def test_no_secret_on_a_command_line():
    """Secrets reach processes in their environment: no ${VAR} of a secret in any service's command or
    entrypoint (process lists and logs show them)."""
    example = [line.split("=", 1)[0] for line in (REPO / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")]
    for name, service in SERVICES.items():
        argv = " ".join(str(x) for key in ("command", "entrypoint") for x in (service.get(key) or []))
        for var in example:
            assert f"${{{var}" not in argv and f"$${var}" not in argv, (name, var)


def test_the_certificates_compose_mounts_are_the_ones_make_certs_makes(tmp_path):
    import subprocess

    subprocess.run([str(REPO / "docker" / "make-certs.sh"), str(tmp_path)], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "KAFKA_KEYSTORE_PASSWORD": "test-only"})
    mounted = {v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", [])
               if isinstance(v, str) and v.startswith("./docker/certs/")}
    assert mounted
    for path in mounted:
        assert (tmp_path / path[len("./docker/certs/"):]).exists(), path
    assert (REPO / ".gitignore").read_text().count("docker/certs") == 1


def test_airflow_recovers_a_dead_scheduler_or_task_as_the_dev_stack_does():
    """Airflow's recovery settings (docs/failures.md): the compose file's are the dev stack's ``HA_SETTINGS``,
    and failed steps are retried."""
    from reclock.dev.airflow import HA_SETTINGS

    for name in AIRFLOW:
        env = SERVICES[name]["environment"]
        assert {k: str(env.get(k)) for k in HA_SETTINGS} == HA_SETTINGS, name
        assert int(env["AIRFLOW__CORE__DEFAULT_TASK_RETRIES"]) >= 3, name
