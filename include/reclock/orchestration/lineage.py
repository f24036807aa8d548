"""OpenLineage from Reclock's tasks, through Airflow's OpenLineage provider.

Every Reclock task is a :class:`ReclockTask` (a ``PythonOperator`` running a plain function of the library);
while it runs, the function reports the datasets it reads and writes (:func:`reads`, :func:`writes`), and the
provider's listener asks the operator for them when the task ends (``get_openlineage_facets_on_complete``,
``..._on_failure``): no extractor to register, nothing sent when no transport is configured.

=====================  =========================================  ==========================================
task                   inputs                                     outputs
=====================  =========================================  ==========================================
``ingest__*`` (write)  the source's upstream (below)               --
``ingest__*`` (append) --                                         the source's collections
``cycle``, ``cycles``  the source's upstream                      the collections
``rebuild__*``         the source's upstream                      the collections
``sink__*``            the collection                             the sink's topic, or its Iceberg table
=====================  =========================================  ==========================================

Dataset names (``reclock.datasets``; a kind names its upstream's, ``SourceRuntime.lineage_inputs``) follow
OpenLineage's naming: a Kafka topic ``kafka://<first broker>`` / ``<topic>``; a Postgres
table ``postgres://<host>:<port>`` / ``<database>.<schema>.<table>``; an S3 source's objects ``s3://<bucket>``
/ ``<prefix>`` (a local folder: ``file`` / its path); a Kinesis stream ``kinesis://<endpoint host>`` (AWS:
``kinesis.<region>.amazonaws.com``) / ``<stream>``; a collection ``reclock://<consensus
host>:<port>/<database>`` / ``<collection>`` (its truth: the shard in the consensus Postgres); an Iceberg
table ``<warehouse URL>`` / ``<namespace>.<table>``. No credential is part of a name.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Iterable

from airflow.providers.standard.operators.python import PythonOperator

from reclock.datasets import DatasetName, collection, iceberg_table, kafka_topic, postgres_table

__all__ = ["DatasetName", "Lineage", "ReclockTask", "collection", "iceberg_table", "kafka_topic", "postgres_table",
           "reads", "writes"]


@dataclass
class Lineage:
    """What a running task read and wrote (in the order reported, each once)."""

    inputs: list[DatasetName] = field(default_factory=list)
    outputs: list[DatasetName] = field(default_factory=list)

    def operator_lineage(self):
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import Dataset

        return OperatorLineage(inputs=[Dataset(namespace=d.namespace, name=d.name) for d in self.inputs],
                               outputs=[Dataset(namespace=d.namespace, name=d.name) for d in self.outputs])


_CURRENT: contextvars.ContextVar[Lineage | None] = contextvars.ContextVar("reclock_lineage", default=None)


def _add(where: list[DatasetName], datasets: Iterable[DatasetName]) -> None:
    for d in datasets:
        if d not in where:
            where.append(d)


def reads(*datasets: DatasetName) -> None:
    """Report datasets the running :class:`ReclockTask` reads (nothing outside one)."""
    lineage = _CURRENT.get()
    if lineage is not None:
        _add(lineage.inputs, datasets)


def writes(*datasets: DatasetName) -> None:
    """Report datasets the running :class:`ReclockTask` writes."""
    lineage = _CURRENT.get()
    if lineage is not None:
        _add(lineage.outputs, datasets)


class ReclockTask(PythonOperator):
    """A task of a Reclock DAG: ``python_callable`` runs with a :class:`Lineage` to report to, which the
    OpenLineage provider reads when the task ends."""

    def execute(self, context):
        self.lineage = Lineage()
        token = _CURRENT.set(self.lineage)
        try:
            return super().execute(context)
        finally:
            _CURRENT.reset(token)

    def get_openlineage_facets_on_complete(self, task_instance):
        return getattr(self, "lineage", Lineage()).operator_lineage()

    def get_openlineage_facets_on_failure(self, task_instance):
        return self.get_openlineage_facets_on_complete(task_instance)
