"""The error history (job.errors) against a real PostgreSQL: one entry per failure, settled
death or lease expiry, the last 20 kept.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

import brooq
from brooq.declare.handlers import Policy
from brooq.sql import Q
from brooq.supervisor import maintenance


def claim(db: psycopg.Connection[Any], worker: str, lease: float = 30.0) -> uuid.UUID:
    rows = db.execute(
        Q.job_finish_and_claim,
        {
            "done": [],
            "topics": ["t"],
            "limit": 1,
            "children": 1,
            "worker": worker,
            "lease": lease,
            "queue": "default",
        },
    ).fetchall()
    assert len(rows) == 1, rows
    return uuid.UUID(str(rows[0][1]))


def test_a_job_without_failures_has_an_empty_history(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t"))
    record = queue.get(job_id)
    assert record is not None and record.errors == [] and record.result is None
    assert queue.list_jobs()[0].errors == []
    db.execute("UPDATE job SET result = '{\"n\": 1}' WHERE id = %s", (job_id,))
    assert queue.list_jobs()[0].result == {"n": 1}


def test_the_history_keeps_the_last_20_entries(db: psycopg.Connection[Any]) -> None:
    job_id, _ = brooq.enqueue(db, brooq.Job("t"))
    for n in range(1, 26):
        assert claim(db, "w1") == job_id
        row = db.execute(
            Q.job_set_failed,
            {
                "id": job_id,
                "worker": "w1",
                "refund": False,
                "max_attempts": 100,
                "delay": 0.0,
                "error": f"error {n}",
                "history_error": f"error {n}",
            },
        ).fetchone()
        assert row == ("failed",)
        errors = db.execute("SELECT errors FROM job WHERE id = %s", (job_id,)).fetchone()[0]  # type: ignore[index]
        assert len(errors) == min(n, 20)
        assert errors[-1]["attempt"] == n and errors[-1]["error"] == f"error {n}"
    assert [e["attempt"] for e in errors] == list(range(6, 26))
    assert [e["error"] for e in errors] == [f"error {n}" for n in range(6, 26)]
    assert {e["worker"] for e in errors} == {"w1"}


def test_settle_dead_worker_names_the_worker(db: psycopg.Connection[Any]) -> None:
    job_id, _ = brooq.enqueue(db, brooq.Job("t"))
    claim(db, "host:41:abcdef")
    policy = Policy(
        max_attempts=5,
        attempt_timeout=60,
        max_execution_timeout=300,
        backoff_base=1,
        backoff_max=60,
    )
    failed, released = maintenance.settle_dead_worker(
        db, "host:41:abcdef", job_id, "worker died: SIGKILL " + "x" * 3000, {}, policy
    )
    assert failed == [(job_id, "t", "failed")] and released == []
    errors, last_error = db.execute(
        "SELECT errors, last_error FROM job WHERE id = %s", (job_id,)
    ).fetchone()  # type: ignore[misc]
    assert len(errors) == 1
    assert (errors[0]["attempt"], errors[0]["worker"]) == (1, "host:41:abcdef")
    # the entry is bounded to 1,000 characters, last_error to 2,000
    assert len(errors[0]["error"]) == 1000 and len(last_error) == 2000
    assert errors[0]["error"].startswith("worker died: SIGKILL xxx")


def test_each_lease_expiry_appends_an_entry(db: psycopg.Connection[Any]) -> None:
    job_id, _ = brooq.enqueue(db, brooq.Job("t"))

    def expire(worker: str) -> None:
        assert claim(db, worker) == job_id
        db.execute("UPDATE job SET locked_until = now() - interval '1 s' WHERE id = %s", (job_id,))
        maintenance.reap_expired(db, 3)

    expire("host:1:aaaaaa")
    expire("host:2:bbbbbb")
    expire("host:3:cccccc")
    state, attempts, errors = db.execute(
        "SELECT state, attempts, errors FROM job WHERE id = %s", (job_id,)
    ).fetchone()  # type: ignore[misc]
    assert (state, attempts) == ("dead", 1)
    # The attempt is refunded at each expiry: the next claim charges attempt 1 again.
    assert [(e["attempt"], e["worker"]) for e in errors] == [
        (1, "host:1:aaaaaa"),
        (1, "host:2:bbbbbb"),
        (1, "host:3:cccccc"),
    ]
    assert errors[0]["error"] == "lease expired (1 of 3): back to pending, the attempt refunded"
    assert errors[1]["error"].startswith("lease expired (2 of 3): back to pending")
    assert errors[2]["error"].startswith("lease expired (3 of 3): dead")
