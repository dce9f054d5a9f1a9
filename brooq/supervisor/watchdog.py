"""What the master must do about its children, decided without side effects.

Three limits: a job running past its max_execution_timeout is killed (hard timeout); a
child told its lease was lost that is still busy after the watchdog grace is killed as
hung; and a child that holds claimed jobs outside any handler (between jobs, in a round
trip to the database, in an on_success hook) and makes no progress for longer than the
lease is killed as stalled, so that its jobs go back instead of being renewed for ever. A
kill is two steps, like gunicorn's: first ask for the stack (SIGUSR2, the child's
faulthandler writes it), then SIGKILL the process group on a later pass.

Progress is anything the master can see a child do: a job starting or ending on its
board, or a new list of held jobs on its pipe.

Pure functions of what the master last saw and the time it is given: they must never act
(brooq.supervisor.enforce sends the signals) and never read a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from brooq.ipc.reasons import LEASE_LOST, MAX_EXECUTION_TIMEOUT, STALLED, KillReason

# Time between the stack request and the kill: enough for faulthandler to write.
STACK_GRACE = 0.2

Action = Literal["dump_stack", "kill"]


@dataclass(frozen=True)
class BusyChild:
    pid: int
    started: float  # monotonic time the job started
    max_execution_timeout: float
    lease_lost_at: float | None  # monotonic time the master told it, or None
    stack_requested_at: float | None


@dataclass(frozen=True)
class HoldingChild:
    """A child that holds claimed jobs and runs no handler right now."""

    pid: int
    progress_at: float  # monotonic time of its last visible progress
    stack_requested_at: float | None


@dataclass(frozen=True)
class Decision:
    pid: int
    action: Action
    reason: KillReason  # max_execution_timeout, lease_lost or stalled


def decide(children: list[BusyChild], now: float, grace: float) -> list[Decision]:
    decisions = []
    for c in children:
        reason: KillReason | None = None
        if now - c.started >= c.max_execution_timeout:
            reason = MAX_EXECUTION_TIMEOUT
        elif c.lease_lost_at is not None and now - c.lease_lost_at >= grace:
            reason = LEASE_LOST
        if reason is not None:
            decisions.extend(_two_steps(c.pid, reason, c.stack_requested_at, now))
    return decisions


def decide_stalled(children: list[HoldingChild], now: float, limit: float) -> list[Decision]:
    """Children holding jobs with no progress for ``limit`` seconds (the lease)."""
    decisions = []
    for c in children:
        if now - c.progress_at >= limit:
            decisions.extend(_two_steps(c.pid, STALLED, c.stack_requested_at, now))
    return decisions


def _two_steps(
    pid: int, reason: KillReason, stack_requested_at: float | None, now: float
) -> list[Decision]:
    if stack_requested_at is None:
        return [Decision(pid, "dump_stack", reason)]
    if now - stack_requested_at >= STACK_GRACE:
        return [Decision(pid, "kill", reason)]
    return []
