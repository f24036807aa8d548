"""Where a stack keeps its state (one folder) and which ports it uses (chosen once, then stable)."""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from reclock.dev.procs import free_port, read_pid

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout this package was installed from (``include/reclock/dev`` -> repo root)."""


_STATE_LOCK = threading.Lock()
"""Held around each read-change-write of ``stack.json`` in this process: services started side by side (threads)
choose their ports without losing each other's."""


def default_state_dir() -> Path:
    return Path(os.environ.get("RECLOCK_HOME", REPO_ROOT / ".reclock")).resolve()


@dataclass
class StackState:
    """A stack's folder: ``stack.json`` holds its ports and generated secrets, one sub-folder a service."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)

    @property
    def file(self) -> Path:
        return self.root / "stack.json"

    def load(self) -> dict:
        try:
            return json.loads(self.file.read_text())
        except FileNotFoundError:
            return {}

    def save(self, data: dict) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        tmp.chmod(0o600)
        tmp.replace(self.file)

    def port(self, name: str) -> int:
        """The port for ``name``: ``RECLOCK_<NAME>_PORT`` if set, else the one chosen before, else a free one."""
        env = os.environ.get(f"RECLOCK_{name.upper()}_PORT")
        with _STATE_LOCK:
            data = self.load()
            ports = data.setdefault("ports", {})
            if env:
                ports[name] = int(env)
            elif name not in ports:
                ports[name] = free_port()
            self.save(data)
        return int(ports[name])

    def secret(self, name: str, nbytes: int = 18) -> str:
        """A generated secret kept in ``stack.json`` (mode 0600), the same on every ``up``."""
        with _STATE_LOCK:
            data = self.load()
            secrets_ = data.setdefault("secrets", {})
            if name not in secrets_:
                secrets_[name] = secrets.token_urlsafe(nbytes)
                self.save(data)
        return secrets_[name]

    def dir(self, name: str) -> Path:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    @property
    def jars(self) -> Path:
        """JVM jars resolved by Maven (shared by every stack of this checkout)."""
        return Path(os.environ.get("RECLOCK_JARS", REPO_ROOT / ".reclock" / "jars"))


class LocalServer:
    """A local server's place in a stack's state, mixed into each ``Local*`` dataclass (which declares
    ``state`` and ``name``, or sets ``name`` on the class): its folder and port, both named ``name``, and its
    pid file and log, named by :attr:`process`."""

    state: StackState
    name: str
    process: ClassVar[str]
    """The stem of the pid file and the log (``moto``: ``moto.pid`` and ``moto.log``)."""

    @property
    def home(self) -> Path:
        return self.state.dir(self.name)

    @property
    def port(self) -> int:
        return self.state.port(self.name)

    @property
    def pidfile(self) -> Path:
        return self.home / f"{self.process}.pid"

    @property
    def log(self) -> Path:
        return self.home / f"{self.process}.log"

    def running(self) -> bool:
        """Whether the process of its pid file is alive."""
        return read_pid(self.pidfile) is not None
