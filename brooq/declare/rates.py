"""Rates: at most N starts in any window of a period, as ``"N/s"``, ``"N/m"``, ``"N/h"`` or
``brooq.Rate(N, per=timedelta(...))``, for the handler options ``rate_limit`` and
``group_rate_limit`` (docs/how-to/rate-limits.md, docs/explanation/rate-limits.md).

A start is counted from its claim. A handler is called a few milliseconds after its job
was claimed, so that the starts the handlers see keep the rate too, each start holds its
place in the window for the period plus an allowance (``Rate.allowance``: a twentieth of
the period, at least ALLOWANCE_MIN, at most ALLOWANCE_MAX), and a child that could not
call the handler within the allowance of sending its claim gives the job back unstarted
(brooq.worker.pacing).

Owns: ``Rate`` (its bounds and its words), ``parse_rate`` (what the options accept) and
the allowance. Must never: do I/O, or read a clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from brooq.durations import Duration, format_seconds, to_seconds

# N is bound as a PostgreSQL integer.
MAX_LIMIT: Final = 2**31 - 1
# The shortest period and the longest (a month's quota).
MIN_PERIOD: Final = 0.1
MAX_PERIOD: Final = 31 * 86400.0
# The allowance: a twentieth of the period, at least ALLOWANCE_MIN, at most
# ALLOWANCE_MAX. A twentieth of the shortest period is less than a claim's round trip on
# a loaded host: a rate of that period then gives many of its claims back late beside
# busy processes and reaches much less of its rate than idle; with ALLOWANCE_MIN it
# reaches the same share either way (tests/process/test_short_rates.py). ALLOWANCE_MIN
# is a fifth of the shortest period, so 5/6 of any rate stays reachable; a period of
# ALLOWANCE_MIN / ALLOWANCE_SHARE or more keeps its twentieth.
ALLOWANCE_SHARE: Final = 0.05
ALLOWANCE_MIN: Final = 0.02
ALLOWANCE_MAX: Final = 0.25
_UNITS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}
_TEXT = re.compile(r"([0-9]+)/(s|m|h)")
FORMS: Final = "'N/s', 'N/m', 'N/h' (N a whole number from 1) or brooq.Rate(N, per=timedelta(...))"


@dataclass(frozen=True, init=False)
class Rate:
    """At most ``limit`` starts in any window of ``per``: ``Rate(50, per=timedelta(seconds=1))``
    is ``"50/s"``. ``per`` is a timedelta, seconds, or a duration text ("2.5s")."""

    limit: int
    seconds: float  # the period

    def __init__(self, limit: int, per: Duration = timedelta(seconds=1)) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise ValueError(f"a rate's limit must be a whole number, got {limit!r}")
        if not 1 <= limit <= MAX_LIMIT:
            raise ValueError(f"a rate's limit must be from 1 to {MAX_LIMIT:,}, got {limit:,}")
        seconds = to_seconds(per)
        if not MIN_PERIOD <= seconds <= MAX_PERIOD:
            raise ValueError(
                f"a rate's period must be from {MIN_PERIOD:g}s to 31d, got {seconds:g}s"
            )
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "seconds", seconds)

    @property
    def per(self) -> timedelta:
        return timedelta(seconds=self.seconds)

    @property
    def allowance(self) -> float:
        """Seconds a handler may start after its claim was sent; a start's place in the
        window lasts the period plus this (see ALLOWANCE_SHARE and ALLOWANCE_MIN)."""
        return min(max(self.seconds * ALLOWANCE_SHARE, ALLOWANCE_MIN), ALLOWANCE_MAX)

    @property
    def window(self) -> float:
        """Seconds a start holds its place in the window: the period and the allowance."""
        return self.seconds + self.allowance

    def __str__(self) -> str:
        for unit, seconds in _UNITS.items():
            if self.seconds == seconds:
                return f"{self.limit}/{unit}"
        return f"{self.limit}/{format_seconds(self.seconds)}"

    def __repr__(self) -> str:
        return f"Rate({self.limit}, per={self.per!r})"

    def to_dict(self) -> dict[str, object]:
        return {"limit": self.limit, "per_seconds": self.seconds, "text": str(self)}


def parse_rate(value: object, option: str) -> Rate:
    """``value`` as a Rate: a Rate, or ``"N/s"``, ``"N/m"``, ``"N/h"``; a ValueError naming
    ``option`` and the accepted forms otherwise."""
    if isinstance(value, Rate):
        return value
    if isinstance(value, str):
        found = _TEXT.fullmatch(value.strip())
        if found:
            try:
                return Rate(int(found.group(1)), _UNITS[found.group(2)])
            except ValueError as exc:
                raise ValueError(f"{option}: {exc}") from None
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
    raise ValueError(f"{option} must be {FORMS}, got {shown}")
