"""The one scheduler of the master's periodic duties, and what a duty is.

Owns the timing of everything the master does on a clock: each duty is a small object
with its name, its period (None: every pass of the loop) and a ``run_once(now)``
returning counts; the Scheduler hands out the duties due at a given ``now`` in a fixed
order.

The Scheduler is pure (its clock is the ``now`` it is given) and the duties must never
wait: a duty that cannot reach the database returns nothing and runs again next period.
No duty ever touches a child's process: renewal only tells a child its lease is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

Counts = dict[str, int]


class Duty(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def period(self) -> float | None:
        """Seconds between two runs; None: every pass of the loop, on no timer."""

    @property
    def first_after(self) -> float:
        """Seconds from the scheduler's start to the first run."""

    def run_once(self, now: float) -> Counts: ...


class Scheduler:
    """Duties in a fixed order, each due ``period`` seconds after its last run."""

    def __init__(self, duties: Sequence[Duty], now: float) -> None:
        self.duties = list(duties)
        self._next = {d.name: now + d.first_after for d in duties if d.period is not None}

    def due(self, now: float) -> Iterator[Duty]:
        """The duties due at ``now``, in order, each rescheduled one period after ``now``
        as it is handed out. Lazy: a duty is looked at once the one before it has run, so
        a duty made due at once by an earlier one (renewal, by a reconnection) runs in
        the same pass. A duty that ran and left work (its ``again_after`` is not None, as
        Retention's while it is behind) runs again that many seconds after ``now``
        instead of a period later; one that changed its period when it ran (Stats, after a
        slow run) is next due that new period after ``now``."""
        for d in self.duties:
            if d.period is None:
                yield d
            elif now >= self._next[d.name]:
                self._next[d.name] = now + d.period
                yield d
                self._next[d.name] = now + d.period  # a duty may pace itself (Stats)
                again = getattr(d, "again_after", None)
                if again is not None:
                    self._next[d.name] = min(self._next[d.name], now + again)

    def next_at(self) -> float:
        """When the next timed duty is due."""
        return min(self._next.values(), default=float("inf"))

    def due_now(self, name: str) -> None:
        self._next[name] = float("-inf")
