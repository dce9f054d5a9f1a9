"""What the master must do about its busy children, decided without side effects.

Two limits: a job running past its max_execution_timeout is killed (hard timeout), and
a child told its lease was lost that is still busy after the watchdog grace is killed
as hung. A kill is two steps, like gunicorn's: first ask for the stack (SIGUSR2, the
child's faulthandler writes it), then SIGKILL the process group on a later pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
class Decision:
    pid: int
    action: Action
    reason: str  # "max_execution_timeout" | "lease_lost"


def decide(children: list[BusyChild], now: float, grace: float) -> list[Decision]:
    decisions = []
    for c in children:
        reason: str | None = None
        if now - c.started >= c.max_execution_timeout:
            reason = "max_execution_timeout"
        elif c.lease_lost_at is not None and now - c.lease_lost_at >= grace:
            reason = "lease_lost"
        if reason is None:
            continue
        if c.stack_requested_at is None:
            decisions.append(Decision(c.pid, "dump_stack", reason))
        elif now - c.stack_requested_at >= STACK_GRACE:
            decisions.append(Decision(c.pid, "kill", reason))
    return decisions
