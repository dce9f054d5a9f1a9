"""The vacuum duty's decisions (brooq.supervisor.vacuum): past the threshold, never twice, given
up after an hour.
"""

from __future__ import annotations

from typing import Any


class TableHealth:
    """The maintenance connection's answer to job_table_health: (dead tuples, xid age)."""

    q = type("Q", (), {"job_table_health": "health", "job_vacuum": "vacuum"})()

    def __init__(self, dead: float = 0.0) -> None:
        self.dead, self.asked = dead, 0

    def with_db(self, what: str, fn: Any) -> tuple[float, float]:
        self.asked += 1
        return (self.dead, 0.0)


def test_vacuum_starts_past_the_threshold_and_never_twice_at_once() -> None:
    """Below the threshold nothing is sent; while one VACUUM is in flight the table is
    not even looked at (the real sending and reading: tests/process/test_operations.py)."""
    from brooq.supervisor.duties import vacuum as vacuum_mod

    health = TableHealth(dead=99_999)
    duty = vacuum_mod.Vacuum(health, "dsn", 100_000, 2.0, clock=lambda: 1.0)  # type: ignore[arg-type]
    assert duty.run_once(0.0) == {} and health.asked == 1 and duty.line.conn is None
    health.dead = 10**9
    duty.line.started_at = 0.0  # one in flight
    assert duty.run_once(1.0) == {} and health.asked == 1
    off = vacuum_mod.Vacuum(health, "dsn", 0, 2.0)  # type: ignore[arg-type]
    assert off.run_once(2.0) == {} and health.asked == 1  # 0: left to autovacuum


def test_a_vacuum_without_an_answer_is_given_up_after_an_hour() -> None:
    """A lost server or a cut network must not stop every later vacuum: the statement in
    flight is dropped after GIVE_UP_AFTER, and the duty decides again."""
    from brooq.supervisor.duties import vacuum as vacuum_mod

    now = [0.0]
    duty = vacuum_mod.Vacuum(TableHealth(), "dsn", 100, 2.0, clock=lambda: now[0])  # type: ignore[arg-type]
    duty.line.started_at = 0.0  # a VACUUM sent at 0 and never answered
    now[0] = vacuum_mod.GIVE_UP_AFTER - 1
    duty.run_once(now[0])
    assert duty.line.started_at == 0.0
    now[0] = vacuum_mod.GIVE_UP_AFTER + 1
    duty.run_once(now[0])
    assert duty.line.started_at is None and duty.line.conn is None


def test_a_vacuum_that_could_not_clean_waits_for_as_many_new_dead_tuples() -> None:
    """Under a held snapshot a VACUUM leaves the dead tuples where they were: the next
    waits until the threshold's worth more have piled up, not one period. Once they go
    (autovacuum's run after the snapshot ended, say), the threshold counts from there."""
    from brooq.supervisor.duties import vacuum as vacuum_mod
    from brooq.supervisor.offloop import Answer

    health = TableHealth(dead=150_000)
    duty = vacuum_mod.Vacuum(health, "dsn", 100_000, 2.0)  # type: ignore[arg-type]
    sent: list[str] = []
    duty.line.send = lambda text: sent.append(text) or True  # type: ignore[method-assign]
    assert duty.run_once(0.0) == {"started": 1} and len(sent) == 1
    duty.line.service = lambda readable: Answer([], "", 1.0)  # type: ignore[method-assign]
    duty.service([])  # the VACUUM's answer: it removed nothing
    health.dead = 152_000  # what it left, and a little more since
    assert duty.run_once(2.0) == {} and duty.left == 152_000
    health.dead = 251_999
    assert duty.run_once(4.0) == {}
    health.dead = 252_000
    assert duty.run_once(6.0) == {"started": 1} and len(sent) == 2
    duty.service([])  # this one removed them all: the snapshot is gone
    health.dead = 1_000
    assert duty.run_once(8.0) == {} and duty.left == 1_000
    health.dead = 101_000
    assert duty.run_once(10.0) == {"started": 1} and len(sent) == 3
