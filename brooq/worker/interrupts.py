"""The child's signal table, and the one place a handler runs with its interruptions armed.

Interruptions reach the handler as exceptions raised by signal handlers in the main
thread, and only while the handler runs (ChildState.in_handler):
  SIGALRM -> brooq.AttemptTimeout (attempt_timeout, the soft limit)
  SIGUSR1 -> brooq.LeaseLost      (the master found the job canceled, reaped or taken)
SIGTERM asks the child to finish its job and exit. SIGUSR2 dumps every thread's Python
stack (faulthandler) to a file the master reads before a hard kill. Ctrl-C, SIGHUP and
the terminal signals are the master's business: ignored here.

Must never raise an interruption outside `call` -- not inside brooq's own outcome code,
not between two statements of a write -- and never leave the timer armed after it.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
from collections.abc import Callable
from typing import IO, Any

from brooq.declare.handlers import Policy
from brooq.job import AttemptTimeout, Claim, Interruption, LeaseLost
from brooq.worker.state import ChildState

log = logging.getLogger("brooq.child")


def install(state: ChildState, stack_file: str) -> IO[str]:
    """Set the child's signal table; returns the stack dump file (kept open for SIGUSR2)."""

    def on_term(signum: int, frame: object) -> None:
        state.stopping = True

    def on_alarm(signum: int, frame: object) -> None:
        if state.in_handler:
            state.in_handler = False
            raise AttemptTimeout("attempt_timeout exceeded")

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
            signal.setitimer(signal.ITIMER_REAL, policy.attempt_timeout)
            state.in_handler = True
            if claim.id in state.lost:
                raise LeaseLost(f"lease of job {claim.id} lost")
            value = fn(claim)
        except BaseException as exc:
            error = exc
        finally:
            state.in_handler = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Interruption as exc:  # landed between the handler's return and the finally
        error = exc
    if isinstance(error, KeyboardInterrupt | SystemExit):
        log.warning("event=handler_exit job=%s raised=%s", claim.id, type(error).__name__)
    return error, value
