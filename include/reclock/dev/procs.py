"""Background processes with pid files: start, wait for a port, stop exactly what we started."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from reclock.errors import StackError

LOOPBACK = "127.0.0.1"


PORT_FLOOR = 10000
"""The lowest port :func:`free_port` chooses (below it: well-known and registered services)."""

PORT_CLAIM_S = 3600.0
"""How long a port :func:`free_port` chose stays out of every other choice on this machine: the time a stack
may take between choosing its ports and its servers binding them."""


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ephemeral ports (``net.ipv4.ip_local_port_range``; Linux's default elsewhere)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


@functools.cache
def _port_pool() -> tuple[int, ...]:
    """The ports :func:`free_port` draws from: :data:`PORT_FLOOR` to 65535, the ephemeral range left out."""
    lo, hi = ephemeral_ports()
    return tuple(p for p in range(PORT_FLOOR, 65536) if not lo <= p <= hi)


TAKEOVER_STALE_S = 60.0
"""A takeover lock (:func:`_claim`) older than this was left by a chooser that died holding it."""


def _claim(port: int, claims: Path) -> bool:
    """Claim ``port`` for this machine's stacks for :data:`PORT_CLAIM_S`; False if a younger claim holds it.

    A stale claim is taken over under a lock of its own (``<port>.taking``, created exclusively), and only if
    it is still stale once the lock is held: of two choosers that found it stale at once, the second finds it
    taken over (or the lock held) and goes on to another port."""
    path = claims / str(port)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        pass
    if not _stale(path):
        return False
    lock = claims / f"{port}.taking"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:  # another chooser is taking it over (or died doing so: its lock goes once stale)
        with contextlib.suppress(FileNotFoundError):
            if time.time() - lock.stat().st_mtime > TAKEOVER_STALE_S:
                lock.unlink()
        return False
    try:
        if not _stale(path):  # taken over by another chooser just before the lock
            return False
        os.utime(path)
        return True
    finally:
        os.close(fd)
        lock.unlink(missing_ok=True)


def _stale(claim: Path) -> bool:
    """Whether the claim file ``claim`` is older than :data:`PORT_CLAIM_S` (a claim gone is not stale)."""
    try:
        return time.time() - claim.stat().st_mtime >= PORT_CLAIM_S
    except FileNotFoundError:
        return False


def free_port(claims: Path | None = None) -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now and that stays free until a server binds it.

    A server often binds its port minutes after the stack chose it (Airflow's settings name a proxy's port
    before Postgres starts). The kernel's own choice (binding port 0) is an ephemeral port, and meanwhile any
    process binding port 0 (a JVM's block manager, an RPC server) or connecting anywhere may get the same one.
    So the port is drawn outside the ephemeral range, and claimed (a file in ``claims``, by default a folder
    of this user's in the temporary directory) so that no other stack on the machine chooses it within
    :data:`PORT_CLAIM_S`."""
    claims = claims if claims is not None else Path(tempfile.gettempdir()) / f"reclock-ports-{os.getuid()}"
    claims.mkdir(mode=0o700, parents=True, exist_ok=True)
    pool = _port_pool()
    start = random.randrange(len(pool)) if pool else 0
    for i in range(len(pool)):  # every port of the pool once, from a random one on
        port = pool[(start + i) % len(pool)]
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
        if _claim(port, claims):
            return port
    lo, hi = ephemeral_ports()
    raise StackError(f"no free TCP port on {LOOPBACK} between {PORT_FLOOR} and 65535 outside the ephemeral range "
                     f"{lo}-{hi}")


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def wait_until(what: str, check: Callable[[], bool], timeout: float, log: Path | None = None,
               alive: Callable[[], bool] | None = None) -> float:
    """Poll ``check`` until it is true; return the seconds waited. Raise ``StackError`` naming ``what``
    (and the tail of ``log``) on timeout or when ``alive`` says the process died."""
    start = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - start
        except Exception:  # noqa: BLE001 - a health probe failing just means "not yet"
            pass
        if alive is not None and not alive():
            raise StackError(f"{what} exited during start-up{_log_tail(log)}")
        if time.monotonic() - start > timeout:
            raise StackError(f"{what} did not become healthy within {timeout:.0f}s{_log_tail(log)}")
        time.sleep(0.2)


def _log_tail(log: Path | None, lines: int = 25) -> str:
    if log is None or not log.exists():
        return ""
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return f"\n--- last lines of {log} ---\n" + "\n".join(tail)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def read_pid(pidfile: Path) -> int | None:
    """The live process whose id is the first line of ``pidfile``, or None (no file, or not running)."""
    try:
        pid = int(pidfile.read_text().split("\n", 1)[0].strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def spawn(name: str, argv: Sequence[str], *, log: Path, pidfile: Path, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> int:
    """Start ``argv`` in its own session (so ``stop`` can end its whole group), output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name}: {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None, cwd=str(cwd) if cwd else None,
            start_new_session=True,
        )
    pidfile.write_text(str(proc.pid))
    return proc.pid


def stop(pidfile: Path, timeout: float = 20.0) -> bool:
    """Stop the process group recorded in ``pidfile`` and its processes' descendants that made groups of their
    own (an Airflow scheduler's task processes: left alone, a continuous source's task ran on, orphaned, for
    the rest of its lease): SIGTERM, then SIGKILL. True if one was running."""
    pid = read_pid(pidfile)
    if pid is None:
        pidfile.unlink(missing_ok=True)
        return False
    procs = _proc_table()
    outside = _tree(pid, procs) - {p for p, (_, _, group) in procs.items() if group == pid}
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        for p in outside:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and (_group_alive(pid) or any(pid_alive(p) for p in outside)):
            time.sleep(0.1)
        if not _group_alive(pid) and not any(pid_alive(p) for p in outside):
            break
    pidfile.unlink(missing_ok=True)
    return True


def side_by_side(calls: Mapping[str, Callable[[], object]]) -> tuple[dict[str, object], dict[str, BaseException]]:
    """Call every one of ``calls`` (name -> a server's ``stop``, say) at once, each in a thread of its own, and
    wait for all of them: servers that need none of each other stop in the time of the slowest instead of
    their sum. Each runs whatever another raised. Returns what each returned and, apart, what each raised."""
    from concurrent.futures import ThreadPoolExecutor

    if not calls:
        return {}, {}
    with ThreadPoolExecutor(len(calls), thread_name_prefix="side-by-side") as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
    errors = {name: f.exception() for name, f in futures.items() if f.exception() is not None}
    return {name: f.result() for name, f in futures.items() if name not in errors}, errors


class Stops:
    """Stops to make later, side by side: :meth:`later` notes one (a test session's services note theirs as
    their fixtures end); :meth:`stop_all` makes every noted one at once (:func:`side_by_side`) and raises
    ``StackError`` naming each that failed, once all ended."""

    def __init__(self) -> None:
        self.pending: dict[str, Callable[[], object]] = {}

    def later(self, name: str, stop: Callable[[], object]) -> None:
        self.pending[name] = stop

    def stop_all(self) -> None:
        pending, self.pending = self.pending, {}
        _, errors = side_by_side(pending)
        if errors:
            raise StackError("stopping " + "; ".join(f"{name}: {type(e).__name__}: {e}" for name, e in errors.items()))


def kill_group(pidfile: Path, timeout: float = 30.0) -> bool:
    """SIGKILL the process group recorded in ``pidfile`` (a crash: no shutdown hooks) and wait until it is
    gone; True if one was running."""
    pid = read_pid(pidfile)
    if pid is None:
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _group_alive(pid):
        time.sleep(0.1)
    pidfile.unlink(missing_ok=True)
    return True


def kill_tree(pidfile: Path, timeout: float = 30.0) -> bool:
    """SIGKILL the process group recorded in ``pidfile`` and every descendant of its processes, also those
    that made a group of their own (Airflow's task processes do), as a crash of the host would; wait until
    they are gone. True if the group was running."""
    pid = read_pid(pidfile)
    if pid is None:
        return False
    doomed = _tree(pid, _proc_table())
    for p in doomed:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(pid_alive(p) for p in doomed):
        time.sleep(0.1)
    pidfile.unlink(missing_ok=True)
    return bool(doomed)


def _proc_table() -> dict[int, tuple[str, int, int]]:
    """Every process: pid -> (state, parent pid, process group)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().split(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(entry)] = (rest[0], int(rest[1]), int(rest[2]))
    return table


def _tree(pgid: int, procs: dict[int, tuple[str, int, int]]) -> set[int]:
    """The processes of group ``pgid`` (in ``procs``, :func:`_proc_table`) and every descendant of theirs, also
    those in groups of their own."""
    tree = {p for p, (_, _, group) in procs.items() if group == pgid}
    while True:
        more = {p for p, (_, ppid, _) in procs.items() if ppid in tree} - tree
        if not more:
            return tree
        tree |= more


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie does not)."""
    return any(state != "Z" and group == pgid for state, _, group in _proc_table().values())


def run(argv: Sequence[str], what: str, *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 600, user: str | None = None) -> str:
    """Run a command to completion; raise ``StackError`` naming ``what`` with its output on failure."""
    cmd = list(argv)
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    res = subprocess.run(cmd, env=dict(env) if env is not None else None, cwd=str(cwd) if cwd else None,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if res.returncode != 0:
        raise StackError(f"{what} failed (exit {res.returncode}): {' '.join(cmd)}\n{res.stdout[-4000:]}")
    return res.stdout
