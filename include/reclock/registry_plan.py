"""Which writer schemas a slice of wire-format records may carry, and how each resolves to the collection's
reader schema: asked of the registry in the driver, before the Spark job (``reclock.spark.registry_decode``
turns an :class:`AvroPlan` into the job's expressions)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

from reclock.avro_schema import problem
from reclock.errors import SchemaNotFound
from reclock.schema_registry import RegistryClient

OK_FIELD = "_reclock_ok"
"""A boolean field with default ``true`` that the reader schema gets: every record that decodes has it set
(its writer lacks it, so Avro fills the default), and ``from_avro``'s PERMISSIVE mode leaves it null for
one that does not, so an all-null record stays distinguishable from a malformed one."""


@dataclass(frozen=True)
class AvroWriter:
    """A writer schema that may appear: its registry id, its JSON text, and, when the reader cannot read it,
    why (records of such a writer are decode errors carrying that reason)."""

    schema_id: int
    schema: str
    unreadable: str | None = None


@dataclass(frozen=True)
class AvroPlan:
    """How one slice decodes: the reader schema (the collection's, Avro JSON) and every known writer."""

    reader: str
    writers: tuple[AvroWriter, ...]
    missing: tuple[int, ...] = ()  # ids the registry answered it does not hold

    @property
    def ids(self) -> tuple[int, ...]:
        """Every id the plan has an answer for (a writer, or the registry's "no such schema")."""
        return tuple(sorted({w.schema_id for w in self.writers} | set(self.missing)))

    @property
    def reader_with_ok(self) -> str:
        schema = json.loads(self.reader)
        return json.dumps(dict(schema, fields=schema["fields"] + [{"name": OK_FIELD, "type": "boolean",
                                                                    "default": True}]))


def avro_plan(client: RegistryClient, reader: str, subject: str | None, ids: Iterable[int] = ()) -> AvroPlan:
    """The plan of a slice: every version of ``subject`` (the registry asked now) and every id in ``ids``
    (ids met before, by this source or in an earlier attempt of the slice), each checked against ``reader``
    once; an id the registry answers it does not hold is in the plan's ``missing``.
    :class:`~reclock.errors.RegistryUnavailable` when the registry does not answer (or a subject named does
    not exist: a source's subject must)."""
    schemas = {}
    missing = []
    if subject is not None:
        for v in client.subject_versions(subject):
            schemas[v.schema.id] = v.schema
    for i in ids:
        if i not in schemas:
            try:
                schemas[i] = client.schema(i)
            except SchemaNotFound:
                missing.append(i)
    writers = []
    for i, s in sorted(schemas.items()):
        if s.type != "AVRO":
            writers.append(AvroWriter(i, s.text, f"schema {i} is {s.type}, not Avro"))
        elif s.references:
            writers.append(AvroWriter(i, s.text, "it refers to other schemas (references), which Reclock does not "
                                                 "resolve yet"))
        else:
            writers.append(AvroWriter(i, s.text, problem(reader, s.text)))
    return AvroPlan(reader, tuple(writers), tuple(sorted(missing)))
