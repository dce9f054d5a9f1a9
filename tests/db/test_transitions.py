"""Every state x action through Queue.cancel and Queue.retry against PostgreSQL, so the SQL is
seen to follow the constants of brooq.job.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq
from brooq.errors import InvalidTransition, JobNotFound
from brooq.job import (
    FROM_STATES,
    STATES,
    Transition,
    transition_refusal,
)

JOB = uuid.UUID("7d4c5e0a-3f41-4c77-9d3e-2b1f6a0c9e51")


# -- against the database: the SQL follows the constants ------------------------------------


def _job_in(db: psycopg.Connection[Any], state: str) -> uuid.UUID:
    """A job put straight into ``state`` (processing with a lease, as the table demands)."""
    job_id = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, state, locked_by, locked_until) VALUES "
        "(%(id)s, 'rules.t', %(state)s, %(holder)s, %(until)s)",
        {
            "id": job_id,
            "state": state,
            "holder": "someone" if state == "processing" else None,
            "until": datetime.now(timezone.utc) + timedelta(hours=1)
            if state == "processing"
            else None,
        },
    )
    return job_id


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("action", ["cancel", "retry"])
def test_queue_transitions_follow_the_constants(
    queue: brooq.Queue, db: psycopg.Connection[Any], action: Transition, state: str
) -> None:
    job_id = _job_in(db, state)
    moved = queue.cancel(job_id) if action == "cancel" else queue.retry(job_id)
    assert moved == (state in FROM_STATES[action])
    record = queue.get(job_id)
    assert record is not None
    if moved:
        assert record.state == ("canceled" if action == "cancel" else "pending")
        return
    assert record.state == state  # refused: untouched
    refusal = queue.explain_refusal(job_id, action)
    assert isinstance(refusal, InvalidTransition)
    assert str(refusal) == transition_refusal(action, state, job_id)


def test_queue_explains_an_unknown_job(queue: brooq.Queue) -> None:
    assert not queue.cancel(JOB) and not queue.retry(JOB)
    refusal = queue.explain_refusal(JOB, "cancel")
    assert isinstance(refusal, JobNotFound) and str(refusal) == f"no job with id {JOB}"
