"""Where a claim enters the ready index: a floor per queue and priority, past the jobs
claimed before it, and when to read the index whole again.

Why (docs/explanation/claim-walk.md): each claimed job leaves its entry at the front of
the ready index until a VACUUM removes it (and none can while a session holds an older
snapshot: docs/explanation/held-snapshots.md). A claim reads the index in order from its
front, so each claim read the entries of every job claimed since the last VACUUM; entered
at (queue, priority, floor), a claim reads none of them.

A floor is a position in the index order, (available_at, id). After a claim that returned
jobs of a queue's priority, the floor moves to the last of them, M, when M's available_at
is older than the claim's own start (the statement's now()) less SLACK; else to that
start less SLACK. Why that is safe: a job the claim could not see (it committed later) but
that sorts before M has an available_at from before M's; with the default available_at,
its transaction's start, and a transaction shorter than SLACK, it is after the claim's
start less SLACK. Claims take jobs in order, so what is older and was visible is claimed,
by this child or by another (SKIP LOCKED), or of a topic this child does not run.

What can become ready below a floor: a job enqueued in a transaction longer than SLACK, or
with an available_at given in the past; a claim given back (a release keeps the job's
place: the child that gave it back reads whole next, ``forget``); a claim whose statement
failed. Such a job waits for the next whole read, which sets the floors again from what
it took, and which comes FACTOR times as long after the last one as it took, at least
MIN_APART and at most MAX_APART after it, stretched by up to half as much again at random
so that sibling children, started together, do not read whole at the same moment.

Owns: the floors, the ranges a floored claim reads, the choice of a whole read. Must
never do I/O or read the clock (the times are passed in, the randomness too).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone

__all__ = ["FACTOR", "MAX_APART", "MIN_APART", "SLACK", "WHOLE", "Floor", "Floors", "Range"]

# A position in the ready index's order within a queue's priority: (available_at, id).
Floor = tuple[datetime, uuid.UUID]
WHOLE: Floor = (datetime.min.replace(tzinfo=timezone.utc), uuid.UUID(int=0))  # read whole
LOWEST, HIGHEST = -32768, 32767  # priority is a smallint
# Covers the commit of an autocommit enqueue (available_at is its transaction's start)
# and the order in which concurrent producers' commits land. A claim of a queue whose
# jobs are claimed as they come reads again the entries of the jobs claimed within SLACK
# before its start: a longer slack reads more buffers per claim.
SLACK = timedelta(milliseconds=100)
FACTOR = 20.0
MIN_APART = 0.25  # seconds: a job below a floor waits at most about this (and half again)
MAX_APART = 60.0  # seconds

# One row of a floored claim's arrays: the queue, its priorities lo..hi, the floor.
Range = tuple[str, int, int, datetime, uuid.UUID]
# What a claim tells of each job it returned: queue, priority, available_at, id.
Claimed = tuple[str, int, datetime, uuid.UUID]


class Floors:
    """One child's floors; ``start`` before a claim, ``end`` after it."""

    def __init__(self, spread: Callable[[], float] = random.random) -> None:
        self._spread = spread  # a number in [0, 1): how far to stretch the next wait
        self._floors: dict[str, dict[int, Floor]] = {}  # queue -> priority -> floor
        self._whole_due: dict[str, float] = {}  # queue -> monotonic time of the next one
        self._reading_whole: list[str] = []  # the queues the claim under way reads whole

    def start(self, queues: list[str], now: float) -> list[Range] | None:
        """The ranges of a floored claim of ``queues`` (in claim order), or None when the
        claim reads every queue whole (the plain statement)."""
        whole = [q for q in queues if self._whole(q, now)]
        self._reading_whole = whole
        if len(whole) == len(queues):
            return None
        ranges: list[Range] = []
        for queue in queues:
            if queue in whole:
                ranges.append((queue, LOWEST, HIGHEST, *WHOLE))
            else:
                ranges.extend(self.ranges(queue))
        return ranges

    def _whole(self, queue: str, now: float) -> bool:
        return not self._floors.get(queue) or now >= self._whole_due.get(queue, 0.0)

    def ranges(self, queue: str) -> list[Range]:
        """A queue's priorities seen, highest first, each from its floor, and the ranges
        above, between and below them read whole."""
        out: list[Range] = []
        top = HIGHEST
        for priority in sorted(self._floors[queue], reverse=True):
            if priority < top:
                out.append((queue, priority + 1, top, *WHOLE))
            out.append((queue, priority, priority, *self._floors[queue][priority]))
            top = priority - 1
        if top >= LOWEST:
            out.append((queue, LOWEST, top, *WHOLE))
        return out

    def end(
        self,
        claimed: Iterable[Claimed],
        claimed_at: datetime | None,
        started: float,
        ended: float,
    ) -> None:
        """After the claim: the jobs it returned, the start of its statement by the
        database's clock (None when it returned none), and when it started and ended by
        the child's monotonic clock."""
        took = max(0.0, ended - started)
        for queue in self._reading_whole:
            wait = min(MAX_APART, max(MIN_APART, FACTOR * took) * (1.0 + self._spread() / 2))
            self._whole_due[queue] = ended + wait
            # A whole read saw the queue from its front: its floors start again from what
            # it took (jobs given back behind the old floors come first now).
            self._floors.pop(queue, None)
        self._reading_whole = []
        if claimed_at is None:
            return
        # The last position per queue and priority, ordered by the id's int: a batch
        # enqueued together shares its available_at, and a UUID compares in Python code.
        last: dict[tuple[str, int], tuple[datetime, int, uuid.UUID]] = {}
        for queue, priority, available_at, job_id in claimed:
            key, position = (queue, priority), (available_at, job_id.int, job_id)
            if key not in last or position > last[key]:
                last[key] = position
        cut = (claimed_at - SLACK, WHOLE[1])
        for (queue, priority), (at, _, job_id) in last.items():
            floors = self._floors.setdefault(queue, {})
            floor = min((at, job_id), cut)
            if floor > floors.get(priority, WHOLE):
                floors[priority] = floor

    def forget(self) -> None:
        """The next claim reads every queue whole (a claim failed, jobs were given back),
        and the floors start again from what it takes."""
        self._whole_due.clear()
        self._reading_whole = []
