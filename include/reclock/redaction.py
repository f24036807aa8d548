"""Credentials out of text that is shown or kept: error messages recorded in ``reclock.status_history``,
the status page and its JSON, ``reclock status``, log lines.

A message may quote a DSN (``postgresql://user:password@host/db``), a Spark Connect URL
(``sc://host:15002/;token=...``), a librdkafka or JAAS setting (``sasl.password=...``,
``password="..."``), or a PEM private key. :func:`redact` replaces each secret by ``***`` and keeps the
rest, so the message still says what failed and where."""

from __future__ import annotations

import re

MASK = "***"

_URL_PASSWORD = re.compile(r"(\w+://[^:/@\s]*:)[^@\s]*@")
_ASSIGNED = re.compile(r"""(?i)\b([\w.-]*(?:password|passwd|token|secret)[\w.-]*["']?\s*[=:]\s*)"""
                       r"""("[^"]*"|'[^']*'|[^\s;,&)]+)""")
_PEM_KEY = re.compile(r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.S)


def redact(text: str | None) -> str | None:
    """``text`` with what looks like a credential (a URL's password, ``password=...``, ``token=...``,
    ``secret_key: ...``, a PEM private key) replaced by ``***``; None stays None."""
    if text is None:
        return None
    text = _PEM_KEY.sub(f"-----BEGIN \\1PRIVATE KEY-----{MASK}-----END \\1PRIVATE KEY-----", text)
    text = _URL_PASSWORD.sub(rf"\1{MASK}@", text)
    return _ASSIGNED.sub(rf"\1{MASK}", text)
