"""One job of an async child as a task: its slot, its soft limit, its cancellation, and
the claims waiting for a slot.

Owns `Slot` (what the loop knows of a job in flight: its board slot, task, soft limit, and
why brooq cancelled it), the handler's call awaited with its soft limit armed (`Slot.call`),
`SoftLimits` (the loop's timers of those limits, shared by the jobs whose deadlines fall in
the same LIMIT_GRAIN), and `Slot.interrupt`, the one way brooq cancels a task: with a
reason, which then becomes the attempt's exception (AttemptTimeout) or writes nothing
(LeaseLost), while the task's siblings go on. A limit that fires late because the loop was
blocked re-arms once. `Ahead` keeps the claims made beyond the free slots, oldest first.

Must never cancel a task outside its handler (the outcome write after it is brooq's),
and never be called from another thread (the control thread posts into the loop).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

from brooq import logs
from brooq.declare.handlers import HandlerFn
from brooq.errors import InvalidResult
from brooq.job import AttemptTimeout, Claim

__all__ = [
    "AHEAD_PATIENCE",
    "AHEAD_SLOW",
    "CLAIM_AHEAD",
    "LATE_TIMER",
    "LIMIT_GRAIN",
    "Ahead",
    "Slot",
    "SoftLimits",
]

# A timer that fires this late (the loop was blocked by a sibling) re-arms once for its
# lateness: a job is never charged the seconds another job took from it.
LATE_TIMER = 1.0
# The soft limits due within the same LIMIT_GRAIN seconds of loop time share one timer,
# which fires at the grain's end (so a limit fires up to LIMIT_GRAIN late). A timer armed
# and cancelled per job costs several times what adding the job to its grain's set and
# taking it out does (the loop's heap keeps a cancelled one until it sweeps it); so does
# one per short job when the jobs do not overlap: a grain left empty keeps its timer for
# the next job, whose deadline is likely in it, until a new grain opens.
LIMIT_GRAIN = 0.01


# Claims beyond the free slots, one per CLAIM_AHEAD slots, wait in the child and start
# the moment a slot frees, so that a freed slot waits for no round trip; the next trip
# (the finished jobs' `done` with it) goes once half of them have started. Kept no longer
# than AHEAD_PATIENCE while no slot frees (every slot on a long job): then given back
# (attempt refunded), and none claimed ahead again until a slot frees.
CLAIM_AHEAD = 2
AHEAD_PATIENCE = 1.0
# Only while the last job ran this long: shorter jobs free their slots within a round trip
# anyway, and their claims ahead cost CPU per job.
AHEAD_SLOW = 0.005


class Ahead:
    """The claims waiting for a slot, oldest first, with when each came."""

    def __init__(self, capacity: int, paced: bool) -> None:
        # None with a topic under a rate or a limit: a start deadline counts from the claim.
        self.most = 0 if paced else capacity // CLAIM_AHEAD
        self.claims: deque[tuple[Claim[Any], float]] = deque()
        self.on = True  # off after a give-back for patience, until a slot frees
        self.slow = False  # the last job ran AHEAD_SLOW or longer

    def room(self) -> int:
        return (self.most if self.on and self.slow else 0) - len(self.claims)

    def full_enough(self) -> bool:
        """Claims ahead still wait, at least half as many as it keeps: no trip yet."""
        return bool(self.claims) and 2 * len(self.claims) >= self.most

    def ids(self) -> list[uuid.UUID]:
        return [c.id for c, _ in self.claims]

    def stale(self, now: float) -> bool:
        return bool(self.claims) and now - self.claims[0][1] > AHEAD_PATIENCE

    def take_all(self) -> list[uuid.UUID]:
        ids = self.ids()
        self.claims.clear()
        return ids


class SoftLimits:
    """The soft-limit timers of one loop: one per grain with a job due in it, and the
    grains left empty since the last grain opened (cancelled when one opens), so they
    are never more than the jobs in flight and those few."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._due: dict[int, tuple[set[Slot], asyncio.TimerHandle]] = {}
        self._emptied: list[int] = []  # grains whose last job left, timers kept

    def arm(self, slot: Slot, deadline: float) -> None:
        key = slot.limit_key = math.ceil(deadline / LIMIT_GRAIN)
        due = self._due.get(key)
        if due is None:
            self._cancel_emptied()
            timer = self.loop.call_at(key * LIMIT_GRAIN, self._fire, key)
            due = self._due[key] = (set(), timer)
        due[0].add(slot)

    def disarm(self, slot: Slot) -> None:
        due = self._due.get(slot.limit_key)
        if due is not None:
            due[0].discard(slot)
            if not due[0] and (not self._emptied or self._emptied[-1] != slot.limit_key):
                self._emptied.append(slot.limit_key)

    def timers(self) -> int:
        """The timers armed now."""
        return len(self._due)

    def _cancel_emptied(self) -> None:
        for key in self._emptied:
            due = self._due.get(key)
            if due is not None and not due[0]:  # still empty: no job came back to it
                due[1].cancel()
                del self._due[key]
        self._emptied.clear()

    def _fire(self, key: int) -> None:
        due = self._due.pop(key, None)
        for slot in list(due[0]) if due is not None else ():
            slot.soft_limit(self)


@dataclass(eq=False)
class Slot:
    index: int
    claim: Claim[Any]
    started: float = 0.0
    task: asyncio.Task[None] | None = None
    limits: SoftLimits | None = None  # the loop's (set by the loop when it starts the job)
    limit_key: int = 0  # its grain in limits
    deadline: float = 0.0  # loop time of the soft limit
    attempt_timeout: float = 0.0
    in_handler: bool = False
    reason: BaseException | None = None  # why brooq cancelled it
    rearmed: bool = False
    settled: bool = False  # its outcome is written: no longer held (the slot frees after)

    async def call(
        self, runner: HandlerFn, attempt_timeout: float
    ) -> tuple[BaseException | None, Any]:
        """The topic's runner awaited in this task, its soft limit armed: what it raised
        (the reason, when brooq cancelled it) or returned."""
        limits = self.limits
        assert limits is not None
        claim = self.claim
        self.attempt_timeout = attempt_timeout
        self.deadline = limits.loop.time() + attempt_timeout
        limits.arm(self, self.deadline)
        self.in_handler = True
        logs.current_job.set((claim.id, claim.topic))  # this task's own context
        try:
            value = await runner(claim)
            if asyncio.iscoroutine(value):
                value.close()
                raise InvalidResult(
                    "the handler returned a coroutine: declare it async def, or await what it calls"
                )
        except asyncio.CancelledError as exc:
            if self.reason is None:
                return exc, None
            # The cancellation is ours and handled: the task ends normally (Python 3.11
            # counts cancellations, asyncio.timeout reads them).
            uncancel = getattr(asyncio.current_task(), "uncancel", None)
            if uncancel is not None:
                uncancel()
            return self.reason, None
        except BaseException as exc:  # the attempt's, as in a sync child
            return exc, None
        finally:
            self.in_handler = False
            limits.disarm(self)
        return None, value

    def soft_limit(self, limits: SoftLimits) -> None:
        """Its grain's timer fired (the limit is due, up to LIMIT_GRAIN ago)."""
        if not self.in_handler:
            return
        now = limits.loop.time()
        late = now - self.deadline
        if late > LATE_TIMER and not self.rearmed:
            self.rearmed = True  # the loop was blocked: give back the time it lost
            self.deadline = now + late
            limits.arm(self, self.deadline)
            return
        self.interrupt(AttemptTimeout(f"attempt_timeout {self.attempt_timeout:g}s exceeded"))

    def interrupt(self, reason: BaseException) -> None:
        """Cancel the job's task with ``reason`` if its handler still runs."""
        if not self.in_handler or self.reason is not None or self.task is None:
            return
        self.reason = reason
        self.task.cancel(f"brooq.{type(reason).__name__}: {reason}")
