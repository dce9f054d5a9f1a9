"""queue.wait answered across processes: a job a real brooq-master's child finishes, or that
goes dead.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import psycopg
import pytest

import brooq
from brooq.producer import wait as job_wait_mod
from tests.harness import StartMaster


def attempt_pids(db: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[int, int]:
    """attempt -> pid of the child that ran it (the test app records each execution)."""
    rows = db.execute(
        "SELECT attempt, pid FROM execution WHERE job_id = %s AND note IN ('', 'start')",
        (job_id,),
    ).fetchall()
    return {int(a): int(p) for a, p in rows}


def waited(db: psycopg.Connection[Any], job_id: uuid.UUID) -> bool:
    row = db.execute("SELECT waited FROM job_all WHERE id = %s", (job_id,)).fetchone()
    return bool(row and row[0])


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """queue.wait polls only every 60 s: returning sooner takes the notification."""
    monkeypatch.setattr(job_wait_mod, "WAIT_POLL_FIRST", 60.0)
    monkeypatch.setattr(job_wait_mod, "WAIT_POLL_MAX", 60.0)


# -- waiting ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_poll")
def test_wait_returns_a_job_a_master_child_finishes(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.ok", {"sleep": 0.5}))
    start_master(workers=1)
    started = time.monotonic()
    record = queue.wait(job_id, timeout=30)  # polls every 60 s: the NOTIFY woke it
    assert time.monotonic() - started < 25
    assert (record.state, record.attempts) == ("done", 1)
    assert attempt_pids(db, job_id)[1] != os.getpid()  # run in another process
    assert waited(db, job_id)


def test_wait_on_a_job_that_goes_dead(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.fail"))
    start_master(workers=1)
    record = queue.wait(job_id, timeout=30)
    assert (record.state, record.attempts) == ("dead", 3)
    assert record.last_error == "ValueError: bad input on attempt 3"
