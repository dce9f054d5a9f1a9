"""Where a claim enters the ready index: a floor on available_at per queue and priority,
used while reading the index whole has become expensive, and when to read it whole again.

Why (docs/explanation/held-snapshots.md): each claimed job leaves its entry at
the front of the ready index until a VACUUM removes it, and no VACUUM can while a session
holds a snapshot older than the claim. A claim reads the index in order from its front
and visits the row of every entry on its way, so under a snapshot held for minutes each
claim visits every job claimed since. Entered at (queue, priority, floor), a claim reads
none of them.

The floor of a queue's priority is the oldest available_at among the jobs of that
priority the child's last claims returned, less SLACK. Claims take jobs in order, so what
is older and still ready is being claimed by another child, or of a topic this child
does not run. What can become ready below a floor: a job whose enqueue committed more
than SLACK after its available_at was taken (an enqueue inside a long transaction), a
claim given back (a release keeps the job's place), a claim whose statement failed.
Such a job waits for the next whole read.

A queue is read whole (the plain claim statement) while a whole read of it costs less
than WORTH, so on a table that VACUUM keeps clean nothing changes. Past WORTH the claims
use the floors (job_finish_and_claim_floored: the priorities seen, each from its floor,
and the ranges between them whole), and a whole read comes again once the time since
the last one is FACTOR times what it took, stretched by up to half as much again at
random so that sibling children, started together, do not read whole at the same
moment (whole reads then cost at most about 1/FACTOR of the child's time), and at the
latest MAX_APART after it.

Owns: the floors, the ranges a floored claim reads, the choice of a whole read. Must
never do I/O or read the clock (the times are passed in, the randomness too).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone

__all__ = ["FACTOR", "MAX_APART", "SLACK", "WHOLE", "WORTH", "Floors", "Range"]

WHOLE = datetime.min.replace(tzinfo=timezone.utc)  # the floor of a range read whole
LOWEST, HIGHEST = -32768, 32767  # priority is a smallint
# Covers the commit of an autocommit enqueue (available_at is its transaction's start)
# and the order in which concurrent producers' commits land. Each claim visits the rows
# of the jobs claimed within SLACK before its floor: under a held snapshot, a longer
# slack reads more buffers per job.
SLACK = timedelta(milliseconds=100)
WORTH = 0.005  # seconds: a whole read cheaper than this is always taken
FACTOR = 20.0
MAX_APART = 60.0  # seconds

# One row of a floored claim's arrays: the queue, its priorities lo..hi, the floor.
Range = tuple[str, int, int, datetime]


class Floors:
    """One child's floors; ``start`` before a claim, ``end`` after it."""

    def __init__(self, spread: Callable[[], float] = random.random) -> None:
        self._spread = spread  # a number in [0, 1): how far to stretch the next wait
        self._floors: dict[str, dict[int, datetime]] = {}  # queue -> priority -> floor
        self._whole_took: dict[str, float] = {}  # queue -> seconds of its last whole read
        self._whole_due: dict[str, float] = {}  # queue -> monotonic time of the next one
        self._reading_whole: list[str] = []  # the queues the claim under way reads whole
        self._floored = False  # whether the claim under way enters some queue at floors

    def start(self, queues: list[str], now: float) -> list[Range] | None:
        """The ranges of a floored claim of ``queues`` (in claim order), or None when the
        claim reads every queue whole (the plain statement)."""
        whole = [q for q in queues if self._whole(q, now)]
        self._reading_whole = whole
        self._floored = len(whole) < len(queues)
        if not self._floored:
            return None
        ranges: list[Range] = []
        for queue in queues:
            if queue in whole:
                ranges.append((queue, LOWEST, HIGHEST, WHOLE))
            else:
                ranges.extend(self.ranges(queue))
        return ranges

    def _whole(self, queue: str, now: float) -> bool:
        return (
            not self._floors.get(queue)
            or self._whole_took.get(queue, 0.0) < WORTH
            or now >= self._whole_due.get(queue, 0.0)
        )

    def ranges(self, queue: str) -> list[Range]:
        """A queue's priorities seen, highest first, each from its floor, and the ranges
        above, between and below them read whole."""
        out: list[Range] = []
        top = HIGHEST
        for priority in sorted(self._floors[queue], reverse=True):
            if priority < top:
                out.append((queue, priority + 1, top, WHOLE))
            out.append((queue, priority, priority, self._floors[queue][priority]))
            top = priority - 1
        if top >= LOWEST:
            out.append((queue, LOWEST, top, WHOLE))
        return out

    def tracks(self, took: float) -> bool:
        """Whether the claim under way, ``took`` seconds long, moves the floors: not a
        cheap whole read (the common case, a table VACUUM keeps clean), whose floors
        would never be used; the first claim past WORTH sets them. Asked before ``end``,
        so that the caller lists the claimed jobs only when they count."""
        return self._floored or took >= WORTH

    def end(
        self, claimed: Iterable[tuple[str, int, datetime]], started: float, ended: float
    ) -> None:
        """After the claim: the (queue, priority, available_at) of the jobs it returned,
        and when it started and ended."""
        took = max(0.0, ended - started)
        for queue in self._reading_whole:
            self._whole_took[queue] = took
            wait = FACTOR * took * (1.0 + self._spread() / 2)
            self._whole_due[queue] = ended + min(MAX_APART, wait)
        self._reading_whole = []
        oldest: dict[tuple[str, int], datetime] = {}
        for queue, priority, available_at in claimed:
            key = (queue, priority)
            if key not in oldest or available_at < oldest[key]:
                oldest[key] = available_at
        for (queue, priority), available_at in oldest.items():
            floors = self._floors.setdefault(queue, {})
            floor = available_at - SLACK
            if floor > floors.get(priority, WHOLE):
                floors[priority] = floor

    def forget(self) -> None:
        """The next claim reads every queue whole (a claim failed, say)."""
        self._whole_due.clear()
        self._reading_whole = []
        self._floored = False
