"""What every child process is, whichever loop runs its jobs: its parts, set up after fork.

Owns `ChildProcess`: the config the master handed over, the application's
on_child_start hooks (run first), the handlers of the child's kind composed with their
middleware (docs/async.md: a middleware never wraps the other kind),
the connection, board, meter and outcome writer, the link to the master, the round trips
(brooq.worker.roundtrip) and the attempts' bookkeeping (brooq.worker.attempt), the sink
of claim.progress (the board), the keep_logs capture (brooq.worker.joblogs) and the
consumer spans (brooq.worker.spans, when traced), and when the child retires. The sync
loop (brooq.worker.child) and the async one (brooq.worker.aio) stand on it.

Must never claim, run a handler or write an outcome itself: the loops do, through the
parts set up here.
"""

from __future__ import annotations

import gc
import uuid
from typing import IO, Any

from brooq import tracing
from brooq.declare.handlers import HandlerFn, Middleware, Policy, described, is_async_callable
from brooq.ipc import progress
from brooq.ipc.board import MESSAGE_MAX_BYTES, Board
from brooq.ipc.reasons import ASYNC, MAX_JOBS, MAX_MEMORY
from brooq.job import Claim
from brooq.rules import worked_queues
from brooq.sql import queries
from brooq.worker import attempt, execute, joblogs
from brooq.worker.attempt import Attempts
from brooq.worker.chain import compose, compose_async
from brooq.worker.connection import ChildConnection
from brooq.worker.durable import Durable
from brooq.worker.link import MasterLink
from brooq.worker.meter import Meter, resident_mib
from brooq.worker.outcome import OutcomeWriter
from brooq.worker.pacing import turns
from brooq.worker.roundtrip import RoundTrips
from brooq.worker.spans import Spans
from brooq.worker.state import ChildConfig, ChildState
from brooq.worker.upstream import UpstreamReader
from brooq.worker.weights import RoundOrder

__all__ = ["ChildProcess"]


class ChildProcess:
    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.settings = config.settings
        # The statements of the master's schema (QUEUE_SCHEMA), looked up once here: the
        # loops read plain attributes and dictionaries.
        self.q = queries(self.settings.schema)
        self.handlers = config.handlers
        self.middleware: tuple[Middleware, ...] = config.middleware
        self.child_start = config.child_start
        self.runners: dict[str, HandlerFn] = {}  # each topic's middleware chain and handler
        self.keeps: dict[str, int] = {}  # keep_logs: each such topic's bytes per attempt
        self.spans: Spans | None = None  # a consumer span per attempt, when traced
        self.policies: dict[str, Policy] = {}
        self.state = ChildState()
        self.board = config.board or Board()
        self.meter = Meter(config.metrics)
        self.db = ChildConnection(config.dsn, config.identity, self.settings, self.state)
        self.outcomes = OutcomeWriter(
            config.identity, self.settings, self.db, self.state, self.board, self.meter
        )
        self.jobs_done = 0
        # Whether should_retire can ever be true (a limit is set): the loops ask per job.
        self.may_retire = bool(
            self.settings.max_jobs_per_child or self.settings.max_memory_per_child
        )
        self._stack_fh: IO[str] | None = None

    @property
    def master_gone(self) -> bool:
        return self.state.master_gone

    def setup(self) -> None:
        self._stack_fh = attempt.install_signals(self.state, self.config.stack_file)
        self.link = MasterLink(
            self.config.to_master,
            self.config.from_master,
            self.settings,
            self.state,
            self.config.stack_file,
        )
        if self.config.reload_baseline is not None:
            self._reload_app()
        for hook in self.child_start:  # the application's set-up after the fork
            hook()
        self.policies = {t: h.policy(self.settings) for t, h in self.handlers.items()}
        Claim.reader = UpstreamReader(self.config.dsn, self.settings.schema)
        Claim.durable = Durable(self.config.dsn, self.settings, self.handlers)
        # A child runs the handlers of its kind only, each wrapped by the Queue's
        # middleware of that kind (docs/async.md: a middleware never wraps the other kind).
        is_async = self.config.kind == ASYNC
        mine = {t: h for t, h in self.handlers.items() if h.is_async == is_async}
        outer = tuple(m for m in self.middleware if is_async_callable(m) == is_async)
        join = compose_async if is_async else compose
        self.runners = {t: join(h.fn, (*outer, *h.middleware)) for t, h in mine.items()}
        self.keeps = {t: h.keep_logs for t, h in mine.items() if h.keep_logs}
        if self.keeps:
            joblogs.install()
        # Decided once the application is imported and its on_child_start hooks ran
        # (either may configure the OpenTelemetry SDK): brooq.tracing.
        found = tracing.tracer()
        self.spans = None if found is None else Spans(found, self.q, self.db)
        self.outcomes.handlers = self.handlers
        self.outcomes.id_text = self.link.text_of
        self.trips = RoundTrips(
            self.config.identity,
            self.settings,
            self.q,
            self.db,
            self.outcomes,
            self.policies,
            sorted(t for t, h in mine.items() if h.global_limit is None and not h.coordinated),
            turns(mine),
            RoundOrder(worked_queues(self.settings.queues, self.handlers)),
            self.config.children or max(1, self.settings.workers),
            self.link.tell,
            self.link.tell_held,
        )
        # An async child's jobs share the process's CPU time: none is metered per job.
        self.attempts = Attempts(
            self.board,
            self.meter,
            self.handlers,
            self.settings.max_payload_bytes,
            self.state.lost,
            measure_cpu=not is_async,
        )
        progress.sink = self._progress
        # What the child set up lives as long as it does: kept out of the collector's
        # full passes, which would walk all of it again every few thousand jobs.
        gc.freeze()
        self.link.start()
        self.link.update_title()
        ready: dict[str, Any] = {"ready": 1}
        if self.config.reload_baseline is not None:  # re-imported: the master's are stale
            ready["handlers"] = described(self.handlers, self.settings)
        self.tell(ready)

    def _progress(
        self, job_id: uuid.UUID, attempt: int, fraction: float, message: str
    ) -> str | None:
        """A handler's claim.progress(), on the board for the master's progress tick
        (brooq.supervisor.duties.progress); its message as the database can store it
        (brooq.worker.execute.storable), None when the job runs in no slot any more."""
        text = execute.storable(message, self.db.codec, progress.MESSAGE_MAX)
        raw = text.encode()[:MESSAGE_MAX_BYTES]
        if not self.board.progress(job_id, fraction, raw):
            return None
        return text

    def _reload_app(self) -> None:
        from brooq.app import forget_user_modules, load

        assert self.config.reload_baseline is not None
        forget_user_modules(set(self.config.reload_baseline))
        queue = load(self.config.app_spec)
        self.handlers = queue.handlers
        self.middleware = tuple(queue.middlewares)
        self.child_start = tuple(queue.child_start_hooks)

    def tell(self, message: dict[str, Any]) -> None:
        self.link.tell(message)

    def should_retire(self) -> bool:
        """Whether the child has done its share (max_jobs_per_child) or grown too big
        (max_memory_per_child); the master is told why when it has."""
        s = self.settings
        if s.max_jobs_per_child and self.jobs_done >= s.max_jobs_per_child:
            self.tell({"retire": MAX_JOBS})
            return True
        if s.max_memory_per_child:
            self.attempts.forget_cpu()  # reading the memory is not the next attempt's
        if s.max_memory_per_child and resident_mib() > s.max_memory_per_child:
            self.tell({"retire": MAX_MEMORY})
            return True
        return False

    def retire_after_job(self) -> bool:
        """One more job done (whatever its outcome): whether the child retires now."""
        self.jobs_done += 1
        return self.should_retire()
