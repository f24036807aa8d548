"""A Schema Registry client: writer schemas by id, through the Confluent-compatible REST API.

Records in the Confluent wire format (``reclock.wire``) carry the id of their writer schema; this module
fetches the schema behind an id (``GET /schemas/ids/{id}``), with the schemas it references, and a subject's
versions (``GET /subjects/{subject}/versions/...``). A schema id names one schema forever (the registry
never reuses one), so what is fetched is cached for the life of the client; a subject's version list is
asked again whenever :meth:`RegistryClient.subject_versions` is called.

Any server speaking that API works: Confluent Schema Registry, Apicurio Registry (``/apis/ccompat/v7``),
Karapace, Redpanda. Credentials and TLS come from :class:`RegistrySettings` (an Airflow connection:
``reclock.connections.registry_settings``), never from the config file.

Failures are typed: :class:`~reclock.errors.SchemaNotFound` (the registry answered that the id or subject
does not exist) and :class:`~reclock.errors.RegistryUnavailable` (no answer, a refused login, a server
error, TLS that does not verify): the first is a fact about the data, the second about the registry, and a
source treats them differently (a record of an unknown id is a decode error; a registry that does not
answer stalls the cycle, whatever ``on_decode_error`` says, since the records are fine).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Literal

from reclock.errors import RegistryUnavailable, SchemaNotFound

SchemaType = Literal["AVRO", "PROTOBUF", "JSON"]
SCHEMA_TYPES: tuple[SchemaType, ...] = ("AVRO", "PROTOBUF", "JSON")


@dataclass(frozen=True)
class RegistrySettings:
    """How to reach a registry: ``url`` is the root of its Confluent-compatible API (Confluent's and
    Karapace's server root; Apicurio's ``http(s)://host:port/apis/ccompat/v7``). ``ca_file``: a PEM bundle
    the server's certificate must verify against (absent: the system's); ``cert_file``/``key_file``: a
    client certificate (mutual TLS)."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"registry url {self.url!r} is not an http(s):// URL")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")


@dataclass(frozen=True)
class SchemaReference:
    """A schema a schema refers to (an Avro named type, a Protobuf import, a JSON ``$ref``): ``name`` as the
    referring schema names it, and the subject version that holds it."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    """One schema as the registry holds it: its id, type, text and the schemas it references (resolved,
    each with its own references)."""

    id: int
    type: SchemaType
    text: str
    references: tuple[tuple[SchemaReference, "RegisteredSchema"], ...] = ()

    def parsed(self) -> object:
        """The schema text as JSON (Avro and JSON Schema); a Protobuf schema is ``.proto`` text."""
        if self.type == "PROTOBUF":
            raise ValueError(f"schema {self.id} is Protobuf: its text is .proto source, not JSON")
        return json.loads(self.text)


@dataclass(frozen=True)
class SubjectVersion:
    """Version ``version`` of ``subject`` is schema ``schema.id``."""

    subject: str
    version: int
    schema: RegisteredSchema


class RegistryClient:
    """A thread-safe client of one registry; schemas by id are cached for the client's life."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        self._by_id: dict[int, RegisteredSchema] = {}
        self._by_version: dict[tuple[str, int], SubjectVersion] = {}
        self._lock = threading.Lock()
        self._context = self._ssl_context()
        self._auth = None
        if settings.username is not None:
            token = f"{settings.username}:{settings.password or ''}".encode()
            self._auth = "Basic " + base64.b64encode(token).decode("ascii")

    def _ssl_context(self) -> ssl.SSLContext | None:
        s = self.settings
        if not s.url.startswith("https:"):
            return None
        ctx = ssl.create_default_context(cafile=s.ca_file)
        if s.cert_file:
            ctx.load_cert_chain(s.cert_file, s.key_file)
        return ctx

    # -- the REST calls ------------------------------------------------------------------------------------

    def _get(self, path: str, what: str, body: object = None) -> object:
        """``GET url + path`` (``POST`` with ``body`` as JSON) as JSON; 404 is :class:`SchemaNotFound`,
        anything else that is not a JSON answer is :class:`RegistryUnavailable`."""
        url = self.settings.url.rstrip("/") + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers={
            "Accept": "application/vnd.schemaregistry.v1+json, application/json",
            **({} if data is None else {"Content-Type": "application/vnd.schemaregistry.v1+json"})})
        if self._auth:
            req.add_header("Authorization", self._auth)
        try:
            with urllib.request.urlopen(req, timeout=self.settings.timeout_s, context=self._context) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:
            detail = _error_detail(e)
            if e.code == 404:
                raise SchemaNotFound(self.settings.url, what, detail) from None
            if e.code in (401, 403):
                raise RegistryUnavailable(self.settings.url, f"{what}: HTTP {e.code} ({detail}): the registry "
                                          "refused the credentials of its connection (login and password)") from None
            raise RegistryUnavailable(self.settings.url, f"{what}: HTTP {e.code} ({detail})") from None
        except ssl.SSLError as e:
            raise RegistryUnavailable(self.settings.url, f"{what}: TLS failed ({e.reason or e}); check the "
                                      "connection's ca_file (the CA that signed the registry's certificate)") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, ssl.SSLError):
                raise RegistryUnavailable(self.settings.url, f"{what}: TLS failed ({reason.reason or reason}); check "
                                          "the connection's ca_file (the CA that signed the registry's "
                                          "certificate)") from None
            raise RegistryUnavailable(self.settings.url, f"{what}: {reason}") from None
        try:
            return json.loads(body)
        except ValueError:
            raise RegistryUnavailable(self.settings.url, f"{what}: the answer is not JSON "
                                      f"({body[:200]!r}); is the url the registry's API root?") from None

    def schema(self, schema_id: int) -> RegisteredSchema:
        """The schema with id ``schema_id`` (cached), its references resolved."""
        with self._lock:
            hit = self._by_id.get(schema_id)
        if hit is not None:
            return hit
        body = self._get(f"/schemas/ids/{int(schema_id)}", f"schema id {schema_id}")
        got = self._registered(schema_id, body, f"schema id {schema_id}")
        with self._lock:
            self._by_id[schema_id] = got
        return got

    def subject_versions(self, subject: str) -> list[SubjectVersion]:
        """Every version of ``subject``, oldest first (the version list asked now; each version cached)."""
        quoted = urllib.parse.quote(subject, safe="")
        versions = self._get(f"/subjects/{quoted}/versions", f"subject {subject!r}")
        if not isinstance(versions, list) or not all(isinstance(v, int) for v in versions):
            raise RegistryUnavailable(self.settings.url, f"subject {subject!r}: versions are not a list of "
                                      f"numbers: {versions!r}")
        return [self.subject_version(subject, v) for v in sorted(versions)]

    def subject_version(self, subject: str, version: int) -> SubjectVersion:
        """Version ``version`` of ``subject`` (cached: a subject version never changes)."""
        key = (subject, int(version))
        with self._lock:
            hit = self._by_version.get(key)
        if hit is not None:
            return hit
        what = f"subject {subject!r} version {version}"
        body = self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/{int(version)}", what)
        if not isinstance(body, dict) or not isinstance(body.get("id"), int):
            raise RegistryUnavailable(self.settings.url, f"{what}: no schema id in the answer {body!r}")
        got = SubjectVersion(subject, int(version), self._registered(body["id"], body, what))
        with self._lock:
            self._by_version[key] = got
            self._by_id.setdefault(got.schema.id, got.schema)
        return got

    def register(self, subject: str, text: str, schema_type: SchemaType = "AVRO",
                 references: tuple[SchemaReference, ...] = ()) -> int:
        """Register ``text`` under ``subject`` (a new version unless the subject holds it already); its id.
        The registry's compatibility rules apply (a refused schema is :class:`RegistryUnavailable`, HTTP
        409)."""
        body: dict = {"schema": text, "schemaType": schema_type}
        if references:
            body["references"] = [{"name": r.name, "subject": r.subject, "version": r.version} for r in references]
        got = self._get(f"/subjects/{urllib.parse.quote(subject, safe='')}/versions", f"subject {subject!r}", body)
        if not isinstance(got, dict) or not isinstance(got.get("id"), int):
            raise RegistryUnavailable(self.settings.url, f"subject {subject!r}: no id in the answer {got!r}")
        return int(got["id"])

    def _registered(self, schema_id: int, body: object, what: str) -> RegisteredSchema:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise RegistryUnavailable(self.settings.url, f"{what}: no schema in the answer {body!r}")
        stype = body.get("schemaType", "AVRO") or "AVRO"
        if stype not in SCHEMA_TYPES:
            raise RegistryUnavailable(self.settings.url, f"{what}: unknown schemaType {stype!r}")
        refs = []
        for r in body.get("references") or ():
            ref = SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
            refs.append((ref, self.subject_version(ref.subject, ref.version).schema))
        return RegisteredSchema(int(schema_id), stype, body["schema"], tuple(refs))


def _error_detail(e: urllib.error.HTTPError) -> str:
    """The registry's own message of an error answer (``{"error_code": ..., "message": ...}``), else the
    status text."""
    try:
        body = json.loads(e.read() or b"{}")
    except (ValueError, OSError):
        return str(e.reason)
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(e.reason)
