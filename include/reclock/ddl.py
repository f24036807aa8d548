"""Spark DDL schemas (``"id BIGINT, name STRING"``), parsed in Python: a source's ``format.schema`` is
checked when the config loads, without starting Spark, so a typo (``BIGNT``) is a ``ConfigError`` naming the
source, the word and what was meant, not a JVM trace when the first record arrives.

The grammar is Spark's own for a schema string (what ``from_json`` / ``from_csv`` and
``pyspark.sql.types._parse_datatype_string`` accept): fields ``name TYPE [NOT NULL] [COMMENT 'text']``
separated by commas (``name: TYPE`` too, as inside ``STRUCT<...>``), names plain or in backquotes, types

    BOOLEAN  TINYINT|BYTE  SMALLINT|SHORT  INT|INTEGER  BIGINT|LONG  FLOAT|REAL  DOUBLE
    DECIMAL|DEC|NUMERIC[(p[, s])]  STRING [COLLATE c]  CHAR|CHARACTER(n)  VARCHAR(n)  BINARY
    DATE  TIMESTAMP  TIMESTAMP_LTZ  TIMESTAMP_NTZ  TIME[(p)]  VOID  VARIANT  INTERVAL [qualifier]
    ARRAY<T>  MAP<K, V>  STRUCT<name[:] T [NOT NULL] [COMMENT '...'], ...>

case-insensitive. Law (``tests/integration/test_ddl_spark.py``): on every schema string the test generates,
:func:`parse_schema` accepts exactly what Spark's parser accepts, with the same field names.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from reclock.errors import ConfigError

PRIMITIVES = {
    "BOOLEAN", "TINYINT", "BYTE", "SMALLINT", "SHORT", "INT", "INTEGER", "BIGINT", "LONG", "FLOAT", "REAL",
    "DOUBLE", "DATE", "TIMESTAMP", "TIMESTAMP_LTZ", "TIMESTAMP_NTZ", "BINARY", "VOID", "VARIANT",
}
DECIMALS = {"DECIMAL", "DEC", "NUMERIC"}
LENGTHS = {"CHAR", "CHARACTER", "VARCHAR"}
YEAR_MONTH = ("YEAR", "MONTH")
DAY_TIME = ("DAY", "HOUR", "MINUTE", "SECOND")
KNOWN = sorted(PRIMITIVES | DECIMALS | LENGTHS | {"STRING", "TIME", "INTERVAL", "ARRAY", "MAP", "STRUCT"})
MAX_PRECISION = 38

_TOKEN = re.compile(r"""\s*(?:
    (?P<bq>`(?:[^`]|``)*`)
  | (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<num>\d+(?![A-Za-z0-9_]))
  | (?P<word>[A-Za-z0-9_]+)
  | (?P<neq><>)
  | (?P<p>[<>(),:])
)""", re.VERBOSE)


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # the type as written, normalised: upper case keywords, no comments


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if not text[pos:].strip():
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                start = len(text[pos:]) - len(text[pos:].lstrip()) + pos
                raise self.error(start, f"unexpected {text[start]!r}")
            kind = m.lastgroup
            self.items.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def error(self, at: int, what: str) -> ValueError:
        return ValueError(f"{what} at character {at + 1}")

    def peek(self) -> tuple[str, str, int] | None:
        return self.items[self.i] if self.i < len(self.items) else None

    def next(self, expect: str) -> tuple[str, str, int]:
        tok = self.peek()
        if tok is None:
            raise self.error(len(self.text), f"{expect} expected, the schema ends")
        self.i += 1
        return tok

    def word(self, *words: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] == "word" and tok[1].upper() in words:
            self.i += 1
            return True
        return False

    def punct(self, p: str) -> bool:
        tok = self.peek()
        if tok is not None and tok[0] in ("p", "neq") and tok[1] == p:
            self.i += 1
            return True
        return False

    def expect(self, p: str, what: str) -> None:
        tok = self.next(what)
        if tok[1] != p:
            raise self.error(tok[2], f"{what} expected, found {tok[1]!r}")


_NUMBER = re.compile(r"(?i)\d+(?:[LSY]|(?:E\d+)?(?:F|D|BD))?|\d+E\d+")
"""A word Spark's lexer reads as a number literal (an integer, ``1L``, ``1S``, ``1Y``, ``1E2``, ``1F``, ``1D``,
``1BD``, ``1E2D``...): never a name unless quoted. ``1a``, ``1e``, ``1e2l`` are names."""


def _name(t: _Tokens) -> str:
    kind, text, at = t.next("a field name")
    if kind == "bq":
        return text[1:-1].replace("``", "`")
    if kind in ("word", "num"):
        if _NUMBER.fullmatch(text):
            raise t.error(at, f"a field name expected, found the number {text!r} (quote it as a name: `{text}`)")
        return text
    raise t.error(at, f"a field name expected, found {text!r}")


_COLLATION = re.compile(r"(?i)(UTF8_BINARY|UTF8_LCASE)(_RTRIM)?|(?:UNICODE|[A-Z]{2,3}(?:_[A-Z]{4})?(?:_[A-Z]{3})?)"
                        r"((?:_(?:CS|CI|AS|AI|RTRIM))*)")


def _collation(t: _Tokens) -> str:
    """A collation's name, as Spark reads one: ``UTF8_BINARY`` or ``UTF8_LCASE`` (each with ``_RTRIM`` or not), or
    ``UNICODE`` or an ICU locale (``language[_Script][_COUNTRY]``: ``EN``, ``sr_Cyrl_SRB``) followed by at most
    one of ``_CS``/``_CI``, of ``_AS``/``_AI`` and ``_RTRIM``, in any order; case-insensitive. Whether ICU knows a
    locale is Spark's to say (its list is ICU's): this checks its shape."""
    kind, text, at = t.next("a collation")
    name = text[1:-1].replace("``", "`") if kind == "bq" else text
    m = _COLLATION.fullmatch(name) if kind in ("word", "bq") else None
    if m is not None and m[3]:
        specs = [x.upper() for x in m[3].split("_")[1:]]
        if any(sum(specs.count(x) for x in group) > 1 for group in (("CS", "CI"), ("AS", "AI"), ("RTRIM",))):
            m = None
    if m is None:
        raise t.error(at, f"unknown collation {text!r}; the collations are UTF8_BINARY, UTF8_LCASE, UNICODE and ICU "
                      "locales (EN, sr_Cyrl_SRB), with _CI, _AI or _RTRIM")
    return name


def _int(t: _Tokens, what: str) -> int:
    kind, text, at = t.next(what)
    if kind != "num":
        raise t.error(at, f"{what} expected, found {text!r}")
    return int(text)


def _unknown_type(word: str, at: int, t: _Tokens) -> ValueError:
    close = difflib.get_close_matches(word.upper(), KNOWN, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; the types are {', '.join(KNOWN)}"
    return t.error(at, f"unknown type {word!r}{hint}")


def _type(t: _Tokens) -> str:
    kind, text, at = t.next("a type")
    if kind != "word":
        raise t.error(at, f"a type expected, found {text!r}")
    w = text.upper()
    if w in PRIMITIVES:
        return w
    if w == "STRING":
        if t.word("COLLATE"):
            return f"STRING COLLATE {_collation(t)}"
        return w
    if w in DECIMALS:
        if not t.punct("("):
            return "DECIMAL(10,0)"
        p = _int(t, "a precision")
        s = _int(t, "a scale") if t.punct(",") else 0
        t.expect(")", "')'")
        if not 0 <= p <= MAX_PRECISION or s > p:
            raise t.error(at, f"DECIMAL({p},{s}) is out of range (precision 0 to {MAX_PRECISION}, scale at most "
                              "the precision)")
        return f"DECIMAL({p},{s})"
    if w in LENGTHS:
        if not t.punct("("):
            raise t.error(at, f"{w} needs a length, e.g. {w}(10)")
        n = _int(t, "a length")
        t.expect(")", "')'")
        return f"{'VARCHAR' if w == 'VARCHAR' else 'CHAR'}({n})"
    if w == "TIME":
        if t.punct("("):
            p = _int(t, "a precision")
            t.expect(")", "')'")
            if not 0 <= p <= 6:
                raise t.error(at, f"TIME({p}): the precision is 0 to 6")
            return f"TIME({p})"
        return "TIME(6)"
    if w == "INTERVAL":
        return _interval(t)
    if w == "ARRAY":
        t.expect("<", "'<' (ARRAY<type>)")
        inner = _type(t)
        t.expect(">", "'>'")
        return f"ARRAY<{inner}>"
    if w == "MAP":
        t.expect("<", "'<' (MAP<key type, value type>)")
        k = _type(t)
        t.expect(",", "','")
        v = _type(t)
        t.expect(">", "'>'")
        return f"MAP<{k},{v}>"
    if w == "STRUCT":
        if t.punct("<>"):
            return "STRUCT<>"
        t.expect("<", "'<' (STRUCT<name: type, ...>)")
        if t.punct(">"):
            return "STRUCT<>"
        fields = [_field(t)]
        while t.punct(","):
            fields.append(_field(t))
        t.expect(">", "'>' or ','")
        return "STRUCT<" + ",".join(f"{f.name}:{f.type}" for f in fields) + ">"
    raise _unknown_type(text, at, t)


def _interval(t: _Tokens) -> str:
    tok = t.peek()
    if tok is None or tok[0] != "word" or tok[1].upper() not in YEAR_MONTH + DAY_TIME:
        return "INTERVAL"
    start = tok[1].upper()
    t.i += 1
    if not t.word("TO"):
        return f"INTERVAL {start}"
    kind, text, at = t.next("an interval field")
    end = text.upper()
    group = YEAR_MONTH if start in YEAR_MONTH else DAY_TIME
    if end not in group or group.index(end) <= group.index(start):
        raise t.error(at, f"INTERVAL {start} TO {text} is not an interval type")
    return f"INTERVAL {start} TO {end}"


def _field(t: _Tokens) -> Field:
    name = _name(t)
    t.punct(":")  # `name: TYPE` (STRUCT<...> fields; Spark takes it at the top too)
    typ = _type(t)
    if t.word("NOT"):
        kind, text, at = t.next("NULL")
        if text.upper() != "NULL":
            raise t.error(at, f"NULL expected after NOT, found {text!r}")
        typ += " NOT NULL"
    if t.word("COMMENT"):
        kind, text, at = t.next("a comment string")
        if kind != "str":
            raise t.error(at, f"a quoted comment expected after COMMENT, found {text!r}")
    return Field(name, typ)


def parse_schema(ddl: str) -> tuple[Field, ...]:
    """The fields of a Spark DDL schema string; ``ValueError`` saying what is wrong and where."""
    if not isinstance(ddl, str) or not ddl.strip():
        raise ValueError("the schema is empty")
    t = _Tokens(ddl)
    first = t.peek()
    if first is not None and first[0] == "word" and first[1].upper() == "STRUCT" and \
            len(t.items) > 1 and t.items[1][1] in ("<", "<>"):
        t.i += 1  # a whole STRUCT<...> type: its fields
        if t.punct("<>"):
            fields: list[Field] = []
        else:
            t.expect("<", "'<'")
            fields = [] if t.punct(">") else [_field(t)]
            while fields and t.punct(","):
                fields.append(_field(t))
            if fields:
                t.expect(">", "'>' or ','")
    else:
        fields = [_field(t)]
        while t.punct(","):
            fields.append(_field(t))
    tok = t.peek()
    if tok is not None:
        raise t.error(tok[2], f"',' or the end expected, found {tok[1]!r}")
    return tuple(fields)


def check_schema(ddl: str, what: str) -> tuple[Field, ...]:
    """:func:`parse_schema`, its error a ``ConfigError`` naming ``what`` (the source's format key)."""
    try:
        return parse_schema(ddl)
    except ValueError as e:
        raise ConfigError(f"{what}: {e} in {ddl!r} (Spark DDL, e.g. \"id BIGINT, name STRING\")") from None
