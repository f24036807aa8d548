"""A certificate authority of a stack's own, and the certificates it signs, for the secured services.

``LocalCA(state).issue("kafka", "broker")`` returns the PEM files of a certificate for ``CN=broker``, valid
for ``127.0.0.1`` and ``localhost``, signed by the stack's CA (made on first use under ``<state>/tls``). The
same certificate serves a server (Kafka's listeners, Postgres, the S3 endpoint, the Spark Connect TLS
front) and a client (Kafka's mutual TLS: its subject's CN is the principal). Private keys are files of
mode 0600, unencrypted PKCS#8 (what Kafka's PEM key stores, Postgres and librdkafka all read).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from reclock.dev.procs import LOOPBACK
from reclock.dev.state import StackState

VALID_DAYS = 365


@dataclass(frozen=True)
class Issued:
    """A certificate and its key: ``cert`` (the certificate, then the CA's), ``key`` (0600)."""

    cert: Path
    key: Path

    @property
    def cert_pem(self) -> str:
        return self.cert.read_text()

    @property
    def key_pem(self) -> str:
        return self.key.read_text()


@dataclass
class LocalCA:
    """The stack's CA under ``<state>/tls``: ``ca.pem`` (trust this) and ``ca.key``."""

    state: StackState

    @property
    def home(self) -> Path:
        return self.state.dir("tls")

    @property
    def cert(self) -> Path:
        """The CA's certificate (made on first use)."""
        self._ensure()
        return self._cert

    @property
    def _cert(self) -> Path:
        return self.home / "ca.pem"

    @property
    def pem(self) -> str:
        return self.cert.read_text()

    def _ensure(self) -> None:
        if self._cert.exists():
            return
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"Reclock test CA {self.state.root.name}")])
        now = dt.datetime.now(dt.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        _write_key(self.home / "ca.key", key)
        self._cert.write_bytes(_pem(cert))
        self._cert.chmod(0o644)

    def java_truststore(self) -> Path:
        """``truststore.p12``: the CA as a PKCS#12 trust store without a password (nothing in it is secret),
        for JVMs whose clients know no PEM (S3A: ``-Djavax.net.ssl.trustStore=...``). Made by keytool."""
        path = self.home / "truststore.p12"
        if not path.exists():
            import shutil

            from reclock.dev.procs import run

            keytool = shutil.which("keytool")
            if keytool is None:
                from reclock.errors import StackError

                raise StackError("keytool (from the JDK) is needed to make a Java trust store")
            tmp = path.with_suffix(".tmp")
            tmp.unlink(missing_ok=True)
            run([keytool, "-J-Dkeystore.pkcs12.certProtectionAlgorithm=NONE", "-J-Dkeystore.pkcs12.macAlgorithm=NONE",
                 "-importcert", "-noprompt", "-alias", "reclock-ca", "-file", str(self.cert), "-keystore", str(tmp),
                 "-storetype", "PKCS12", "-storepass", "unprotected"], "keytool -importcert")
            tmp.chmod(0o644)
            tmp.replace(path)
        return path

    def issue(self, name: str, common_name: str, hosts: tuple[str, ...] = (LOOPBACK, "localhost"),
              owner: str | None = None) -> Issued:
        """``<name>.pem`` / ``<name>.key`` for ``CN=<common_name>`` (made once, then reused), valid for
        ``hosts`` as a server and usable as a client; the key owned by ``owner`` (a user name) if given."""
        cert_path, key_path = self.home / f"{name}.pem", self.home / f"{name}.key"
        if not (cert_path.exists() and key_path.exists()):
            self._ensure()
            from cryptography import x509
            from cryptography.hazmat.primitives import hashes, serialization
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

            ca_key = serialization.load_pem_private_key((self.home / "ca.key").read_bytes(), None)
            ca = x509.load_pem_x509_certificate(self.cert.read_bytes())
            key = ec.generate_private_key(ec.SECP256R1())
            sans: list[x509.GeneralName] = []
            for h in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    sans.append(x509.DNSName(h))
            now = dt.datetime.now(dt.timezone.utc)
            cert = (x509.CertificateBuilder()
                    .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                    .issuer_name(ca.subject).public_key(key.public_key())
                    .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                    .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
                    .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                    .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                    .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                          ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                    .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                   critical=False)
                    .sign(ca_key, hashes.SHA256()))
            _write_key(key_path, key)
            cert_path.write_bytes(_pem(cert) + self.cert.read_bytes())
            cert_path.chmod(0o644)
        if owner is not None and os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam(owner)
            os.chown(key_path, pw.pw_uid, pw.pw_gid)
        return Issued(cert_path, key_path)


def _pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _write_key(path: Path, key) -> None:
    from cryptography.hazmat.primitives import serialization

    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
