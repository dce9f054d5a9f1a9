"""brooq.Queue: the application object. Producers enqueue through it, the master imports
it to learn the handlers, operators inspect through it.

Creating a Queue opens nothing. Its pools (brooq.producer.pools) open on first use, in the process
that uses them, and never cross a fork; ``enqueue`` has a connection of its own beside
them (brooq.producer.line), under the same rules; waiting shares one LISTEN connection per
process (brooq.producer.wait).

Owns: the face users touch beside what an application declares (brooq.declare.registry): the
pooled connection and transaction, enqueue* (brooq.producer.insert), the operator's reads and
writes (brooq.operator's functions, on a pooled connection; get_async, list_jobs_async
and cancel_async send the same named statements with the same checked parameters on the
async pool) and wait* (brooq.producer.wait).
Each method checks its arguments before any I/O, then delegates.
Must never: claim jobs or write their outcomes (the worker's), hold SQL of its own (the
modules it delegates to do), or put a call between ``enqueue`` and its line.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.rows import class_row

from brooq.declare.rates import Rate
from brooq.declare.registry import Registry
from brooq.durations import Duration, to_seconds
from brooq.errors import BrooqError
from brooq.job import (
    ON_HOLD,
    Job,
    JobRecord,
    Transition,
    UpstreamJob,
    parse_job_id,
    validate_queue,
)
from brooq.operator import changes, keys, reads, schedules
from brooq.operator.changes import (
    BULK_BATCH_SIZE,
    check_bulk,
    transition_params,
    transition_statement,
)
from brooq.operator.keys import BlockedKey
from brooq.operator.records import (
    AttemptLog,
    BulkResult,
    GroupLimit,
    HolderStats,
    InFlight,
    QueueStats,
    TopicLimits,
    TopicStats,
)
from brooq.operator.schedules import StoredSchedule
from brooq.producer.events import emit_event, emit_event_async
from brooq.producer.insert import (
    KEY_ROUNDS,
    KeyRace,
    check_job,
    check_jobs,
    insert_checked,
    insert_checked_async,
    insert_many_checked,
    insert_many_checked_async,
    queue_of,
    stream_many,
    stream_many_async,
)
from brooq.producer.line import EnqueueLine
from brooq.producer.pools import Pools
from brooq.producer.stacks import JobStack, fetch_stack
from brooq.producer.wait import Waits
from brooq.settings import Settings
from brooq.tracing import tracer

R = TypeVar("R")


class Queue(Registry):
    """The application object: ``queue = brooq.Queue()`` then ``@queue.handler("topic")``.
    What it declares (handlers, middleware, schedules, settings) is brooq.declare.registry's."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool_size: int = 4,
        listen_dsn: str | None = None,
        include: Sequence[str] = (),
        strict_topics: bool = False,
        **settings: Any,
    ) -> None:
        """``include``: the modules that register this Queue's handlers (a package: every
        module under it), imported by ``brooq-master --app`` and ``brooq ... --app`` when
        they load the application, and by this Queue's enqueue doors at their first use
        (docs/how-to/handlers.md, "Handlers in several modules"). ``strict_topics``:
        refuse, before anything is written, a job whose topic no handler of this Queue
        declares (InvalidTopic naming it and the close matches)."""
        super().__init__(
            dsn, listen_dsn=listen_dsn, include=include, strict_topics=strict_topics, **settings
        )
        self.pool_size = pool_size
        self._pools = Pools(self)
        self._waits = Waits(self, self._pools)
        self._line: EnqueueLine | None = None  # enqueue's own connection, opened on first use

    def configure(self, settings: Settings) -> None:
        """Replace the settings (the master applies its flags through this)."""
        self._settings = settings
        if self._line is not None:  # built for the old schema and pooler
            self._line.close()
            self._line = None

    # -- connections (brooq.producer.pools) -------------------------------------------------------

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit off); committed on success, rolled back on error."""
        with self._pools.connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection inside a transaction: your writes and
        ``brooq.enqueue(conn, job)`` commit together, or roll back together."""
        with self._pools.connection() as conn, conn.transaction():
            yield conn

    def close(self) -> None:
        self._pools.close()
        if self._line is not None:
            self._line.close()
        self._line = None
        self._waits.close()

    async def close_async(self) -> None:
        """Close the async pool (from the event loop that used it); ``close`` closes the
        other."""
        await self._pools.close_async()

    # -- producing (brooq.producer.insert) ---------------------------------------------------------

    def enqueue(self, job: Job) -> tuple[uuid.UUID, bool]:
        """Insert one job, committed at once; (id, created).

        One statement in autocommit on the connection this Queue keeps for single
        enqueues (brooq.producer.line: prepared, sent through libpq); the INSERT is its
        own transaction, so no BEGIN and no COMMIT round trips. A key conflict, another
        thread enqueuing at the same moment, or a job with a unique_key, debounce or tags
        takes a pooled connection."""
        # Bad input fails before I/O; a typed topic's payload is checked against its type.
        if self._includes_pending:
            self.load_includes()
        settings = self._settings or self.settings  # the property's call once
        checked = check_job(job, settings.max_payload_bytes, self.handlers)
        if self.strict_topics:
            self.require_topics((checked.topic,))
        # The line's INSERT is the plain job's: a unique_key, debounce, tags, after, held or
        # an ordering_key take the pool; so does a traced enqueue, which stores its trace
        # context (brooq.tracing).
        if (
            checked.unique_key is None
            and checked.tags is None
            and checked.after is None
            and not checked.held
            and checked.ordering_key is None
            and tracer() is None
        ):
            line = self._line
            if line is None:
                line = self._open_line()
            try:  # not the pools' errors(): a context manager's frames on every call
                done = line.insert(checked, queue_of(checked, self.handlers))
            except psycopg.Error as exc:
                if (mapped := self._pools.error(exc)) is exc:
                    raise
                raise mapped from None
            if done is not None:
                return done
        # Another thread holds the line, the job's key is taken, or it has options: the
        # pool's path (a job with after: its row and edges in one transaction there).
        with self._pools.autocommit() as conn:
            return insert_checked(conn, checked, self.handlers, q=self._q)

    def _open_line(self) -> EnqueueLine:
        with self._pools.lock:
            if self._line is None:
                self._line = EnqueueLine(self.dsn, self._pools.connect_kwargs(), self._q)
            return self._line

    def enqueue_many(self, jobs: Iterable[Job]) -> list[tuple[uuid.UUID, bool]]:
        """Insert many jobs in one transaction (COPY, or one INSERT when keys are given);
        [(id, created), ...] in the order given. A refused job is named by its index
        ("job 3: ..."), and nothing is inserted. An iterator (not a list or tuple) is
        taken, checked and sent a block at a time (brooq.producer.insert.stream_many)."""
        if not isinstance(jobs, Sequence):
            return stream_many(
                iter(jobs), self._check_many, self.transaction, self.handlers, self._q,
                self.enqueue_many,
            )  # fmt: skip
        checked = self._check_many(jobs)
        if any(job.after is not None for job in checked):
            # A graph: brooq.producer.insert opens the transaction, and runs it again after a
            # deadlock with the workers ending the jobs named.
            with self._pools.autocommit() as conn:
                return insert_many_checked(conn, checked, self.handlers, q=self._q)
        # The transaction is brooq's own: a key enqueued and ended while the INSERT ran
        # (KeyRace, the transaction aborted) is seen by the next round, which returns
        # its job's id.
        for round_ in range(1, KEY_ROUNDS + 1):
            try:
                with self.transaction() as conn:
                    return insert_many_checked(conn, checked, self.handlers, q=self._q)
            except KeyRace:
                if round_ == KEY_ROUNDS:
                    raise
        raise AssertionError("unreachable")  # the last round returned or raised

    def _check_many(self, jobs: Sequence[object], start: int = 0) -> list[Job]:
        """check_jobs with this Queue's handlers (include= imported first), and
        strict_topics' refusal naming the job by its index (the first ``start``)."""
        if self._includes_pending:
            self.load_includes()
        checked = check_jobs(jobs, self.settings.max_payload_bytes, self.handlers, start)
        if self.strict_topics:
            self.require_topics([job.topic for job in checked], batch=True, start=start)
        return checked

    async def enqueue_async(self, job: Job) -> tuple[uuid.UUID, bool]:
        """``enqueue`` from asyncio code, on this Queue's async pool (opened on first use
        in the running loop, never before a fork); (id, created)."""
        if self._includes_pending:
            self.load_includes()
        settings = self._settings or self.settings  # the property's call once
        checked = check_job(job, settings.max_payload_bytes, self.handlers)
        if self.strict_topics:
            self.require_topics((checked.topic,))
        # One statement; a job with after, one transaction (brooq.producer.insert).
        async with self._pools.async_connection(autocommit=True) as conn:
            return await insert_checked_async(conn, checked, self.handlers, q=self._q)

    async def enqueue_many_async(self, jobs: Iterable[Job]) -> list[tuple[uuid.UUID, bool]]:
        """``enqueue_many`` from asyncio code, in one transaction on the async pool (an
        iterator streamed as there)."""
        if not isinstance(jobs, Sequence):
            return await stream_many_async(
                iter(jobs), self._check_many, self._pools.async_connection, self.handlers,
                self._q, self.enqueue_many_async,
            )  # fmt: skip
        checked = self._check_many(jobs)
        graph = any(job.after is not None for job in checked)  # as enqueue_many
        for round_ in range(1, KEY_ROUNDS + 1):
            try:
                async with self._pools.async_connection(autocommit=graph) as conn:
                    return await insert_many_checked_async(conn, checked, self.handlers, q=self._q)
            except KeyRace:  # as enqueue_many: brooq's own transaction, run again
                if graph or round_ == KEY_ROUNDS:
                    raise
        raise AssertionError("unreachable")  # the last round returned or raised

    def emit_event(self, key: str, payload: Any = None) -> bool:
        """Emit the event ``key`` (committed at once): whether this emit was the first
        under ``key``; the jobs waiting on it (``claim.wait_event``) are released."""
        with self._pools.autocommit() as conn:
            return emit_event(
                conn,
                key,
                payload,
                max_payload_bytes=self.settings.max_payload_bytes,
                schema=self.schema,
            )

    async def emit_event_async(self, key: str, payload: Any = None) -> bool:
        """``emit_event`` from asyncio code, on the async pool."""
        async with self._pools.async_connection(autocommit=True) as conn:
            return await emit_event_async(
                conn,
                key,
                payload,
                max_payload_bytes=self.settings.max_payload_bytes,
                schema=self.schema,
            )

    # -- reading and operating (brooq.operator) --------------------------------------------

    def _on(self, act: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``act(conn, *args, q=...)`` on a pooled connection, committed on success."""
        with self.connection() as conn:
            return act(conn, *args, q=self._q, **kwargs)

    def get(self, job_id: uuid.UUID | str) -> JobRecord | None:
        """The job's row, or None when no job has this id."""
        return self._on(reads.get, parse_job_id(job_id))

    async def get_async(self, job_id: uuid.UUID | str) -> JobRecord | None:
        """``get`` from asyncio code, on the async pool: the job's row, or None."""
        jid = parse_job_id(job_id)
        async with self._pools.async_connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobRecord))
            await cur.execute(self._q.job_get, {"id": jid})
            return await cur.fetchone()

    def logs(self, job_id: uuid.UUID | str) -> list[AttemptLog]:
        """The log records a ``keep_logs=True`` handler emitted, per attempt, oldest first
        ([] when none were kept); JobNotFound for an unknown id."""
        return self._on(reads.job_logs, parse_job_id(job_id))

    def upstream(self, job_id: uuid.UUID | str) -> list[UpstreamJob]:
        """The jobs ``job_id`` waits or waited for (``after``), in the order named."""
        return self._on(reads.upstream, parse_job_id(job_id))

    def downstream(self, job_id: uuid.UUID | str, limit: int = 100) -> list[UpstreamJob]:
        """The jobs that wait or waited for ``job_id``, at most ``limit``, by id."""
        return self._on(reads.downstream, parse_job_id(job_id), limit)

    def cancel(self, job_id: uuid.UUID | str) -> bool:
        """pending, failed, processing or waiting -> canceled (the jobs waiting on it
        follow, docs/how-to/workflows.md). False when the job is unknown or already
        finished (terminal rows are never touched). A running handler is interrupted
        with brooq.LeaseLost as soon as the cancel commits, and its child killed when the
        handler is still running QUEUE_WATCHDOG_GRACE later."""
        return self._on(changes.cancel, parse_job_id(job_id))

    async def cancel_async(self, job_id: uuid.UUID | str) -> bool:
        """``cancel`` from asyncio code, on the async pool (the same statement, the same
        answer: False when the job is unknown or already finished)."""
        return await self._transition_async("cancel", parse_job_id(job_id))

    def hold(self, job_id: uuid.UUID | str) -> bool:
        """pending or failed -> on_hold: no worker claims it until ``release``; its place
        in line and its attempts are kept, and ``cancel`` still works on it. False when
        the job is unknown, taken by a worker, finished, waiting for other jobs, parked by
        a durable handler, or has a unique_key (``explain_refusal`` says which)."""
        return self._on(changes.hold, parse_job_id(job_id))

    async def hold_async(self, job_id: uuid.UUID | str) -> bool:
        """``hold`` from asyncio code, on the async pool (the same statement and answer)."""
        return await self._transition_async("hold", parse_job_id(job_id))

    def release(self, job_id: uuid.UUID | str) -> bool:
        """on_hold -> pending, its place in line kept: it runs as soon as its time has
        come (the masters are woken). False when the job is unknown or not on hold."""
        return self._on(changes.release, parse_job_id(job_id))

    async def release_async(self, job_id: uuid.UUID | str) -> bool:
        """``release`` from asyncio code, on the async pool."""
        return await self._transition_async("release", parse_job_id(job_id))

    async def _transition_async(self, action: Transition, jid: uuid.UUID) -> bool:
        """Cancel, hold or release one job on the async pool (retry's unique-key refusal
        needs the sync path's savepoint)."""
        statement = transition_statement(action, self._q)
        async with self._pools.async_connection() as conn:
            cur = await conn.execute(statement, transition_params(action, jid))
            return await cur.fetchone() is not None

    def retry(self, job_id: uuid.UUID | str, *, fresh: bool = False) -> bool:
        """dead or canceled -> pending now, attempts reset, last_error kept. False when
        the job is unknown, not in one of those states, or another active job holds its
        unique_key (``explain_refusal`` names that job). A durable handler's recorded
        steps are kept (its next run resumes from them); ``fresh=True`` forgets them in
        the same transaction, so it runs from its first step again."""
        if not fresh:
            return self._on(changes.retry, parse_job_id(job_id))
        jid = parse_job_id(job_id)
        with self.transaction() as conn:
            moved = changes.retry(conn, jid, q=self._q)
            if moved:
                conn.execute(self._q.job_steps_forget, {"id": jid})
            return moved

    def cancel_many(
        self,
        *,
        topic: str,
        state: str,
        queue: str | None = None,
        dry_run: bool = False,
        batch_size: int = BULK_BATCH_SIZE,
        tag: str | None = None,
    ) -> BulkResult:
        """Cancel every job of ``topic`` in ``state`` (pending or failed; not processing:
        brooq.job.BULK_FROM_STATES says why), only in ``queue`` and only those carrying
        ``tag`` if given. The topic is
        required: there is no "every topic" by omission. ``dry_run``: count them, change
        nothing. Processed in batches of ``batch_size`` rows, each its own transaction
        (job_cancel_batch says why); a job written after the count started is left alone.
        InvalidTransition for a state the bulk cancel does not take, InvalidTopic or
        InvalidQueue for a malformed name, all before any I/O."""
        return self._many("cancel", topic, state, queue, dry_run, batch_size, tag)

    def purge(
        self,
        *,
        queue: str | None = None,
        topic: str | None = None,
        dry_run: bool = False,
        batch_size: int = BULK_BATCH_SIZE,
    ) -> int:
        """Cancel every job of ``queue`` and/or ``topic`` (at least one; both: the jobs of
        that topic in that queue) that no worker has taken yet: pending (ready or
        scheduled), failed (waiting out a retry's backoff) and waiting (on the jobs named
        in its ``after``), not a durable handler's parked job (it has started). Processing
        and finished jobs are left alone. How many were canceled; ``dry_run``: how many
        would be, nothing changed. In batches of ``batch_size`` rows, each its own
        transaction; jobs enqueued once it has started are left alone. The jobs waiting on
        a purged job are canceled with it, as with ``cancel``. BrooqError when neither is
        given, InvalidQueue or InvalidTopic for a malformed name, all before any I/O."""
        changes.check_purge(queue=queue, topic=topic, batch_size=batch_size)
        return self._on(
            changes.purge, queue=queue, topic=topic, dry_run=dry_run, batch_size=batch_size
        )

    def retry_many(
        self,
        *,
        topic: str,
        state: str,
        queue: str | None = None,
        dry_run: bool = False,
        batch_size: int = BULK_BATCH_SIZE,
        tag: str | None = None,
    ) -> BulkResult:
        """Retry every job of ``topic`` in ``state`` (dead or canceled), only in ``queue``
        and only those carrying ``tag`` if given: each goes back to pending now as
        ``retry`` sends one (attempts reset, last error and error history kept), and the
        masters are woken. A job whose unique_key another active job holds is left alone
        and named in the result's ``taken``. Otherwise as ``cancel_many``."""
        return self._many("retry", topic, state, queue, dry_run, batch_size, tag)

    def hold_many(
        self,
        *,
        topic: str,
        state: str,
        queue: str | None = None,
        dry_run: bool = False,
        batch_size: int = BULK_BATCH_SIZE,
        tag: str | None = None,
    ) -> BulkResult:
        """Hold every job of ``topic`` in ``state`` (pending or failed), only in ``queue``
        and only those carrying ``tag`` if given, as ``hold`` holds one (parked jobs and
        jobs with a unique_key are left alone). Otherwise as ``cancel_many``."""
        return self._many("hold", topic, state, queue, dry_run, batch_size, tag)

    def release_many(
        self,
        *,
        topic: str,
        queue: str | None = None,
        dry_run: bool = False,
        batch_size: int = BULK_BATCH_SIZE,
        tag: str | None = None,
    ) -> BulkResult:
        """Release every held job of ``topic``, only in ``queue`` and only those carrying
        ``tag`` if given, as ``release`` releases one; the masters are woken. Otherwise
        as ``cancel_many``."""
        return self._many("release", topic, ON_HOLD, queue, dry_run, batch_size, tag)

    def _many(
        self,
        action: Transition,
        topic: str,
        state: str,
        queue: str | None,
        dry_run: bool,
        batch_size: int,
        tag: str | None,
    ) -> BulkResult:
        """A bulk ``action`` (changes.change_many), its arguments checked before any I/O."""
        check_bulk(action, topic=topic, state=state, queue=queue, batch_size=batch_size, tag=tag)
        return self._on(
            changes.change_many,
            action,
            topic=topic,
            state=state,
            queue=queue,
            dry_run=dry_run,
            batch_size=batch_size,
            tag=tag,
        )

    def stack(self, job_id: uuid.UUID | str, timeout: Duration = 5.0) -> JobStack:
        """The current Python stack of the handler running the job, from whichever host
        runs it (the request and the answer travel through PostgreSQL: brooq.producer.stacks).
        JobNotFound, JobNotRunning (not processing), StackUnavailable (no master answered
        within ``timeout``, or the job ended meanwhile)."""
        return fetch_stack(
            self.listen_dsn, parse_job_id(job_id), to_seconds(timeout), schema=self.schema
        )

    def explain_refusal(self, job_id: uuid.UUID | str, action: Transition) -> BrooqError:
        """Why cancel, retry, hold or release did nothing, as an error to show an operator:
        JobNotFound, or InvalidTransition naming the job's state (or the job holding its
        unique_key)."""
        return self._on(changes.explain_refusal, parse_job_id(job_id), action)

    def list_jobs(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int = 100,
        queue: str | None = None,
        tag: str | None = None,
    ) -> list[JobRecord]:
        """Newest first; at most 1,000 rows; only ``topic``, ``state``, ``queue`` and jobs
        carrying ``tag`` when given."""
        filters = reads.check_listing(topic=topic, state=state, limit=limit, queue=queue, tag=tag)
        return self._on(reads.list_jobs, **filters)

    async def list_jobs_async(
        self,
        *,
        topic: str | None = None,
        state: str | None = None,
        limit: int = 100,
        queue: str | None = None,
        tag: str | None = None,
    ) -> list[JobRecord]:
        """``list_jobs`` from asyncio code, on the async pool: newest first, the same
        filters and limits (checked before any I/O)."""
        filters = reads.check_listing(topic=topic, state=state, limit=limit, queue=queue, tag=tag)
        async with self._pools.async_connection() as conn:
            cur = conn.cursor(row_factory=class_row(JobRecord))
            await cur.execute(self._q.job_list, filters)
            return await cur.fetchall()

    def stats(self) -> list[TopicStats]:
        """Per queue and topic (by queue, then topic): the counts (waiting, scheduled,
        ready, held, retrying, parked, processing, dead: docs/explanation/guarantees.md,
        "Counts"), the state counts kept (pending, failed, busy) and the age of the oldest
        ready job not held back. Topics holding only done or canceled jobs are left
        out."""
        return self._on(reads.stats)

    def limits(self) -> list[TopicLimits]:
        """Every topic the live masters publish limits for (global_limit, rate_limit,
        group_limit, group_rate_limit), by topic, with what they hold back now."""
        return self._on(reads.topic_limits)

    def set_group_limit(self, topic: str, group: str, limit: int | None) -> bool:
        """Give ``group`` of ``topic`` its own group_limit (a tenant's plan), replacing the
        topic's for that group: at most ``limit`` of its jobs processing at once, fleet-wide
        (0: its jobs wait); None goes back to the topic's. Stored in the database: every
        master obeys it at its next claim of the topic. For a topic claimed apart (a rate,
        a group limit or fair_groups; docs/how-to/rate-limits.md). True when something
        changed. InvalidTopic, InvalidGroup or BrooqError before any
        I/O for a bad argument."""
        changes.check_group_limit(topic, group, limit)
        return self._on(changes.set_group_limit, topic, group, limit)

    def set_group_rate(self, topic: str, group: str, rate: Rate | str | None) -> bool:
        """Give ``group`` of ``topic`` its own rate (a tenant's plan: ``"50/s"``, ``"N/m"``,
        ``"N/h"`` or a ``brooq.Rate``), replacing the topic's group_rate_limit for that
        group; None goes back to the topic's. Stored in the database: every master obeys
        it at its next claim of the topic. For a topic under a rate (rate_limit or
        group_rate_limit; docs/how-to/rate-limits.md). True when something changed.
        InvalidTopic, InvalidGroup or BrooqError before any I/O for a bad argument."""
        changes.check_group_rate(topic, group, rate)
        return self._on(changes.set_group_rate, topic, group, rate)

    def group_limits(self, topic: str | None = None) -> list[GroupLimit]:
        """The groups' own limits and rates set with ``set_group_limit`` and
        ``set_group_rate``, by topic and group (only ``topic``'s if given)."""
        return self._on(reads.group_limits, topic)

    # -- ordered keys (brooq.operator.keys) --------------------------------------------------

    def blocked_keys(self, topic: str | None = None, limit: int = 100) -> list[BlockedKey]:
        """The ordered keys (``Job(ordering_key=...)``) whose next job cannot start, oldest
        first: a dead job blocks them, or their job waits for a retry
        (docs/how-to/ordered-keys.md); ``topic``'s only, if given; at most ``limit``."""
        return self._on(keys.blocked, topic, limit)

    def unblock_key(self, topic: str, key: str) -> uuid.UUID | None:
        """Let the key's next job start although a job of the key is dead (the dead job
        stays dead; retrying it instead puts it first again). The id of the job started, or
        None when none could (nothing waits). BrooqError when no dead job blocks the key."""
        return self._on(keys.unblock, topic, key)

    # -- schedules stored in the database (brooq.operator.schedules) ------------------------

    def add_schedule(
        self,
        name: str,
        topic: str,
        payload: Any = None,
        *,
        cron: str | None = None,
        every: Duration | None = None,
        tz: str = "UTC",
        queue: str | None = None,
        priority: int = 0,
        backfill: int = 0,
        paused: bool = False,
    ) -> StoredSchedule:
        """Store a periodic schedule in the database, beside those the application
        declares with ``periodic``: ``cron`` or ``every`` in ``tz``, as ``periodic`` takes
        them, and the job of each tick (``topic``, ``payload``, ``queue``, ``priority``).
        Every master's periodic duty reads it within a second and enqueues each tick once.
        ``backfill``: after downtime, so many missed ticks before the due one are
        enqueued too (0: only the due one). A name the application declares stays the
        application's. InvalidSettings or BrooqError before any write for a bad argument
        or a name stored already."""
        stored = schedules.make(
            name,
            topic,
            payload,
            cron=cron,
            every=every,
            tz=tz,
            queue=queue,
            priority=priority,
            backfill=backfill,
            paused=paused,
        )
        self._on(schedules.add, stored)
        return stored

    def change_schedule(self, name: str, **fields: Any) -> StoredSchedule:
        """Change a stored schedule: any of ``add_schedule``'s arguments but the name
        (``cron`` and ``every`` replace each other). Masters follow within a second."""
        unknown = set(fields) - {
            "topic", "payload", "cron", "every", "tz", "queue", "priority", "backfill", "paused"
        }  # fmt: skip
        if unknown:
            raise BrooqError(f"change_schedule takes no {', '.join(sorted(unknown))}")
        return self._on(schedules.change, name, **fields)

    def pause_schedule(self, name: str) -> StoredSchedule:
        """No tick of the stored schedule is enqueued until ``resume_schedule``."""
        return self.change_schedule(name, paused=True)

    def resume_schedule(self, name: str) -> StoredSchedule:
        """The stored schedule's ticks come again (missed ones as its backfill says)."""
        return self.change_schedule(name, paused=False)

    def remove_schedule(self, name: str) -> bool:
        """Remove a stored schedule; False when there is none of that name."""
        return self._on(schedules.remove, name)

    def run_schedule(self, name: str) -> uuid.UUID:
        """Enqueue the stored schedule's job now, outside its ticks; its id."""
        stored = self._on(schedules.get, name)
        job_id, _ = self.enqueue(stored.job())
        return job_id

    def stored_schedules(self, name: str | None = None) -> list[StoredSchedule]:
        """The schedules stored in the database, by name, with their last claimed tick."""
        return self._on(schedules.listed, name)

    def in_flight(self, limit: int = 100) -> list[InFlight]:
        """Jobs in state processing, longest running first; at most ``limit`` (1,000)."""
        reads.check_limit(limit)
        return self._on(reads.in_flight, limit)

    def processing_by_holder(self, limit: int = 100) -> list[HolderStats]:
        """Per holder (``locked_by``), its jobs in state processing, busiest first (then by
        name); at most ``limit`` (1,000) holders."""
        reads.check_limit(limit)
        return self._on(reads.processing_by_holder, limit)

    def throughput(self, seconds: float = 60) -> dict[str, int]:
        """Per topic, the jobs that reached done, failed, dead or canceled in the last
        ``seconds``. Topics with none are left out."""
        return reads.per_topic(self.throughput_by_queue(seconds))

    def throughput_by_queue(self, seconds: float = 60) -> dict[tuple[str, str], int]:
        """Per (queue, topic), the jobs that reached done, failed, dead or canceled in the
        last ``seconds``. Pairs with none are left out."""
        reads.check_seconds(seconds)
        return self._on(reads.throughput_by_queue, seconds)

    def pause(self, name: str) -> None:
        """Stop the claims of queue ``name`` (every master sees it within its
        poll_interval). Running jobs finish; producers go on enqueueing. A queue nobody
        used yet may be paused: the pause holds when its jobs arrive."""
        self._on(changes.set_paused, validate_queue(name), paused=True)

    def resume(self, name: str) -> None:
        """Let the masters claim from queue ``name`` again (a queue never paused is left
        running, and gets a row saying so)."""
        self._on(changes.set_paused, validate_queue(name), paused=False)

    def queues(self) -> list[QueueStats]:
        """Every queue holding unfinished or dead jobs, and every queue paused or resumed
        by an operator, by name: paused or not, the counts of ``stats`` summed over the
        queue's topics, and the age of the oldest ready job not held back."""
        return self._on(reads.queues)

    # -- waiting for a job's end (brooq.producer.wait) --------------------------------------------

    def wait(self, job_id: uuid.UUID | str, timeout: float | None = None) -> JobRecord:
        """Block until the job is done, dead or canceled; its row then. WaitTimeout after
        ``timeout`` seconds (None: no limit), JobNotFound for an unknown id. Every waiter
        of this Queue in this process shares one LISTEN connection, and reads the row on
        the pool without holding a connection while it waits (brooq.producer.wait says how);
        DatabaseUnavailable when the listening connection cannot be opened, or a read
        fails."""
        return self._waits.wait(parse_job_id(job_id), timeout)

    async def wait_async(self, job_id: uuid.UUID | str, timeout: float | None = None) -> JobRecord:
        """``await queue.wait_async(id)``: queue.wait from asyncio code, woken through
        the same listener, reading the row on the async pool; the event loop runs
        meanwhile, and a task canceled while it waits leaves nothing subscribed."""
        return await self._waits.wait_async(parse_job_id(job_id), timeout)
