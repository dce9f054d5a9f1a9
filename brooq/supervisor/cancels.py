"""The processing jobs canceled, as the master hears of them: a cancel that stops the
handler now instead of at the next lease renewal.

job_cancel notifies CANCEL_CHANNEL (brooq.ipc.channel) with the job's id when the job it
cancels was processing, and only then. Every master listens; the one whose child holds the
job (its ``held`` list) brings the renewal forward to this pass of its loop, and the
renewal does what it always does with a lease it no longer has: it tells the child
``lost <id>`` (the handler gets brooq.LeaseLost), and the watchdog kills a child still
running the job QUEUE_WATCHDOG_GRACE later. Nothing here writes or decides a job's fate:
the renewal's statement is the judge, so a notification about a job claimed again since
(canceled, retried, claimed) loses nothing but a round trip.

Owns: the ids heard and not yet matched to a child. A cancel can be heard before the
holding child's ``held`` message is read (its claim committed, the cancel committed, the
notification arrived first): such an id is kept for one renewal period and matched again
on each pass while any is kept; past that period the periodic renewal has had its turn.
Must never: send anything to a child, or hold an id longer than a renewal period.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from brooq.supervisor.childproc import ChildProc

log = logging.getLogger("brooq.master")

# At most this many ids kept unmatched: anyone who may connect may NOTIFY the channel, and a
# flood must not grow the master; past it, the oldest go (the periodic renewal still
# finds their jobs canceled).
KEPT_MAX = 10_000


class CancelsHeard:
    """Job ids heard on CANCEL_CHANNEL, each kept until a child of ours holds it or
    ``keep`` seconds have passed."""

    def __init__(self, keep: float) -> None:
        self.keep = keep
        self.pending: dict[uuid.UUID, float] = {}  # job id -> heard at (monotonic)

    def heard(self, payloads: Iterable[str], now: float) -> None:
        """The notifications' payloads; one that is not a job id is ignored (a NOTIFY
        anyone may send)."""
        for payload in payloads:
            try:
                self.pending[uuid.UUID(payload)] = now
            except ValueError:
                continue
        excess = len(self.pending) - KEPT_MAX
        if excess > 0:  # dicts keep insertion order: the first are the oldest heard
            for job_id in list(self.pending)[:excess]:
                del self.pending[job_id]

    def match(self, children: Iterable[ChildProc], now: float) -> bool:
        """True when a child of ours holds a job heard canceled: the renewal must run now.
        Ids matched are forgotten, and so are ids heard ``keep`` seconds ago or more."""
        pending = self.pending
        found = False
        for c in children:
            if c.kill_reason is not None:
                continue
            for job_id in c.held:
                if job_id in pending:
                    del pending[job_id]
                    found = True
                    log.info("event=cancel_heard job=%s pid=%d: renewing now", job_id, c.pid)
            if not pending:
                break
        for job_id, at in list(pending.items()):
            if now - at >= self.keep:
                del pending[job_id]
        return found
