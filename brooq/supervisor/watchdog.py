"""What the master must do about its children, decided without side effects.

Four limits: a job running past its max_execution_timeout is killed (hard timeout); an
async child whose event loop stops beating on its board for loop_block_timeout (or for
BLOCKED_PAST_SOFT_LIMIT while the job blocking it is past its attempt_timeout) is killed
with that job charged (docs/async.md); a child told a job's lease was lost that still
runs it after the watchdog grace is killed as hung; and a child that holds claimed jobs
outside any handler (between jobs, in a round trip to the database, in an on_success
hook) and makes no progress for longer than the lease is killed as stalled, so that its
jobs go back instead of being renewed for ever. A kill is two steps, like gunicorn's:
first ask for the stack (SIGUSR2, the child's faulthandler writes it), then SIGKILL the
process group on a later pass.

Progress is anything the master can see a child do: a job starting or ending on its
board, or a new list of held jobs on its pipe.

Pure functions of what the master last saw and the time it is given: they must never act
(brooq.supervisor.enforce sends the signals) and never read a clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from brooq.ipc.board import Running
from brooq.ipc.reasons import (
    LEASE_LOST,
    LOOP_BLOCKED,
    MAX_EXECUTION_TIMEOUT,
    STALLED,
    KillReason,
)

# Time between the stack request and the kill: enough for faulthandler to write.
STACK_GRACE = 0.2
# A loop blocked this long by a job already past its own attempt_timeout is killed without
# waiting for loop_block_timeout: the soft limit cannot reach a job that holds the loop,
# so the kill is how it is enforced.
BLOCKED_PAST_SOFT_LIMIT = 1.0

Action = Literal["dump_stack", "kill"]


@dataclass(frozen=True)
class LoopView:
    """An async child's event loop as its board shows it."""

    beat: float  # monotonic time of its last beat; 0.0: no loop runs yet
    culprit: uuid.UUID | None  # the job its control thread found blocking it
    block_timeout: float  # loop_block_timeout


@dataclass(frozen=True)
class BusyChild:
    pid: int
    jobs: tuple[Running, ...]  # on its board, one for a sync child
    stack_requested_at: float | None
    lease_lost: Mapping[uuid.UUID, float] = field(default_factory=dict)  # job -> told at
    loop: LoopView | None = None  # an async child's loop


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
    reason: KillReason  # max_execution_timeout, loop_blocked, lease_lost or stalled
    job: uuid.UUID | None = None  # the guilty job, charged the attempt; None: nobody


def decide(children: list[BusyChild], now: float, grace: float) -> list[Decision]:
    decisions = []
    for c in children:
        found = _verdict(c, now, grace)
        if found is not None:
            decisions.extend(_two_steps(c.pid, found[0], found[1], c.stack_requested_at, now))
    return decisions


def _verdict(c: BusyChild, now: float, grace: float) -> tuple[KillReason, uuid.UUID | None] | None:
    """The first limit this child is past, and the job to charge for it."""
    past = [j for j in c.jobs if now - j.started >= j.max_execution_timeout]
    if past:
        return MAX_EXECUTION_TIMEOUT, min(past, key=lambda j: j.started).id
    loop = c.loop
    if loop is not None and loop.beat and c.jobs:
        silent = now - loop.beat
        culprit = next((j for j in c.jobs if j.id == loop.culprit), None)
        if silent >= loop.block_timeout or (
            culprit is not None
            and silent >= BLOCKED_PAST_SOFT_LIMIT
            and now - culprit.started >= culprit.attempt_timeout
        ):
            return LOOP_BLOCKED, culprit.id if culprit is not None else None
    on_board = {j.id for j in c.jobs}
    if any(j in on_board and now - at >= grace for j, at in c.lease_lost.items()):
        return LEASE_LOST, None
    return None


def decide_stalled(children: list[HoldingChild], now: float, limit: float) -> list[Decision]:
    """Children holding jobs with no progress for ``limit`` seconds (the lease)."""
    decisions = []
    for c in children:
        if now - c.progress_at >= limit:
            decisions.extend(_two_steps(c.pid, STALLED, None, c.stack_requested_at, now))
    return decisions


def _two_steps(
    pid: int,
    reason: KillReason,
    job: uuid.UUID | None,
    stack_requested_at: float | None,
    now: float,
) -> list[Decision]:
    if stack_requested_at is None:
        return [Decision(pid, "dump_stack", reason, job)]
    if now - stack_requested_at >= STACK_GRACE:
        return [Decision(pid, "kill", reason, job)]
    return []
