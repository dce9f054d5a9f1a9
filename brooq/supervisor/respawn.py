"""When the master may fork a replacement child, and when it must give up.

A child that dies outside any job -- before it said ready, or after, in its claim loop --
says nothing about a job and everything about the fleet: the next child will most likely
die the same way (the schema was dropped, a permission revoked, a library broken). Such
deaths form a streak: each one delays the next fork (exponential backoff), and a streak
of STORM_FATAL ends the master (exit 3) instead of a crash loop. The streak ends when a
child is seen running a job, or when a child has stayed alive for STABLE_AFTER seconds
since it was forked.

Deaths inside a job (a poison job's segfault, a hard timeout) are the job's business:
they are recorded as failed attempts and replaced at once, without backoff, so a poison
job reaches `dead` after max_attempts runs rather than after max_attempts backoffs.

Pure state with an injected clock: it decides, the fleet (brooq.supervisor.fleet) acts.
It must never fork, sleep or read a clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

RESPAWN_BASE = 0.5  # seconds before the fork after the first death of a streak
RESPAWN_MAX = 10.0
STORM_FATAL = 5  # deaths in a row outside a job that end the master
STABLE_AFTER = 30.0  # a child alive this long ends the streak


@dataclass
class CrashStreak:
    count: int = 0
    last_at: float = float("-inf")  # monotonic time of the last death in the streak

    def died(self, now: float) -> None:
        self.count += 1
        self.last_at = now

    def healthy(self) -> None:
        """A child ran a job or stayed up: the fleet works."""
        self.count = 0
        self.last_at = float("-inf")

    def delay(self) -> float:
        """Backoff before the next fork: 0 without a streak, then 0.5 s doubling to 10 s."""
        if self.count == 0:
            return 0.0
        return float(min(RESPAWN_BASE * 2.0 ** (self.count - 1), RESPAWN_MAX))

    def fork_at(self) -> float:
        """The earliest monotonic time a replacement may be forked."""
        return self.last_at + self.delay() if self.count else float("-inf")

    @property
    def fatal(self) -> bool:
        return self.count >= STORM_FATAL
