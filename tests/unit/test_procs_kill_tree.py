"""``reclock.dev.procs.kill_tree``: a crash of a host kills a process group and what its processes started in
groups of their own (Airflow's task processes), which ``kill_group`` leaves running; ``stop`` ends them too."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

from reclock.dev import procs

CHILD = """
import os, sys, time
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)  # a group of its own, as Airflow's task process makes
    time.sleep(600)
    os._exit(0)
os.setpgid(pid, pid)  # the parent too (the usual idiom), so the group is the child's before its pid is told
print(pid, flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def _spawned(tmp_path):
    """The leader (its pid in a pidfile) and its grandchild in a group of its own; both SIGKILLed on leaving."""
    pidfile = tmp_path / "leader.pid"
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, start_new_session=True)
    grandchild = int(p.stdout.readline())
    pidfile.write_text(str(p.pid))
    try:
        yield p, grandchild, pidfile
    finally:
        for pid in (p.pid, grandchild):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_kill_tree_kills_descendants_in_groups_of_their_own(tmp_path):
    with _spawned(tmp_path) as (p, grandchild, pidfile):
        assert procs.kill_tree(pidfile)
        p.wait(10)
        deadline = time.monotonic() + 10
        while procs.pid_alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not procs.pid_alive(grandchild)
        assert not pidfile.exists() and not procs.kill_tree(pidfile)


def test_kill_group_alone_leaves_them(tmp_path):
    """What ``kill_tree`` is for: the group's SIGKILL does not reach a descendant that left the group."""
    with _spawned(tmp_path) as (p, grandchild, pidfile):
        assert procs.kill_group(pidfile)
        p.wait(10)
        time.sleep(0.2)
        assert procs.pid_alive(grandchild)


def test_stop_ends_descendants_in_groups_of_their_own(tmp_path):
    """A stack's ``down`` (``procs.stop``: SIGTERM to the group) once left a continuous source's Airflow task
    process running, orphaned, for the rest of its lease: it had made a group of its own."""
    with _spawned(tmp_path) as (p, grandchild, pidfile):
        assert procs.stop(pidfile, timeout=10)
        p.wait(10)
        assert not procs.pid_alive(grandchild)
        assert not pidfile.exists() and not procs.stop(pidfile)
