"""One attempt: its bookkeeping around the handler call, whichever loop runs it, and the
sync loop's call itself, with the child's signal table armed.

Owns what every attempt does before and after its handler, written once for the sync
loop (brooq.worker.child), the async one (brooq.worker.aio) and brooq.testing's drain:
`Attempts.begin` posts the job on the board (the master's watchdog reads it) and decodes
a typed payload, or says why it is refused; `Attempts.end` clears the board, takes the
duration, concludes (the outcome, the result as JSON text, the traceback to log) and
meters the attempt. How the handler is called between the two is each loop's own (a
signal-armed call, a task, a drain's call).

The sync loop calls a handler through `call`, the one place a handler runs with its
interruptions armed (`install_signals` sets the child's signal table, below).

Must never touch the database or the pipes to the master, and never add a call per job to
the sync loop: `begin` and `end` replace the calls they gather.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import math
import os
import random
import signal
import time
import traceback
import uuid
from collections.abc import Callable
from typing import IO, Any

from brooq.declare.handlers import Handler, Policy
from brooq.encoding import check_payload_size, encode_payload, to_json
from brooq.errors import InvalidPayload, InvalidResult, PayloadMismatch
from brooq.ipc import tracebacks
from brooq.ipc.board import Board
from brooq.job import AttemptTimeout, Claim, Interruption, LeaseLost
from brooq.worker import execute
from brooq.worker.connection import Undecodable
from brooq.worker.meter import Meter
from brooq.worker.outcome import report_policy_error
from brooq.worker.state import ChildState

__all__ = [
    "NEVER",
    "Attempts",
    "Concluded",
    "alarm",
    "arm",
    "call",
    "encode_result",
    "install_signals",
    "refused_payload",
]

# What an attempt came to: the outcome to write, the result as JSON text (or None), the
# traceback to log ("" or a newline and the text), and how long the handler ran.
Concluded = tuple[execute.Outcome, str | None, str, float]


class Attempts:
    """The attempts of one process: its board, meter, handlers and limits, and the jobs
    whose lease the master says is lost (``lost``: the set the control thread adds to)."""

    def __init__(
        self,
        board: Board,
        meter: Meter,
        handlers: dict[str, Handler],
        max_payload_bytes: int,
        lost: set[uuid.UUID],
        measure_cpu: bool,
    ) -> None:
        self.board = board
        self.meter = meter
        self.handlers = handlers
        self.max_payload_bytes = max_payload_bytes
        self.lost = lost
        # The process's CPU time belongs to one attempt only when one runs at a time.
        self.measure_cpu = measure_cpu and meter.metrics is not None
        self.cpu_before = 0.0
        # The CPU clock read at the last attempt's end, when nothing but brooq's own
        # per-job steps ran since (a job kept for the next round trip): the next attempt
        # counts from there. A read of the clock is a system call, as long as a no-op
        # job's whole handler call; the few microseconds between two attempts of a batch
        # go to the second (forget_cpu: a round trip, a write or a release came between).
        self.cpu_mark: float | None = None

    def begin(
        self, claim: Claim[Any], policy: Policy, started: float, slot: int = 0
    ) -> InvalidPayload | None:
        """Post the job on the board (at ``slot``) and decode its payload in place when
        its topic is typed: why the payload is refused, or None (the handler may run)."""
        if self.measure_cpu:
            mark = self.cpu_mark
            self.cpu_before = time.process_time() if mark is None else mark
        self.board.post(
            claim.id,
            claim.topic,
            claim.attempt,
            started,
            policy.max_execution_timeout,
            policy.attempt_timeout,
            slot,
        )
        if self.handlers[claim.topic].codec is None and claim.payload.__class__ is not Undecodable:
            return None  # not a call per untyped job
        return refused_payload(claim, self.handlers[claim.topic])

    def end(
        self,
        claim: Claim[Any],
        policy: Policy,
        error: BaseException | None,
        value: Any,
        refused: InvalidPayload | None,
        started: float,
        slot: int = 0,
    ) -> Concluded:
        """Clear the board (from here on the watchdog leaves the job alone), conclude
        what the handler raised or returned, and meter the attempt."""
        self.board.clear(slot)
        now = time.monotonic()
        duration = now - started
        result = None
        result_refused = False
        if value is not None and error is None:
            try:
                result = encode_result(value, self.max_payload_bytes)
            except InvalidResult as exc:
                error = exc
                result_refused = True
        tb = ""
        if error is not None and refused is None and not isinstance(error, Interruption):
            tb = "\n" + "".join(traceback.format_exception(error)).rstrip()
        if error is None:
            outcome = execute.DONE
        elif refused is not None:  # retrying cannot fix it
            outcome = execute.Outcome(
                "failed", error=execute.describe(refused), final=True, error_kind="refused"
            )
        else:
            retry = self.handlers[claim.topic].retry
            outcome = execute.decide(error, claim.attempt, policy, random.random(), retry)
            report_policy_error(claim, outcome)
            if result_refused:  # brooq's own frames: the error says it all
                outcome = dataclasses.replace(outcome, error_kind="refused")
            elif outcome.kind in ("failed", "canceled"):
                # Kept in the error history entry; a timeout's says where it was.
                kept = tracebacks.format_exception(error)
                outcome = dataclasses.replace(outcome, traceback=kept)
        if self.lost and claim.id in self.lost and outcome.kind != "parked":
            outcome = execute.Outcome("abandon")
        self.cpu_mark = self.meter.attempt(
            claim.topic, duration, self.cpu_before if self.measure_cpu else None, now
        )
        return outcome, result, tb, duration

    def forget_cpu(self) -> None:
        """More than brooq's per-job steps ran since the last attempt ended (a round
        trip, an outcome written, claims released): the next attempt reads the clock."""
        self.cpu_mark = None


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


def encode_result(value: Any, limit: int) -> str:
    """What a handler returned as JSON text for the result column, or InvalidResult."""
    text = encode_payload(to_json(value), "result", InvalidResult)
    check_payload_size(text, limit, "result", InvalidResult)
    return text


# -- the signal table and the armed call -----------------------------------------------------------
# The child's signal table, and the one place a handler runs with its interruptions armed.
#
# Interruptions reach the handler as exceptions raised by signal handlers in the main
# thread, and only while the handler runs (ChildState.in_handler):
#   SIGALRM -> brooq.AttemptTimeout (attempt_timeout, the soft limit; `arm` and `alarm`)
#   SIGUSR1 -> brooq.LeaseLost      (the master found the job canceled, reaped or taken)
# SIGTERM asks the child to finish its job and exit. SIGUSR2 dumps every thread's Python
# stack (faulthandler) to a file the master reads before a hard kill. Ctrl-C, SIGHUP and
# the terminal signals are the master's business: ignored here.
#
# Must never raise an interruption outside `call` -- not inside brooq's own outcome code,
# not between two statements of a write -- and never leave the timer armed after it.

log = logging.getLogger("brooq.child")


def install_signals(state: ChildState, stack_file: str) -> IO[str]:
    """Set the child's signal table; returns the stack dump file (kept open for SIGUSR2)."""

    def on_term(signum: int, frame: object) -> None:
        state.stopping = True

    def on_alarm(signum: int, frame: object) -> None:
        alarm(state)

    def on_lease_lost(signum: int, frame: object) -> None:
        claim = state.running
        if state.in_handler and claim is not None and claim.id in state.lost:
            state.in_handler = False
            raise LeaseLost(f"lease of job {claim.id} lost")

    os.setpgrp()  # the master kills our whole group, grandchildren included
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's business
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTTIN, signal.SIG_IGN)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGUSR1, on_lease_lost)
    signal.set_wakeup_fd(state.wake_w, warn_on_full_buffer=False)
    # Appended to: the master empties the file before it asks for a stack.
    stack_fh = open(stack_file, "a")  # noqa: SIM115 - lives with the process
    faulthandler.register(signal.SIGUSR2, file=stack_fh, all_threads=True)
    return stack_fh


# The soft limit's timer is not set and cleared around every attempt (two system calls
# per job): `arm` sets it only when it would fire after the new attempt's deadline, or
# is not set; when it fires, `alarm` raises only into a handler past its own deadline,
# and otherwise sets it again for the attempt under way, if any. So a timer left from an
# attempt that ended fires at most once more, into no handler.
NEVER = math.inf


def arm(state: ChildState, timeout: float) -> None:
    """The deadline of the attempt starting now, ``timeout`` seconds away (none for 0),
    with the timer set if it would fire later than that."""
    if timeout <= 0:
        state.deadline = NEVER
        return
    deadline = state.deadline = time.monotonic() + timeout
    if deadline < state.alarm_at:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        state.alarm_at = deadline


def alarm(state: ChildState) -> None:
    """SIGALRM: AttemptTimeout into a handler past its deadline; for an attempt whose
    deadline is still ahead (the timer was set for an earlier one), the timer again."""
    state.alarm_at = NEVER
    deadline = state.deadline
    if deadline == NEVER:
        return
    ahead = deadline - time.monotonic()
    if ahead > 0:
        # At least a microsecond: setitimer would take less as "clear the timer".
        signal.setitimer(signal.ITIMER_REAL, max(ahead, 1e-6))
        state.alarm_at = deadline
    elif state.in_handler:
        state.in_handler = False
        raise AttemptTimeout("attempt_timeout exceeded")


def call(
    fn: Callable[[Claim[Any]], Any], claim: Claim[Any], policy: Policy, state: ChildState
) -> tuple[BaseException | None, Any]:
    """Run the topic's runner (its middleware chain around the handler) with the soft
    timeout armed, so that a hanging middleware is bounded like a handler; return what it
    raised, if anything, and what it returned."""
    error: BaseException | None = None
    value: Any = None
    try:
        try:
            arm(state, policy.attempt_timeout)
            state.in_handler = True
            if state.lost and claim.id in state.lost:
                raise LeaseLost(f"lease of job {claim.id} lost")
            value = fn(claim)
        except BaseException as exc:
            error = exc
        finally:
            state.in_handler = False
            state.deadline = NEVER  # a timer that fires now finds nothing to do
    except Interruption as exc:  # landed between the handler's return and the finally
        error = exc
    if isinstance(error, KeyboardInterrupt | SystemExit):
        log.warning("event=handler_exit job=%s raised=%s", claim.id, type(error).__name__)
    return error, value
