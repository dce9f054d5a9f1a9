"""The waiter's logic, written once for queue.wait and queue.wait_async: driven here
step by step, without a database."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from brooq.errors import DatabaseUnavailable, JobNotFound
from brooq.job import JobRecord
from brooq.producer import wait as job_wait

JOB_ID = uuid.UUID(int=7)


class _Sub:
    error: BaseException | None = None


class _Owner:
    listen_dsn = "postgresql://u@h/db"
    settings: Any = None


def _record(state: str) -> JobRecord:
    now = datetime.now(timezone.utc)
    return JobRecord(JOB_ID, "t", None, state, 1, now, None, None, None, None, now, now)


def test_the_wait_reads_waits_backs_off_and_returns_the_ended_row() -> None:
    clock = job_wait.WaitClock(None)
    steps = job_wait._wait_steps(JOB_ID, clock, _Sub(), _Owner())
    assert next(steps) is job_wait._READ
    assert steps.send(_record("pending")) == job_wait.WAIT_POLL_FIRST
    assert steps.send(False) is job_wait._READ  # no wake-up: polled, the interval doubles
    assert steps.send(_record("processing")) == 2 * job_wait.WAIT_POLL_FIRST
    assert steps.send(True) is job_wait._READ  # woken: the interval stays
    assert steps.send(_record("processing")) == 2 * job_wait.WAIT_POLL_FIRST
    with pytest.raises(StopIteration) as done:
        steps.send(True)
        steps.send(_record("done"))
    assert done.value.value.state == "done"


def test_the_wait_names_an_unknown_job_and_a_lost_listener() -> None:
    steps = job_wait._wait_steps(JOB_ID, job_wait.WaitClock(1.0), _Sub(), _Owner())
    next(steps)
    with pytest.raises(JobNotFound, match=str(JOB_ID)):
        steps.send(None)
    sub = _Sub()
    sub.error = OSError("connection refused")
    steps = job_wait._wait_steps(JOB_ID, job_wait.WaitClock(1.0), sub, _Owner())
    next(steps)
    with pytest.raises(DatabaseUnavailable, match="connection refused"):
        steps.send(_record("pending"))


def _lost(reached: bool = False) -> job_wait.Lost:
    return job_wait.Lost(
        DatabaseUnavailable("cannot reach the database u@h:5432/db: refused"), reached
    )


def test_a_wait_rides_over_a_lost_database_and_reads_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(job_wait.time, "monotonic", lambda: now[0])
    clock = job_wait.WaitClock(None)
    steps = job_wait._wait_steps(JOB_ID, clock, _Sub(), _Owner())
    next(steps)
    assert steps.send(_record("processing")) == job_wait.WAIT_POLL_FIRST
    assert steps.send(False) is job_wait._READ
    # The database is gone (a failover): the wait polls on, backing off.
    assert steps.send(_lost()) == 2 * job_wait.WAIT_POLL_FIRST
    now[0] += job_wait.WAIT_OUTAGE - 1
    assert steps.send(False) is job_wait._READ
    assert steps.send(_lost()) == 4 * job_wait.WAIT_POLL_FIRST
    assert steps.send(False) is job_wait._READ
    # Back: the outage is forgotten, and a later one has its whole WAIT_OUTAGE again.
    assert steps.send(_record("processing")) == 8 * job_wait.WAIT_POLL_FIRST
    assert steps.send(True) is job_wait._READ
    # A lost read is tried again within WAIT_LOST_RETRY, however long the poll has grown.
    assert steps.send(_lost()) == job_wait.WAIT_LOST_RETRY < 8 * job_wait.WAIT_POLL_FIRST
    now[0] += job_wait.WAIT_OUTAGE - 1
    assert steps.send(True) is job_wait._READ
    with pytest.raises(StopIteration) as done:
        steps.send(_record("done"))
    assert done.value.value.state == "done"


def test_a_wait_says_a_database_lost_for_too_long_a_first_read_lost_and_a_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr(job_wait.time, "monotonic", lambda: now[0])
    # Lost for WAIT_OUTAGE in a row: the error, not an endless wait.
    steps = job_wait._wait_steps(JOB_ID, job_wait.WaitClock(None), _Sub(), _Owner())
    next(steps)
    steps.send(_record("processing"))
    steps.send(False)
    steps.send(_lost())
    steps.send(False)
    now[0] += job_wait.WAIT_OUTAGE
    with pytest.raises(DatabaseUnavailable, match="refused"):
        steps.send(_lost())
    # The very first read lost: a wrong DSN or a database down, said at once.
    steps = job_wait._wait_steps(JOB_ID, job_wait.WaitClock(None), _Sub(), _Owner())
    next(steps)
    with pytest.raises(DatabaseUnavailable, match="refused"):
        steps.send(_lost())
    # The very first read lost midway, its connection in hand: the database answered
    # (the DSN is right), so this is an outage the wait rides over.
    steps = job_wait._wait_steps(JOB_ID, job_wait.WaitClock(None), _Sub(), _Owner())
    next(steps)
    assert steps.send(_lost(reached=True)) == job_wait.WAIT_POLL_FIRST
    assert steps.send(False) is job_wait._READ
    assert steps.send(_lost()) == 2 * job_wait.WAIT_POLL_FIRST  # still riding over
    # Past the wait's own deadline while the database is lost: the database's error.
    steps = job_wait._wait_steps(JOB_ID, job_wait.WaitClock(5.0), _Sub(), _Owner())
    next(steps)
    steps.send(_record("processing"))
    steps.send(False)
    now[0] += 5.0
    with pytest.raises(DatabaseUnavailable, match="refused"):
        steps.send(_lost())


def test_a_lost_read_is_tried_again_soon_whatever_the_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that ended while its read failed sends no wake-up: with polling as good as
    off, the wait would sit until its deadline."""
    monkeypatch.setattr(job_wait, "WAIT_POLL_FIRST", 60.0)
    clock = job_wait.WaitClock(120)
    steps = job_wait._wait_steps(JOB_ID, clock, _Sub(), _Owner())
    next(steps)
    assert steps.send(_record("processing")) == pytest.approx(60.0, abs=0.01)
    assert steps.send(True) is job_wait._READ
    assert steps.send(_lost()) == job_wait.WAIT_LOST_RETRY
    assert steps.send(False) is job_wait._READ
    with pytest.raises(StopIteration) as done:
        steps.send(_record("done"))
    assert done.value.value.state == "done"
