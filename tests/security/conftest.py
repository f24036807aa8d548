"""The secured services of the security tests, started once per test session: a Kafka broker with
SASL/SCRAM-SHA-512 over TLS, mutual TLS and ACLs; Postgres accepting only TLS with SCRAM; moto's S3 over
TLS; all with certificates of a CA made here (``reclock.dev.tls``), beside the plain services of the other
tests. Principals: ``reclock`` (SCRAM, and a client certificate), with only the ACLs a test grants it."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass

import psycopg
import pytest

from reclock.dev.kafka import LocalKafka
from reclock.dev.postgres import LocalPostgres
from reclock.dev.s3 import LocalS3
from reclock.dev.state import StackState
from reclock.dev.tls import LocalCA
from reclock.grants import cdc_grants, consensus_grants

_n = itertools.count()
KAFKA_USER = "reclock"


@dataclass
class Secured:
    state: StackState
    kafka: LocalKafka
    postgres: LocalPostgres
    s3: LocalS3

    @property
    def ca(self) -> LocalCA:
        return LocalCA(self.state)

    @property
    def kafka_password(self) -> str:
        return self.state.secret("secure_kafka_reclock_password")

    @property
    def consensus_password(self) -> str:
        return self.state.secret("secure_pg_consensus_password")

    @property
    def cdc_password(self) -> str:
        return self.state.secret("secure_pg_cdc_password")

    def secrets(self) -> dict[str, str]:
        """Every secret the tests use, by what it is (the leak tests grep for them)."""
        s3 = self.s3.settings()
        return {"kafka password": self.kafka_password, "consensus password": self.consensus_password,
                "cdc password": self.cdc_password, "postgres superuser password": self.postgres.password,
                "s3 secret key": s3.secret_key,
                "kafka client key": self.kafka.mtls_config(KAFKA_USER).key_pem.split("\n")[1]}

    def kafka_connection(self, password: str | None = None, **extra: str) -> str:
        """``AIRFLOW_CONN_...`` JSON of the ``reclock`` principal: SCRAM-SHA-512 over TLS, the test CA."""
        return json.dumps({"conn_type": "kafka", "login": KAFKA_USER,
                           "password": self.kafka_password if password is None else password,
                           "extra": {"bootstrap.servers": self.kafka.bootstrap, "security.protocol": "SASL_SSL",
                                     "sasl.mechanism": "SCRAM-SHA-512", "ssl.ca.location": str(self.ca.cert),
                                     **extra}})

    def mtls_connection(self) -> str:
        """``AIRFLOW_CONN_...`` JSON of the ``reclock`` principal with its client certificate (mutual TLS)."""
        issued = self.ca.issue(f"kafka-client-{KAFKA_USER}", KAFKA_USER)
        return json.dumps({"conn_type": "kafka", "extra": {
            "bootstrap.servers": self.kafka.mtls_bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca.cert), "ssl.certificate.location": str(issued.cert),
            "ssl.key.location": str(issued.key)}})

    def consensus_db(self) -> str:
        """A new database whose consensus role ``reclock_app`` has exactly :func:`consensus_grants`; its DSN
        (TLS, verify-full)."""
        name = f"sec{os.getpid()}_{next(_n)}"
        with psycopg.connect(self.postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        with psycopg.connect(self.postgres.dsn(name), autocommit=True) as conn:
            for sql in consensus_grants("reclock_app", name):
                conn.execute(sql)
        return self.postgres.dsn(name, "reclock_app", self.consensus_password)

    def upstream_db(self, setup_sql: str, tables: list[str], publication: str = "pub") -> tuple[str, str]:
        """A new upstream database set up by its owner (``setup_sql``, then ``publication`` over
        ``tables``), with :func:`cdc_grants` for ``reclock_cdc``; (the owner's DSN, the CDC role's DSN)."""
        name = f"up{os.getpid()}_{next(_n)}"
        with psycopg.connect(self.postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        owner = self.postgres.dsn(name)
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(setup_sql)
            conn.execute(f"CREATE PUBLICATION {publication} FOR TABLE {', '.join(tables)}")
            for sql in cdc_grants("reclock_cdc", tables, name):
                conn.execute(sql)
        return owner, self.postgres.dsn(name, "reclock_cdc", self.cdc_password)


@pytest.fixture(scope="session")
def secured(stack_state: StackState, stops):
    """The secured services (see the module)."""
    kafka = LocalKafka(stack_state, heap="512m", secure=True, name="kafka_secure")
    postgres = LocalPostgres(stack_state, fast=True, tls=True, name="postgres_tls")
    s3 = LocalS3(stack_state, tls=True, name="s3_tls")
    s = Secured(stack_state, kafka, postgres, s3)
    started = []
    try:
        for service in (postgres, kafka, s3):
            service.start()
            started.append(service)
        kafka.add_user(KAFKA_USER, s.kafka_password)
        postgres.create_role("reclock_app", s.consensus_password)
        postgres.create_role("reclock_cdc", s.cdc_password)
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
    yield s
    for service in started:  # at the session's end, beside the others (tests/conftest.py stops)
        stops.later(service.name, service.stop)

