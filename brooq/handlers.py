"""Handler registration and per-topic policy (attempts, timeouts, backoff)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brooq.durations import Duration, to_seconds, too_long
from brooq.errors import InvalidSettings
from brooq.job import validate_topic

if TYPE_CHECKING:
    from brooq.job import Claim
    from brooq.settings import Settings

HandlerFn = Callable[["Claim"], None]
MAX_ATTEMPTS = 2**31 - 1  # the job's attempts column is a PostgreSQL integer


@dataclass(frozen=True)
class Policy:
    """How one topic is run. Times in seconds."""

    max_attempts: int
    attempt_timeout: float
    max_execution_timeout: float
    backoff_base: float
    backoff_max: float


@dataclass(frozen=True)
class Handler:
    topic: str
    fn: HandlerFn
    # Values given at registration; None falls back to the queue's settings.
    max_attempts: int | None
    attempt_timeout: float | None
    max_execution_timeout: float | None
    backoff_base: float | None
    backoff_max: float | None

    def policy(self, settings: Settings) -> Policy:
        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        max_execution = pick(self.max_execution_timeout, settings.max_execution_timeout)
        backoff_max = pick(self.backoff_max, settings.backoff_max)
        # A default never contradicts a value given at registration: an unset
        # attempt_timeout (backoff_base) is capped by the max_execution_timeout
        # (backoff_max) the handler asked for.
        return Policy(
            max_attempts=pick(self.max_attempts, settings.max_attempts),
            attempt_timeout=pick(
                self.attempt_timeout, min(settings.attempt_timeout, max_execution)
            ),
            max_execution_timeout=max_execution,
            backoff_base=pick(self.backoff_base, min(settings.backoff_base, backoff_max)),
            backoff_max=backoff_max,
        )


def policy_problems(topic: str, policy: Policy) -> list[str]:
    problems = []
    if policy.max_attempts < 1:
        problems.append(f"{topic}: max_attempts must be at least 1, got {policy.max_attempts}")
    for name in ("attempt_timeout", "max_execution_timeout", "backoff_base", "backoff_max"):
        value = getattr(policy, name)
        if value <= 0:
            problems.append(f"{topic}: {name} must be positive, got {value:g}s")
    if policy.attempt_timeout > policy.max_execution_timeout > 0:
        problems.append(
            f"{topic}: attempt_timeout ({policy.attempt_timeout:g}s) must not exceed "
            f"max_execution_timeout ({policy.max_execution_timeout:g}s)"
        )
    if policy.backoff_base > policy.backoff_max > 0:
        problems.append(
            f"{topic}: backoff_base ({policy.backoff_base:g}s) must not exceed "
            f"backoff_max ({policy.backoff_max:g}s)"
        )
    return problems


def build(
    topic: str,
    fn: HandlerFn,
    *,
    max_attempts: int | None,
    attempt_timeout: Duration | None,
    max_execution_timeout: Duration | None,
    backoff_base: Duration | None,
    backoff_max: Duration | None,
) -> Handler:
    """Validate what was given at registration and return the Handler."""
    validate_topic(topic)
    problems: list[str] = []
    if not callable(fn):
        problems.append(f"{topic}: the handler must be callable")
    seconds: dict[str, float | None] = {}
    for name, value in (
        ("attempt_timeout", attempt_timeout),
        ("max_execution_timeout", max_execution_timeout),
        ("backoff_base", backoff_base),
        ("backoff_max", backoff_max),
    ):
        if value is None:
            seconds[name] = None
            continue
        try:
            seconds[name] = to_seconds(value)
        except ValueError as exc:
            problems.append(f"{topic}: {name}: {exc}")
            seconds[name] = None
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
    ):
        problems.append(f"{topic}: max_attempts must be an integer, got {max_attempts!r}")
        max_attempts = None
    if max_attempts is not None and max_attempts < 1:
        problems.append(f"{topic}: max_attempts must be at least 1, got {max_attempts}")
    if max_attempts is not None and max_attempts > MAX_ATTEMPTS:
        # attempts is an integer column; and not {max_attempts}: a huge int's text raises.
        problems.append(f"{topic}: max_attempts must be at most {MAX_ATTEMPTS}")
    for name, value in seconds.items():
        if value is not None and value <= 0:
            problems.append(f"{topic}: {name} must be positive, got {value:g}s")
        reason = None if value is None else too_long(value)
        if reason:
            problems.append(f"{topic}: {name}: {reason}")
    pairs = (("attempt_timeout", "max_execution_timeout"), ("backoff_base", "backoff_max"))
    for low, high in pairs:
        low_s, high_s = seconds[low], seconds[high]
        if low_s is not None and high_s is not None and low_s > high_s > 0:
            problems.append(f"{topic}: {low} ({low_s:g}s) must not exceed {high} ({high_s:g}s)")
    if problems:
        raise InvalidSettings(problems)
    return Handler(topic=topic, fn=fn, max_attempts=max_attempts, **seconds)
