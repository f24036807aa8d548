"""docker-compose.yaml's secured Kafka, run here without Docker: ``docker/make-certs.sh`` makes the
certificates, the broker starts from ``docker/kafka/server.properties`` (its key store password from the
environment through Kafka's EnvVarConfigProvider), the kafka-init service's command (``reclock grants
--apply-kafka``, as the admin of the compose file's admin connection) creates the user and the ACLs, and a
client with the compose file's ``reclock_kafka`` connection probes a topic; without the password, or with
another principal, it is refused. Host names and paths are the compose file's, mapped to this machine."""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from reclock.config import parse_config
from reclock.dev import procs
from reclock.dev.jars import ensure_jars
from reclock.errors import KafkaAuthenticationFailed
from reclock.sources.kafka.upstream import KafkaUpstream

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
CERTS = "/etc/reclock/certs"


def _env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in COMPOSE["services"][service]["environment"].items()}


@pytest.mark.timeout(600)
def test_compose_kafka_config_certificates_and_kafka_init(stack_state, tmp_path, monkeypatch):
    certs = tmp_path / "certs"
    password = secrets.token_urlsafe(12)
    env = {**os.environ, "KAFKA_KEYSTORE_PASSWORD": password}
    subprocess.run([str(REPO / "docker" / "make-certs.sh"), str(certs)], env=env, check=True, capture_output=True)
    ports = {name: procs.free_port() for name in ("9092", "9093", "9094", "29092")}

    def here(text: str) -> str:
        """The compose file's names on this machine: its certificates' folder, kafka:PORT, localhost:29092."""
        text = text.replace(CERTS, str(certs))
        for port, free in ports.items():
            text = text.replace(f"kafka:{port}", f"127.0.0.1:{free}").replace(f"localhost:{port}", f"127.0.0.1:{free}")
            text = text.replace(f"://:{port}", f"://127.0.0.1:{free}")
        return text

    home = tmp_path / "kafka"
    home.mkdir()
    props = here((REPO / "docker" / "kafka" / "server.properties").read_text())
    props = props.replace("log.dirs=/var/lib/kafka/data", f"log.dirs={home / 'data'}")
    (home / "server.properties").write_text(props)
    java = ["java", "-Xmx384m", "-cp", str(ensure_jars(stack_state, "kafka") / "*")]
    cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    procs.run([*java, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c",
               str(home / "server.properties"), "--standalone"], "format", env=env, timeout=180)
    pidfile = home / "kafka.pid"
    procs.spawn("compose kafka", [*java, "kafka.Kafka", str(home / "server.properties")], log=home / "kafka.out",
                pidfile=pidfile, env=env)
    try:
        procs.wait_until("compose kafka", lambda: procs.port_open(ports["9092"]), 240, log=home / "kafka.out",
                         alive=lambda: procs.read_pid(pidfile) is not None)
        compose = _env("airflow-scheduler")
        admin_conn = here(_env("kafka-init")["AIRFLOW_CONN_RECLOCK_KAFKA_ADMIN"]).replace(
            "/tmp/admin.key", str(certs / "admin.key"))  # kafka-init copies the key there for its user
        kafka_pw = secrets.token_urlsafe(12)
        reclock_conn = here(compose["AIRFLOW_CONN_RECLOCK_KAFKA"]).replace(
            "${RECLOCK_KAFKA_PASSWORD:?set RECLOCK_KAFKA_PASSWORD in .env}", kafka_pw)
        config = tmp_path / "reclock.yaml"
        config.write_text(yaml.safe_dump({"sources": {"c_orders": {
            "kafka": {"topic": "c_orders", "connection": "reclock_kafka"}, "format": {"type": "text"}}}}))
        init = " ".join(COMPOSE["services"]["kafka-init"]["command"])
        args = init[init.index("reclock grants") + len("reclock grants"):].split()
        out = subprocess.run([sys.executable, "-m", "reclock.cli", "grants", "--config", str(config), *args],
                             env={**env, "AIRFLOW_CONN_RECLOCK_KAFKA_ADMIN": admin_conn,
                                  "RECLOCK_KAFKA_PASSWORD": kafka_pw}, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        from confluent_kafka.admin import AdminClient, NewTopic

        from reclock.kafka_client import from_connection

        c = json.loads(admin_conn)
        admin = from_connection("admin", None, None, None, None, c["extra"])
        client = AdminClient(admin.librdkafka())  # kept: its futures fail when it is collected
        client.create_topics([NewTopic("c_orders", 2, 1)])["c_orders"].result(30)
        monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA", reclock_conn)
        monkeypatch.delenv("RECLOCK_BOOTSTRAP", raising=False)
        from reclock.settings import find_kafka

        spec = parse_config(yaml.safe_load(config.read_text())).source("c_orders")
        kafka = find_kafka(spec.upstream, "source c_orders")
        assert kafka.protocol == "SASL_SSL" and kafka.ca_pem == (certs / "ca.pem").read_text()
        assert KafkaUpstream("c_orders", kafka, "c_orders").probe_upper().get(0) == 0
        wrong = json.loads(reclock_conn)
        wrong["password"] = "not-the-password"
        monkeypatch.setenv("AIRFLOW_CONN_RECLOCK_KAFKA", json.dumps(wrong))
        with pytest.raises(KafkaAuthenticationFailed):
            KafkaUpstream("c_orders", find_kafka(spec.upstream, "source c_orders"), "c_orders").probe_upper()
        for leaked in (password, kafka_pw):
            assert leaked not in (home / "kafka.out").read_text() + out.stdout + out.stderr
    finally:
        procs.stop(pidfile, timeout=30)
