"""Where a claim starts in the ready index: a floor on available_at per queue, and when
to read the index whole again.

Why (measured: docs/explanation/held-snapshots.md): each claimed job leaves its entry at
the front of the ready index until a VACUUM removes it, and no VACUUM can while a session
holds a snapshot older than the claim. A claim reads the index in order from its front
and visits the row of every entry on its way, so under a snapshot held for minutes each
claim visited every job claimed since: at 1,000 jobs/s, 60,000 rows a minute, and a
claim of 5 ms became one of 100 ms and more. Given a floor, the claim passes the older
entries inside the index (one comparison each, no row visited).

The floor of a queue is the oldest available_at among the jobs the child's last claim
of it returned, less SLACK. Claims take jobs in order, so what is older and still ready
is being claimed by another child, or of a topic this child does not run. What can
become ready below the floor: a job whose enqueue committed more than SLACK after its
available_at was taken (an enqueue inside a long transaction), a claim given back
(a release keeps the job's place), a claim whose statement failed. Such a job waits
for the next whole read: a claim reads the index whole once the time since the last
whole read is FACTOR times what that read took (whole reads cost at most about
1/FACTOR of the child's time), and at the latest MAX_APART after it. On a table that
VACUUM keeps clean a whole read takes a fraction of a millisecond, so nearly every claim
is a whole read and nothing changes; under a held snapshot whole reads become rare and
the other claims stay cheap.

Owns: the floors and the choice of a whole read. Must never do I/O or read the clock
(the times are passed in).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

__all__ = ["FACTOR", "MAX_APART", "SLACK", "WHOLE", "Floors"]

WHOLE = datetime.min.replace(tzinfo=timezone.utc)  # the floor of a whole read
# Covers the commit of an autocommit enqueue (available_at is its transaction's start)
# and the order in which concurrent producers' commits land. Each claim visits the rows
# of the jobs claimed within SLACK before its floor: at 1,000 jobs/s under a held
# snapshot, 1 s of slack read 650-1,000 buffers per job, 100 ms 250-530.
SLACK = timedelta(milliseconds=100)
FACTOR = 20.0
MAX_APART = 60.0  # seconds


class Floors:
    """The floors of one child's queues; ``start`` before a claim, ``end`` after it."""

    def __init__(self) -> None:
        self._floor: dict[str, datetime] = {}
        self._whole_due: dict[str, float] = {}  # monotonic time of the next whole read
        self._whole: dict[str, bool] = {}  # the claim under way reads the index whole

    def start(self, queue: str, now: float) -> datetime:
        """The floor of a claim of ``queue`` starting at ``now``: WHOLE when a whole read
        is due (or no claim of it returned a job yet)."""
        whole = now >= self._whole_due.get(queue, 0.0) or queue not in self._floor
        self._whole[queue] = whole
        return WHOLE if whole else self._floor[queue]

    def end(self, queue: str, oldest: datetime | None, started: float, ended: float) -> None:
        """After the claim started by ``start``: the oldest available_at of the jobs it
        returned (None: none), and when it started and ended."""
        if self._whole.pop(queue, False):
            self._whole_due[queue] = ended + min(MAX_APART, FACTOR * max(0.0, ended - started))
        if oldest is None:
            return
        floor = oldest - SLACK
        if floor > self._floor.get(queue, WHOLE):
            self._floor[queue] = floor

    def forget(self, queue: str) -> None:
        """The next claim of ``queue`` reads the index whole (a claim failed, say)."""
        self._whole_due.pop(queue, None)
        self._whole.pop(queue, None)
