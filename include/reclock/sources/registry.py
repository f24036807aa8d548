"""The registry of source kinds: a new kind is a folder ``reclock/sources/<kind>/`` and its line here.

Config, the DAG factories, ``reclock status``, the UI page, continuous groups, triggers and rebuilds find a
source's kind here (:func:`kind_of`), never by testing which section its spec has.
"""

from __future__ import annotations

from reclock.errors import ConfigError
from reclock.sources.base import SourceKind
from reclock.sources.kafka.kind import KAFKA
from reclock.sources.kinesis.kind import KINESIS
from reclock.sources.postgres.kind import POSTGRES
from reclock.sources.s3.kind import S3

KINDS: dict[str, SourceKind] = {k.name: k for k in (KAFKA, POSTGRES, S3, KINESIS)}
"""Every kind by name (its config section's key)."""


def kind_named(name: str) -> SourceKind:
    """The kind called ``name``; a ``ConfigError`` naming the kinds there are otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ConfigError(f"no source kind {name!r}; the kinds are {', '.join(sorted(KINDS))}") from None


def kind_of(spec) -> SourceKind:
    """The kind of the source ``spec`` (a ``SourceSpec``)."""
    return kind_named(spec.kind)
