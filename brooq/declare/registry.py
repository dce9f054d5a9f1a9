"""What an application declares: its handlers, middleware and schedules, and its
settings and connection strings as given (resolved on first read). brooq.Queue is one;
the master reads these to run it.

Owns: registering handlers (brooq.declare.handlers builds them), middleware and schedules
(brooq.declare.periodic), the unknown-setting check, and resolving the DSNs and settings late
(defaults < QUEUE_* environment < Queue(**settings)); ``include=``, the modules that
register handlers on this Queue, imported once when its handlers are first needed
(``load_includes``: a package with every module under it), and ``strict_topics``, the
refusal of a topic no handler declares (``require_topics``, with the close matches).
Must never: open a connection or do other I/O (brooq.Queue does, on what is declared here)
but importing the modules ``include=`` names.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

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
from brooq.errors import AppLoadError, BrooqError, InvalidSettings, InvalidTopic, PoolerMismatch
from brooq.job import DEFAULT_QUEUE
from brooq.settings import FIELDS, Settings, load
from brooq.sql import Queries, queries

# @queue.handler(...) returns the function it was given, its type kept.
H = TypeVar("H", bound=HandlerFn)


def _check_include(include: object) -> tuple[str, ...]:
    """``include=`` as module names, or InvalidSettings saying what is wrong."""
    if isinstance(include, str) or not isinstance(include, Iterable):
        raise InvalidSettings(
            [f"include= takes a list of module names (e.g. ['shop.tasks']), got {include!r}"]
        )
    names = tuple(include)
    bad = [
        repr(name)
        for name in names
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split("."))
    ]
    if bad:
        raise InvalidSettings([f"include= names modules as dotted names; not {', '.join(bad)}"])
    return names


def _import(name: str, owner: str) -> Any:
    try:
        return importlib.import_module(name)
    except InvalidSettings as exc:
        raise AppLoadError(
            f"cannot import {name!r} ({owner}): " + "; ".join(exc.problems),
            [f"{name}: {p}" for p in exc.problems],
        ) from exc
    except Exception as exc:
        detail = " ".join(str(exc).split())
        raise AppLoadError(
            f"cannot import {name!r} ({owner}): {type(exc).__name__}: {detail}"
        ) from exc


def import_included(name: str, owner: str = "named in the Queue's include=") -> list[str]:
    """Import ``name``; a package with every module under it (pkgutil.walk_packages).
    The modules imported, in order; AppLoadError naming the module that failed."""
    module = _import(name, owner)
    done = [name]
    path = getattr(module, "__path__", None)
    if path is None:
        return done

    def failed(sub: str) -> None:  # a subpackage walk_packages could not import
        _import(sub, owner)

    for info in pkgutil.walk_packages(path, prefix=f"{name}.", onerror=failed):
        _import(info.name, owner)
        done.append(info.name)
    return done


class Registry:
    """An application's declarations; ``brooq.Queue`` adds the I/O."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        listen_dsn: str | None = None,
        include: Sequence[str] = (),
        strict_topics: bool = False,
        **settings: Any,
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
        # The modules registering this Queue's handlers, imported once (load_includes).
        self.include = _check_include(include)
        self._includes_pending = bool(self.include)
        self._includes_lock = threading.Lock()
        if not isinstance(strict_topics, bool):
            raise InvalidSettings([f"strict_topics must be True or False, got {strict_topics!r}"])
        self.strict_topics = strict_topics
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

    # -- include= and strict_topics ---------------------------------------------------------

    def load_includes(self) -> None:
        """Import the modules ``include=`` names (once per Queue; a package with every
        module under it), so that the handlers they register are known.
        brooq.app.load calls it (brooq-master, ``brooq ... --app``), and so do a Queue's
        enqueue doors at their first use. AppLoadError names a module that failed (the
        next call tries again)."""
        if not self._includes_pending:
            return
        with self._includes_lock:
            if not self._includes_pending:
                return
            self._includes_pending = False  # a module enqueuing as it is imported: no loop
            try:
                for name in self.include:
                    import_included(name)
            except BaseException:
                self._includes_pending = True
                raise

    def require_topics(self, topics: Iterable[str], *, batch: bool = False, start: int = 0) -> None:
        """With ``strict_topics=True``: InvalidTopic for the first of ``topics`` no
        handler of this Queue declares, naming it and the close matches (the modules of
        ``include=`` imported first); in a ``batch``, named by its index as enqueue_many
        names a refused job ("job 3: ...", the first at ``start``). Nothing without
        strict_topics."""
        if not self.strict_topics:
            return
        self.load_includes()
        handlers = self.handlers
        for index, topic in enumerate(topics, start):
            if topic not in handlers:
                where = f"job {index}: " if batch else ""
                raise InvalidTopic(where + self.unknown_topic(topic))

    def unknown_topic(self, topic: str) -> str:
        """The refusal of ``topic``, which no handler of this Queue declares."""
        if not self.handlers:
            return (
                f"topic {topic!r} has no handler: this Queue (strict_topics=True) declares "
                "none; register them with @queue.handler, or name their modules in include="
            )
        close = difflib.get_close_matches(topic, sorted(self.handlers), n=3, cutoff=0.6)
        hint = (
            "; did you mean " + " or ".join(repr(c) for c in close) + "?"
            if close
            else f"; its topics are {', '.join(sorted(self.handlers)[:10])}"
            + (", ..." if len(self.handlers) > 10 else "")
        )
        return f"topic {topic!r} has no handler on this Queue (strict_topics=True){hint}"

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
        fair_groups: bool = False,
        ordering_skip_dead: bool = False,
    ) -> Callable[[H], H]:
        """Register ``fn(claim)`` for ``topic``; the decorator returns ``fn`` itself, its
        type unchanged (a typed checker sees the function you wrote). Unset options take
        the queue's settings (QUEUE_MAX_ATTEMPTS etc.; defaults 5, 1m, 5m, 1s, 1m).
        ``queue``: where jobs of this topic go when they name none; ``global_limit``: at
        most that many of them processing at once across every master on the database.
        ``payload``: a dataclass
        or pydantic model; ``claim.payload`` is then an instance of it, and a job enqueued
        through this Queue is checked against it before anything is written.
        ``middleware``: this topic's, inside the Queue's (``@queue.middleware``).
        ``retry``: ``fn(attempt, exc) -> timedelta | None`` after a failed attempt (None:
        no more attempts); without it, exponential backoff. What ``fn`` returns, if not
        None, is stored with ``done`` (``queue.get(id).result``). ``rate_limit``: at most
        N starts in any window of a period across every master (``"N/s"``, ``"N/m"``,
        ``"N/h"`` or ``brooq.Rate(N, per=timedelta(...))``); ``group_limit``: at most N
        jobs processing per group (``Job(group=...)``); ``group_rate_limit``: a rate per
        group; ``fair_groups``: the claims take the groups in turn, an equal share each,
        so that one group's backlog never holds the others back
        (docs/how-to/rate-limits.md). ``ordering_skip_dead``: a dead job of an ordered key
        (``Job(ordering_key=...)``) hands its key on within a second instead of blocking
        it (docs/how-to/ordered-keys.md). ``keep_logs``: keep the log records the
        handler emits during each attempt with the job (True: up to 64 KiB per attempt,
        or a number of bytes; ``queue.logs(id)``, docs/how-to/job-logs-and-progress.md)."""

        def register(fn: H) -> H:
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
                fair_groups=fair_groups,
                ordering_skip_dead=ordering_skip_dead,
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
