"""The ordering of a job's time limits: one attempt fits in the whole execution budget, and
the first backoff in the longest one.

    attempt_timeout <= max_execution_timeout        backoff_base <= backoff_max

Owns: that rule, its wording (settings.validate and handler registration report the same
sentence, a handler's prefixed with its topic), and how an unset handler option is capped
so that a default never contradicts a value given at registration.
Must never: know where a value came from (environment, Queue(**settings), flags, handler
options: the callers say so), or check anything but the ordering (positivity and ranges
are settings' and handlers' own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# (lower, upper): the lower limit must not exceed the upper one.
ORDERED: Final = (
    ("attempt_timeout", "max_execution_timeout"),
    ("backoff_base", "backoff_max"),
)
NAMES: Final = tuple(name for pair in ORDERED for name in pair)


def ordering_problems(seconds: Mapping[str, float | None], prefix: str = "") -> list[str]:
    """Each pair of ``seconds`` out of order, as a sentence: "attempt_timeout (600s) must
    not exceed max_execution_timeout (300s)". A pair with a value missing (None), or whose
    upper value is not positive (reported as such elsewhere), is not judged."""
    problems = []
    for low, high in ORDERED:
        low_s, high_s = seconds.get(low), seconds.get(high)
        if low_s is not None and high_s is not None and low_s > high_s > 0:
            problems.append(f"{prefix}{low} ({low_s:g}s) must not exceed {high} ({high_s:g}s)")
    return problems


def resolve(given: Mapping[str, float | None], defaults: Mapping[str, float]) -> dict[str, float]:
    """The four limits of a handler: a value given wins, else the default. An unset lower
    limit is capped by the upper one actually used: a handler registered with
    max_execution_timeout="30s" runs attempts of at most 30s even if the queue's
    attempt_timeout is 1m (and the same for backoff_base under backoff_max)."""
    limits: dict[str, float] = {}
    for low, high in ORDERED:
        given_high = given.get(high)
        upper = defaults[high] if given_high is None else given_high
        given_low = given.get(low)
        limits[low] = min(defaults[low], upper) if given_low is None else given_low
        limits[high] = upper
    return limits
