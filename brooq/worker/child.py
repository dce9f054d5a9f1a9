"""A worker process: set up after fork, then claim -> run the handler -> write the outcome.

One job at a time. The child opens its own connection after the fork
(brooq.worker.connection) and talks to the master over two pipes (brooq.worker.link):
it reports ready and what it holds, and it hears "wake" and "lost <id>" from the
control thread. Its signal table and the armed handler call are in
brooq.worker.interrupts, outcome writing in brooq.worker.outcome, what the outcome is in
brooq.worker.execute. This module owns `Child` -- setup and the claim loop, with its
adaptive batches -- and `main`, the entry point after fork.

Must never renew a lease (the master does), never write an outcome other than through
the guarded statements (the batched `done` of job_finish_and_claim or OutcomeWriter),
and never let an exception raised outside a handler pass as the handler's.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg.rows import RowMaker

from brooq import logs, pooler
from brooq.encoding import check_payload_size, encode_payload
from brooq.errors import InvalidPayload, InvalidResult, PayloadMismatch
from brooq.handlers import Handler, HandlerFn, Middleware, Policy, is_async_callable
from brooq.ipc.board import Board
from brooq.ipc.reasons import (
    ASYNC,
    EXIT_APP_LOAD_ERROR,
    EXIT_BOOT_ERROR,
    EXIT_CRASHED,
    EXIT_OK,
    MAX_JOBS,
    MAX_MEMORY,
)
from brooq.job import Claim, Interruption
from brooq.payloads import to_json
from brooq.sql import queries
from brooq.worker import execute, interrupts
from brooq.worker.chain import compose, compose_async
from brooq.worker.config import BATCH_BUDGET, LONG_JOB, ChildConfig
from brooq.worker.connection import ChildConnection, Stop, Undecodable
from brooq.worker.link import MasterLink
from brooq.worker.meter import Meter, resident_mib
from brooq.worker.outcome import OutcomeWriter, report_policy_error
from brooq.worker.state import ChildState
from brooq.worker.weights import RoundOrder, worked_queues

if TYPE_CHECKING:
    from typing_extensions import LiteralString

__all__ = [
    "Child",
    "ClaimRow",
    "claim_row",
    "conclude",
    "encode_result",
    "main",
    "refused_payload",
]

log = logging.getLogger("brooq.child")


class ClaimRow(NamedTuple):
    """A row of job_finish_and_claim, its columns by name. A finished row (claimed false)
    carries only its id: the other columns are NULL."""

    claimed: bool
    id: uuid.UUID
    topic: str
    payload: Any
    attempts: int
    locked_by: str
    locked_until: datetime
    available_at: datetime
    queue: str
    priority: int

    def claim(self) -> Claim[Any]:
        """The Claim a handler gets for a claimed row."""
        return Claim(
            id=self.id,
            topic=self.topic,
            payload=self.payload,
            attempt=self.attempts,
            locked_by=self.locked_by,
            locked_until=self.locked_until,
            queue=self.queue,
            priority=self.priority,
        )


_CLAIM_COLUMNS = tuple(name.encode() for name in ClaimRow._fields)


def claim_row(cursor: psycopg.Cursor[Any]) -> RowMaker[ClaimRow]:
    """The row factory of the claim: ClaimRow._make (as cheap as a namedtuple_row and
    typed), after checking once per result that the columns are the fields, by name."""
    res = cursor.pgresult
    names = tuple(map(res.fname, range(res.nfields))) if res is not None else ()
    if names != _CLAIM_COLUMNS:
        raise psycopg.ProgrammingError(f"job_finish_and_claim returned {names}")
    return ClaimRow._make


# What was written for each finished job when the batched `done` was refused: the
# state (None: nothing) and the outcome written (brooq.worker.outcome.OutcomeWriter.write).
Apart = dict[uuid.UUID, tuple[str | None, execute.Outcome]]


@dataclass
class _Finished:
    claim: Claim[Any]
    duration: float
    result: str | None  # what the handler returned, as JSON text


# The claim statement of a round trip: (without results, with results), by the shape of
# the round (one queue, several, a limited topic); the Child takes its schema's texts.
_STATEMENTS = {
    "one": ("job_finish_and_claim", "job_finish_and_claim_results"),
    "queues": ("job_finish_and_claim_queues", "job_finish_and_claim_queues_results"),
    "limited": ("job_finish_and_claim_limited", "job_finish_and_claim_limited_results"),
}


class Child:
    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.settings = config.settings
        # The statements of the master's schema (QUEUE_SCHEMA), looked up once here: the
        # claim loop reads plain attributes and dictionaries, as with the module's Q.
        self.q = queries(self.settings.schema)
        self.statements: dict[str, tuple[LiteralString, LiteralString]] = {
            shape: (getattr(self.q, plain), getattr(self.q, with_results))
            for shape, (plain, with_results) in _STATEMENTS.items()
        }
        self.handlers = config.handlers
        self.middleware: tuple[Middleware, ...] = config.middleware
        self.runners: dict[str, HandlerFn] = {}  # each topic's middleware chain and handler
        self.policies: dict[str, Policy] = {}
        self.topics: list[str] = []  # the topics claimed without a global_limit
        self.limited: list[tuple[str, int]] = []  # (topic, global_limit), tried in turn
        self._limited_turn = 0
        self.order = RoundOrder((("default", 1),))
        self.paused: frozenset[str] = frozenset()  # worked queues found paused
        self._paused_read = float("-inf")  # monotonic time of that reading
        self.state = ChildState()
        self.board = config.board or Board()
        self.meter = Meter(config.metrics)
        self.db = ChildConnection(config.dsn, config.identity, self.settings, self.state)
        self.outcomes = OutcomeWriter(
            config.identity, self.settings, self.db, self.state, self.board, self.meter
        )
        self.jobs_done = 0
        self.batch = 1
        self.held: list[uuid.UUID] = []  # claimed and not yet settled, in claim order
        self.unwritten: list[_Finished] = []  # finished with `done`, written next trip
        self.results_unwritten = False  # one of them has a result to store
        self.claims_failing = False  # the master was told the last claim failed
        self._stack_fh: IO[str] | None = None

    @property
    def master_gone(self) -> bool:
        return self.state.master_gone

    # -- setup -------------------------------------------------------------------------

    def setup(self) -> None:
        self._stack_fh = interrupts.install(self.state, self.config.stack_file)
        self.link = MasterLink(
            self.config.to_master,
            self.config.from_master,
            self.settings,
            self.state,
            self.config.stack_file,
        )
        if self.config.reload_baseline is not None:
            self._reload_app()
        self.policies = {t: h.policy(self.settings) for t, h in self.handlers.items()}
        # A child runs the handlers of its kind only, each wrapped by the Queue's
        # middleware of that kind (docs/async.md: a middleware never wraps the other kind).
        is_async = self.config.kind == ASYNC
        mine = {t: h for t, h in self.handlers.items() if h.is_async == is_async}
        outer = tuple(m for m in self.middleware if is_async_callable(m) == is_async)
        join = compose_async if is_async else compose
        self.runners = {t: join(h.fn, (*outer, *h.middleware)) for t, h in mine.items()}
        self.topics = sorted(t for t, h in mine.items() if h.global_limit is None)
        self.limited = sorted(
            (t, h.global_limit) for t, h in mine.items() if h.global_limit is not None
        )
        self.order = RoundOrder(worked_queues(self.settings.queues, self.handlers))
        self.outcomes.handlers = self.handlers
        self.link.start()
        self.link.update_title()
        self._tell({"ready": 1})

    def _reload_app(self) -> None:
        from brooq.app import forget_user_modules, load

        assert self.config.reload_baseline is not None
        forget_user_modules(set(self.config.reload_baseline))
        queue = load(self.config.app_spec)
        self.handlers = queue.handlers
        self.middleware = tuple(queue.middlewares)

    def _tell(self, message: dict[str, Any]) -> None:
        self.link.tell(message)

    # -- the loop ---------------------------------------------------------------------------
    #
    # Claims are adaptive: one job at a time by default; while recent jobs are short and
    # the queue keeps the batch full, a few at once (up to claim_batch_max), so one round
    # trip writes the finished jobs' `done` and claims the next ones. A long job drops the
    # batch back to one and gives back what it had claimed beyond the job it runs.

    def run(self) -> int:
        if self.config.kind == ASYNC:
            from brooq.worker.aio import AsyncLoop

            return AsyncLoop(self).run()
        try:
            while not self.state.stopping:
                claims = self._flush_and_claim(self.batch)
                if not claims:
                    self.state.sleep(self.settings.poll_interval)
                    continue
                if self._run_batch(claims):
                    break
        except Stop:
            pass
        finally:
            self._finish_up()
        return EXIT_OK

    def _finish_up(self) -> None:
        """Before exiting: give back what was not started, write what finished. Also when
        the master is gone: the database may well be up, and a finished job whose `done`
        is not written runs again once its lease expires."""
        try:
            unstarted = [i for i in self.held if i not in {f.claim.id for f in self.unwritten}]
            if unstarted:
                self._release(unstarted)
            if self.unwritten:
                self._flush_and_claim(0)
        except (Stop, psycopg.Error):
            pass  # the leases expire and the reaper returns the jobs
        self.meter.flush()

    def _run_batch(self, claims: list[Claim]) -> bool:
        """Run claimed jobs in order; True when the child must retire."""
        elapsed = 0.0
        for i, claim in enumerate(claims):
            if self.state.stopping:
                self._release([c.id for c in claims[i:]])
                return False
            duration = self._run_one(claim, claims, i + 1)
            elapsed += duration
            rest = claims[i + 1 :]
            if rest and duration >= LONG_JOB:
                # Others may run them sooner. The control thread asked the master to give
                # them back already, at LONG_JOB into the job: this is a no-op for those.
                self._release([c.id for c in rest])
                self.batch = 1
                return self._should_retire()
            if self._should_retire():
                self._release([c.id for c in rest])
                return True
        self._adapt(len(claims), elapsed / len(claims))
        return False

    def _adapt(self, claimed: int, mean: float) -> None:
        cap = max(1, self.settings.claim_batch_max)
        fits = int(BATCH_BUDGET / mean) if mean > 0 else cap
        target = max(1, min(cap, fits))
        if claimed >= self.batch:  # the queue filled the batch: it may grow
            self.batch = min(self.batch * 2, target)
        else:  # the queue runs shallow: shrink
            self.batch = max(1, min(self.batch // 2, target))

    def _flush_and_claim(self, limit: int) -> list[Claim]:
        """Write `done` for the finished jobs and claim up to ``limit`` new ones, in one
        statement. Tells the master the new state: busy comes with each job, idle here."""
        finished = self.unwritten
        if self.state.stopping:
            limit = 0
        trip = self._round_trip(finished, self.results_unwritten, limit)
        if trip is None:
            return []
        self.unwritten = []
        self.results_unwritten = False
        claims = self._settle_round(finished, *trip)
        self.held = [c.id for c in claims]
        # What the master said was lost concerned earlier claims: every job held now was
        # just claimed, and is ours even if it is a job claimed before (canceled, then
        # retried). A notice about a new claim comes again at the next renewal.
        self.state.lost.clear()
        # The master renews what we hold: it must know before any of these jobs runs.
        self.link.tell_held(self.held)
        self.meter.claimed(claims)
        return claims

    def _round_trip(
        self, finished: list[_Finished], with_results: bool, limit: int
    ) -> tuple[list[ClaimRow], list[str], Apart | None] | None:
        """The claim statement: write ``finished`` as `done`, claim up to ``limit``. Its
        rows, the round's queues in order, and None, or, when the database refused the
        statement for what a result holds, no rows and what was written for each finished
        job on its own (``Apart``); None when the database failed (not known whether it
        committed: the finished jobs stay held and are written again on the next pass,
        the guard makes that harmless; claims it may have made come back through the
        reaper). Only the database here: an async child runs it in its DB thread while
        jobs run (brooq.worker.aio)."""
        queues = self._claimable_queues() if limit else []
        if not queues:  # nothing to claim from: only write what finished
            if not finished:
                return [], [], None
            limit, queues = 0, self.order.names[:1]
        params: dict[str, Any] = {
            "done": [f.claim.id for f in finished],
            "topics": self.topics,
            "limit": limit,
            "children": self.config.children or max(1, self.settings.workers),
            "worker": self.config.identity,
            "lease": self.settings.lease,
        }
        if self.limited:  # one limited topic per round, in turn
            shape = "limited"
            self._limited_turn = (self._limited_turn + 1) % len(self.limited)
            params["limited"], params["cap"] = self.limited[self._limited_turn]
            params["queues"] = queues
        elif len(queues) == 1:
            shape = "one"
            params["queue"] = queues[0]
        else:
            shape = "queues"
            params["queues"] = queues
        plain, with_results_statement = self.statements[shape]
        statement = plain
        if with_results:
            statement = with_results_statement
            params["results"] = [f.result for f in finished]
        try:
            conn = self.db.get()
            cur = conn.cursor(row_factory=claim_row)
            if self.db.local is None:
                rows = cur.execute(statement, params, prepare=True).fetchall()
            else:  # behind a transaction pooler: its settings first, in the same round trip
                with self.db.scoped(conn):
                    rows = cur.execute(statement, params).fetchall()
        except psycopg.OperationalError as exc:
            self.db.failed("claim", exc)
            self._claims_fail(exc)
            return None
        except (
            psycopg.errors.InvalidSqlStatementName,
            psycopg.errors.DuplicatePreparedStatement,
        ) as exc:  # the child crashes either way: say why (brooq.pooler)
            raise pooler.prepared_mismatch(exc) or exc from None
        except psycopg.Error as exc:
            if not with_results:
                raise  # no job's content in it: brooq's own fault, the child crashes
            # A result the database cannot hold (a character its encoding lacks) fails
            # the whole statement, which wrote nothing: each finished job is written on
            # its own, so that only the job whose result is refused is charged.
            log.warning(
                "event=done_refused jobs=%d error=%r: writing each on its own",
                len(finished),
                execute.describe(exc),
            )
            return [], queues, self._write_apart(finished)
        if self.claims_failing:
            self.claims_failing = False
            self._tell({"claims": "ok"})
        return rows, queues, None

    def _claims_fail(self, exc: BaseException) -> None:
        """Tell the master once that claims fail, and why (its /readyz says so while every
        child's do): the database answers, but refuses them (a disk full, say)."""
        if not self.claims_failing:
            self.claims_failing = True
            first = str(exc).strip().splitlines()
            self._tell({"claims": "failing", "error": first[0] if first else type(exc).__name__})

    def _write_apart(self, finished: list[_Finished]) -> Apart:
        """Write each finished job's `done` (and result) in a statement of its own."""
        apart: Apart = {}
        for f in finished:
            policy = self.policies[f.claim.topic]
            apart[f.claim.id] = self.outcomes.write(f.claim, policy, execute.DONE, f.result)
        return apart

    def _settle_round(
        self,
        finished: list[_Finished],
        rows: list[ClaimRow],
        queues: list[str],
        apart: Apart | None = None,
    ) -> list[Claim]:
        """After a round trip: log and count the `done` written (or what was written for
        each on its own), and the claims in the order of the round (the queues as tried,
        then priority, then FIFO)."""
        if apart is not None:
            for f in finished:
                state, outcome = apart[f.claim.id]
                self.outcomes.settled(f.claim, state, f.duration, outcome)
            return []
        written = {r.id for r in rows if not r.claimed}
        with logs.batch(log):  # the round trip's job_done lines in one write
            for f in finished:
                state = "done" if f.claim.id in written else None
                self.outcomes.settled(f.claim, state, f.duration)
        rank = {name: i for i, name in enumerate(queues)}
        claimed = sorted(
            (r for r in rows if r.claimed),
            key=lambda r: (rank.get(r.queue, 0), -r.priority, r.available_at, r.id),
        )
        return [r.claim() for r in claimed]

    def _claimable_queues(self) -> list[str]:
        """This round's queues in order, without the paused ones. The pauses are read
        again once poll_interval has passed since the last reading, so an operator's pause
        holds for this child within poll_interval; if the read fails, the last one holds."""
        now = time.monotonic()
        if now - self._paused_read >= self.settings.poll_interval:
            try:
                rows = self.db.get().execute(
                    self.q.queue_paused_names, {"queues": self.order.names}, prepare=True
                )
                self.paused = frozenset(row[0] for row in rows)
                self._paused_read = now
            except psycopg.OperationalError as exc:
                self.db.failed("paused queues", exc)
        return [name for name in self.order.next() if name not in self.paused]

    def _release(self, ids: list[uuid.UUID]) -> None:
        if not ids:
            return
        try:
            conn = self.db.get()
            conn.execute(self.q.job_release_ids, {"ids": ids, "worker": self.config.identity})
        except psycopg.OperationalError as exc:
            self.db.failed("release", exc)  # the reaper returns them after the lease
        self.held = [i for i in self.held if i not in ids]
        self.link.tell_held(self.held)

    def _run_one(self, claim: Claim, batch: Sequence[Claim] = (), after: int = 0) -> float:
        """Run one claimed job; write its outcome, or keep a plain `done` for the next
        round trip. Returns how long the handler ran."""
        policy = self.policies[claim.topic]
        state = self.state
        state.started = time.monotonic()
        state.running = claim
        # No list is made per job: the control thread slices batch[after:] if it must.
        state.tail = (state.started, batch, after) if after < len(batch) else None
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "event=job_claimed job=%s topic=%s attempt=%d",
                claim.id,
                claim.topic,
                claim.attempt,
            )
        cpu_before = self.meter.cpu()
        self.board.post(
            claim.id,
            claim.topic,
            claim.attempt,
            state.started,
            policy.max_execution_timeout,
            policy.attempt_timeout,
        )
        handler = self.handlers[claim.topic]
        refused = None
        if handler.codec is not None or claim.payload.__class__ is Undecodable:
            refused = refused_payload(claim, handler)  # not a call per untyped job
        if refused is None:
            # The handler's own log records name its job (brooq.logs).
            context = logs.current_job.set((claim.id, claim.topic))
            try:
                error, value = interrupts.call(self.runners[claim.topic], claim, policy, state)
            finally:
                logs.current_job.reset(context)
        else:  # the handler and its middleware run zero times
            error, value = refused, None
        state.tail = None  # before the duration is taken: see ChildState.tail
        self.board.clear()  # from here on the watchdog leaves us alone
        duration = time.monotonic() - state.started
        outcome, result, tb = conclude(
            claim,
            policy,
            handler,
            error,
            value,
            refused,
            self.settings.max_payload_bytes,
            state.lost,
        )
        self.meter.attempt(claim.topic, duration, cpu_before)
        state.running = None
        self.jobs_done += 1
        if outcome.kind == "done" and not claim.chained and not claim.success_hooks:
            # written with the next claim
            self.unwritten.append(_Finished(claim, duration, result))
            if result is not None:
                self.results_unwritten = True
            return duration
        written_state, written = self.outcomes.write(claim, policy, outcome, result)
        if outcome.kind != "abandon":
            self.outcomes.settled(claim, written_state, duration, written, tb)
        # Tell the master at once (outcomes other than a plain done are rare): a renewal
        # that finds this job settled would report its lease lost, and the report could
        # reach us after the job, retried, was claimed again.
        self.held = [i for i in self.held if i != claim.id]
        self.link.tell_held(self.held)
        return duration

    def _should_retire(self) -> bool:
        s = self.settings
        if s.max_jobs_per_child and self.jobs_done >= s.max_jobs_per_child:
            self._tell({"retire": MAX_JOBS})
            return True
        if s.max_memory_per_child and resident_mib() > s.max_memory_per_child:
            self._tell({"retire": MAX_MEMORY})
            return True
        return False


def refused_payload(claim: Claim[Any], handler: Handler) -> InvalidPayload | None:
    """Decode a typed topic's payload in place (before the middleware: every layer sees
    the Model); the error when the stored payload cannot be read or does not fit."""
    payload = claim.payload
    if isinstance(payload, Undecodable):
        return InvalidPayload(f"the stored payload cannot be decoded: {payload}")
    if handler.codec is not None:
        try:
            claim.payload = handler.codec.decode(payload)
        except PayloadMismatch as exc:
            return exc
    return None


def conclude(
    claim: Claim[Any],
    policy: Policy,
    handler: Handler,
    error: BaseException | None,
    value: Any,
    refused: InvalidPayload | None,
    max_payload_bytes: int,
    lost: set[uuid.UUID] | frozenset[uuid.UUID] = frozenset(),
) -> tuple[execute.Outcome, str | None, str]:
    """What an attempt comes to, from what the handler raised or returned: the outcome,
    the result as JSON text, and the traceback to log (abandon when its lease is
    ``lost``). Shared by the sync loop, the async one (brooq.worker.aio) and
    brooq.testing.drain."""
    result = None
    if value is not None and error is None:
        try:
            result = encode_result(value, max_payload_bytes)
        except InvalidResult as exc:
            error = exc
    tb = ""
    if error is not None and refused is None and not isinstance(error, Interruption):
        tb = "\n" + "".join(traceback.format_exception(error)).rstrip()
    if refused is not None:  # retrying cannot fix it
        outcome = execute.Outcome("failed", error=execute.describe(refused), final=True)
    else:
        outcome = execute.decide(error, claim.attempt, policy, random.random(), handler.retry)
        report_policy_error(claim, outcome)
    if claim.id in lost:
        outcome = execute.Outcome("abandon")
    return outcome, result, tb


def encode_result(value: Any, limit: int) -> str:
    """What a handler returned as JSON text for the result column, or InvalidResult."""
    text = encode_payload(to_json(value), "result", InvalidResult)
    check_payload_size(text, limit, "result", InvalidResult)
    return text


def main(config: ChildConfig) -> None:
    """Entry point right after fork(); never returns."""
    from brooq.errors import AppLoadError

    try:
        child = Child(config)
        child.setup()
    except BaseException as exc:
        log.error("event=child_boot_failed error=%r", f"{type(exc).__name__}: {exc}")
        os._exit(EXIT_APP_LOAD_ERROR if isinstance(exc, AppLoadError) else EXIT_BOOT_ERROR)
    code = EXIT_CRASHED
    try:
        code = child.run()
    except BaseException:
        log.exception("event=child_crashed")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
