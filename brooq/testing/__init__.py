"""Helpers for testing an application's handlers against a real PostgreSQL.

    counts = brooq.testing.drain(queue)            # run what is ready, here, now
    assert counts == {"done": 3}
    [job] = brooq.testing.jobs(queue, topic="email.send")

Owns `drain` (the jobs ready now, run in the calling process through the worker's own
claim and outcome statements: retries, signals, chain, on_success, typed payloads,
results, middleware, retry policies) and `jobs` (every matching row, oldest first), and
`bind` (point an application's Queue at a test database). The pytest plugin
(brooq.testing.pytest_plugin, registered as ``brooq``) provides the ``brooq_dsn`` fixture.

What one process cannot honour: ``max_execution_timeout`` (the master's hard kill; a
handler that never returns hangs the test) and lease renewal (a handler running longer
than the lease may be reaped by a brooq-master working the same database). The soft
``attempt_timeout`` is honoured when ``drain`` runs in the main thread (SIGALRM), not in
another thread. A failed job is retried only once its backoff has passed: ``drain`` runs
what is ready *now*; set ``backoff_base`` small in tests, or call it again.

Must never: run jobs a master could not (paused queues stay paused, topics without a
handler stay), or write outcomes other than through the worker's guarded statements.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Collection, Iterator
from typing import Any

import psycopg
from psycopg.rows import class_row

from brooq.errors import InvalidResult
from brooq.handlers import Handler
from brooq.ipc.board import Board
from brooq.job import AttemptTimeout, Claim, JobRecord, validate_topic
from brooq.queue import Queue
from brooq.sql import Q
from brooq.worker import execute, interrupts
from brooq.worker.chain import compose
from brooq.worker.child import ClaimRow, claim_row, encode_result, refused_payload
from brooq.worker.connection import ChildConnection
from brooq.worker.meter import Meter
from brooq.worker.outcome import OutcomeWriter, report_policy_error
from brooq.worker.state import ChildState

__all__ = ["bind", "drain", "jobs"]


def drain(
    queue: Queue, *, topics: Collection[str] | None = None, max_jobs: int | None = None
) -> dict[str, int]:
    """Run every job that is ready now, and those that become ready by running them
    (chained jobs, retries without delay), one at a time in this process; the counts of
    what was written, by state: ``{"done": 3, "failed": 1}`` (also "dead", "canceled").
    ``topics``: only these (of the Queue's handlers); ``max_jobs``: stop after that many.
    Jobs scheduled for later, of paused queues, or of topics without a handler stay."""
    wanted = sorted(queue.handlers) if topics is None else sorted(set(topics))
    for topic in wanted:
        validate_topic(topic)
        if topic not in queue.handlers:
            raise ValueError(f"drain: no handler for topic {topic!r} in this Queue")
    if max_jobs is not None and max_jobs < 0:
        raise ValueError(f"drain: max_jobs must be at least 0, got {max_jobs}")
    runner = _Drain(queue, wanted)
    try:
        return runner.run(max_jobs)
    finally:
        runner.close()


def jobs(queue: Queue, *, topic: str | None = None, state: str | None = None) -> list[JobRecord]:
    """Every job of the Queue's database (of ``topic``, in ``state``), oldest first."""
    with queue.connection() as conn:
        cur = conn.cursor(row_factory=class_row(JobRecord))
        return cur.execute(Q.testing_jobs, {"topic": topic, "state": state}).fetchall()


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


class _Drain:
    """One drain: a connection of its own, as a child's, and the child's outcome writer."""

    def __init__(self, queue: Queue, topics: list[str]) -> None:
        self.queue = queue
        self.settings = queue.settings
        self.topics = topics
        self.handlers: dict[str, Handler] = queue.handlers
        self.identity = f"{socket.gethostname()}:{os.getpid()}:testing-{uuid.uuid4().hex[:6]}"
        self.state = ChildState()
        self.board = Board()
        self.db = ChildConnection(queue.dsn, self.identity, self.settings, self.state)
        self.outcomes = OutcomeWriter(
            self.identity, self.settings, self.db, self.state, self.board, Meter(None)
        )
        self.outcomes.handlers = self.handlers
        self.runners = {
            t: compose(h.fn, (*queue.middlewares, *h.middleware)) for t, h in self.handlers.items()
        }
        self.policies = {t: h.policy(self.settings) for t, h in self.handlers.items()}

    def run(self, max_jobs: int | None) -> dict[str, int]:
        counts: Counter[str] = Counter()
        ran = 0
        with _soft_timeout(self.state):
            while max_jobs is None or ran < max_jobs:
                claim = self._claim_one()
                if claim is None:
                    break
                written = self._run(claim)
                ran += 1
                if written is not None:
                    counts[written] += 1
        return dict(counts)

    def _claim_one(self) -> Claim[Any] | None:
        conn = self.db.get()
        queues = [r[0] for r in conn.execute(Q.testing_ready_queues, {"topics": self.topics})]
        paused = {r[0] for r in conn.execute(Q.queue_paused_names, {"queues": queues})}
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
        rows: list[ClaimRow] = (
            conn.cursor(row_factory=claim_row)
            .execute(Q.job_finish_and_claim_queues, params)
            .fetchall()
        )
        return next((r.claim() for r in rows if r.claimed), None)

    def _run(self, claim: Claim[Any]) -> str | None:
        """The child's _run_one for one job, its outcome written at once."""
        handler = self.handlers[claim.topic]
        policy = self.policies[claim.topic]
        started = time.monotonic()
        refused = refused_payload(claim, handler)
        error: BaseException | None
        value: Any
        if refused is not None:
            error, value = refused, None
        elif threading.current_thread() is threading.main_thread():
            error, value = interrupts.call(self.runners[claim.topic], claim, policy, self.state)
        else:  # no SIGALRM here: its default action would end the process
            error, value = _call_untimed(self.runners[claim.topic], claim)
        result = None
        if value is not None and error is None:
            try:
                result = encode_result(value, self.settings.max_payload_bytes)
            except InvalidResult as exc:
                error = exc
        if refused is not None:
            outcome = execute.Outcome("failed", error=execute.describe(refused), final=True)
        else:
            outcome = execute.decide(error, claim.attempt, policy, random.random(), handler.retry)
            report_policy_error(claim, outcome)
        state, written = self.outcomes.write(claim, policy, outcome, result)
        if outcome.kind != "abandon":
            self.outcomes.settled(claim, state, time.monotonic() - started, written)
        return state

    def close(self) -> None:
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


@contextlib.contextmanager
def _soft_timeout(state: ChildState) -> Iterator[None]:
    """SIGALRM raises AttemptTimeout into the handler while one runs, as in a child;
    only in the main thread (the only one that receives signals). The previous handler
    and what was left of a timer armed before are restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: object) -> None:
        if state.in_handler:
            state.in_handler = False
            raise AttemptTimeout("attempt_timeout exceeded")

    # Someone else's timer (pytest-timeout's signal method uses this one) is set aside
    # while jobs run and armed again after with what is left of it.
    left, interval = signal.setitimer(signal.ITIMER_REAL, 0)
    started = time.monotonic()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left > 0:
            remaining = max(left - (time.monotonic() - started), 0.001)
            signal.setitimer(signal.ITIMER_REAL, remaining, interval)
