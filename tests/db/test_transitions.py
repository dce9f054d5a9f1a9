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


def _job_in(db: psycopg.Connection[Any], state: str, *, moved: bool = False) -> uuid.UUID:
    """A job put straight into ``state`` (processing with a lease, as the table demands):
    inserted in it (a finished job stays in job, as one that ended before migration 0020),
    or with ``moved`` inserted pending and updated into it (a finished job is then in
    job_history, as every job ending now is)."""
    job_id = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, state, locked_by, locked_until) VALUES "
        "(%(id)s, 'rules.t', %(state)s, %(holder)s, %(until)s)",
        {
            "id": job_id,
            "state": "pending" if moved else state,
            "holder": "someone" if state == "processing" else None,
            "until": datetime.now(timezone.utc) + timedelta(hours=1)
            if state == "processing"
            else None,
        },
    )
    if moved:
        db.execute("UPDATE job SET state = %s WHERE id = %s", (state, job_id))
    return job_id


# Where each transition puts a job.
_AFTER = {"cancel": "canceled", "retry": "pending", "hold": "on_hold", "release": "pending"}


@pytest.mark.parametrize("moved", [False, True], ids=["in-place", "moved"])
@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("action", ["cancel", "retry", "hold", "release"])
def test_queue_transitions_follow_the_constants(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    action: Transition,
    state: str,
    moved: bool,
) -> None:
    job_id = _job_in(db, state, moved=moved)
    finished = state in ("done", "dead", "canceled")
    if moved and finished:
        assert db.execute("SELECT 1 FROM job_history WHERE id = %s", (job_id,)).fetchone()
    changed = getattr(queue, action)(job_id)
    assert changed == (state in FROM_STATES[action])
    record = queue.get(job_id)
    assert record is not None
    if changed:
        assert record.state == _AFTER[action]
        # Where it is now: an active job in job, a finished one in job_history only.
        tables = [
            table
            for table in ("job", "job_history")
            if db.execute(f"SELECT 1 FROM {table} WHERE id = %s", (job_id,)).fetchone()
        ]
        assert tables == (["job_history"] if action == "cancel" else ["job"])
        return
    assert record.state == state  # refused: untouched
    refusal = queue.explain_refusal(job_id, action)
    assert isinstance(refusal, InvalidTransition)
    assert str(refusal) == transition_refusal(action, state, job_id)


def test_queue_explains_an_unknown_job(queue: brooq.Queue) -> None:
    assert not queue.cancel(JOB) and not queue.retry(JOB)
    refusal = queue.explain_refusal(JOB, "cancel")
    assert isinstance(refusal, JobNotFound) and str(refusal) == f"no job with id {JOB}"
