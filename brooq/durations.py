"""Durations: ``timedelta``, seconds as a number, or a string with a unit ("1m30s", "250ms")."""

from __future__ import annotations

import math
import re
from datetime import timedelta

Duration = timedelta | int | float | str

_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
# ASCII digits only: \d would also take Arabic-Indic or fullwidth digits.
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_BARE_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")

# The longest duration a setting or a handler option may be: 100 years. Far inside what
# PostgreSQL can add to now() (timestamps reach 294276 AD), what timedelta holds, and what
# threading and setitimer accept; far beyond any real lease, timeout or TTL. Without a
# bound, QUEUE_LEASE=999999999d passed and then every claim failed: timestamp out of range.
MAX_SECONDS = 100 * 365 * 86400.0
MAX_TEXT = "36500d (100 years)"


def too_long(seconds: float) -> str | None:
    """Why ``seconds`` is refused as a setting's duration, or None when it is not."""
    if seconds > MAX_SECONDS:
        return f"more than the longest duration brooq accepts, {MAX_TEXT}"
    return None


def parse_duration_string(text: str) -> float:
    """Parse "1h30m", "2.5s", "250ms" into seconds. A bare number has no unit and is refused."""
    cleaned = text.strip()
    if not cleaned:
        raise ValueError("empty duration")
    pos = 0
    total = 0.0
    for match in _PART.finditer(cleaned):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(cleaned) or pos == 0:
        if _BARE_NUMBER.fullmatch(cleaned):
            raise ValueError(f"{text!r} has no unit; write e.g. '{cleaned}s'")
        raise ValueError(f"{text!r} is not a duration; use a number with a unit: ms, s, m, h, d")
    if not math.isfinite(total):
        # float("1" * 400) is inf, not an error.
        raise ValueError(f"{text!r} is too large to be a duration")
    return total


def to_seconds(value: Duration, *, allow_bare_number: bool = True) -> float:
    """Seconds of a duration given as timedelta, number or string with a unit."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float):
        if not allow_bare_number:
            raise ValueError(f"{value!r} has no unit")
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond the float range
            # Not {value!r}: repr of an int over 4,300 digits raises ValueError itself.
            raise ValueError("an integer this large is not a duration (in seconds)") from None
        if not math.isfinite(seconds):
            raise ValueError(f"{value!r} is not a finite duration")
        return seconds
    if isinstance(value, str):
        return parse_duration_string(value)
    raise ValueError(f"{value!r} is not a duration (timedelta, seconds or a string like '30s')")


def format_seconds(seconds: float) -> str:
    """A short human form: 0.25s, 90s, 5m, 1h30m."""
    if seconds < 60 or seconds != int(seconds):
        return f"{seconds:g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = ""
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if secs:
        out += f"{secs}s"
    return out


def format_age(seconds: float) -> str:
    """A length of time at a glance, one decimal, sign dropped: 4.2s, 3.5m, 2.0h, 3.1d."""
    seconds = abs(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
