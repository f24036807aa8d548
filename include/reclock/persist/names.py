"""Names that become SQL identifiers (or blob folders) are validated before they are quoted.

A source name becomes part of the view name ``<source>_progress``, so it is kept short enough (51
characters) that the view name fits Postgres' 63-byte identifier limit; a shard id may use 61.
"""

from __future__ import annotations

import re

from reclock.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,60}$")
SOURCE_RE = re.compile(r"^[a-z][a-z0-9_]{0,50}$")
SHARD_RE = NAME_RE


def _check(name: object, pattern: re.Pattern, what: str, most: int) -> str:
    if not isinstance(name, str) or not pattern.match(name):
        raise ConfigError(f"{what} {name!r} is not valid: use lower-case letters, digits and _ "
                          f"(starting with a letter, at most {most} characters)")
    return name


def validate_name(name: str, what: str = "name") -> str:
    """Return ``name`` if it matches ``^[a-z][a-z0-9_]{0,60}$``, else raise ``ConfigError``."""
    return _check(name, NAME_RE, what, 61)


def validate_source_name(name: str) -> str:
    """Return ``name`` if it matches ``^[a-z][a-z0-9_]{0,50}$`` (so ``<name>_progress`` is a valid
    identifier), else raise ``ConfigError``."""
    return _check(name, SOURCE_RE, "source name", 51)


def validate_shard_id(shard: str) -> str:
    """Return ``shard`` if it matches ``^[a-z][a-z0-9_]{0,60}$``, else raise ``ConfigError``."""
    return _check(shard, SHARD_RE, "shard id", 61)
