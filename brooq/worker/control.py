"""What the control thread asks of the loop that runs the jobs, whichever it is.

Owns `LoopControl`, the protocol both loops implement (the sync one in
brooq.worker.child, the async one in brooq.worker.aio) and the control thread
(brooq.worker.link) calls, through ChildState.loop: what to do when the master says a
job's lease is lost or that this stop is a drain, a job's await chain and stack, which
batchmates of a long job to give back, a look at the loop every tick, and the title.

Must never hold code: only the protocol. Every method is called from the control
thread, so an implementation must never raise into the loop's thread other than as the
loop allows (a signal for the sync loop, a callback posted into the event loop for the
async one), and never touch the database.
"""

from __future__ import annotations

import uuid
from typing import Protocol

__all__ = ["LoopControl"]


class LoopControl(Protocol):
    def on_lost(self, job_id: uuid.UUID) -> None:
        """The master says the job's lease is lost (ChildState.lost has it already):
        interrupt it if its handler runs."""

    def on_drain(self) -> None:
        """The master says this stop is a drain: its deadline is graceful_timeout."""

    def await_chain(self, job_id: uuid.UUID) -> str:
        """What a suspended job awaits, written beside the thread stacks before the
        master's hard kill ("" when the thread stacks say it all)."""

    def stack_text(self, job_id: uuid.UUID) -> str:
        """`brooq jobs stack`: the job's stack as a traceback ("" if it is not running)."""

    def batchmates_due(self, now: float) -> list[uuid.UUID]:
        """The jobs claimed after a job running for LONG_JOB in its batch, once: the
        master gives them back (empty when there are none, or they were given)."""

    def watch(self, now: float) -> None:
        """A look at the loop every TITLE_TICK (a blocked event loop is named)."""

    def title(self) -> str:
        """The process title: the jobs running, or idle."""
