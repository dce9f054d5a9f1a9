"""The error history (job.errors) and queue.wait / wait_async, against a real
PostgreSQL and, where a worker matters, a real brooq-master (the children's identity as
the history's worker, a wait answered across processes)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

import brooq
from brooq import queue as queue_mod
from brooq import waiting
from brooq.handlers import Policy
from brooq.sql import Q
from brooq.supervisor import maintenance
from tests.db.test_cli import as_json, ok
from tests.harness import StartMaster, wait_for

HOST = socket.gethostname()


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


def attempt_pids(db: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[int, int]:
    """attempt -> pid of the child that ran it (the test app records each execution)."""
    rows = db.execute(
        "SELECT attempt, pid FROM execution WHERE job_id = %s AND note IN ('', 'start')",
        (job_id,),
    ).fetchall()
    return {int(a): int(p) for a, p in rows}


def is_identity_of(worker: str, pid: int) -> bool:
    """A child's identity is host:pid:tag (brooq.worker.config.identity_for)."""
    host, wpid, tag = worker.split(":")
    return (host, int(wpid)) == (HOST, pid) and len(tag) == 6


def waited(db: psycopg.Connection[Any], job_id: uuid.UUID) -> bool:
    row = db.execute("SELECT waited FROM job WHERE id = %s", (job_id,)).fetchone()
    return bool(row and row[0])


class Waiter(threading.Thread):
    """queue.wait in a thread: its record, its error, when it returned."""

    def __init__(self, queue: brooq.Queue, job_id: uuid.UUID, timeout: float | None) -> None:
        super().__init__(daemon=True)
        self.queue, self.job_id, self.timeout = queue, job_id, timeout
        self.record: brooq.JobRecord | None = None
        self.error: BaseException | None = None
        self.returned_at = 0.0

    def run(self) -> None:
        try:
            self.record = self.queue.wait(self.job_id, timeout=self.timeout)
        except BaseException as exc:
            self.error = exc
        self.returned_at = time.monotonic()


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """queue.wait polls only every 60 s: returning sooner takes the notification."""
    monkeypatch.setattr(queue_mod, "WAIT_POLL_FIRST", 60.0)
    monkeypatch.setattr(queue_mod, "WAIT_POLL_MAX", 60.0)


@pytest.fixture
def waiters() -> Iterator[list[Waiter]]:
    started: list[Waiter] = []
    yield started
    for w in started:
        w.join(15)


def start_waiter(
    waiters: list[Waiter], queue: brooq.Queue, job_id: uuid.UUID, timeout: float | None = 30
) -> Waiter:
    w = Waiter(queue, job_id, timeout)
    waiters.append(w)
    w.start()
    return w


# -- the error history -------------------------------------------------------------------------


def test_three_failures_leave_three_entries_with_the_childs_identity(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, dsn: str
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.fail"))  # max_attempts 3, backoff 50-100 ms
    start_master(workers=2)
    record = queue.wait(job_id, timeout=30)
    assert (record.state, record.attempts) == ("dead", 3)
    pids = attempt_pids(db, job_id)
    assert sorted(pids) == [1, 2, 3]
    assert [e["attempt"] for e in record.errors] == [1, 2, 3]  # oldest first
    for entry in record.errors:
        assert set(entry) == {"attempt", "at", "error", "worker"}
        n = entry["attempt"]
        assert entry["error"] == f"ValueError: bad input on attempt {n}"
        assert is_identity_of(entry["worker"], pids[n]), (entry, pids)
    times = [datetime.fromisoformat(e["at"]) for e in record.errors]
    assert times == sorted(times) and len(set(times)) == 3
    assert queue.get(job_id) == record
    assert json.loads(json.dumps(record.to_dict()))["errors"] == record.errors

    # brooq jobs show: one line per entry; --json carries the history whole
    text = ok(dsn, "jobs", "show", str(job_id))
    lines = text.splitlines()
    at = lines.index("errors (3, oldest first):")
    for i, entry in enumerate(record.errors, start=1):
        line = lines[at + i]
        assert line.startswith(f"  attempt {i}  ") and entry["worker"] in line
        assert line.endswith(f"ValueError: bad input on attempt {i}")
    assert lines[at + 4] == "last error:      ValueError: bad input on attempt 3"
    shown = as_json(dsn, "jobs", "show", str(job_id))
    assert shown["errors"] == record.errors and shown["result"] is None


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


def test_a_killed_childs_job_gets_one_entry_with_the_dead_childs_identity(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    start_master(workers=1)
    job_id, _ = queue.enqueue(brooq.Job("t.slow", {"seconds": 2}))
    pid = wait_for(lambda: attempt_pids(db, job_id).get(1), what="the handler started")
    os.kill(pid, signal.SIGKILL)
    record = queue.wait(job_id, timeout=30)  # settled by the master, then run again
    assert (record.state, record.attempts) == ("done", 2)
    assert len(record.errors) == 1
    entry = record.errors[0]
    assert (entry["attempt"], entry["error"]) == (1, "worker died: SIGKILL")
    assert is_identity_of(entry["worker"], pid)
    assert attempt_pids(db, job_id)[2] != pid


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


def test_a_retried_job_is_no_longer_flagged_waited(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """Its waiter has returned: a retry clears the flag, so the job's next end costs no
    notification; the history stays."""
    job_id, _ = queue.enqueue(brooq.Job("t.ok"))
    db.execute(
        "UPDATE job SET state = 'dead', waited = true, errors = '[{\"attempt\": 1}]' WHERE id = %s",
        (job_id,),
    )
    assert queue.retry(job_id)
    assert not waited(db, job_id)
    assert db.execute("SELECT errors FROM job WHERE id = %s", (job_id,)).fetchone() == (
        [{"attempt": 1}],
    )


def test_wait_times_out(queue: brooq.Queue, db: psycopg.Connection[Any]) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t.ok"))  # no master: it stays pending
    started = time.monotonic()
    with pytest.raises(brooq.WaitTimeout) as raised:
        queue.wait(job_id, timeout=0.5)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed <= 1.5, elapsed
    assert isinstance(raised.value, TimeoutError) and str(job_id) in str(raised.value)
    assert waited(db, job_id)


@pytest.mark.usefixtures("no_poll")
def test_wait_wakes_on_the_notification_of_any_ending(
    queue: brooq.Queue, db: psycopg.Connection[Any], waiters: list[Waiter]
) -> None:
    # No master: the job is ended by hand, as an operator's cancel would (a canceled
    # job is terminal too), while another waited job's end is notified first.
    other, _ = queue.enqueue(brooq.Job("t"))
    job_id, _ = queue.enqueue(brooq.Job("t"))
    w = start_waiter(waiters, queue, job_id)
    w_other = start_waiter(waiters, queue, other)
    wait_for(lambda: waited(db, job_id) and waited(db, other), what="the flags")
    db.execute("UPDATE job SET state = 'done' WHERE id = %s", (other,))
    w_other.join(10)
    assert w_other.record is not None and w_other.record.state == "done"
    assert w.is_alive()  # another job's notification is not ours
    assert queue.cancel(job_id)
    ended = time.monotonic()
    w.join(10)
    assert w.error is None and w.record is not None and w.record.state == "canceled"
    assert w.returned_at - ended < 5  # not the 60 s poll


def test_wait_returns_through_the_poll_when_no_notification_comes(
    queue: brooq.Queue, db: psycopg.Connection[Any], waiters: list[Waiter]
) -> None:
    db.execute("DROP TRIGGER job_waited_notify ON job")  # every notification missed
    job_id, _ = queue.enqueue(brooq.Job("t"))
    w = start_waiter(waiters, queue, job_id, timeout=20)
    wait_for(lambda: waited(db, job_id), what="the flag")
    time.sleep(0.5)
    db.execute("UPDATE job SET state = 'dead' WHERE id = %s", (job_id,))
    ended = time.monotonic()
    w.join(15)
    assert w.error is None and w.record is not None and w.record.state == "dead"
    assert w.returned_at - ended < 2.5  # the poll interval was at most 1.6 s by then


def test_wait_survives_a_lost_connection(
    queue: brooq.Queue, db: psycopg.Connection[Any], waiters: list[Waiter]
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t"))
    w = start_waiter(waiters, queue, job_id, timeout=20)
    wait_for(lambda: waited(db, job_id), what="the flag")

    def waiter_pids() -> list[int]:
        """The backend of the waiters' shared LISTEN connection (brooq.waiting)."""
        rows = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            (waiting.APPLICATION_NAME,),
        ).fetchall()
        return [int(r[0]) for r in rows]

    [pid] = wait_for(waiter_pids, what="the waiter's backend")
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: waiter_pids() and waiter_pids() != [pid], what="a new connection")
    assert w.is_alive()
    db.execute("UPDATE job SET state = 'done' WHERE id = %s", (job_id,))
    w.join(15)
    assert w.error is None and w.record is not None and w.record.state == "done"


def test_wait_on_a_finished_job_returns_at_once(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t"))
    db.execute("UPDATE job SET state = 'done' WHERE id = %s", (job_id,))
    started = time.monotonic()
    assert queue.wait(job_id, timeout=0).state == "done"
    assert time.monotonic() - started < 1
    assert not waited(db, job_id)  # job_wait_register leaves a terminal row alone


def test_wait_unknown_and_malformed_ids(queue: brooq.Queue) -> None:
    missing = uuid.uuid4()
    with pytest.raises(brooq.JobNotFound, match=str(missing)):
        queue.wait(missing, timeout=5)
    with pytest.raises(brooq.JobNotFound):
        asyncio.run(queue.wait_async(missing, timeout=5))
    with pytest.raises(brooq.InvalidJobId):
        queue.wait("42")
    with pytest.raises(brooq.InvalidJobId):
        asyncio.run(queue.wait_async("42"))
    for bad in (-1, float("nan"), "1"):
        with pytest.raises(brooq.BrooqError, match="timeout"):
            queue.wait(missing, timeout=bad)  # type: ignore[arg-type]


@pytest.mark.usefixtures("no_poll")
def test_wait_async(queue: brooq.Queue, dsn: str) -> None:
    job_id, _ = queue.enqueue(brooq.Job("t"))
    pending, _ = queue.enqueue(brooq.Job("t"))

    def finish_when_waited() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_for(lambda: waited(conn, job_id), what="the flag")
            time.sleep(0.3)
            conn.execute("UPDATE job SET state = 'done' WHERE id = %s", (job_id,))

    async def main() -> tuple[brooq.JobRecord, int, float]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.02)

        tick = asyncio.create_task(ticker())
        finisher = asyncio.create_task(asyncio.to_thread(finish_when_waited))
        started = time.monotonic()
        record = await queue.wait_async(job_id, timeout=20)
        elapsed = time.monotonic() - started
        done.set()
        await tick
        await finisher
        with pytest.raises(brooq.WaitTimeout):
            await queue.wait_async(pending, timeout=0.3)
        return record, ticks, elapsed

    record, ticks, elapsed = asyncio.run(main())
    assert record.state == "done"
    assert elapsed < 10  # the notification, not the 60 s poll
    assert ticks >= 5  # the event loop ran meanwhile
