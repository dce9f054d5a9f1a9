"""queue.wait and wait_async at scale, on a real PostgreSQL: hundreds of waiters share
one LISTEN connection (brooq.producer.wait_listener) and the Queue's bounded pool, so their number
does not grow the server's connections, and producers beside them are served; a waiter
canceled leaves nothing behind; the shared connection lost, a job ending meanwhile still
wakes its waiter; a fork's child waits on a listener of its own."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
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

N = 500


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """queue.wait polls only every 60 s: returning sooner takes a wake-up."""
    monkeypatch.setattr(job_wait_mod, "WAIT_POLL_FIRST", 60.0)
    monkeypatch.setattr(job_wait_mod, "WAIT_POLL_MAX", 60.0)


def server_connections(db: psycopg.Connection[Any]) -> int:
    """The test database's client connections, the checking connection's own left out (an
    autovacuum worker on the job table, or a query's parallel worker, is no connection)."""
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def flagged(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM job_all WHERE waited").fetchone()
    assert row is not None
    return int(row[0])


def finish(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> None:
    """Each job done, with its own payload's number as its result."""
    db.execute(
        "UPDATE job SET state = 'done', result = jsonb_build_object('n', payload->'n') "
        "WHERE id = ANY(%s)",
        (ids,),
    )


def enqueue_numbered(queue: brooq.Queue, n: int) -> list[uuid.UUID]:
    return [i for i, _ in queue.enqueue_many([brooq.Job("t", {"n": k}) for k in range(n)])]


class Waiter(threading.Thread):
    def __init__(self, queue: brooq.Queue, job_id: uuid.UUID) -> None:
        super().__init__(daemon=True)
        self.queue, self.job_id = queue, job_id
        self.record: brooq.JobRecord | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.record = self.queue.wait(self.job_id, timeout=60)
        except BaseException as exc:
            self.error = exc


@pytest.fixture
def threads() -> Iterator[list[Waiter]]:
    started: list[Waiter] = []
    yield started
    for w in started:
        w.join(15)


@pytest.mark.usefixtures("no_poll")
def test_500_waiting_threads_share_a_few_server_connections(
    queue: brooq.Queue, db: psycopg.Connection[Any], threads: list[Waiter]
) -> None:
    """500 threads in queue.wait at once: the server sees the pool and one listening
    connection, however many wait; an enqueue_many and an enqueue beside them succeed;
    each waiter is woken by its own job's end (the poll is a minute) with its record."""
    ids = enqueue_numbered(queue, N)
    peak = 0

    def sample() -> int:
        nonlocal peak
        peak = max(peak, server_connections(db))
        return peak

    for job_id in ids:
        w = Waiter(queue, job_id)
        threads.append(w)
        w.start()
        if len(threads) % 50 == 0:
            sample()
    wait_for(lambda: sample() and flagged(db) == N, timeout=30, what="every row flagged")
    assert [w.error for w in threads if w.error is not None] == []
    beside = queue.enqueue_many([brooq.Job("t", {"beside": k}) for k in range(10)])
    assert len(beside) == 10 and all(created for _, created in beside)
    assert queue.enqueue(brooq.Job("t", {"beside": "one"}))[1]
    finish(db, ids)
    wait_for(
        lambda: sample() and not any(w.is_alive() for w in threads),
        timeout=30,
        what="every waiter returned",
    )
    for n, w in enumerate(threads):
        assert w.error is None, w.error
        assert w.record is not None and w.record.id == ids[n]
        assert (w.record.state, w.record.result) == ("done", {"n": n})
    # the pool (4), the listener, the enqueue's own connection; a connection the pool
    # replaced may still show while its backend exits (a loaded machine), so each
    # replacement the pool counted is allowed for, and no more.
    opened = queue._pools._pool.get_stats()["connections_num"] if queue._pools._pool else 0
    replaced = max(0, opened - queue.pool_size)
    assert peak <= queue.pool_size + 2 + replaced, (peak, opened)
    listener = queue._waits._listener
    assert listener is not None and listener.waiting == 0


@pytest.mark.usefixtures("no_poll")
def test_500_async_waiters_share_a_few_server_connections(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """500 tasks in wait_async in one event loop: the async pool and the one listener,
    whatever their number; producers beside them succeed; each gets its own record; a
    task canceled while it waits leaves nothing subscribed."""
    ids = enqueue_numbered(queue, N)
    never, _ = queue.enqueue(brooq.Job("t"))
    lock = threading.Lock()  # db is one connection; to_thread may run two samples at once

    def sample() -> int:
        with lock:
            return server_connections(db)

    def flagged_all() -> bool:
        with lock:
            return flagged(db) == N + 1

    async def main() -> tuple[list[brooq.JobRecord], int]:
        peak = 0
        tasks = [asyncio.create_task(queue.wait_async(i, timeout=60)) for i in ids]
        canceled = asyncio.create_task(queue.wait_async(never, timeout=60))
        deadline = time.monotonic() + 30
        while True:
            peak = max(peak, await asyncio.to_thread(sample))
            if await asyncio.to_thread(flagged_all):
                break
            assert time.monotonic() < deadline, "every row flagged"
            await asyncio.sleep(0.05)
        canceled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await canceled
        _, created = await queue.enqueue_async(brooq.Job("t", {"beside": "one"}))
        beside = await queue.enqueue_many_async([brooq.Job("t", {"beside": k}) for k in range(10)])
        assert created and len(beside) == 10
        await asyncio.to_thread(finish_locked)
        done = asyncio.gather(*tasks)
        while not done.done():
            peak = max(peak, await asyncio.to_thread(sample))
            await asyncio.wait([done], timeout=0.1)
            assert time.monotonic() < deadline + 30, "every waiter returned"
        records = done.result()
        await queue.close_async()
        return records, peak

    def finish_locked() -> None:
        with lock:
            finish(db, ids)

    records, peak = asyncio.run(main())
    assert [r.id for r in records] == ids
    assert [(r.state, r.result) for r in records] == [("done", {"n": n}) for n in range(N)]
    # the async pool (4), the sync pool's first connection (enqueue_many), the listener,
    # the enqueue's own connection
    assert peak <= queue.pool_size + 3, peak
    listener = queue._waits._listener
    assert listener is not None and listener.waiting == 0


@pytest.mark.usefixtures("no_poll")
def test_a_job_that_ends_while_the_listener_is_lost_still_wakes_its_waiters(
    queue: brooq.Queue, db: psycopg.Connection[Any], connect: Any
) -> None:
    """The shared connection terminated and the jobs' ends committed right after, before
    the listener can be back: their notifications reach nobody, and the waiters, which
    poll only every minute, are woken when it listens again and read their rows."""
    ids = enqueue_numbered(queue, 5)
    threads = [Waiter(queue, i) for i in ids]
    for w in threads:
        w.start()
    wait_for(lambda: flagged(db) == 5, what="the flags")

    def listener_pids() -> list[int]:
        rows = db.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            (wait_listener.APPLICATION_NAME,),
        ).fetchall()
        return [int(r[0]) for r in rows]

    [pid] = wait_for(listener_pids, what="the listening backend")
    ender = connect(autocommit=False)
    ender.execute("UPDATE job SET state = 'done' WHERE id = ANY(%s)", (ids,))
    ender.execute("SELECT pg_terminate_backend(%s)", (pid,))
    ender.commit()
    for w in threads:
        w.join(20)
    assert [(w.error, w.record and w.record.state) for w in threads] == [(None, "done")] * 5
    assert listener_pids() and listener_pids() != [pid]


@pytest.mark.usefixtures("no_poll")
def test_a_forked_child_waits_on_a_listener_of_its_own(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    """The parent is waiting (its listener runs) when it forks: the child's wait opens a
    connection of its own and returns its job; the parent's listener, untouched by the
    child, still wakes the parent's waiter."""
    mine, theirs = enqueue_numbered(queue, 2)
    parent = Waiter(queue, mine)
    parent.start()
    wait_for(lambda: flagged(db) == 1, what="the parent's flag")
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when its own wait returned its job done
        code = 1
        try:
            code = 0 if queue.wait(theirs, timeout=20).state == "done" else 3
        finally:
            os._exit(code)
    reaped = False
    try:
        wait_for(lambda: flagged(db) == 2, what="the child's flag")
        finish(db, [theirs])
        _, status = os.waitpid(pid, 0)
        reaped = True
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        if not reaped:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    finish(db, [mine])
    parent.join(20)
    assert parent.error is None and parent.record is not None and parent.record.state == "done"


def test_a_listen_database_that_cannot_be_reached_is_the_waiters_error(dsn: str) -> None:
    """The rows are readable (the pool's DSN) but the listening connection cannot open:
    each waiter, sync and async, raises DatabaseUnavailable instead of polling silently,
    and a job already over is still returned."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = brooq.Queue(dsn, listen_dsn=f"postgresql://postgres@127.0.0.1:{port}/postgres")
    try:
        job_id, _ = q.enqueue(brooq.Job("t"))
        with pytest.raises(brooq.DatabaseUnavailable, match=str(port)):
            q.wait(job_id, timeout=20)
        with pytest.raises(brooq.DatabaseUnavailable, match=str(port)):
            asyncio.run(q.wait_async(job_id, timeout=20))
        q.cancel(job_id)
        assert q.wait(job_id, timeout=20).state == "canceled"
    finally:
        q.close()
