"""free_port: a port outside the kernel's ephemeral range, claimed so that no other stack chooses it meanwhile."""

import os
import socket
import time

from reclock.dev import procs


def test_ports_are_drawn_outside_the_ephemeral_range_and_never_twice_while_claimed(tmp_path):
    lo, hi = procs.ephemeral_ports()
    ports = [procs.free_port(tmp_path) for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(10000 <= p <= 65535 and not lo <= p <= hi for p in ports)
    assert sorted(int(f.name) for f in tmp_path.iterdir()) == sorted(ports)
    for p in ports[:20]:  # each was free when chosen
        with socket.socket() as s:
            s.bind((procs.LOOPBACK, p))


def test_a_claim_keeps_its_port_from_other_choosers_until_it_is_stale(tmp_path):
    port = procs.free_port(tmp_path)
    assert not procs._claim(port, tmp_path)
    old = time.time() - procs.PORT_CLAIM_S - 1
    os.utime(tmp_path / str(port), (old, old))
    assert procs._claim(port, tmp_path)
    assert not procs._claim(port, tmp_path)  # taken over: fresh again


def test_a_stale_claim_is_taken_over_by_one_chooser_only(tmp_path):
    """Two choosers that find a claim stale at once: the one holding the takeover lock takes it over; the other
    finds the lock held, or, once the lock is gone, the claim fresh again. A lock a dead chooser left goes
    once stale."""
    port = procs.free_port(tmp_path)
    old = time.time() - procs.PORT_CLAIM_S - 1
    os.utime(tmp_path / str(port), (old, old))
    lock = tmp_path / f"{port}.taking"
    lock.touch()  # another chooser holds the takeover lock
    assert not procs._claim(port, tmp_path)
    assert lock.exists()  # a young lock is left to its holder
    dead = time.time() - procs.TAKEOVER_STALE_S - 1
    os.utime(lock, (dead, dead))  # ... which died holding it
    assert not procs._claim(port, tmp_path) and not lock.exists()
    assert procs._claim(port, tmp_path)  # the stale claim, taken over
    assert not lock.exists()
    assert not procs._claim(port, tmp_path)  # the other chooser, just after: fresh again


def test_a_port_a_server_listens_on_is_never_chosen(tmp_path, monkeypatch):
    busy = procs.free_port(tmp_path / "elsewhere")  # a port of the pool, then a server on it
    with socket.socket() as s:
        s.bind((procs.LOOPBACK, busy))
        s.listen()
        pool = procs._port_pool()
        monkeypatch.setattr(procs.random, "randrange", lambda n: pool.index(busy))  # the walk starts on it
        port = procs.free_port(tmp_path)
        assert port != busy and not (tmp_path / str(busy)).exists()
