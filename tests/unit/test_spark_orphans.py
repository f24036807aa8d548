"""What one write step does with the Spark sessions it uses (``reclock.spark.orphans``): which it interrupts, when
it asks for the source's write lock, what it tags. The Spark Connect side is tested against a real server
(``tests/integration/test_network_faults.py``, a killed writer's job); here a session is a recorder with the
methods a session has."""

from __future__ import annotations

import pytest

from reclock.spark.orphans import OrphanedWrites, write_tag


class Recorder:
    """A session's tag methods, recording each call; ``connect``: whether it looks like a Spark Connect session
    (it has a ``client``)."""

    def __init__(self, connect: bool = True, left: int = 1, fails: bool = False) -> None:
        if connect:
            self.client = object()
        self.calls: list[tuple[str, str]] = []
        self.left = left
        self.fails = fails

    def interruptTag(self, tag: str) -> list[str]:  # noqa: N802 - PySpark's name
        self.calls.append(("interrupt", tag))
        if self.fails:
            raise RuntimeError("UNAVAILABLE")
        ids, self.left = [f"op{i}" for i in range(self.left)], 0
        return ids

    def addTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("add", tag))

    def removeTag(self, tag: str) -> None:  # noqa: N802
        self.calls.append(("remove", tag))


class Claims:
    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.answer


def test_a_step_that_holds_the_lock_interrupts_what_the_tag_still_runs_then_tags_its_own_work():
    s, claim = Recorder(left=2), Claims(True)
    w = OrphanedWrites("orders", claim)
    w.attach(s)
    w.attach(s)  # the same session again (every ctx.spark() of the step): nothing more
    assert s.calls == [("interrupt", "reclock-write-orders"), ("add", "reclock-write-orders")]
    assert w.interrupted == 2 and claim.asked == 1
    w.detach()
    assert s.calls[-1] == ("remove", "reclock-write-orders")


def test_a_step_without_the_lock_interrupts_nothing():
    s = Recorder()
    w = OrphanedWrites("orders", Claims(False))
    w.attach(s)
    assert s.calls == [("add", "reclock-write-orders")] and w.interrupted == 0


def test_a_session_in_the_process_is_tagged_and_the_lock_never_asked():
    """No Spark Connect: a dead process took its driver with it, so there is nothing to interrupt (and two
    writers of one source in one process must not interrupt each other)."""
    s, claim = Recorder(connect=False), Claims(True)
    w = OrphanedWrites("orders", claim)
    w.attach(s)
    assert s.calls == [("add", "reclock-write-orders")] and claim.asked == 0


class Classic(Recorder):
    """A classic session: PySpark's ``client`` raises on it (not an ``AttributeError``)."""

    def __init__(self) -> None:
        super().__init__(connect=False)

    @property
    def client(self):
        raise RuntimeError("[ONLY_SUPPORTED_WITH_SPARK_CONNECT] SparkSession.client is only supported with Spark Connect")


def test_a_classic_session_whose_client_raises_is_tagged_only():
    s, claim = Classic(), Claims(True)
    OrphanedWrites("orders", claim).attach(s)
    assert s.calls == [("add", "reclock-write-orders")] and claim.asked == 0


def test_a_new_session_in_the_same_step_is_cleared_too_and_the_lock_asked_once():
    """A write that attaches anew (its server restarted) uses a second session: it is cleared and tagged as
    the first was; the lock is the step's, taken once."""
    first, second, claim = Recorder(left=0), Recorder(left=1), Claims(True)
    w = OrphanedWrites("orders", claim)
    w.attach(first)
    w.attach(second)
    assert second.calls == [("interrupt", "reclock-write-orders"), ("add", "reclock-write-orders")]
    assert claim.asked == 1 and w.interrupted == 1
    w.detach()
    assert first.calls[-1] == second.calls[-1] == ("remove", "reclock-write-orders")


def test_an_interrupt_that_fails_leaves_the_step_to_its_own_work(caplog):
    s = Recorder(fails=True)
    w = OrphanedWrites("orders", Claims(True))
    w.attach(s)
    assert s.calls == [("interrupt", "reclock-write-orders"), ("add", "reclock-write-orders")]
    assert w.interrupted == 0 and "interrupting what a dead writer left running failed" in caplog.text


@pytest.mark.parametrize("source, tag", [("orders", "reclock-write-orders"), ("a,b", "reclock-write-a_b")])
def test_the_write_tag_is_one_spark_takes(source, tag):
    assert write_tag(source) == tag
