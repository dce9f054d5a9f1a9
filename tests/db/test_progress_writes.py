"""Progress in the job table (claim.progress): the master's write (job_write_progress)
only while the job is processing under the attempt and holder that reported it, a locked
row skipped and said, a new claim starting with none, and the outcome statements' _progress
variants carrying the attempt's last report, after which no write changes it."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from brooq.sql import Q
from brooq.supervisor import maintenance


def _job(db: psycopg.Connection[Any], worker: str, attempts: int = 1) -> uuid.UUID:
    job_id = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, state, attempts, locked_by, locked_until) "
        "VALUES (%s, 't', 'processing', %s, %s, now() + interval '30 seconds')",
        (job_id, attempts, worker),
    )
    return job_id


def _progress(db: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[Any, ...] | None:
    return db.execute(
        "SELECT progress, progress_message FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()


def test_the_master_writes_a_report_only_for_its_attempt_and_holder(
    db: psycopg.Connection[Any],
) -> None:
    a, b, c = _job(db, "w1"), _job(db, "w1", attempts=2), _job(db, "w2")
    reports = [
        (a, "w1", 1, 0.5, "résumé, half"),
        (b, "w1", 1, 0.9, "an earlier attempt's"),  # b runs its second attempt
        (c, "w1", 1, 0.9, "not its holder"),
    ]
    assert maintenance.write_progress(db, reports) == set()  # nothing locked
    assert _progress(db, a) == (0.5, "résumé, half")
    assert _progress(db, b) == (None, None)
    assert _progress(db, c) == (None, None)
    assert maintenance.write_progress(db, [(a, "w1", 1, 1.0, "")]) == set()
    assert _progress(db, a) == (1.0, "")
    assert maintenance.write_progress(db, []) == set()  # no statement at all


def test_a_finished_job_keeps_its_progress_whatever_the_master_writes_later(
    db: psycopg.Connection[Any],
) -> None:
    for outcome in ("done", "failed", "canceled"):
        job_id = _job(db, "w1")
        params: dict[str, Any] = {
            "id": job_id,
            "worker": "w1",
            "progress": 0.8,
            "progress_message": "last before the end",
            "error": "boom",
            "history_error": "boom",
            "kind": "raised",
            "traceback": None,
        }
        if outcome == "done":
            assert db.execute(Q.job_set_done_progress, {**params, "result": None}).rowcount == 1
        elif outcome == "canceled":
            assert db.execute(Q.job_set_canceled_progress, params).rowcount == 1
        else:
            state = db.execute(
                Q.job_set_failed_progress,
                {
                    **params,
                    "refund": False,
                    "max_attempts": 3,
                    "delay": 60,
                },
            ).fetchone()
            assert state == ("failed",)
        # A report read off the board before the outcome, written after it: nothing.
        assert maintenance.write_progress(db, [(job_id, "w1", 1, 0.9, "late")]) == set()
        assert _progress(db, job_id) == (0.8, "last before the end"), outcome


def test_the_plain_outcome_keeps_what_the_master_wrote(db: psycopg.Connection[Any]) -> None:
    job_id = _job(db, "w1")
    maintenance.write_progress(db, [(job_id, "w1", 1, 0.3, "a third")])
    assert db.execute(Q.job_set_done, {"id": job_id, "worker": "w1", "result": None}).rowcount
    assert _progress(db, job_id) == (0.3, "a third")


def test_a_locked_row_is_skipped_and_said(db: psycopg.Connection[Any], dsn: str) -> None:
    job_id = _job(db, "w1")
    with psycopg.connect(dsn) as other:  # the child's outcome transaction, say
        other.execute("SELECT 1 FROM job WHERE id = %s FOR NO KEY UPDATE", (job_id,))
        assert maintenance.write_progress(db, [(job_id, "w1", 1, 0.5, "x")]) == {job_id}
        other.rollback()
    assert _progress(db, job_id) == (None, None)
    assert maintenance.write_progress(db, [(job_id, "w1", 1, 0.5, "x")]) == set()
    assert _progress(db, job_id) == (0.5, "x")


def test_a_new_claim_starts_with_no_progress(db: psycopg.Connection[Any]) -> None:
    job_id = uuid.uuid4()
    db.execute(
        "INSERT INTO job (id, topic, state, attempts, progress, progress_message) "
        "VALUES (%s, 't', 'failed', 1, 0.4, 'the first attempt''s')",
        (job_id,),
    )
    rows = db.execute(
        Q.job_finish_and_claim,
        {
            "done": [],
            "topics": ["t"],
            "limit": 1,
            "children": 1,
            "worker": "w1",
            "lease": 30.0,
            "queue": "default",
        },
    ).fetchall()
    assert [r[1] for r in rows] == [job_id]
    assert _progress(db, job_id) == (None, None)
