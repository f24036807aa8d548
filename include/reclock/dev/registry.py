"""A local Schema Registry for tests and benchmarks: Apicurio Registry 2.4.2 (``jvm/registry/pom.xml``) with
in-memory storage, its Confluent-compatible API at ``/apis/ccompat/v7``, on free 127.0.0.1 ports: plain HTTP
and HTTPS (a self-signed certificate made for it), both requiring HTTP basic auth with a generated user.
Its schemas are gone when it stops.

It is a real registry: schema ids, subjects, versions and references as Confluent's API defines them;
``reclock.schema_registry`` reaches it as it reaches Confluent Schema Registry or Karapace.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from reclock.dev import procs
from reclock.dev.jars import REGISTRY_RUNNER, ensure_registry
from reclock.dev.procs import LOOPBACK
from reclock.dev.state import LocalServer, StackState
from reclock.errors import StackError
from reclock.schema_registry import RegistrySettings

CCOMPAT = "/apis/ccompat/v7"
USER = "reclock"


@dataclass
class LocalRegistry(LocalServer):
    """``java -jar reclock-registry-runner.jar`` under ``state``'s ``registry`` folder."""

    state: StackState
    heap: str = "384m"

    name: ClassVar[str] = "registry"
    process: ClassVar[str] = "registry"

    @property
    def tls_port(self) -> int:
        return self.state.port("registry_tls")

    @property
    def password(self) -> str:
        return self.state.secret("registry_password")

    @property
    def ca_file(self) -> Path:
        """The registry's self-signed certificate: the CA a client verifies its TLS port against."""
        return self.home / "cert.pem"

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}{CCOMPAT}"

    @property
    def tls_url(self) -> str:
        return f"https://{LOOPBACK}:{self.tls_port}{CCOMPAT}"

    def settings(self, tls: bool = False) -> RegistrySettings:
        """Settings that reach this registry (over TLS when ``tls``) with its user."""
        if tls:
            return RegistrySettings(self.tls_url, USER, self.password, ca_file=str(self.ca_file))
        return RegistrySettings(self.url, USER, self.password)

    def _certificate(self) -> None:
        """A self-signed EC certificate for 127.0.0.1 (made once per state folder)."""
        key_file = self.home / "key.pem"
        if self.ca_file.exists() and key_file.exists():
            return
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "reclock test registry")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=365))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK)),
                                                            x509.DNSName("localhost")]), critical=False)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        key_file.chmod(0o600)
        self.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def start(self, timeout: float = 240) -> float:
        """Start the registry unless it runs; wait until its API answers. Returns the seconds it took."""
        t0 = time.monotonic()
        if not self.running():
            java = shutil.which("java")
            if java is None:
                raise StackError("Java 17+ is needed for the Schema Registry; install Debian's `default-jre-headless`")
            folder = ensure_registry(self.state)
            for port in (self.port, self.tls_port):
                if procs.port_open(port):
                    raise StackError(f"registry: port {port} on {LOOPBACK} is taken by another process "
                                     "(set RECLOCK_REGISTRY_PORT / RECLOCK_REGISTRY_TLS_PORT or free it)")
            self._certificate()
            props = {
                "quarkus.http.host": LOOPBACK,
                "quarkus.http.port": self.port,
                "quarkus.http.ssl-port": self.tls_port,
                "quarkus.http.ssl.certificate.files": self.ca_file,
                "quarkus.http.ssl.certificate.key-files": self.home / "key.pem",
                f"quarkus.security.users.embedded.users.{USER}": self.password,
                "quarkus.http.cors.origins": f"http://{LOOPBACK}:{self.port}",
            }
            # the password goes in a properties file (mode 0600), not on a command line `ps` shows
            conf = self.home / "application.properties"
            conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            conf.chmod(0o600)
            # C1 only: a test registry serves a few hundred requests; start-up is what costs
            procs.spawn("registry", [java, f"-Xmx{self.heap}", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                                     f"-Dquarkus.config.locations={conf}", "-jar", str(folder / REGISTRY_RUNNER)],
                        log=self.log, pidfile=self.pidfile, cwd=self.home)
        try:
            procs.wait_until("schema registry", self._ready, timeout, log=self.log, alive=self.running)
        except BaseException:
            self.stop()  # nobody else would stop a registry that never answered
            raise
        return time.monotonic() - t0

    def _ready(self) -> bool:
        req = urllib.request.Request(f"http://{LOOPBACK}:{self.port}/health/ready")
        with urllib.request.urlopen(req, timeout=2) as resp:
            return json.loads(resp.read()).get("status") == "UP"

    def stop(self) -> bool:
        return procs.stop(self.pidfile, timeout=20)
