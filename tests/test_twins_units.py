"""The producer's and the waiter's logic, written once for the sync and async forms:
driven here step by step, without a database."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

import pytest

from brooq import job_wait, produce
from brooq.errors import BrooqError, DatabaseUnavailable, JobNotFound
from brooq.job import Job, JobRecord
from brooq.sql import Q

JOB_ID = uuid.UUID(int=7)


def test_a_key_whose_holder_keeps_vanishing_is_refused_in_the_same_words_by_both_forms() -> None:
    # One generator serves insert_checked and insert_checked_async: the refusal is its.
    steps = produce._insert_one(Job("t", {}, idempotency_key="k"), {}, Q)
    asked = [next(steps)]
    with pytest.raises(BrooqError, match="REPEATABLE READ or SERIALIZABLE"):
        while True:
            asked.append(steps.send(None))  # no row inserted, no row holding the key
    assert [step.statement for step in asked] == [Q.job_insert, Q.job_get_id_by_key] * 3


def test_keyless_jobs_are_copied_ready_and_scheduled_apart() -> None:
    later = datetime(2030, 1, 1, tzinfo=timezone.utc)
    jobs = [Job("t", 1), Job("t", 2, available_at=later), Job("t", 3)]
    steps = produce._insert_many(jobs, {}, Q)
    ready = next(steps)
    scheduled = steps.send(None)
    assert isinstance(ready, produce._Copy) and len(ready.rows) == 2
    assert isinstance(scheduled, produce._Copy) and scheduled.rows[0][3] == later
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert [created for _, created in done.value.value] == [True, True, True]


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
