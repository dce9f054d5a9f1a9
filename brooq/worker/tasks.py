"""One job of an async child as a task: its slot, its soft limit, its cancellation.

Owns `Slot` (what the loop knows of a job in flight: its board slot, task, timer, and why
brooq cancelled it), the handler's call awaited with its soft limit armed (`Slot.call`),
and `Slot.interrupt`, the one way brooq cancels a task: with a reason, which then becomes
the attempt's exception (AttemptTimeout) or writes nothing (LeaseLost), while the task's
siblings go on. A timer that fires late because the loop was blocked re-arms once.

Must never cancel a task outside its handler (the outcome write after it is brooq's),
and never be called from another thread (the control thread posts into the loop).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from brooq import logs
from brooq.errors import InvalidResult
from brooq.handlers import HandlerFn
from brooq.job import AttemptTimeout, Claim

__all__ = ["LATE_TIMER", "Slot"]

# A timer that fires this late (the loop was blocked by a sibling) re-arms once for its
# lateness: a job is never charged the seconds another job took from it.
LATE_TIMER = 1.0


@dataclass(eq=False)
class Slot:
    index: int
    claim: Claim[Any]
    started: float = 0.0
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    deadline: float = 0.0  # loop time of the soft limit
    in_handler: bool = False
    reason: BaseException | None = None  # why brooq cancelled it
    rearmed: bool = False
    settled: bool = False  # its outcome is written: no longer held (the slot frees after)

    async def call(
        self, runner: HandlerFn, attempt_timeout: float
    ) -> tuple[BaseException | None, Any]:
        """The topic's runner awaited in this task, its soft limit armed: what it raised
        (the reason, when brooq cancelled it) or returned."""
        loop = asyncio.get_running_loop()
        claim = self.claim
        self.deadline = loop.time() + attempt_timeout
        self.timer = loop.call_at(self.deadline, self._soft_limit, loop, attempt_timeout)
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
            self.timer.cancel()
        return None, value

    def _soft_limit(self, loop: asyncio.AbstractEventLoop, attempt_timeout: float) -> None:
        late = loop.time() - self.deadline
        if late > LATE_TIMER and not self.rearmed:
            self.rearmed = True  # the loop was blocked: give back the time it lost
            self.deadline = loop.time() + late
            self.timer = loop.call_at(self.deadline, self._soft_limit, loop, attempt_timeout)
            return
        self.interrupt(AttemptTimeout(f"attempt_timeout {attempt_timeout:g}s exceeded"))

    def interrupt(self, reason: BaseException) -> None:
        """Cancel the job's task with ``reason`` if its handler still runs."""
        if not self.in_handler or self.reason is not None or self.task is None:
            return
        self.reason = reason
        self.task.cancel(f"brooq.{type(reason).__name__}: {reason}")
