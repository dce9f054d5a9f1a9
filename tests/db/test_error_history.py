"""The error history (job.errors) against a real PostgreSQL: one entry per failure, settled
death or lease expiry, the last 20 kept.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import brooq
import brooq.testing
from brooq.declare.handlers import Policy
from brooq.page import reads as page_reads
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


def fail(db: psycopg.Connection[Any], job_id: uuid.UUID, n: int, tb: str | None) -> None:
    """The child's failed outcome for attempt ``n``, with ``tb`` as its traceback."""
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
            "kind": "raised",
            "traceback": tb,
        },
    ).fetchone()
    assert row == ("failed",)


def history(db: psycopg.Connection[Any], job_id: uuid.UUID) -> list[dict[str, Any]]:
    return db.execute("SELECT errors FROM job_all WHERE id = %s", (job_id,)).fetchone()[0]  # type: ignore[index,no-any-return]


def test_the_history_keeps_the_last_20_entries(db: psycopg.Connection[Any]) -> None:
    job_id, _ = brooq.enqueue(db, brooq.Job("t"))
    for n in range(1, 26):
        assert claim(db, "w1") == job_id
        fail(db, job_id, n, f"Traceback (most recent call last):\n  attempt {n}\nValueError")
        errors = history(db, job_id)
        assert len(errors) == min(n, 20)
        assert errors[-1]["attempt"] == n and errors[-1]["error"] == f"error {n}"
    assert [e["attempt"] for e in errors] == list(range(6, 26))
    assert [e["error"] for e in errors] == [f"error {n}" for n in range(6, 26)]
    assert {e["worker"] for e in errors} == {"w1"}
    assert {e["kind"] for e in errors} == {"raised"}
    # Tracebacks on the newest 5 entries only: the older ones keep their one-line error.
    assert [e["traceback"] is not None for e in errors] == [False] * 15 + [True] * 5
    assert errors[-1]["traceback"].endswith("attempt 25\nValueError")
    assert set(errors[0]) == {"attempt", "at", "started_at", "worker", "error", "kind", "traceback"}


def test_an_entry_says_when_its_attempt_was_claimed(db: psycopg.Connection[Any]) -> None:
    job_id, _ = brooq.enqueue(db, brooq.Job("t"))
    claim(db, "w1")
    claimed = db.execute("SELECT updated_at FROM job WHERE id = %s", (job_id,)).fetchone()[0]  # type: ignore[index]
    fail(db, job_id, 1, None)
    [entry] = history(db, job_id)
    assert datetime.fromisoformat(entry["started_at"]) == claimed
    assert datetime.fromisoformat(entry["at"]) >= claimed
    assert entry["traceback"] is None


def test_entries_of_an_older_release_are_kept_as_they_are(db: psycopg.Connection[Any]) -> None:
    """Rows written before migration 0018 (four keys, no traceback) and a history that is
    not an array (written by hand): appended to, never refused."""
    old = [
        {"attempt": n, "at": "2026-12-01T10:00:00+00:00", "error": "e", "worker": "w"}
        for n in (1, 2, 3, 4, 5, 6)
    ]
    job_id, _ = brooq.enqueue(db, brooq.Job("t"))
    db.execute("UPDATE job SET errors = %s WHERE id = %s", (Jsonb(old), job_id))
    claim(db, "w1")
    fail(db, job_id, 7, "tb 7")
    errors = history(db, job_id)
    assert errors[:6] == old and errors[6]["traceback"] == "tb 7"
    db.execute("DELETE FROM job WHERE id = %s", (job_id,))
    other, _ = brooq.enqueue(db, brooq.Job("t", {"n": 2}))
    db.execute('UPDATE job SET errors = \'{"not": "a list"}\' WHERE id = %s', (other,))
    assert claim(db, "w1") == other
    fail(db, other, 1, "tb")
    assert [e["error"] for e in history(db, other)] == ["error 1"]


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
    assert (errors[0]["kind"], errors[0]["traceback"]) == ("worker_died", None)


def test_a_kill_settled_keeps_the_stack_apart_from_its_one_line_error(
    db: psycopg.Connection[Any],
) -> None:
    """The watchdog's kill: last_error as before (the cause with the stack read), the
    entry's error the one line, its traceback the stack as brooq.ipc.tracebacks cut it."""
    job_id, _ = brooq.enqueue(db, brooq.Job("t"))
    claim(db, "host:41:abcdef")
    policy = Policy(5, 60, 300, 1, 60)
    stack = 'Stack when killed (most recent call last):\n  File "app.py", line 3, in spin'
    maintenance.settle_dead_worker(
        db,
        "host:41:abcdef",
        job_id,
        "killed: max_execution_timeout 2s exceeded (ran 2.1s); stack (...):\n  File ...",
        {},
        policy,
        kind="killed",
        summary="killed: max_execution_timeout 2s exceeded (ran 2.1s)",
        traceback=stack,
    )
    errors, last_error = db.execute(
        "SELECT errors, last_error FROM job WHERE id = %s", (job_id,)
    ).fetchone()  # type: ignore[misc]
    assert last_error.endswith("stack (...):\n  File ...")
    [entry] = errors
    assert entry["error"] == "killed: max_execution_timeout 2s exceeded (ran 2.1s)"
    assert (entry["kind"], entry["traceback"]) == ("killed", stack)


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
        "SELECT state, attempts, errors FROM job_all WHERE id = %s", (job_id,)
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
    assert {(e["kind"], e["traceback"]) for e in errors} == {("lease_expired", None)}


def test_what_drain_runs_keeps_its_traceback_and_the_page_reads_it(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """The child's path (brooq.testing.drain runs the worker's attempt and outcome code):
    a nested raise keeps its traceback, a CancelJob its own entry; the status page's job
    read (web_job_get) carries the history, tracebacks included, for its job view."""

    def count(order: dict[str, Any]) -> int:
        return len(order["items"])

    def average(order: dict[str, Any]) -> float:
        return sum(order["items"]) / count(order)

    @queue.handler("t.average", max_attempts=1)
    def handle(claim: brooq.Claim) -> float:
        if claim.payload.get("cancel"):
            raise brooq.CancelJob("no longer wanted")
        return average(claim.payload)

    failed, _ = queue.enqueue(brooq.Job("t.average", {"items": []}))
    canceled, _ = queue.enqueue(brooq.Job("t.average", {"items": [], "cancel": True}))
    brooq.testing.drain(queue, topics=["t.average"])
    record = queue.get(failed)
    assert record is not None and record.state == "dead"
    [entry] = record.errors
    assert (entry["kind"], entry["error"]) == ("raised", "ZeroDivisionError: division by zero")
    assert "in handle" in entry["traceback"] and "in average" in entry["traceback"]
    assert entry["traceback"].endswith("ZeroDivisionError: division by zero")
    record = queue.get(canceled)
    assert record is not None and record.state == "canceled"
    [entry] = record.errors
    assert (entry["kind"], entry["error"]) == ("canceled", "CancelJob: no longer wanted")
    assert entry["traceback"].endswith("CancelJob: no longer wanted")
    page = page_reads.job(db, failed)
    assert page is not None and page["errors"] == queue.get(failed).errors  # type: ignore[union-attr]
