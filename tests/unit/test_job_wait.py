"""The waiter's logic, written once for queue.wait and queue.wait_async: driven here
step by step, without a database."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from brooq import job_wait
from brooq.errors import DatabaseUnavailable, JobNotFound
from brooq.job import JobRecord

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
