"""The producer's logic, written once for the sync and async forms: driven here step by
step, without a database."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from brooq.errors import BrooqError
from brooq.job import Job
from brooq.producer import insert
from brooq.sql import Q

JOB_ID = uuid.UUID(int=7)


def test_a_key_whose_holder_keeps_vanishing_is_refused_in_the_same_words_by_both_forms() -> None:
    # One generator serves insert_checked and insert_checked_async: the refusal is its.
    steps = insert._insert_one(Job("t", {}, idempotency_key="k"), {}, Q)
    asked = [next(steps)]
    with pytest.raises(BrooqError, match="REPEATABLE READ or SERIALIZABLE"):
        while True:
            asked.append(steps.send(None))  # no row inserted, no row holding the key
    assert [step.statement for step in asked] == [Q.job_insert, Q.job_get_id_by_key] * 3


def test_keyless_jobs_are_copied_ready_and_scheduled_apart() -> None:
    later = datetime(2030, 1, 1, tzinfo=timezone.utc)
    jobs = [Job("t", 1), Job("t", 2, available_at=later), Job("t", 3)]
    steps = insert._insert_many(jobs, {}, Q)
    ready = next(steps)
    scheduled = steps.send(None)
    assert isinstance(ready, insert.Copy) and len(ready.rows) == 2
    assert isinstance(scheduled, insert.Copy) and scheduled.rows[0][3] == later
    with pytest.raises(StopIteration) as done:
        steps.send(None)
    assert [created for _, created in done.value.value] == [True, True, True]
