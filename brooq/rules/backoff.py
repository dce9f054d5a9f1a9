"""Backoff between attempts: d = min(base * 2^(attempts-1), max), wait uniform in [d/2, d].

The ceiling is checked before the power is taken, so attempt 10,000 gives backoff_max
rather than an overflow. Read by the child (brooq.worker.execute) and by the master
when it fails the job of a child that died with it (brooq.supervisor.maintenance).

Must never sleep or read the clock: it computes a number of seconds; SQL applies it.
"""

from __future__ import annotations

import random


def backoff_ceiling(attempts: int, base: float, maximum: float) -> float:
    """The upper bound d for the wait after ``attempts`` attempts (attempts >= 1)."""
    exponent = max(attempts, 1) - 1
    # 2.0 ** 1024 raises OverflowError; any exponent this large is past every ceiling.
    if exponent >= 1000:
        return maximum
    return min(base * 2.0**exponent, maximum)


def backoff(attempts: int, base: float, maximum: float, draw: float | None = None) -> float:
    """Seconds to wait before the next attempt: uniform in [d/2, d]. ``draw`` in [0, 1)
    replaces the random draw (for tests and for callers that draw themselves)."""
    d = backoff_ceiling(attempts, base, maximum)
    r = random.random() if draw is None else draw
    return d / 2 + r * (d / 2)


def delay_seconds(requested: float, maximum: float) -> float:
    """A handler's Delay(s), clamped to backoff_max."""
    return max(0.0, min(requested, maximum))
