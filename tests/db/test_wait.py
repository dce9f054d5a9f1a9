"""queue.wait and wait_async against a real PostgreSQL: woken by the notification of any
ending, through the poll when none comes, across a lost connection; the timeout, the
unknown and malformed ids.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import brooq
from brooq.producer import wait as job_wait_mod
from brooq.producer import wait_listener
from tests.harness import wait_for


def waited(db: psycopg.Connection[Any], job_id: uuid.UUID) -> bool:
    row = db.execute("SELECT waited FROM job_all WHERE id = %s", (job_id,)).fetchone()
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
    monkeypatch.setattr(job_wait_mod, "WAIT_POLL_FIRST", 60.0)
    monkeypatch.setattr(job_wait_mod, "WAIT_POLL_MAX", 60.0)


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
    assert db.execute("SELECT errors FROM job_all WHERE id = %s", (job_id,)).fetchone() == (
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
        """The backend of the waiters' shared LISTEN connection (brooq.producer.wait_listener)."""
        rows = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            (wait_listener.APPLICATION_NAME,),
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
