"""What the tests of a real Kafka Connect worker running Debezium share (``test_debezium_source``,
``test_debezium_avro``): a worker running for a module, and waiting for what it wrote."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psycopg

from reclock.dev.connect import LocalConnect
from reclock.sources.kafka.upstream import KafkaUpstream


@contextmanager
def running(worker: LocalConnect, postgres) -> Iterator[LocalConnect]:
    """``worker`` started; at the end stopped, and its replication slot dropped (a slot left behind would pin
    the shared Postgres's WAL for the rest of the session)."""
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
        with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE slot_name = %s", (worker.slot,))


def end_offset(kafka, topic: str) -> int:
    """The records in ``topic`` (every partition's end offset); 0 while it does not exist (Debezium creates a
    table's topic with its first record)."""
    try:
        return sum(o for _, o in KafkaUpstream("t", kafka.bootstrap, topic).probe_upper())
    except Exception:  # noqa: BLE001 - the topic is created with the connector's first record
        return 0


def wait_written(kafka, topic: str, at_least: int, timeout: float = 60) -> int:
    """Until ``topic`` holds ``at_least`` records (asserted within ``timeout``); how many it holds."""
    deadline = time.monotonic() + timeout
    while (n := end_offset(kafka, topic)) < at_least:
        assert time.monotonic() < deadline, f"Debezium wrote {n} records to {topic}, expected {at_least}"
        time.sleep(0.05)
    return n


def wait_flushed(worker: LocalConnect, since: float, timeout: float) -> None:
    """Until the worker flushed its source offsets after ``since`` (a ``time.time()``; it rewrites its offsets
    file when it has new offsets, on a timer every ``offset.flush.interval.ms``), asserted within ``timeout``."""
    path = Path(worker.home) / "offsets.dat"
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_mtime > since):
        assert time.monotonic() < deadline, "the Connect worker did not flush its offsets"
        time.sleep(0.05)
