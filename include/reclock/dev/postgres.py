"""A local PostgreSQL server for the stack and the tests (Debian's server binaries, run as a non-root user).

Postgres refuses to run as root, so when we are root the cluster belongs to the ``postgres`` user and
every server command runs through ``runuser``. It listens on 127.0.0.1 only, with ``wal_level=logical``
(the Postgres CDC source needs it), password authentication over TCP, and no Unix socket.

``LocalPostgres(state, tls=True)`` accepts only TLS connections (``hostssl`` with SCRAM, everything else
rejected) with a server certificate of the stack's CA (``reclock.dev.tls``); its :meth:`~LocalPostgres.dsn`
then asks for ``sslmode=verify-full`` against that CA.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import psycopg

from reclock.dev.procs import LOOPBACK, port_open, run
from reclock.dev.state import LocalServer, StackState
from reclock.dev.tls import LocalCA
from reclock.errors import StackError

DB_USER = "reclock"


def find_bin_dir() -> Path | None:
    """The newest installed server's ``bin/`` (``RECLOCK_PG_BIN`` wins), or None."""
    if os.environ.get("RECLOCK_PG_BIN"):
        return Path(os.environ["RECLOCK_PG_BIN"])
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def ensure_installed() -> Path:
    """Return the server's ``bin/``, installing Debian's ``postgresql`` package if it is missing."""
    bin_dir = find_bin_dir()
    if bin_dir is not None:
        return bin_dir
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(
            "no PostgreSQL server found under /usr/lib/postgresql/*/bin; install Debian's `postgresql` "
            "package or set RECLOCK_PG_BIN to a server's bin/ folder"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], "apt-get update", env=env, timeout=900)
    run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "postgresql"],
        "apt-get install postgresql", env=env, timeout=1200)
    # the package may start a default cluster on 5432; we never use it, so leave Debian's service alone
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise StackError("installed Debian's postgresql but found no initdb under /usr/lib/postgresql")
    return bin_dir


def _run_as() -> str | None:
    """The user that owns and runs the cluster: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        run(["useradd", "--system", "--home-dir", "/var/lib/postgresql", "--shell", "/bin/bash", "postgres"],
            "create the postgres user")
    return "postgres"


def _reachable_by_others(path: Path) -> bool:
    """Every folder from / down to ``path`` lets other users traverse it."""
    p = path.resolve()
    for folder in [p, *p.parents]:
        if not folder.stat().st_mode & 0o001:
            return False
    return True


def _chown(path: Path) -> None:
    """Give ``path`` to the user the servers run as (:func:`_run_as`), if they run as another."""
    user = _run_as()
    if user:
        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)


class _Server(LocalServer):
    """What a primary and a standby share: a data folder under the server's own, the postmaster's pid file,
    ``pg_ctl`` start and stop."""

    process: ClassVar[str] = "postgres"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def pidfile(self) -> Path:
        """The postmaster's own (its first line is the pid; it exists while the server runs)."""
        return self.data / "postmaster.pid"

    def running(self) -> bool:
        return port_open(self.port) and self.pidfile.exists()

    def _pg_ctl(self, action: str, *options: str) -> None:
        run([str(ensure_installed() / "pg_ctl"), "-D", str(self.data), *options, action],
            f"pg_ctl {action} ({self.name})", user=_run_as(), timeout=90)

    def start_server(self) -> None:
        """Start the server if it is not running (its data folder must exist; nothing else is asked: a standby
        after a crash of its primary comes up read-only with what it received, ready to be promoted)."""
        if not self.running():
            self.log.touch()
            _chown(self.log)
            self._pg_ctl("start", "-l", str(self.log), "-w", "-t", "60", "-o", f"-p {self.port}")

    def stop(self) -> bool:
        if not self.pidfile.exists():
            return False
        self._pg_ctl("stop", "-m", "fast", "-w")
        return True


@dataclass
class LocalPostgres(_Server):
    """One cluster under ``<state>/postgres``: ``start`` is idempotent and ``stop`` ends only it."""

    state: StackState
    fast: bool = False  # fsync off: for throwaway test clusters only
    tls: bool = False  # TLS only (hostssl), the stack CA's certificate
    name: str = "postgres"  # the state folder and port name

    @property
    def password(self) -> str:
        return self.state.secret("postgres_password")

    def dsn(self, dbname: str = "reclock", user: str = DB_USER, password: str | None = None) -> str:
        """A DSN for ``user`` (default: the superuser); with ``tls``, ``sslmode=verify-full`` against the CA."""
        from urllib.parse import quote

        auth = f"{quote(user, safe='')}:{quote(self.password if password is None else password, safe='')}"
        return f"postgresql://{auth}@{LOOPBACK}:{self.port}/{dbname}{self.ssl_query}"

    @property
    def ssl_query(self) -> str:
        """``?sslmode=verify-full&sslrootcert=<ca.pem>`` with ``tls``, else empty."""
        return f"?sslmode=verify-full&sslrootcert={LocalCA(self.state).cert}" if self.tls else ""

    def init(self) -> None:
        bin_dir = ensure_installed()
        if (self.data / "PG_VERSION").exists():
            return
        user = _run_as()
        if user and not _reachable_by_others(self.home):
            raise StackError(f"postgres: {self.home} is not reachable by the {user} user (a parent folder is "
                             f"not world-executable); set RECLOCK_HOME to a folder under e.g. /var/tmp")
        self.home.chmod(0o755)
        _chown(self.home)
        pwfile = self.home / "pwfile"
        pwfile.write_text(self.password + "\n")
        _chown(pwfile)
        pwfile.chmod(0o600)
        try:
            run([str(bin_dir / "initdb"), "-D", str(self.data), "-U", DB_USER, "--pwfile", str(pwfile),
                 "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
                "initdb", user=_run_as(), timeout=120)
        finally:
            pwfile.unlink(missing_ok=True)
        conf = [
            f"listen_addresses = '{LOOPBACK}'",
            f"port = {self.port}",
            "unix_socket_directories = ''",
            "wal_level = logical",
            "max_wal_senders = 10",
            "max_replication_slots = 10",
            "max_connections = 200",
            "shared_buffers = 128MB",
        ]
        if self.fast:
            conf += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        if self.tls:
            issued = LocalCA(self.state).issue(f"{self.name}-server", "postgres", owner=user)
            conf += ["ssl = on", f"ssl_cert_file = '{issued.cert}'", f"ssl_key_file = '{issued.key}'",
                     "ssl_min_protocol_version = 'TLSv1.2'", "password_encryption = 'scram-sha-256'"]
            hba = self.data / "pg_hba.conf"  # TLS with SCRAM over TCP, nothing else
            hba.write_text("# reclock: TLS only\n"
                           "hostssl all         all 127.0.0.1/32 scram-sha-256\n"
                           "hostssl replication all 127.0.0.1/32 scram-sha-256\n"
                           "host    all         all 0.0.0.0/0    reject\n"
                           "host    replication all 0.0.0.0/0    reject\n")
            _chown(hba)
        with open(self.data / "postgresql.conf", "a") as f:
            f.write("\n# reclock\n" + "\n".join(conf) + "\n")

    def start(self) -> float:
        """Init if needed, start if not running, create the databases; return seconds taken."""
        t0 = time.monotonic()
        self.init()
        if not self.running() and port_open(self.port):
            raise StackError(f"postgres: port {self.port} on {LOOPBACK} is taken by another process "
                             f"(set RECLOCK_POSTGRES_PORT or free it)")
        self.start_server()
        self.create_database("reclock")
        self.create_database("airflow")
        return time.monotonic() - t0

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')

    def create_role(self, role: str, password: str) -> None:
        """A login role ``role`` (no other right) with ``password``, or its password reset. libpq computes the
        SCRAM verifier here, so the password itself never reaches the server or its log."""
        from psycopg import sql

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            conn.execute(sql.SQL("{} ROLE {} {} PASSWORD {}").format(
                sql.SQL("ALTER" if exists else "CREATE"), sql.Identifier(role),
                sql.SQL("" if exists else "LOGIN"), sql.Literal(verifier)))



@dataclass
class LocalStandby(_Server):
    """A streaming standby of ``primary`` under ``<state>/<name>``: a ``pg_basebackup`` of it (``-R``: it
    follows the primary), on a port of its own. ``synchronous``: the primary names it in
    ``synchronous_standby_names``, so a commit (``synchronous_commit = on``, which Reclock's connections use)
    returns only once the standby has it; otherwise it replicates asynchronously and may lag. ``promote`` makes
    it a primary (a failover); :func:`failover_dsn` gives clients both hosts, libpq taking the one that
    accepts writes."""

    state: StackState
    primary: LocalPostgres
    name: str = "postgres_standby"
    synchronous: bool = True

    @property
    def application_name(self) -> str:
        return f"reclock_{self.name}"

    @property
    def password(self) -> str:
        """The superuser's password: the primary's (a base backup copies it), so a promoted standby can be the
        primary of a standby of its own."""
        return self.primary.password

    def dsn(self, dbname: str = "reclock") -> str:
        return f"postgresql://{DB_USER}:{self.primary.password}@{LOOPBACK}:{self.port}/{dbname}"

    def start(self, timeout: float = 120) -> float:
        """Take the base backup (first start), start the standby, set the primary's synchronous standby
        names, and wait until it streams (as a synchronous standby when ``synchronous``)."""
        t0 = time.monotonic()
        bin_dir = ensure_installed()
        if not (self.data / "PG_VERSION").exists():
            self.home.chmod(0o755)
            _chown(self.home)
            conninfo = (f"host={LOOPBACK} port={self.primary.port} user={DB_USER} password={self.primary.password} "
                        f"application_name={self.application_name}")
            run([str(bin_dir / "pg_basebackup"), "-D", str(self.data), "-X", "stream", "-R", "-c", "fast",
                 "-d", conninfo], "pg_basebackup", user=_run_as(), timeout=300)
            with open(self.data / "postgresql.conf", "a") as f:
                f.write(f"\n# reclock standby\nport = {self.port}\nhot_standby = on\n")
        self.start_server()
        names = self.application_name if self.synchronous else ""
        with psycopg.connect(self.primary.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
            conn.execute("SELECT pg_reload_conf()")
            want = "sync" if self.synchronous else "async"
            deadline = time.monotonic() + timeout
            while True:
                row = conn.execute("SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                                   (self.application_name,)).fetchone()
                if row == ("streaming", want):
                    break
                if time.monotonic() > deadline:
                    raise StackError(f"postgres standby {self.name}: not streaming as {want} after {timeout:.0f}s "
                                     f"(pg_stat_replication: {row}); see {self.log}")
                time.sleep(0.2)
        return time.monotonic() - t0

    def promote(self, timeout: float = 60) -> None:
        """Make the standby a primary (``pg_ctl promote``: it stops following and accepts writes)."""
        run([str(ensure_installed() / "pg_ctl"), "-D", str(self.data), "-w", "-t", str(int(timeout)), "promote"],
            "pg_ctl promote", user=_run_as(), timeout=timeout + 30)



def crash(server: LocalPostgres | LocalStandby) -> None:
    """Stop ``server`` as a crash would (``pg_ctl stop -m immediate``: no shutdown checkpoint, every session
    cut); its data stays for a later start."""
    run([str(ensure_installed() / "pg_ctl"), "-D", str(server.data), "-m", "immediate", "-w", "stop"],
        "pg_ctl stop -m immediate", user=_run_as(), timeout=90)


def failover_dsn(primary: LocalPostgres, standby: LocalStandby, dbname: str = "reclock") -> str:
    """A DSN naming both servers: libpq tries them in order and keeps the one that accepts writes
    (``target_session_attrs=read-write``), so clients follow a promotion without a new setting."""
    return (f"postgresql://{DB_USER}:{primary.password}@{LOOPBACK}:{primary.port},{LOOPBACK}:{standby.port}/{dbname}"
            "?target_session_attrs=read-write")
