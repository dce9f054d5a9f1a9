"""Waiting for a job's end: queue.wait and queue.wait_async.

A waiter subscribes to its job on the Queue's one LISTEN connection in this process
(brooq.producer.wait_listener.OutcomeListener, on the direct ``listen_dsn``: LISTEN
cannot go through a transaction pooler, docs/poolers.md), then flags the row as waited
for (the trigger of migration 0006 then notifies its end) and reads it, on a pooled
connection held for those two statements only: waiters add no connections and never hold
one while they wait. It reads the row again on its notification, when the listener
(re)starts listening, or when the poll interval (WAIT_POLL_FIRST doubling to
WAIT_POLL_MAX) passes, the fallback for a notification missed.

A wait rides over a database it cannot reach for a while (a failover: the primary gone,
a standby promoted; docs/how-to/high-availability.md): once the database has answered it
(a read held a connection, even one that was lost midway), a read that fails with
DatabaseUnavailable is tried again at the poll interval (within WAIT_LOST_RETRY whatever
the poll), for up to WAIT_OUTAGE seconds in a row and never past its timeout; then that
error is raised. A first read that cannot get a connection at all is raised at once (a
wrong DSN is said at once), as is a read-only server (ReadOnlyDatabase: a
misconfiguration, not an outage).

The loop is written once, without I/O (``_wait_steps``: a generator that yields what it
needs next, a read or a wait of so many seconds, and is sent the answer); ``Waits.wait``
drives it with a threading.Event on the sync pool, ``Waits.wait_async`` with an
asyncio.Event on the async pool.

Owns: the wait clock (deadline, WaitTimeout, the poll's backoff, the outage ridden
over), that loop and its two drivers, and each Queue's listener in each process (one
inherited across fork is the parent's: forgotten, never closed).
Must never: write a job's state (the flag only), or hold a pooled connection while it waits.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Generator
from typing import Protocol

from psycopg.rows import class_row

from brooq.db import unavailable
from brooq.errors import (
    BrooqError,
    DatabaseUnavailable,
    JobNotFound,
    ReadOnlyDatabase,
    WaitTimeout,
)
from brooq.job import TERMINAL_STATES, JobRecord
from brooq.producer.pools import Pools
from brooq.producer.wait_listener import OutcomeListener, Subscription, async_waker
from brooq.settings import Settings
from brooq.sql import Queries, queries

WAIT_POLL_FIRST = 0.1  # seconds: queue.wait's fallback poll, doubling...
WAIT_POLL_MAX = 5.0  # ...to this
# Seconds in a row a wait goes on reading while the database cannot be reached: longer
# than a failover takes (Patroni's default ttl is 30 s; managed services document one to
# two minutes), short enough that a database gone for good is said, not waited for.
WAIT_OUTAGE = 120.0
# Seconds at most before a read that could not reach the database is tried again,
# whatever the poll interval: no wake-up comes for a job that ended meanwhile.
WAIT_LOST_RETRY = 0.5

# What _wait_steps yields for "clear the wake-up, then read the row" (else: seconds to
# wait for a wake-up, answered True if it came).
_READ = None


class Lost:
    """What a driver sends for a read that could not reach the database."""

    __slots__ = ("error", "reached")

    def __init__(self, error: DatabaseUnavailable, reached: bool) -> None:
        self.error = error
        # The read held a connection before it failed: the DSN answers, this is an outage.
        self.reached = reached


class Owner(Protocol):
    """What waiting reads from its Queue, late: at the first wait."""

    @property
    def listen_dsn(self) -> str: ...

    @property
    def settings(self) -> Settings: ...


class WaitClock:
    """queue.wait's deadline and poll interval."""

    def __init__(self, timeout: float | None) -> None:
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float))
        ):
            raise BrooqError(f"timeout must be a number of seconds or None, not {timeout!r}")
        if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
            raise BrooqError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.poll = WAIT_POLL_FIRST
        self.reached = False  # the database has answered this wait
        self.lost_since: float | None = None  # the first of the failed reads in a row

    def finished(self, job_id: uuid.UUID, record: JobRecord | None) -> bool:
        """True when the job has ended; JobNotFound when there is no such job."""
        if record is None:
            raise JobNotFound(f"no job with id {job_id}")
        return record.state in TERMINAL_STATES

    def next_wait(self, job_id: uuid.UUID) -> float:
        """How long to wait for a notification before polling; WaitTimeout past the
        deadline."""
        if self.deadline is None:
            return self.poll
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"job {job_id} did not end (done, dead or canceled) within {self.timeout:g}s"
            )
        return min(self.poll, left)

    def polled(self) -> None:
        self.poll = min(self.poll * 2, WAIT_POLL_MAX)

    def read(self) -> None:
        """A read reached the database."""
        self.reached = True
        self.lost_since = None

    def lost(self, error: DatabaseUnavailable, reached: bool = False) -> None:
        """A read could not reach the database (``reached``: it held a connection before
        it failed): raise ``error`` unless the wait rides over it (the database has
        answered it, for less than WAIT_OUTAGE, before its deadline)."""
        now = time.monotonic()
        if reached:
            self.reached = True
        if self.lost_since is None:
            self.lost_since = now
        if (
            not self.reached
            or now - self.lost_since >= WAIT_OUTAGE
            or (self.deadline is not None and now >= self.deadline)
        ):
            raise error


def _wait_steps(
    jid: uuid.UUID, clock: WaitClock, sub: Subscription, owner: Owner
) -> Generator[float | None, object, JobRecord]:
    """The wait, without I/O: yields _READ (sent the row) or seconds to wait (sent
    whether a wake-up came); returns the row once the job has ended."""
    while True:
        record = yield _READ
        if isinstance(record, Lost):
            clock.lost(record.error, record.reached)  # raises unless it rides over it
        else:
            assert record is None or isinstance(record, JobRecord)
            clock.read()
            if clock.finished(jid, record):
                assert record is not None
                return record
            if sub.error is not None:
                raise unavailable(owner.listen_dsn, sub.error)
        wait = clock.next_wait(jid)
        if isinstance(record, Lost):
            wait = min(wait, WAIT_LOST_RETRY)
        if not (yield wait):
            clock.polled()


def _lost(exc: DatabaseUnavailable, reached: list[bool]) -> Lost:
    """A failed read as the wait's loop is told of it; a read-only server is raised."""
    if isinstance(exc, ReadOnlyDatabase):
        raise exc
    return Lost(exc, reached[0])


class Waits:
    """One Queue's waiting, over its pools and its listener in this process."""

    def __init__(self, owner: Owner, pools: Pools) -> None:
        self._owner = owner
        self._pools = pools
        self._listener: OutcomeListener | None = None
        self._listener_pid = 0
        self._lock = threading.Lock()
        _WAITS.add(self)

    def wait(self, jid: uuid.UUID, timeout: float | None) -> JobRecord:
        clock = WaitClock(timeout)
        woken = threading.Event()
        listener = self._outcomes()
        sub = listener.subscribe(jid, woken.set)
        try:
            steps = _wait_steps(jid, clock, sub, self._owner)
            step = next(steps)
            while True:
                answer: object
                if step is _READ:
                    woken.clear()  # before the read: a wake-up from now on is not lost
                    reached = [False]
                    try:
                        answer = self._read(jid, reached)
                    except DatabaseUnavailable as exc:
                        answer = _lost(exc, reached)
                else:
                    answer = woken.wait(step)
                step = steps.send(answer)
        except StopIteration as done:
            record: JobRecord = done.value
            return record
        finally:
            listener.unsubscribe(sub)

    async def wait_async(self, jid: uuid.UUID, timeout: float | None) -> JobRecord:
        clock = WaitClock(timeout)
        woken = asyncio.Event()
        listener = self._outcomes()
        sub = listener.subscribe(jid, async_waker(woken))
        try:
            steps = _wait_steps(jid, clock, sub, self._owner)
            step = next(steps)
            while True:
                answer: object
                if step is _READ:
                    woken.clear()  # before the read
                    reached = [False]
                    try:
                        answer = await self._read_async(jid, reached)
                    except DatabaseUnavailable as exc:
                        answer = _lost(exc, reached)
                else:
                    try:
                        answer = await asyncio.wait_for(woken.wait(), step)
                    except TimeoutError:
                        answer = False
                step = steps.send(answer)
        except StopIteration as done:
            record: JobRecord = done.value
            return record
        finally:
            listener.unsubscribe(sub)

    def close(self) -> None:
        if self._listener is not None and self._listener_pid == os.getpid():
            self._listener.close()
        self._listener = None

    @property
    def _q(self) -> Queries:
        return queries(self._owner.settings.schema)

    def _outcomes(self) -> OutcomeListener:
        """The listener in this process."""
        listener = self._listener
        if listener is not None and self._listener_pid == os.getpid():
            return listener
        dsn = self._owner.listen_dsn  # PoolerMismatch before anything starts
        with self._lock:
            if self._listener is None or self._listener_pid != os.getpid():
                self._listener = OutcomeListener(dsn, self._q.listen_outcomes)
                self._listener_pid = os.getpid()
            return self._listener

    def _read(self, jid: uuid.UUID, reached: list[bool]) -> JobRecord | None:
        """Flag the row as waited for, then read it: two statements in autocommit, so
        the flag is committed (and the outcome's trigger sees it) before the read, and
        no row lock is held across a round trip. ``reached[0]`` is set once the pool
        gave a connection (a failure after it is the session lost, not a wrong DSN)."""
        q = self._q
        with self._pools.autocommit() as conn:
            reached[0] = True
            conn.execute(q.job_wait_register, {"id": jid})
            cur = conn.cursor(row_factory=class_row(JobRecord))
            return cur.execute(q.job_get, {"id": jid}).fetchone()

    async def _read_async(self, jid: uuid.UUID, reached: list[bool]) -> JobRecord | None:
        q = self._q
        async with self._pools.async_connection(autocommit=True) as conn:
            reached[0] = True
            await conn.execute(q.job_wait_register, {"id": jid})
            cur = conn.cursor(row_factory=class_row(JobRecord))
            await cur.execute(q.job_get, {"id": jid})
            return await cur.fetchone()


# Every Waits of this process: a fork's child forgets their listeners (the thread does
# not exist there and the socket is the parent's: never used) and replaces their locks.
_WAITS: weakref.WeakSet[Waits] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for waits in list(_WAITS):
        waits._lock = threading.Lock()
        waits._listener = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
