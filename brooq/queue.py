"""brooq.Queue: the application object. Producers enqueue through it, the master imports
it to learn the handlers, operators inspect through it.

Creating a Queue opens nothing. The connection pool opens on first use, in the process
that uses it; a pool inherited across fork() is dropped unused (never closed, since its
sockets belong to the parent), so no connection ever crosses a fork. ``enqueue`` has a
connection of its own beside the pool (brooq.enqueue_line), under the same rules.

Owns: the handler registry, the settings as the application gives them, the pooled
connection of producers and operators, the operator's reads (get, list_jobs, stats,
in_flight, processing_by_holder, throughput, queues) and writes (cancel, retry:
``transition`` binds the states of brooq.job to job_cancel/job_retry, for the master's
admin HTTP too; cancel_many, retry_many: the bulk forms, in batches of their own
transactions, BulkResult; pause, resume), and waiting for a job's end (wait, wait_async:
woken through the one LISTEN connection of brooq.waiting, shared by every waiter of this
Queue in this process, on the direct ``listen_dsn`` since LISTEN cannot go through a
transaction pooler (docs/poolers.md); each reads its row on the pool, with a backoff poll
as the fallback).
Must never: claim jobs or write their outcomes (the worker's), keep a connection across fork(),
read a row by position, or spell which states a transition accepts (brooq.job does).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import class_row, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from brooq import dsn as dsn_mod
from brooq import poolcheck, pooler
from brooq import produce as producer
from brooq import settings as settings_mod
from brooq.db import CONNECT_TIMEOUT, lost_connection, schema_missing, unavailable
from brooq.durations import Duration, to_seconds
from brooq.enqueue_line import EnqueueLine
from brooq.errors import (
    BrooqError,
    InvalidSettings,
    InvalidTransition,
    JobNotFound,
    PoolerMismatch,
    WaitTimeout,
)
from brooq.handlers import Handler, HandlerFn, Middleware, RetryPolicy, build, callable_problem
from brooq.job import (
    BULK_FROM_STATES,
    DEFAULT_QUEUE,
    FROM_STATES,
    STATES,
    TERMINAL_STATES,
    Job,
    JobRecord,
    Transition,
    bulk_state_refusal,
    parse_job_id,
    transition_refusal,
    validate_queue,
    validate_topic,
)
from brooq.periodic import JobSpec, Schedule, build_schedule
from brooq.sql import Q, Queries, queries
from brooq.stacks import JobStack, fetch_stack
from brooq.waiting import OutcomeListener, async_waker

if TYPE_CHECKING:
    from typing_extensions import LiteralString

log = logging.getLogger("brooq")

LIST_LIMIT_MAX = 1000
IN_FLIGHT_LIMIT_MAX = 1000
# The statements' names: each schema has its own set (brooq.sql.queries).
_TRANSITION_QUERIES: dict[Transition, str] = {"cancel": "job_cancel", "retry": "job_retry"}
_BULK_QUERIES: dict[Transition, str] = {"cancel": "job_cancel_batch", "retry": "job_retry_batch"}
# Rows one batch of cancel_many/retry_many locks and writes in its own transaction: big
# enough that a million jobs take a hundred round trips, small enough that no batch holds
# its locks for long.
BULK_BATCH_SIZE = 10_000
# The keyset's start: below every id (brooq.ids makes UUIDv7s, never the nil UUID).
_BEFORE_EVERY_ID = uuid.UUID(int=0)


@dataclass(frozen=True)
class BulkResult:
    """What a bulk cancel or retry came to. ``matched``: the jobs in the given topic,
    state (and queue) when it started; ``changed``: those it moved. Fewer changed than
    matched: the others changed state meanwhile (claimed, finished, canceled by someone
    else) and were left alone. With ``dry_run=True``, ``changed`` is 0."""

    matched: int
    changed: int

    def to_dict(self) -> dict[str, int]:
        return {"matched": self.matched, "changed": self.changed}


def transition_params(action: Transition, job_id: uuid.UUID) -> dict[str, Any]:
    """The parameters of job_cancel (job_retry): the job and the states it may leave,
    brooq.job.CANCELABLE_STATES (RETRYABLE_STATES)."""
    return {"id": job_id, "from_states": list(FROM_STATES[action])}


def transition(
    conn: psycopg.Connection[Any], action: Transition, job_id: uuid.UUID, q: Queries = Q
) -> bool:
    """Cancel or retry ``job_id`` on the caller's connection (nothing committed here);
    True when the job moved, False when it is unknown or its state does not allow it."""
    statement: LiteralString = getattr(q, _TRANSITION_QUERIES[action])
    cur = conn.execute(statement, transition_params(action, job_id))
    return cur.fetchone() is not None


@dataclass(frozen=True)
class TopicStats:
    """One topic's jobs in one queue, by state. ``ready``: pending or failed and due now.
    ``busy``: processing under an unexpired lease, i.e. the children working on this
    topic. A topic whose jobs sit in two queues has a row in each."""

    topic: str
    pending: int = 0
    processing: int = 0
    failed: int = 0
    dead: int = 0
    oldest_ready_age: float = 0.0
    ready: int = 0
    busy: int = 0
    queue: str = DEFAULT_QUEUE  # last: positional and keyword construction keep working

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "topic": self.topic,
            "pending": self.pending,
            "ready": self.ready,
            "processing": self.processing,
            "busy": self.busy,
            "failed": self.failed,
            "dead": self.dead,
            "oldest_ready_age_seconds": round(self.oldest_ready_age, 3),
        }


@dataclass(frozen=True)
class QueueStats:
    """One queue: paused or not, and its jobs. ``ready``: pending or failed and due now;
    ``scheduled``: pending or failed and due later; ``failed`` (waiting for a retry) is
    counted in one of those too. A queue paused before any job came shows with zeros."""

    name: str
    paused: bool = False
    ready: int = 0
    scheduled: int = 0
    processing: int = 0
    failed: int = 0
    dead: int = 0
    oldest_ready_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "paused": self.paused,
            "ready": self.ready,
            "scheduled": self.scheduled,
            "processing": self.processing,
            "failed": self.failed,
            "dead": self.dead,
            "oldest_ready_seconds": round(self.oldest_ready_seconds, 3),
        }


@dataclass(frozen=True)
class InFlight:
    """A job in state processing: who holds it, since when, and how long its lease lasts.
    ``lease_left`` is negative once the lease has expired (the reaper will return it)."""

    id: uuid.UUID
    topic: str
    attempts: int
    locked_by: str
    locked_until: datetime
    running_for: float
    lease_left: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "topic": self.topic,
            "attempts": self.attempts,
            "locked_by": self.locked_by,
            "locked_until": self.locked_until.isoformat(),
            "running_for_seconds": round(self.running_for, 3),
            "lease_left_seconds": round(self.lease_left, 3),
        }


@dataclass(frozen=True)
class HolderStats:
    """One holder of jobs in state processing (its ``locked_by``: a child, one job at a
    time if sync, many if async): how many it holds, and how long the oldest of them has
    run. Expired leases count until the reaper gives them back."""

    locked_by: str
    processing: int
    oldest_running: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "locked_by": self.locked_by,
            "processing": self.processing,
            "oldest_running_seconds": round(self.oldest_running, 3),
        }


class Queue:
    """The application object: ``queue = brooq.Queue()`` then ``@queue.handler("topic")``."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool_size: int = 4,
        listen_dsn: str | None = None,
        **settings: Any,
    ) -> None:
        self._dsn_arg = dsn
        self._dsn: str | None = None
        # The direct connection (docs/poolers.md): None reads QUEUE_LISTEN_DATABASE_URL,
        # else the same as dsn.
        self._listen_dsn_arg = listen_dsn
        self._listen_dsn: str | None = None
        self._overrides = dict(settings)
        self._settings: settings_mod.Settings | None = None
        self.pool_size = pool_size
        self.handlers: dict[str, Handler] = {}
        self.middlewares: list[Middleware] = []  # every topic's, outermost first
        self.schedules: dict[str, Schedule] = {}  # queue.periodic(...), by name
        self._pool: ConnectionPool[Any] | None = None
        self._pool_pid = 0
        # The async producers' pool: opened on first use in a running event loop, bound
        # to that loop and to this process (dropped unused after a fork, like the other).
        self._apool: AsyncConnectionPool[Any] | None = None
        self._apool_owner: tuple[int, object] = (0, None)  # (pid, event loop)
        # Queue.enqueue's own connection (opened on first enqueue, per process).
        self._line: EnqueueLine | None = None
        # The waiters' shared LISTEN connection (brooq.waiting), per process.
        self._listener: OutcomeListener | None = None
        self._listener_pid = 0
        # Creating the async pool, per (pid, loop): tasks that first use it at once open
        # one pool, not one each.
        self._apool_lock: tuple[tuple[int, object], Any] = ((0, None), None)
        self._open_lock = threading.Lock()  # creating the pool, the line or the listener
        _QUEUES.add(self)
        # Fail early on unknown names and bad values given in code.
        unknown = sorted(set(settings) - settings_mod.FIELDS)
        if unknown:
            raise BrooqError(f"unknown Queue settings: {', '.join(unknown)}")

    # -- configuration ---------------------------------------------------------------

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            self._dsn = dsn_mod.resolve(self._dsn_arg, explicitly="brooq.Queue(dsn=...)")
        return self._dsn

    @property
    def listen_dsn(self) -> str:
        """Where queue.wait and queue.stack LISTEN: a connection that reaches PostgreSQL
        directly. Behind a transaction pooler (QUEUE_POOLER=transaction) it must differ
        from ``dsn``: PoolerMismatch otherwise."""
        if self._listen_dsn is None:
            found = dsn_mod.resolve_listen(self.dsn, self._listen_dsn_arg)
            problem = pooler.need_direct(self.settings.pooler, self.dsn, found, "queue")
            if problem:
                raise PoolerMismatch(problem)
            self._listen_dsn = found
        return self._listen_dsn

    @property
    def settings(self) -> settings_mod.Settings:
        """Defaults < QUEUE_* environment < Queue(**settings); validated on first read."""
        if self._settings is None:
            self._settings = settings_mod.load(overrides=self._overrides)
        return self._settings

    def configure(self, settings: settings_mod.Settings) -> None:
        """Replace the settings (the master applies its flags through this)."""
        self._settings = settings
        if self._line is not None:  # built for the old schema and pooler
            self._line.close()
            self._line = None

    @property
    def schema(self) -> str | None:
        """brooq's schema (QUEUE_SCHEMA, Queue(schema=...)); None: the search_path's."""
        return self.settings.schema

    @property
    def _q(self) -> Queries:
        """The statements of this Queue's schema (rendered once per schema, cached)."""
        return queries(self.settings.schema)

    def handler(
        self,
        topic: str,
        *,
        max_attempts: int | None = None,
        attempt_timeout: Duration | None = None,
        max_execution_timeout: Duration | None = None,
        backoff_base: Duration | None = None,
        backoff_max: Duration | None = None,
        queue: str = DEFAULT_QUEUE,
        global_limit: int | None = None,
        payload: type | None = None,
        middleware: Sequence[Middleware] | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register ``fn(claim)`` for ``topic``. Unset options take the queue's settings
        (QUEUE_MAX_ATTEMPTS etc.; defaults 5, 1m, 5m, 1s, 1m). ``queue``: where jobs of
        this topic go when they name none; ``global_limit``: at most that many of them
        processing at once across every master on the database. ``payload``: a dataclass
        or pydantic model; ``claim.payload`` is then an instance of it, and a job enqueued
        through this Queue is checked against it before anything is written.
        ``middleware``: this topic's, inside the Queue's (``@queue.middleware``).
        ``retry``: ``fn(attempt, exc) -> timedelta | None`` after a failed attempt (None:
        no more attempts); without it, exponential backoff. What ``fn`` returns, if not
        None, is stored with ``done`` (``queue.get(id).result``)."""

        def register(fn: HandlerFn) -> HandlerFn:
            if topic in self.handlers:
                raise BrooqError(f"a handler for topic {topic!r} is already registered")
            self.handlers[topic] = build(
                topic,
                fn,
                max_attempts=max_attempts,
                attempt_timeout=attempt_timeout,
                max_execution_timeout=max_execution_timeout,
                backoff_base=backoff_base,
                backoff_max=backoff_max,
                queue=queue,
                global_limit=global_limit,
                payload=payload,
                middleware=middleware,
                retry=retry,
            )
            return fn

        return register

    def middleware(self, fn: Middleware) -> Middleware:
        """Register ``fn(claim, call_next)`` around every job of this Queue; it must
        return ``call_next(claim)`` (or raise). The first registered is the outermost;
        a handler's own ``middleware=[...]`` runs inside these. brooq's logging and
        metrics wrap them all. A plain ``def`` wraps the sync handlers, an ``async def``
        (which awaits ``call_next(claim)``) the async ones: a middleware never wraps a
        handler of the other kind (docs/async.md says why)."""
        problem = callable_problem(fn, 2, "fn(claim, call_next)")
        if problem:
            raise InvalidSettings([f"middleware {problem}"])
        self.middlewares.append(fn)
        return fn

    def periodic(
        self,
        name: str,
        cron: str | None = None,
        every: Duration | None = None,
        tz: str = "UTC",
        job: JobSpec | None = None,
    ) -> Schedule:
        """Enqueue ``job`` once per tick, whatever the number of masters (brooq-master
        runs the schedules). ``cron``: 5 fields or @hourly/@daily/@weekly/@monthly/
        @yearly, whole minutes in ``tz`` (an IANA name); ``every``: a duration of at
        least 1s, ticks at the multiples of it from the Unix epoch. ``job``: a brooq.Job,
        or a callable taking the tick (an aware datetime in ``tz``) and returning one.
        Each tick's job has the key ``periodic:<name>:<tick UTC, e.g.
        2026-12-01T03:00:00Z>`` (a key the Job names is replaced). Every problem of the
        call is raised at once, as InvalidSettings."""
        schedule = build_schedule(
            name, cron=cron, every=every, tz=tz, job=job, taken=self.schedules
        )
        self.schedules[schedule.name] = schedule
        return schedule

    # -- connections -------------------------------------------------------------------

    def _get_pool(self) -> ConnectionPool[Any]:
        pool = self._pool
        if pool is not None and self._pool_pid == os.getpid():
            return pool
        with self._open_lock:  # threads' first uses at once open one pool, not several
            return self._open_pool()

    def _open_pool(self) -> ConnectionPool[Any]:
        if self._pool is not None and self._pool_pid != os.getpid():
            # Inherited across fork: the sockets are the parent's. Forget it, do not close it.
            self._pool = None
        if self._pool is None:
            pool: ConnectionPool[Any] = ConnectionPool(
                self.dsn,
                check=poolcheck.check_connection,
                name="brooq",
                **self._pool_options(),
            )
            try:
                pool.open(wait=True, timeout=CONNECT_TIMEOUT)
            except PoolTimeout:
                pool.close(timeout=0)
                raise self._unavailable() from None
            self._pool, self._pool_pid = pool, os.getpid()
        return self._pool

    def _unavailable(self) -> BrooqError:
        try:
            psycopg.connect(self.dsn, connect_timeout=CONNECT_TIMEOUT).close()
        except psycopg.Error as exc:
            return unavailable(self.dsn, exc)
        return unavailable(self.dsn, TimeoutError("timed out waiting for a pooled connection"))

    def _pool_options(self) -> dict[str, Any]:
        """What the sync and the async pool share: opened by the caller, its size."""
        return {
            "min_size": 1,
            "max_size": max(1, self.pool_size),
            "open": False,
            "timeout": CONNECT_TIMEOUT,
            # Behind a transaction pooler: no prepared statements (brooq.pooler).
            "kwargs": {
                "connect_timeout": CONNECT_TIMEOUT,
                **pooler.connect_kwargs(self.settings.pooler, self.dsn, {}),
            },
        }

    @contextmanager
    def _database_errors(self) -> Iterator[None]:
        """brooq's errors for a pooled connection's failures (both pools)."""
        try:
            yield
        except PoolTimeout:
            raise self._unavailable() from None
        except psycopg.Error as exc:
            if (mapped := self._database_error(exc)) is exc:
                raise
            raise mapped from None

    def _database_error(self, exc: psycopg.Error) -> Exception:
        """The error to raise for a statement's failure: brooq's own where it has one
        (no table, a lost or unreachable database, a pooler brooq was not told about),
        else ``exc`` itself."""
        if isinstance(exc, psycopg.errors.UndefinedTable):
            return schema_missing(exc)
        if isinstance(exc, psycopg.OperationalError):
            if (mismatch := pooler.prepared_mismatch(exc)) is not None:
                return mismatch
            return unavailable(self.dsn, exc) if lost_connection(exc) else exc
        if isinstance(
            exc,
            psycopg.errors.InvalidSqlStatementName | psycopg.errors.DuplicatePreparedStatement,
        ):
            return pooler.prepared_mismatch(exc) or exc
        return exc

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit off); committed on success, rolled back on error."""
        pool = self._get_pool()
        with self._database_errors(), pool.connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside a transaction: your writes and
        ``brooq.enqueue(conn, job)`` commit together, or roll back together."""
        with self.connection() as conn, conn.transaction():
            yield conn

    def close(self) -> None:
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.close()
        self._pool = None
        if self._line is not None:
            self._line.close()
        self._line = None
        if self._listener is not None and self._listener_pid == os.getpid():
            self._listener.close()
        self._listener = None

    def _enqueue_line(self) -> EnqueueLine:
        line = self._line
        if line is None:
            with self._open_lock:
                line = self._line
                if line is None:
                    options = self._pool_options()["kwargs"]
                    line = self._line = EnqueueLine(self.dsn, options, self._q)
        return line

    async def _get_async_pool(self) -> AsyncConnectionPool[Any]:
        import asyncio

        owner = (os.getpid(), asyncio.get_running_loop())
        pool = self._apool
        if pool is not None and self._apool_owner == owner:
            return pool
        if self._apool_lock[0] != owner:
            self._apool_lock = (owner, asyncio.Lock())
        async with self._apool_lock[1]:
            return await self._open_async_pool(owner)

    async def _open_async_pool(self, owner: tuple[int, object]) -> AsyncConnectionPool[Any]:
        if self._apool is not None and self._apool_owner != owner:
            # Another process's (inherited across fork) or another loop's: its sockets
            # and futures are not ours to use or close here. Forget it.
            self._apool = None
        if self._apool is None:
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                self.dsn,
                check=poolcheck.check_connection_async,
                name="brooq-async",
                **self._pool_options(),
            )
            try:
                await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
            except PoolTimeout:
                await pool.close(timeout=0)
                raise self._unavailable() from None
            self._apool, self._apool_owner = pool, owner
        return self._apool

    @contextlib.asynccontextmanager
    async def _async_connection(
        self, *, autocommit: bool = False
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the async pool, in a transaction (or in autocommit: each
        statement its own, no BEGIN and COMMIT round trips), with the errors of
        ``connection``."""
        pool = await self._get_async_pool()
        with self._database_errors():
            async with pool.connection() as conn:
                if autocommit:
                    await conn.set_autocommit(True)
                    try:
                        yield conn
                    finally:
                        with contextlib.suppress(psycopg.Error):
                            await conn.set_autocommit(False)  # the pool's are transactional
                else:
                    async with conn.transaction():
                        yield conn

    async def close_async(self) -> None:
        """Close the async pool (from the event loop that used it); ``close`` closes the
        other."""
        import asyncio

        owner = (os.getpid(), asyncio.get_running_loop())
        if self._apool is not None and self._apool_owner == owner:
            await self._apool.close()
        self._apool = None

    # -- producing -----------------------------------------------------------------------

    @property
    def _max_payload(self) -> int:
        return self.settings.max_payload_bytes

    def enqueue(self, job: Job) -> tuple[uuid.UUID, bool]:
        """Insert one job, committed at once; (id, created).

        One statement in autocommit on the connection this Queue keeps for single
        enqueues (brooq.enqueue_line: prepared, sent through libpq); the INSERT is its
        own transaction, so no BEGIN and no COMMIT round trips. A key conflict, or
        another thread enqueuing at the same moment, takes a pooled connection."""
        # Bad input fails before I/O; a typed topic's payload is checked against its type.
        checked = producer.check_job(job, self._max_payload, self.handlers)
        try:  # not _database_errors(): a context manager's frames on every call
            done = self._enqueue_line().insert(checked, producer.queue_of(checked, self.handlers))
        except psycopg.Error as exc:
            if (mapped := self._database_error(exc)) is exc:
                raise
            raise mapped from None
        if done is not None:
            return done
        # Another thread holds the line, or the job's key is taken: the pool's path.
        with self.connection() as conn:
            conn.autocommit = True
            try:
                return producer.insert_checked(conn, checked, self.handlers, q=self._q)
            finally:
                # The pool hands out transactional connections; a broken one it drops.
                with contextlib.suppress(psycopg.Error):
                    conn.autocommit = False

    def enqueue_many(self, jobs: Sequence[Job]) -> list[tuple[uuid.UUID, bool]]:
        """Insert many jobs in one transaction (COPY, or one INSERT when keys are given);
        [(id, created), ...] in the order given. A refused job is named by its index
        ("job 3: ..."), and nothing is inserted."""
        checked = producer.check_jobs(jobs, self._max_payload, self.handlers)  # before any I/O
        with self.transaction() as conn:
            return producer.insert_many_checked(conn, checked, self.handlers, q=self._q)

    async def enqueue_async(self, job: Job) -> tuple[uuid.UUID, bool]:
        """``enqueue`` from asyncio code, on this Queue's async pool (opened on first use
        in the running loop, never before a fork); (id, created)."""
        checked = producer.check_job(job, self._max_payload, self.handlers)
        async with self._async_connection(autocommit=True) as conn:  # one statement
            return await producer.insert_checked_async(conn, checked, self.handlers, q=self._q)

    async def enqueue_many_async(self, jobs: Sequence[Job]) -> list[tuple[uuid.UUID, bool]]:
        """``enqueue_many`` from asyncio code, in one transaction on the async pool."""
        checked = producer.check_jobs(jobs, self._max_payload, self.handlers)
        async with self._async_connection() as conn:
            return await producer.insert_many_checked_async(conn, checked, self.handlers, q=self._q)

    # -- reading and operating -----------------------------------------------------------

    def get(self, job_id: uuid.UUID | str) -> JobRecord | None:
        """The job's row, or None when no job has this id."""
        jid = parse_job_id(job_id)
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobRecord))
            return cur.execute(self._q.job_get, {"id": jid}).fetchone()

    def cancel(self, job_id: uuid.UUID | str) -> bool:
        """pending, failed or processing -> canceled. False when the job is unknown or
        already finished (terminal rows are never touched). A running handler is
        interrupted with brooq.LeaseLost at the master's next lease renewal."""
        jid = parse_job_id(job_id)
        with self.transaction() as conn:
            return transition(conn, "cancel", jid, self._q)

    def retry(self, job_id: uuid.UUID | str) -> bool:
        """dead or canceled -> pending now, attempts reset, last_error kept. False when
        the job is unknown or not in one of those states."""
        jid = parse_job_id(job_id)
        with self.transaction() as conn:
            return transition(conn, "retry", jid, self._q)

    def cancel_many(
        self,
        *,
        topic: str,
        state: str,
        queue: str | None = None,
        dry_run: bool = False,
        batch_size: int = BULK_BATCH_SIZE,
    ) -> BulkResult:
        """Cancel every job of ``topic`` in ``state`` (pending or failed; not processing:
        brooq.job.BULK_FROM_STATES says why), only in ``queue`` if given. The topic is
        required: there is no "every topic" by omission. ``dry_run``: count them, change
        nothing. Processed in batches of ``batch_size`` rows, each its own transaction
        (job_cancel_batch says why); a job written after the count started is left alone.
        InvalidTransition for a state the bulk cancel does not take, InvalidTopic or
        InvalidQueue for a malformed name, all before any I/O."""
        return self._change_many(
            "cancel",
            topic=topic,
            state=state,
            queue=queue,
            dry_run=dry_run,
            batch_size=batch_size,
        )

    def retry_many(
        self,
        *,
        topic: str,
        state: str,
        queue: str | None = None,
        dry_run: bool = False,
        batch_size: int = BULK_BATCH_SIZE,
    ) -> BulkResult:
        """Retry every job of ``topic`` in ``state`` (dead or canceled), only in ``queue``
        if given: each goes back to pending now as ``retry`` sends one (attempts reset,
        last error and error history kept), and the masters are woken. Otherwise as
        ``cancel_many``."""
        return self._change_many(
            "retry",
            topic=topic,
            state=state,
            queue=queue,
            dry_run=dry_run,
            batch_size=batch_size,
        )

    def _change_many(
        self,
        action: Transition,
        *,
        topic: str,
        state: str,
        queue: str | None,
        dry_run: bool,
        batch_size: int,
    ) -> BulkResult:
        validate_topic(topic)
        if queue is not None:
            validate_queue(queue)
        refusal = bulk_state_refusal(action, state)
        if refusal is not None:
            raise InvalidTransition(refusal)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise BrooqError(f"batch_size must be a positive integer, got {batch_size!r}")
        filters: dict[str, Any] = {"topic": topic, "state": state, "queue": queue}
        with self.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            count = cur.execute(self._q.job_count_matching, filters).fetchone()
            assert count is not None  # an aggregate without GROUP BY: always one row
            conn.commit()
            matched = int(count["matched"])
            if dry_run or matched == 0:
                return BulkResult(matched=matched, changed=0)
            params = {
                **filters,
                "as_of": count["as_of"],
                "from_states": list(BULK_FROM_STATES[action]),
                "batch": batch_size,
                "after": _BEFORE_EVERY_ID,
            }
            changed = 0
            while True:
                batch = cur.execute(getattr(self._q, _BULK_QUERIES[action]), params).fetchone()
                assert batch is not None
                # Each batch commits on its own: its row locks last one batch, not the run.
                conn.commit()
                changed += int(batch["changed"])
                if batch["picked"] < batch_size:  # the keyset reached the end
                    return BulkResult(matched=matched, changed=changed)
                params["after"] = batch["last_id"]

    def stack(self, job_id: uuid.UUID | str, timeout: Duration = 5.0) -> JobStack:
        """The current Python stack of the handler running the job, from whichever host
        runs it (the request and the answer travel through PostgreSQL: brooq.stacks).
        JobNotFound, JobNotRunning (not processing), StackUnavailable (no master answered
        within ``timeout``, or the job ended meanwhile)."""
        return fetch_stack(
            self.listen_dsn, parse_job_id(job_id), to_seconds(timeout), schema=self.schema
        )

    def explain_refusal(self, job_id: uuid.UUID | str, action: Transition) -> BrooqError:
        """Why cancel or retry did nothing, as an error to show an operator:
        JobNotFound, or InvalidTransition naming the job's state."""
        record = self.get(job_id)
        if record is None:
            return JobNotFound(f"no job with id {parse_job_id(job_id)}")
        return InvalidTransition(transition_refusal(action, record.state, record.id))

    def list_jobs(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int = 100,
        queue: str | None = None,
    ) -> list[JobRecord]:
        """Newest first; at most 1,000 rows."""
        if topic is not None:
            validate_topic(topic)
        if queue is not None:
            validate_queue(queue)
        if state is not None and state not in STATES:
            raise BrooqError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise BrooqError(f"limit must be between 1 and {LIST_LIMIT_MAX}, got {limit}")
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobRecord))
            return cur.execute(
                self._q.job_list, {"topic": topic, "state": state, "queue": queue, "limit": limit}
            ).fetchall()

    def stats(self) -> list[TopicStats]:
        """Per queue and topic (by queue, then topic), in one snapshot: jobs in each active
        state and dead, how many are ready and busy, and the age of the oldest ready job.
        Topics holding only done or canceled jobs are left out."""
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(TopicStats))
            return cur.execute(self._q.job_stats_by_topic).fetchall()

    def in_flight(self, limit: int = 100) -> list[InFlight]:
        """Jobs in state processing, longest running first; at most ``limit`` (1,000)."""
        if not 1 <= limit <= IN_FLIGHT_LIMIT_MAX:
            raise BrooqError(f"limit must be between 1 and {IN_FLIGHT_LIMIT_MAX}, got {limit}")
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(InFlight))
            return cur.execute(self._q.job_list_processing, {"limit": limit}).fetchall()

    def processing_by_holder(self, limit: int = 100) -> list[HolderStats]:
        """Per holder (``locked_by``), its jobs in state processing, busiest first (then by
        name); at most ``limit`` (1,000) holders."""
        if not 1 <= limit <= IN_FLIGHT_LIMIT_MAX:
            raise BrooqError(f"limit must be between 1 and {IN_FLIGHT_LIMIT_MAX}, got {limit}")
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(HolderStats))
            return cur.execute(self._q.job_processing_by_holder, {"limit": limit}).fetchall()

    def throughput(self, seconds: float = 60) -> dict[str, int]:
        """Per topic, the jobs that reached done, failed, dead or canceled in the last
        ``seconds``. Topics with none are left out."""
        totals: dict[str, int] = {}
        for (_, topic), jobs in self.throughput_by_queue(seconds).items():
            totals[topic] = totals.get(topic, 0) + jobs
        return totals

    # -- queues: pause, resume, per-queue counts ---------------------------------------------

    def pause(self, name: str) -> None:
        """Stop the claims of queue ``name`` (every master sees it within its
        poll_interval). Running jobs finish; producers go on enqueueing. A queue nobody
        used yet may be paused: the pause holds when its jobs arrive."""
        self._set_paused(name, paused=True)

    def resume(self, name: str) -> None:
        """Let the masters claim from queue ``name`` again (a queue never paused is left
        running, and gets a row saying so)."""
        self._set_paused(name, paused=False)

    def _set_paused(self, name: str, *, paused: bool) -> None:
        checked = validate_queue(name)  # a malformed name fails before any I/O
        with self.transaction() as conn:
            conn.execute(self._q.queue_set_paused, {"name": checked, "paused": paused})

    def queues(self) -> list[QueueStats]:
        """Every queue holding active or dead jobs, and every queue paused or resumed by
        an operator, by name, in one snapshot: paused or not, ready, scheduled,
        processing, failed and dead jobs, and the age of the oldest ready job."""
        with self.connection() as conn:
            cur = conn.cursor(row_factory=class_row(QueueStats))
            return cur.execute(self._q.job_queue_stats).fetchall()

    def throughput_by_queue(self, seconds: float = 60) -> dict[tuple[str, str], int]:
        """Per (queue, topic), the jobs that reached done, failed, dead or canceled in the
        last ``seconds``. Pairs with none are left out."""
        if not seconds > 0:
            raise BrooqError(f"seconds must be positive, got {seconds!r}")
        with self.connection() as conn:
            rows = conn.cursor(row_factory=dict_row).execute(
                self._q.job_count_finished_since, {"seconds": float(seconds)}
            )
            return {(row["queue"], row["topic"]): int(row["jobs"]) for row in rows}

    # -- waiting for a job's end -------------------------------------------------------------

    def wait(self, job_id: uuid.UUID | str, timeout: float | None = None) -> JobRecord:
        """Block until the job is done, dead or canceled; its row then. WaitTimeout after
        ``timeout`` seconds (None: no limit), JobNotFound for an unknown id.

        Every waiter of this Queue in this process shares one LISTEN brooq_outcome
        connection (brooq.waiting): a waiter subscribes to its job there, then flags
        the row as waited for (the trigger of migration 0006 then notifies its end)
        and reads it, on a pooled connection held for those two statements only (the
        pool is bounded, so waiters add no connections, and never hold one while they
        wait: they cannot starve enqueue). It reads the row again on its notification,
        when the listener (re)starts listening, or when the poll interval (0.1 s
        doubling to 5 s) passes, the fallback for a notification missed. The workers
        pay nothing for jobs nobody waits for. DatabaseUnavailable when the listening
        connection cannot be opened, or a read fails."""
        jid = parse_job_id(job_id)
        clock = _WaitClock(timeout)
        woken = threading.Event()
        listener = self._outcomes()
        sub = listener.subscribe(jid, woken.set)
        try:
            while True:
                woken.clear()  # before the read: a wake-up from now on is not lost
                record = self._wait_read(jid)
                if clock.finished(jid, record):
                    assert record is not None
                    return record
                if sub.error is not None:
                    raise unavailable(self.listen_dsn, sub.error)
                if not woken.wait(clock.next_wait(jid)):
                    clock.polled()
        finally:
            listener.unsubscribe(sub)

    async def wait_async(self, job_id: uuid.UUID | str, timeout: float | None = None) -> JobRecord:
        """``await queue.wait_async(id)``: queue.wait from asyncio code, woken through
        the same listener (in this loop, from its thread), reading the row on the async
        pool; the event loop runs meanwhile, and a task canceled while it waits leaves
        nothing subscribed."""
        import asyncio

        jid = parse_job_id(job_id)
        clock = _WaitClock(timeout)
        woken = asyncio.Event()
        listener = self._outcomes()
        sub = listener.subscribe(jid, async_waker(woken))
        try:
            while True:
                woken.clear()  # before the read
                record = await self._wait_read_async(jid)
                if clock.finished(jid, record):
                    assert record is not None
                    return record
                if sub.error is not None:
                    raise unavailable(self.listen_dsn, sub.error)
                wait = clock.next_wait(jid)  # outside the try: WaitTimeout is a TimeoutError
                try:
                    await asyncio.wait_for(woken.wait(), wait)
                except TimeoutError:
                    clock.polled()
        finally:
            listener.unsubscribe(sub)

    def _outcomes(self) -> OutcomeListener:
        """This Queue's listener in this process (one inherited across fork is the
        parent's: forgotten, never closed)."""
        listener = self._listener
        if listener is not None and self._listener_pid == os.getpid():
            return listener
        dsn = self.listen_dsn  # PoolerMismatch before anything starts
        with self._open_lock:
            if self._listener is None or self._listener_pid != os.getpid():
                self._listener = OutcomeListener(dsn, self._q.listen_outcomes)
                self._listener_pid = os.getpid()
            return self._listener

    def _wait_read(self, jid: uuid.UUID) -> JobRecord | None:
        """Flag the row as waited for, then read it: two statements in autocommit, so
        the flag is committed (and the outcome's trigger sees it) before the read, and
        no row lock is held across a round trip."""
        with self.connection() as conn:
            conn.autocommit = True
            try:
                conn.execute(self._q.job_wait_register, {"id": jid})
                cur = conn.cursor(row_factory=class_row(JobRecord))
                return cur.execute(self._q.job_get, {"id": jid}).fetchone()
            finally:
                with contextlib.suppress(psycopg.Error):
                    conn.autocommit = False  # the pool hands out transactional ones

    async def _wait_read_async(self, jid: uuid.UUID) -> JobRecord | None:
        async with self._async_connection(autocommit=True) as conn:
            await conn.execute(self._q.job_wait_register, {"id": jid})
            cur = conn.cursor(row_factory=class_row(JobRecord))
            await cur.execute(self._q.job_get, {"id": jid})
            return await cur.fetchone()


WAIT_POLL_FIRST = 0.1  # seconds: queue.wait's fallback poll, doubling...
WAIT_POLL_MAX = 5.0  # ...to this


# Every Queue of this process: a fork's child gives each a fresh _open_lock (one held
# by a thread of the parent at the fork would never be released in the child).
_QUEUES: weakref.WeakSet[Queue] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for queue in list(_QUEUES):
        queue._open_lock = threading.Lock()
        # Its thread does not exist here and its socket is the parent's: never used.
        queue._listener = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _WaitClock:
    """queue.wait's deadline and poll interval, shared by the sync and async forms."""

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
