"""What an application declares: its handlers, middleware and schedules, and its
settings and connection strings as given (resolved on first read). brooq.Queue is one;
the master reads these to run it.

Owns: registering handlers (brooq.declare.handlers builds them), middleware and schedules
(brooq.declare.periodic), the unknown-setting check, and resolving the DSNs and settings late
(defaults < QUEUE_* environment < Queue(**settings)).
Must never: open a connection or do other I/O (brooq.Queue does, on what is declared here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from brooq.db import need_direct
from brooq.declare.handlers import (
    Handler,
    HandlerFn,
    Middleware,
    RetryPolicy,
    build,
    callable_problem,
)
from brooq.declare.periodic import JobSpec, Schedule, build_schedule
from brooq.declare.rates import Rate
from brooq.dsn import resolve, resolve_listen
from brooq.durations import Duration
from brooq.errors import BrooqError, InvalidSettings, PoolerMismatch
from brooq.job import DEFAULT_QUEUE
from brooq.settings import FIELDS, Settings, load
from brooq.sql import Queries, queries


class Registry:
    """An application's declarations; ``brooq.Queue`` adds the I/O."""

    def __init__(
        self, dsn: str | None = None, *, listen_dsn: str | None = None, **settings: Any
    ) -> None:
        self._dsn_arg = dsn
        self._dsn: str | None = None
        # The direct connection (docs/poolers.md): None reads QUEUE_LISTEN_DATABASE_URL,
        # else the same as dsn.
        self._listen_dsn_arg = listen_dsn
        self._listen_dsn: str | None = None
        self._overrides = dict(settings)
        self._settings: Settings | None = None
        self.handlers: dict[str, Handler] = {}
        self.middlewares: list[Middleware] = []  # every topic's, outermost first
        self.schedules: dict[str, Schedule] = {}  # queue.periodic(...), by name
        self.child_start_hooks: list[Callable[[], object]] = []  # @queue.on_child_start
        # Fail early on unknown names and bad values given in code.
        unknown = sorted(set(settings) - FIELDS)
        if unknown:
            raise BrooqError(f"unknown Queue settings: {', '.join(unknown)}")

    # -- configuration ---------------------------------------------------------------

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            self._dsn = resolve(self._dsn_arg, explicitly="brooq.Queue(dsn=...)")
        return self._dsn

    @property
    def listen_dsn(self) -> str:
        """Where queue.wait and queue.stack LISTEN: a connection that reaches PostgreSQL
        directly. Behind a transaction pooler (QUEUE_POOLER=transaction) it must differ
        from ``dsn``: PoolerMismatch otherwise."""
        if self._listen_dsn is None:
            found = resolve_listen(self.dsn, self._listen_dsn_arg)
            problem = need_direct(self.settings.pooler, self.dsn, found, "queue")
            if problem:
                raise PoolerMismatch(problem)
            self._listen_dsn = found
        return self._listen_dsn

    @property
    def settings(self) -> Settings:
        """Defaults < QUEUE_* environment < Queue(**settings); validated on first read."""
        if self._settings is None:
            self._settings = load(overrides=self._overrides)
        return self._settings

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
        rate_limit: Rate | str | None = None,
        group_limit: int | None = None,
        group_rate_limit: Rate | str | None = None,
        keep_logs: bool | int = False,
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
        None, is stored with ``done`` (``queue.get(id).result``). ``rate_limit``: at most
        N starts in any window of a period across every master (``"N/s"``, ``"N/m"``,
        ``"N/h"`` or ``brooq.Rate(N, per=timedelta(...))``); ``group_limit``: at most N
        jobs processing per group (``Job(group=...)``); ``group_rate_limit``: a rate per
        group (docs/how-to/rate-limits.md). ``keep_logs``: keep the log records the
        handler emits during each attempt with the job (True: up to 64 KiB per attempt,
        or a number of bytes; ``queue.logs(id)``, docs/how-to/job-logs-and-progress.md)."""

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
                rate_limit=rate_limit,
                group_limit=group_limit,
                group_rate_limit=group_rate_limit,
                keep_logs=keep_logs,
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

    def on_child_start(self, fn: Callable[[], object]) -> Callable[[], object]:
        """Register ``fn()``, called in each worker child once it has started (after the
        fork, before its first claim; again in the children of a reload): set up what
        must not cross a fork there, such as an OpenTelemetry SDK and its exporter
        (docs/how-to/tracing.md). An exception from it stops the child from starting."""
        problem = callable_problem(fn, 0, "fn()")
        if problem:
            raise InvalidSettings([f"on_child_start {problem}"])
        self.child_start_hooks.append(fn)
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
