"""Names that become SQL identifiers are validated before they are quoted."""

from __future__ import annotations

import re

from reclock.errors import ConfigError

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,60}$")


def validate_name(name: str, what: str = "name") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{what} {name!r} is not valid: use lower-case letters, digits and _ "
                          f"(starting with a letter, at most 61 characters)")
    return name
