"""Fail points: named places inside the cycle's steps where a test (or an operator rehearsing a crash)
can make the process fail, like Materialize's ``fail_point!``.

Enable them with ``RECLOCK_FAILPOINTS=name[,name...]`` (``name=exit`` ends the process at once with
``os._exit(86)``, as a crash would; plain ``name`` raises :class:`FailpointHit`), or in-process with
:func:`enabled`. Disabled fail points cost one dictionary lookup.

Points: ``mint:after_binding`` (binding durable, descriptions not returned), ``write_batches:before_job``,
``write_batches:after_slice`` (some parts written, not all), ``write_batches:joint_job`` (a continuous
group's joint Spark job about to start: its sources then write in jobs of their own), ``append:in_transaction`` (inside the
append's transaction, before commit), ``resume:after_commit`` (offsets committed, compaction not done),
``compact:before_swap`` (merged parts written, the shard's batches not yet swapped), ``sink:in_transaction``
(a Kafka sink's messages produced, its transaction open), ``iceberg:before_commit`` (an Iceberg export's data
files and manifests written, the catalog not yet committed), ``iceberg:after_commit`` (committed, the read
hold not yet moved).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

_ACTIVE: dict[str, str] = {}


class FailpointHit(RuntimeError):
    """Raised where an enabled fail point is reached."""


def _from_env() -> dict[str, str]:
    out = {}
    for item in filter(None, (x.strip() for x in os.environ.get("RECLOCK_FAILPOINTS", "").split(","))):
        name, _, action = item.partition("=")
        out[name] = action or "raise"
    return out


def failpoint(name: str) -> None:
    """Fail here if ``name`` is enabled (in-process or through ``RECLOCK_FAILPOINTS``)."""
    action = _ACTIVE.get(name) or (_from_env().get(name) if "RECLOCK_FAILPOINTS" in os.environ else None)
    if action is None:
        return
    if action == "exit":
        os._exit(86)
    raise FailpointHit(f"fail point {name} reached")


@contextlib.contextmanager
def enabled(name: str, action: str = "raise") -> Iterator[None]:
    """Enable fail point ``name`` for the ``with`` block."""
    _ACTIVE[name] = action
    try:
        yield
    finally:
        _ACTIVE.pop(name, None)
