"""Helpers for testing an application's handlers against a real PostgreSQL.

    counts = brooq.testing.drain(queue)            # run what is ready, here, now
    assert counts == {"done": 3}
    [job] = brooq.testing.jobs(queue, topic="email.send")
    counts = await brooq.testing.drain_async(queue)  # in an async test: on its loop

Owns `drain` and `drain_async` (the jobs ready now, run in the calling process through
the worker's own claim and outcome statements: retries, signals, chain, on_success,
typed payloads, results, middleware of the handler's kind, retry policies; an `async
def` handler awaited to completion on an event loop), `jobs` (every matching row, oldest
first), and `bind` (point an application's Queue at a test database). The pytest plugin
(brooq.testing.pytest_plugin, registered as ``brooq``) provides the ``brooq_dsn`` fixture.

What one process cannot honour: ``max_execution_timeout`` (the master's hard kill; a
handler that never returns, or a coroutine that never yields, hangs the test) and lease
renewal (a handler running longer than the lease may be reaped by a brooq-master working
the same database). The soft ``attempt_timeout`` of a sync handler is honoured when the
drain runs in the main thread (SIGALRM), not in another thread; an async handler's, by
cancelling its task, in any thread. A failed job is retried only once its backoff has
passed: a drain runs what is ready *now*; set ``backoff_base`` small in tests, or call it
again.

Must never: run jobs a master could not (paused queues stay paused, topics without a
handler stay), wrap a handler in middleware of the other kind (brooq.worker.process's
rule), run a sync handler on an event loop of its own making (a sync child has none), or
write outcomes other than through the worker's guarded statements. Each attempt's
bookkeeping is the child's own (brooq.worker.attempt); drain and drain_async share one
generator of the drain's steps (`_Drain.steps`) and differ only in how they await an
async handler.

- `pytest_plugin`: the ``brooq_dsn`` fixture: a fresh migrated database for each test.
- `server`: where the PostgreSQL of a test run comes from, and its scratch databases.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Collection, Generator, Iterator
from typing import Any

import psycopg
from psycopg.rows import class_row

from brooq.declare.handlers import Handler, HandlerFn, is_async_callable
from brooq.errors import InvalidResult
from brooq.ipc.board import Board
from brooq.job import AttemptTimeout, Claim, JobRecord, validate_topic
from brooq.queue import Queue
from brooq.worker import attempt, joblogs
from brooq.worker.attempt import Attempts
from brooq.worker.chain import compose, compose_async
from brooq.worker.connection import ChildConnection
from brooq.worker.durable import Durable
from brooq.worker.meter import Meter
from brooq.worker.outcome import OutcomeWriter
from brooq.worker.roundtrip import ClaimRow, claim_row
from brooq.worker.state import ChildState

__all__ = ["bind", "drain", "drain_async", "jobs"]


def drain(
    queue: Queue, *, topics: Collection[str] | None = None, max_jobs: int | None = None
) -> dict[str, int]:
    """Run every job that is ready now, and those that become ready by running them
    (chained jobs, retries without delay, jobs whose ``after`` jobs ended), one at a time
    in this process; the counts of what was written, by state: ``{"done": 3,
    "failed": 1}`` (also "dead", "canceled").
    ``topics``: only these (of the Queue's handlers); ``max_jobs``: stop after that many.
    Jobs scheduled for later, of paused queues, or of topics without a handler stay.

    A sync handler runs in this thread, wrapped by the Queue's sync middleware, with no
    event loop running; an ``async def`` handler is awaited to completion, wrapped by
    the Queue's async middleware, on an event loop of this call's own (made at the first
    async job, closed at the end of the drain as ``asyncio.run`` closes its own), and
    its soft ``attempt_timeout`` cancels it (``brooq.AttemptTimeout``, as for a sync
    handler). In a thread where an event loop is already running (an async test), no
    loop of drain's own can run: topics with an async handler raise RuntimeError before
    anything is claimed (the sync topics still drain); ``await drain_async(...)`` runs
    them on that loop."""
    wanted = _wanted(queue, topics, max_jobs)
    asynchronous = [t for t in wanted if queue.handlers[t].is_async]
    if asynchronous and _loop_running():
        raise RuntimeError(
            "drain: an event loop is running in this thread and cannot run the async "
            f"handlers of {', '.join(asynchronous)}: await brooq.testing.drain_async(queue) "
            "runs them on it (or pass topics= without them)"
        )
    runner = _Drain(queue, wanted)
    try:
        return runner.run(max_jobs)
    finally:
        runner.close()


async def drain_async(
    queue: Queue, *, topics: Collection[str] | None = None, max_jobs: int | None = None
) -> dict[str, int]:
    """``drain`` for an async test: the same jobs, outcomes and counts, the async
    handlers awaited on the running loop (so they may use what the test made on it: an
    async client, an Event, a server task). brooq's own statements and the sync handlers
    run in this thread, holding the loop meanwhile, as a sync call would. If this call
    is cancelled, so is the job running, and it is given back (pending, its attempt
    refunded)."""
    wanted = _wanted(queue, topics, max_jobs)
    runner = _Drain(queue, wanted)
    try:
        return await runner.run_async(max_jobs)
    finally:
        runner.close()


def _wanted(queue: Queue, topics: Collection[str] | None, max_jobs: int | None) -> list[str]:
    # The handlers of the modules named in include= are the Queue's too, enqueued or not.
    queue.load_includes()
    wanted = sorted(queue.handlers) if topics is None else sorted(set(topics))
    for topic in wanted:
        validate_topic(topic)
        if topic not in queue.handlers:
            raise ValueError(f"drain: no handler for topic {topic!r} in this Queue")
    if max_jobs is not None and max_jobs < 0:
        raise ValueError(f"drain: max_jobs must be at least 0, got {max_jobs}")
    return wanted


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def jobs(queue: Queue, *, topic: str | None = None, state: str | None = None) -> list[JobRecord]:
    """Every job of the Queue's database (of ``topic``, in ``state``), oldest first."""
    with queue.connection() as conn:
        cur = conn.cursor(row_factory=class_row(JobRecord))
        return cur.execute(queue._q.testing_jobs, {"topic": topic, "state": state}).fetchall()


@contextlib.contextmanager
def bind(queue: Queue, dsn: str) -> Iterator[Queue]:
    """Point ``queue`` (an application's own, imported) at ``dsn`` for the block: its
    pools are closed first and after, so nothing of either database is reused."""
    saved = (queue._dsn_arg, queue._dsn)
    queue.close()
    queue._dsn_arg, queue._dsn = dsn, None
    try:
        yield queue
    finally:
        queue.close()
        queue._dsn_arg, queue._dsn = saved


# A drain's steps (_Drain.steps): yields the claims of async handlers, is sent what each
# raised or returned, returns the counts.
_Steps = Generator[Claim[Any], tuple[BaseException | None, Any], dict[str, int]]


class _Drain:
    """One drain: a connection of its own, as a child's, and the child's outcome writer;
    for the async jobs of a sync drain, an event loop of its own made at the first."""

    def __init__(self, queue: Queue, topics: list[str]) -> None:
        self.queue = queue
        self.settings = queue.settings
        self.topics = topics
        self.handlers: dict[str, Handler] = queue.handlers
        self.identity = f"{socket.gethostname()}:{os.getpid()}:testing-{uuid.uuid4().hex[:6]}"
        self.state = ChildState()
        self.board = Board()
        self.db = ChildConnection(queue.dsn, self.identity, self.settings, self.state)
        meter = Meter(None)
        self.outcomes = OutcomeWriter(
            self.identity, self.settings, self.db, self.state, self.board, meter
        )
        self.attempts = Attempts(
            self.board,
            meter,
            self.handlers,
            self.settings.max_payload_bytes,
            self.state.lost,
            measure_cpu=False,
        )
        self.outcomes.handlers = self.handlers
        if any(h.keep_logs for h in self.handlers.values()):
            joblogs.install()  # keep_logs handlers' records, as a child keeps them
        # As a child composes them: the Queue's middleware of the handler's kind, then
        # the topic's own (of that kind: registration refuses the other).
        outer_sync = tuple(m for m in queue.middlewares if not is_async_callable(m))
        outer_async = tuple(m for m in queue.middlewares if is_async_callable(m))
        self.runners: dict[str, HandlerFn] = {
            t: (
                compose_async(h.fn, (*outer_async, *h.middleware))
                if h.is_async
                else compose(h.fn, (*outer_sync, *h.middleware))
            )
            for t, h in self.handlers.items()
        }
        self.policies = {t: h.policy(self.settings) for t, h in self.handlers.items()}
        self.loop: asyncio.AbstractEventLoop | None = None
        # claim.upstream, read through the Queue while the drain runs.
        self.reader, Claim.reader = Claim.reader, queue.upstream
        # claim.step and the other durable operations, on the drain's own backend.
        self.durable = Claim.durable
        Claim.durable = Durable(queue.dsn, self.settings, self.handlers)

    def steps(self, max_jobs: int | None) -> _Steps:
        """The drain, sans the await: it claims, begins and ends each attempt and writes
        its outcome, and calls a sync handler itself; for an async handler it yields the
        claim and is sent what the handler raised or returned. Its value: the counts."""
        counts: Counter[str] = Counter()
        ran = 0
        while max_jobs is None or ran < max_jobs:
            claim = self._claim_one()
            if claim is None:
                break
            policy = self.policies[claim.topic]
            started = time.monotonic()
            refused = self.attempts.begin(claim, policy, started)
            error: BaseException | None
            value: Any
            handler = self.handlers[claim.topic]
            kept = joblogs.Kept(handler.keep_logs) if handler.keep_logs else None
            context = joblogs.current.set(kept)  # a task made for the handler copies it
            try:
                if refused is not None:
                    error, value = refused, None
                elif handler.is_async:
                    error, value = yield claim
                else:
                    error, value = self._call(claim)
            finally:
                try:
                    joblogs.current.reset(context)
                except ValueError:  # closed in another context: a cancelled async drain
                    joblogs.current.set(None)
            outcome, result, _, _ = self.attempts.end(claim, policy, error, value, refused, started)
            text = None if kept is None else kept.text()
            state, written = self.outcomes.write(claim, policy, outcome, result, text)
            if outcome.kind != "abandon":
                self.outcomes.settled(claim, state, time.monotonic() - started, written)
            if state is not None:
                counts[state] += 1
            ran += 1
        return dict(counts)

    def run(self, max_jobs: int | None) -> dict[str, int]:
        with _soft_timeout(self.state):
            steps = self.steps(max_jobs)
            try:
                claim = next(steps)
                while True:
                    if self.loop is None:
                        self.loop = asyncio.new_event_loop()
                    claim = steps.send(self.loop.run_until_complete(self._call_async(claim)))
            except StopIteration as finished:
                counts: dict[str, int] = finished.value
                return counts

    async def run_async(self, max_jobs: int | None) -> dict[str, int]:
        with _soft_timeout(self.state):
            steps = self.steps(max_jobs)
            try:
                claim = next(steps)
                while True:
                    claim = steps.send(await self._call_async(claim))
            except StopIteration as finished:
                counts: dict[str, int] = finished.value
                return counts

    def _claim_one(self) -> Claim[Any] | None:
        conn = self.db.get()
        queues = [
            r[0] for r in conn.execute(self.queue._q.testing_ready_queues, {"topics": self.topics})
        ]
        paused = {r[0] for r in conn.execute(self.queue._q.queue_paused_names, {"queues": queues})}
        queues = [q for q in queues if q not in paused]
        if not queues:
            return None
        params = {
            "done": [],
            "topics": self.topics,
            "limit": 1,
            "children": 1,
            "worker": self.identity,
            "lease": self.settings.lease,
            "queues": queues,
        }
        with self.db.scoped(conn):  # behind a transaction pooler, as a child's claim
            rows: list[ClaimRow] = (
                conn.cursor(row_factory=claim_row)
                .execute(self.queue._q.job_finish_and_claim_queues, params)
                .fetchall()
            )
        return next((r.claim() for r in rows if r.claimed), None)

    def _call(self, claim: Claim[Any]) -> tuple[BaseException | None, Any]:
        """A sync handler, in this thread: the child's attempt.call."""
        runner, policy = self.runners[claim.topic], self.policies[claim.topic]
        if threading.current_thread() is threading.main_thread():
            return attempt.call(runner, claim, policy, self.state)
        return _call_untimed(runner, claim)  # no SIGALRM here: it would end the process

    async def _call_async(self, claim: Claim[Any]) -> tuple[BaseException | None, Any]:
        """An async handler, awaited in a task of its own on the running loop, cancelled
        at its attempt_timeout as an async child cancels it: AttemptTimeout is then the
        attempt's exception (a TimeoutError the handler raises itself stays its own).
        Cancelled from outside, the job is cancelled too and given back."""
        policy = self.policies[claim.topic]
        loop = asyncio.get_running_loop()
        reason: list[BaseException] = []  # why brooq cancelled the task, if it did
        task = loop.create_task(_attempt(self.runners[claim.topic], claim, reason))

        def cancel(why: BaseException) -> None:
            if not task.done() and not reason:
                reason.append(why)
                task.cancel(f"brooq.{type(why).__name__}: {why}")

        limit = f"attempt_timeout {policy.attempt_timeout:g}s exceeded"
        timer = loop.call_later(policy.attempt_timeout, cancel, AttemptTimeout(limit))
        try:
            # Not `await task`: a cancel of this call must not reach the task without
            # its reason (the handler's own cancellations are its attempt's exception).
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancel(_GivenBack("brooq: the drain was cancelled"))
            await asyncio.wait([task])
            conn = self.db.get()
            conn.execute(
                self.queue._q.job_release_ids, {"ids": [claim.id], "worker": self.identity}
            )
            raise
        finally:
            timer.cancel()
        return task.result()

    def close(self) -> None:
        Claim.reader = self.reader
        Claim.durable.close()
        Claim.durable = self.durable
        if self.loop is not None:
            _close_loop(self.loop)
        conn = self.db.conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        self.board.close()
        for fd in (self.state.wake_r, self.state.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _call_untimed(fn: Any, claim: Claim[Any]) -> tuple[BaseException | None, Any]:
    try:
        return None, fn(claim)
    except Exception as exc:
        return exc, None


class _GivenBack(BaseException):
    """Why a job's task was cancelled when drain_async itself was: it goes back."""


async def _attempt(
    fn: HandlerFn, claim: Claim[Any], reason: list[BaseException]
) -> tuple[BaseException | None, Any]:
    """One attempt of an async runner, as brooq.worker.aio runs it: what it raised (any
    BaseException: a KeyboardInterrupt must not escape the loop here either) or
    returned. A cancellation of brooq's raises its reason; any other is the handler's."""
    try:
        value = await fn(claim)
    except asyncio.CancelledError as exc:
        return (reason[0] if reason else exc), None
    except BaseException as exc:
        return exc, None
    if asyncio.iscoroutine(value):
        value.close()
        return (
            InvalidResult(
                "the handler returned a coroutine: declare it async def, or await what it calls"
            ),
            None,
        )
    return None, value


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does after its coroutine: cancel the tasks left (a handler's
    background tasks), finish the async generators and the default executor, close."""
    try:
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()


@contextlib.contextmanager
def _soft_timeout(state: ChildState) -> Iterator[None]:
    """SIGALRM raises AttemptTimeout into the handler while one runs, as in a child;
    only in the main thread (the only one that receives signals). The previous handler
    and what was left of a timer armed before are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        attempt.alarm(state)

    # Someone else's timer (pytest-timeout's signal method uses this one) is set aside
    # while jobs run and armed again after with what is left of it.
    left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        state.alarm_at = attempt.NEVER  # cleared: the next drain's first attempt sets it
        signal.signal(signal.SIGALRM, previous)
        if left > 0:
            remaining = max(left - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, remaining, interval)
