"""An async child seen from its control thread: which job's coroutine blocks the event
loop, and the process title.

A coroutine that never yields (time.sleep, CPU work, a blocking client) stops the loop's
beat on the board. Once the beat is CULPRIT_AFTER old, the task the loop is running is the
culprit: its job is named on the board for the master (whose watchdog then kills the child
and charges that job alone) and in one log line per stall.

Owns the culprit's naming and the title's text. Must never touch the loop or a task: it
runs in the control thread and only reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brooq.ipc.board import Board
    from brooq.worker.tasks import Slot

log = logging.getLogger("brooq.child")

# The control thread names the job blocking the loop once the beat is this old.
CULPRIT_AFTER = 0.5


class Culprit:
    """The job named as blocking the loop, and the stall last logged."""

    def __init__(self) -> None:
        self.job: uuid.UUID | None = None
        self._logged_for = 0.0

    def watch(
        self,
        board: Board,
        loop: asyncio.AbstractEventLoop | None,
        by_task: dict[asyncio.Task[None], Slot],
        now: float,
    ) -> None:
        """A loop silent for CULPRIT_AFTER is blocked by the task running now: name its
        job on the board, and clear the name once the loop beats again."""
        beat = board.loop_beat()
        if loop is None or not beat:
            return
        if now - beat < CULPRIT_AFTER:
            if self.job is not None:
                self.job = None
                board.set_culprit(None, 0.0)
            return
        task = asyncio.current_task(loop)
        slot = by_task.get(task) if task is not None else None
        culprit = slot.claim.id if slot is not None else None
        if culprit != self.job:
            self.job = culprit
            board.set_culprit(culprit, beat)
        if culprit is not None and slot is not None and self._logged_for != beat:
            self._logged_for = beat
            log.warning(
                "event=loop_blocked job=%s topic=%s blocked=%.1fs: a coroutine that does "
                "not yield (time.sleep, CPU work, a blocking client) holds the event loop",
                culprit,
                slot.claim.topic,
                now - beat,
            )


def title(slots: list[Slot], capacity: int) -> str:
    """The jobs in flight, per topic, and the oldest's age."""
    if not slots:
        return f"brooq-child: async idle 0/{capacity}"
    topics: dict[str, int] = {}
    for s in slots:
        topics[s.claim.topic] = topics.get(s.claim.topic, 0) + 1
    oldest = min((s.started for s in slots if s.started), default=0.0)
    age = (time.monotonic() - oldest) if oldest else 0.0
    per_topic = ", ".join(f"{t} {n}" for t, n in sorted(topics.items()))
    return f"brooq-child: async {len(slots)}/{capacity} jobs ({per_topic}) oldest {age:.1f}s"
