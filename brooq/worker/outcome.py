"""Writing one job's outcome, and the log line and count of what was written.

Owns the outcome statements other than the batched `done` of the claim round trip:
done with chained jobs, on_success hooks, a keep_logs attempt's log text or a progress
report (one transaction, the board's hooks flag set while the application's hooks run),
failed (SQL makes it dead when the attempts are used up), canceled (each with its _logs
and _progress variants: the attempt's last claim.progress() is written with its outcome);
retrying a write over a dropped connection; and `settled`, the one place that logs and
counts what was written (job_done, job_failed, job_dead, outcome_skipped), the batched
`done` lines included.

Must never write unguarded: every statement matches the row only while it is still
'processing' and locked by this child, so a write after the lease was lost, or a second
write after a dropped connection, changes nothing. Must never renew a lease, and never
run while an interruption may be raised (the handler has returned: brooq.worker.attempt).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import uuid
from collections.abc import Callable, Container, Iterable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from brooq import logs
from brooq.declare.handlers import Policy
from brooq.ipc import progress
from brooq.ipc.board import Board
from brooq.ipc.tracebacks import TRACEBACK_MAX, format_exception
from brooq.job import Claim
from brooq.producer.insert import Handlers, check_jobs, insert_many_checked
from brooq.rules import backoff, bounded
from brooq.settings import Settings
from brooq.sql import queries
from brooq.worker import execute
from brooq.worker.connection import ChildConnection, Stop
from brooq.worker.meter import Meter
from brooq.worker.state import ChildState

if TYPE_CHECKING:
    from typing_extensions import LiteralString

log = logging.getLogger("brooq.child")
# The line of a job written done (``state``: done), the one line every job logs.
_DONE_LINE = "event=job_%s job=%s topic=%s attempt=%d duration=%.3fs"

WRITE_TRIES = 5
# A kept traceback as the database can store it: its bound, and room for the escapes of
# what the database's encoding lacks (the text is cut again at this bound).
TRACEBACK_STORED = 2 * TRACEBACK_MAX
LOGS_MAX = 2 * 1048576  # characters: keep_logs' bound is at most 1 MiB of UTF-8


class OutcomeWriter:
    def __init__(
        self,
        identity: str,
        settings: Settings,
        connection: ChildConnection,
        state: ChildState,
        board: Board,
        meter: Meter,
    ) -> None:
        self.identity = identity
        self.settings = settings
        self.q = queries(settings.schema)  # once: the finish path reads an attribute
        # The child's handlers: a chained job naming no queue goes to its handler's.
        self.handlers: Handlers = {}
        self.connection = connection
        self.state = state
        self.board = board
        self.meter = meter
        # A job id's text for the job_done line: the held list's (brooq.worker.link),
        # made once per job, once the link is up.
        self.id_text: Callable[[uuid.UUID], str] = str

    def write(
        self,
        claim: Claim[Any],
        policy: Policy,
        outcome: execute.Outcome,
        result: str | None = None,
        logs: str | None = None,
    ) -> tuple[str | None, execute.Outcome]:
        """Write the outcome: the state written (None when nothing was) and the outcome
        actually written (a failing on_success turns done into failed). ``result``: what
        the handler returned as JSON text, stored with `done`; ``logs``: a keep_logs
        attempt's log text (brooq.worker.joblogs), written by the statements' _logs
        variants in the same statement."""
        if outcome.kind == "abandon":
            log.info("event=lease_lost job=%s topic=%s: nothing written", claim.id, claim.topic)
            return None, outcome
        if outcome.kind == "parked":  # the park committed: brooq.worker.durable
            parked = outcome.parked
            log.info(
                "event=job_parked job=%s topic=%s reason=%s until=%s%s",
                claim.id,
                claim.topic,
                parked.reason if parked else "?",
                parked.until.isoformat() if parked and parked.until else "-",
                f" key={parked.key!r}" if parked and parked.key is not None else "",
            )
            return None, outcome
        # Should the child die in the write (its hooks are application code), the master
        # charges this job, not the ones beside it (brooq.supervisor.settlement).
        self.board.settling(claim.id)
        try:
            return self._write(claim, policy, outcome, result, logs)
        finally:
            self.board.settling(None)

    def _write(
        self,
        claim: Claim[Any],
        policy: Policy,
        outcome: execute.Outcome,
        result: str | None,
        logs: str | None,
    ) -> tuple[str | None, execute.Outcome]:
        if logs is not None:  # as the database can store it
            logs = execute.storable(logs, self.connection.codec, LOGS_MAX)
        if outcome.error is not None:  # the application's text, as the database holds it
            outcome = dataclasses.replace(
                outcome, error=execute.storable(outcome.error, self.connection.codec)
            )
        if outcome.traceback is not None:  # so is its traceback (its source lines)
            kept = execute.storable(outcome.traceback, self.connection.codec, TRACEBACK_STORED)
            outcome = dataclasses.replace(outcome, traceback=kept)
        refused = False
        # The connection may drop mid-write: reconnect and write again. The guard makes
        # a second write harmless (a committed first one left the row not 'processing').
        for attempt in range(WRITE_TRIES):
            try:
                return self._write_once(claim, policy, outcome, result, logs)
            except psycopg.OperationalError as exc:
                self.connection.failed("outcome", exc)
                if attempt == WRITE_TRIES - 1 or self.state.master_gone:
                    break
                self.state.sleep(min(0.2 * 2**attempt, 2.0))
            except Stop:
                break
            except Exception as exc:
                # The database (or the driver) refused what this job's outcome holds, in a
                # way storable() did not foresee. The job is charged, never its
                # siblings: once more as a failed attempt whose text is ASCII only.
                if refused:
                    log.error(
                        "event=outcome_refused job=%s topic=%s error=%r: not written; the "
                        "lease will expire and the reaper charges the attempt",
                        claim.id,
                        claim.topic,
                        execute.describe(exc),
                    )
                    return None, outcome
                refused = True
                outcome = refused_outcome(claim, policy, outcome, exc)
                log.error(
                    "event=outcome_refused job=%s topic=%s error=%r: written as a failed "
                    "attempt instead",
                    claim.id,
                    claim.topic,
                    outcome.error,
                )
        log.error(
            "event=outcome_not_written job=%s topic=%s: the lease will expire and the reaper "
            "returns the job",
            claim.id,
            claim.topic,
        )
        return None, outcome

    def _write_once(
        self,
        claim: Claim[Any],
        policy: Policy,
        outcome: execute.Outcome,
        result: str | None,
        logs: str | None,
    ) -> tuple[str | None, execute.Outcome]:
        conn = self.connection.get()
        who: dict[str, Any] = {"id": claim.id, "worker": self.identity}
        if logs is not None:
            who["logs"] = logs
        if claim.reported is not None:  # the attempt's last progress, frozen with its outcome
            fraction, message = claim.reported
            who["progress"] = fraction
            who["progress_message"] = execute.storable(
                message, self.connection.codec, progress.MESSAGE_MAX
            )
        if outcome.kind == "done":  # with chained jobs or on_success hooks (or logs)
            try:
                return self._write_done(conn, claim, who, result), outcome
            except psycopg.OperationalError:
                raise
            except Exception as exc:
                log.warning(
                    "event=success_rolled_back job=%s topic=%s error=%r",
                    claim.id,
                    claim.topic,
                    execute.describe(exc),
                )
                handler = self.handlers.get(claim.topic)
                retry = handler.retry if handler is not None else None
                cause = exc.__cause__ if isinstance(exc, _ResultRefused) else exc
                assert cause is not None
                outcome = execute.decide(cause, claim.attempt, policy, random.random(), retry)
                report_policy_error(claim, outcome)
                refused = isinstance(exc, _ResultRefused)
                what = "result not stored: " if refused else "on success: "
                kept = None if refused else format_exception(cause)
                outcome = execute.Outcome(
                    "failed",
                    delay=outcome.delay,
                    error=execute.storable(what + (outcome.error or ""), self.connection.codec),
                    final=outcome.final,
                    error_kind="refused" if refused else "raised",
                    traceback=None
                    if kept is None
                    else execute.storable(kept, self.connection.codec, TRACEBACK_STORED),
                )
        if outcome.kind == "canceled":
            with self.connection.scoped(conn):
                statement = self._statement("job_set_canceled", who)
                cur = conn.execute(
                    statement,
                    {
                        **who,
                        "error": outcome.error,
                        "history_error": bounded(outcome.error or "", 1000),
                        "traceback": outcome.traceback,
                    },
                )
            # After the block: in a pipeline, the count is known once it has synced.
            return ("canceled" if cur.rowcount else None), outcome
        cur = conn.cursor(row_factory=dict_row)  # the failure path: a dict costs nothing here
        with self.connection.scoped(conn):
            row = cur.execute(
                self._statement("job_set_failed", who),
                {
                    **who,
                    "refund": outcome.refund,
                    # final: dead now (attempts >= 0 always holds in job_set_failed)
                    "max_attempts": 0 if outcome.final else policy.max_attempts,
                    "delay": outcome.delay,
                    "error": outcome.error,
                    "history_error": bounded(outcome.error or "", 1000),
                    "kind": outcome.error_kind,
                    "traceback": outcome.traceback,
                },
                prepare=True,
            ).fetchone()
        return (str(row["state"]) if row else None), outcome

    def _write_done(
        self,
        conn: psycopg.Connection[Any],
        claim: Claim[Any],
        who: dict[str, Any],
        result: str | None,
    ) -> str | None:
        """`done`, the chained jobs and the on_success hooks in one transaction; None
        (all rolled back) when the row is no longer ours."""
        try:
            with conn.transaction():
                self.connection.apply_local(conn)  # behind a transaction pooler only
                try:
                    statement = self._statement("job_set_done", who)
                    cur = conn.execute(statement, {**who, "result": result}, prepare=True)
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as exc:  # the result itself (an encoding lacks it)
                    raise _ResultRefused from exc
                if cur.rowcount == 0:
                    raise _NotOurs
                checked = check_jobs(claim.chained, self.settings.max_payload_bytes, self.handlers)
                insert_many_checked(conn, checked, self.handlers, q=self.q)
                if claim.success_hooks:
                    conn.execute(self.q.session_planner_defaults)
                    self.board.hooks_running(True)  # the stall rule leaves us alone
                    try:
                        for hook in claim.success_hooks:
                            hook(conn)
                    finally:
                        self.board.hooks_running(False)
        except _NotOurs:
            return None
        return "done"

    def _statement(self, name: str, who: dict[str, Any]) -> LiteralString:
        """The outcome statement's variant for what ``who`` carries: _logs (a keep_logs
        attempt's text), _progress (the attempt's last claim.progress()), or both."""
        if "logs" in who:
            name += "_logs"
        if "progress" in who:
            name += "_progress"
        statement: LiteralString = getattr(self.q, name)
        return statement

    def settled(
        self,
        claim: Claim,
        state: str | None,
        elapsed: float,
        outcome: execute.Outcome | None = None,
        traceback: str = "",
    ) -> None:
        """Log (and count) what was written for one job; None means nothing was.
        ``traceback`` ends the failed and dead lines (empty, or a newline and the text)."""
        if state is not None:
            self.meter.outcome(claim.topic, state)
        elif outcome is not None and outcome.kind == "parked":
            return  # logged by write
        if state is None:
            log.info(
                "event=outcome_skipped job=%s topic=%s: no longer ours (canceled or reaped)",
                claim.id,
                claim.topic,
            )
        elif state == "dead":
            log.error(
                "event=job_dead job=%s topic=%s attempt=%d error=%r%s",
                claim.id,
                claim.topic,
                claim.attempt,
                outcome.error if outcome else None,
                traceback,
            )
        elif state == "failed":
            log.warning(
                "event=job_failed job=%s topic=%s attempt=%d retry_in=%.1fs error=%r%s",
                claim.id,
                claim.topic,
                claim.attempt,
                outcome.delay if outcome else 0,
                outcome.error if outcome else None,
                traceback,
            )
        elif log.isEnabledFor(logging.INFO):
            _log_quick(
                logging.INFO,
                _DONE_LINE,
                state,
                self.id_text(claim.id),
                claim.topic,
                claim.attempt,
                elapsed,
            )

    def settled_done(
        self, finished: Iterable[tuple[Claim, float, object]], unwritten: Container[int]
    ) -> None:
        """``settled`` of a round trip's finished jobs (claim, duration, result): `done`
        written for each, but nothing for those whose id's int is in ``unwritten``. Their
        job_done lines, the text settled makes, are made in one pass and counted once per
        topic."""
        counts: dict[str, int] = {}
        write = None
        info = log.isEnabledFor(logging.INFO)
        if info:
            write = logs.held_lines(log, logging.INFO)
        text = self.id_text
        for claim, duration, _ in finished:
            if claim.id.int in unwritten:
                self.settled(claim, None, duration)
                continue
            topic = claim.topic
            counts[topic] = counts.get(topic, 0) + 1
            if write is not None:  # _DONE_LINE % (...), without its tuple and parsing
                write(
                    f"event=job_done job={text(claim.id)} topic={topic} "
                    f"attempt={claim.attempt:d} duration={duration:.3f}s"
                )
            elif info:
                _log_quick(
                    logging.INFO, _DONE_LINE, "done", text(claim.id), topic, claim.attempt, duration
                )
        for topic, n in counts.items():
            self.meter.outcome(topic, "done", n)


def report_policy_error(claim: Claim[Any], outcome: execute.Outcome) -> None:
    """Log a retry policy that raised or answered nonsense (the default backoff applied)."""
    if outcome.policy_error is not None:
        log.error(
            "event=retry_policy_failed job=%s topic=%s error=%r: the default backoff applies",
            claim.id,
            claim.topic,
            outcome.policy_error,
        )


def refused_outcome(
    claim: Claim[Any], policy: Policy, outcome: execute.Outcome, exc: BaseException
) -> execute.Outcome:
    """The failed attempt written when the database refused ``outcome``: its text says
    what was refused and why, in ASCII (escapes for the rest), so nothing in it can be
    refused again; charged like any failed attempt, so the job ends dead after its own
    attempts."""
    text = f"brooq could not write this attempt's outcome ({outcome.kind}): "
    text += execute.describe(exc)
    if outcome.error:
        text += f"; the attempt's error: {outcome.error}"
    delay = outcome.delay
    if outcome.kind != "failed":
        delay = backoff(claim.attempt, policy.backoff_base, policy.backoff_max, random.random())
    return execute.Outcome(
        "failed",
        delay=delay,
        error=execute.storable(text, "ascii"),
        final=outcome.final,
        error_kind="refused",
    )


class _NotOurs(Exception):
    """The done write matched no row: roll back the chain, write nothing."""


class _ResultRefused(Exception):
    """The done write itself was refused (its __cause__ says why): the result."""


def _log_quick(level: int, msg: str, *args: object) -> None:
    """log.log() for the per-job lines: inside logs.batch(log) without a LogRecord when
    brooq's own handler alone formats them (logs.emit_plain), else without
    Logger.findCaller (walking the stack for the caller's file and line costs more than
    a short job, and brooq's log formats do not show them)."""
    if logs.emit_plain(log, level, msg, args):
        return
    log.handle(log.makeRecord(log.name, level, __file__, 0, msg, args, None))
