"""A child's state: what it is given at fork time, and the little its pieces share.

Owns ChildConfig (everything the master hands a child: read-only input, never changed
while the child runs), identity_for (the child's locked_by), the worker's constants, and
ChildState (whether it stops, the job running now, the wake pipe). The exit codes live
in brooq.ipc.reasons, the contract with the master; they are never defined here.

The main thread (claim loop, outcome writing), its signal handlers and the control thread
(brooq.worker.link) all read and write the one ChildState; it is the only state they
share. Each field has one writer in normal operation (noted per field) and is a plain
attribute read (no lock): a reader that sees an old value acts one tick later, never
wrongly.

The wake pipe is what the main thread sleeps on between polls and backoffs: the control
thread writes to it ("w" when the master says jobs may be ready, "x" when the master is
gone) and so does Python's signal wakeup (signal.set_wakeup_fd), so SIGTERM ends a sleep.

Must never do I/O other than the wake pipe, and never decide anything: it only holds.
"""

from __future__ import annotations

import math
import os
import select
import socket
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from brooq.declare.handlers import Handler, Middleware
from brooq.ipc import protocol
from brooq.ipc.board import Board
from brooq.ipc.reasons import SYNC, ChildKind
from brooq.job import Claim
from brooq.settings import Settings

if TYPE_CHECKING:
    from brooq.metrics import Metrics
    from brooq.worker.control import LoopControl

__all__ = [
    "BATCH_BUDGET",
    "PEAK_RSS_MAX_AGE",
    "TITLE_TICK",
    "ChildConfig",
    "ChildState",
    "identity_for",
]

# A batch holds at most about BATCH_BUDGET seconds of recent average work, so that the
# round trip between jobs is paid once per batch while nothing waits long behind its
# batchmates (a job longer than brooq.rules.LONG_JOB gives back the rest).
BATCH_BUDGET = 0.1
PEAK_RSS_MAX_AGE = 0.25
TITLE_TICK = 0.25  # how often the control thread refreshes the process title


@dataclass
class ChildConfig:
    """What the master hands a child at fork time."""

    identity: str
    dsn: str
    settings: Settings
    handlers: dict[str, Handler]
    to_master: int  # write end
    from_master: int  # read end
    stack_file: str
    app_spec: str = ""
    reload_baseline: frozenset[str] | None = None  # set after SIGHUP: re-import the app
    metrics: Metrics | None = None
    board: Board | None = None  # shared with the master; a private one when alone
    middleware: tuple[Middleware, ...] = ()  # the Queue's, outermost first
    child_start: tuple[Callable[[], object], ...] = ()  # @queue.on_child_start, in order
    kind: ChildKind = SYNC  # which handlers it runs (docs/async.md)
    children: int = 0  # the master's children of this kind (the claim's fair share); 0: workers


def identity_for(pid: int, tag: str) -> str:
    """locked_by of a child: unique on this host (hostname, pid) and across pid reuse (tag)."""
    return f"{socket.gethostname()}:{pid}:{tag}"


class ChildState:
    def __init__(self) -> None:
        self.stopping = False  # SIGTERM, or the master is gone: finish the job, then exit
        self.master_gone = False  # the pipe to the master ended or broke
        self.running: Claim | None = None  # the job whose handler runs now (main thread)
        self.started = 0.0  # time.monotonic() when it started (main thread)
        self.in_handler = False  # interruptions may be raised only while this is True
        # The soft limit (brooq.worker.attempt.arm): the running attempt's deadline and
        # when the timer set fires, time.monotonic(); infinite: none.
        self.deadline = math.inf
        self.alarm_at = math.inf
        self.lost: set[uuid.UUID] = set()  # held jobs the master says are no longer ours
        # While a handler runs: when it started, its batch and the index of the first job
        # claimed after it, in one assignment (the main thread writes, the control thread
        # reads), so they always belong together. None between handlers: set back before
        # the duration is taken, so a job the control thread saw past LONG_JOB is one the
        # main thread measures past LONG_JOB too, and never runs the rest of its batch
        # (brooq.worker.link).
        self.tail: tuple[float, Sequence[Claim], int] | None = None
        # The loop running the jobs, sync or async, once it runs: what the control thread
        # asks when the master speaks, and every tick (brooq.worker.control).
        self.loop: LoopControl | None = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def master_is_gone(self) -> None:
        """Without a master nobody renews our leases: stop taking jobs."""
        self.master_gone = True
        self.stopping = True

    def wake(self, why: bytes) -> None:
        """End the main thread's sleep (from another thread)."""
        protocol.send(self.wake_w, why)

    def sleep(self, seconds: float) -> None:
        """Wait for a wake-up, a signal or the timeout."""
        ready, _, _ = select.select([self.wake_r], [], [], seconds)
        if ready:
            try:
                while os.read(self.wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
