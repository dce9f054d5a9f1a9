"""An async child's soft limits (brooq.worker.tasks.SoftLimits and Slot.call), on a real
event loop: short jobs one after another share their grain's timer, a new grain cancels
the timers of the grains left empty, and a job past its limit gets AttemptTimeout while a
sibling started later runs on."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone
from typing import Any

from brooq.job import AttemptTimeout, Claim
from brooq.worker.tasks import LIMIT_GRAIN, Slot, SoftLimits


def _slot(limits: SoftLimits, i: int = 0) -> Slot:
    claim: Claim[Any] = Claim(uuid.uuid4(), "t", None, 1, "h:1:x", datetime.now(timezone.utc))
    return Slot(i, claim, limits=limits)


def test_short_jobs_one_after_another_share_their_grain_timer() -> None:
    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        limits = SoftLimits(loop)
        made = 0
        call_at = loop.call_at

        def counting(*args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            nonlocal made
            made += 1
            return call_at(*args, **kwargs)

        loop.call_at = counting  # type: ignore[method-assign]
        deadline = (int(loop.time() / LIMIT_GRAIN) + 1000.5) * LIMIT_GRAIN  # mid-grain
        most = 0
        for i in range(100):
            slot = _slot(limits, i)
            limits.arm(slot, deadline)
            most = max(most, limits.timers())
            limits.disarm(slot)
        return made, most

    made, most = asyncio.run(main())
    assert made == 1 and most == 1


def test_a_new_grain_cancels_the_timers_of_the_grains_left_empty() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        limits = SoftLimits(loop)
        base = (int(loop.time() / LIMIT_GRAIN) + 1000.5) * LIMIT_GRAIN
        first, second, busy = _slot(limits, 0), _slot(limits, 1), _slot(limits, 2)
        limits.arm(busy, base)  # a job still running in the first grain keeps its timer
        limits.arm(first, base)
        limits.disarm(first)
        limits.arm(second, base + 5 * LIMIT_GRAIN)
        assert limits.timers() == 2  # the busy grain's and the new one
        limits.disarm(busy)
        limits.disarm(second)
        limits.arm(_slot(limits, 3), base + 10 * LIMIT_GRAIN)
        assert limits.timers() == 1  # both emptied grains' timers cancelled
        handles = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert len(handles) == 1

    asyncio.run(main())


def test_a_job_past_its_limit_is_interrupted_and_a_later_one_runs_on() -> None:
    """A short job empties the grain; a long one started after it, limit 0.05 s, gets
    AttemptTimeout from the grain's timer; one with a 1 s limit sleeping 0.2 s returns."""

    async def main() -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        limits = SoftLimits(loop)

        async def quick(claim: Claim[Any]) -> None:
            return None

        async def sleeps(claim: Claim[Any]) -> str:
            await asyncio.sleep(0.2 if claim.topic == "t" and slow.claim is claim else 5.0)
            return "slept"

        first = _slot(limits, 0)
        first.task = asyncio.ensure_future(first.call(quick, 0.05))
        await first.task
        stuck, slow = _slot(limits, 1), _slot(limits, 2)
        stuck_task = asyncio.ensure_future(stuck.call(sleeps, 0.05))
        slow_task = asyncio.ensure_future(slow.call(sleeps, 1.0))
        stuck.task, slow.task = stuck_task, slow_task  # type: ignore[assignment]
        return await asyncio.wait_for(asyncio.gather(stuck_task, slow_task), 10)

    (stuck_error, _), (slow_error, slow_value) = asyncio.run(main())
    assert isinstance(stuck_error, AttemptTimeout)
    assert slow_error is None and slow_value == "slept"
