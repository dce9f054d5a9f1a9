"""From what a handler did to the outcome to write: done, failed (with its delay and
whether the attempt is refunded), canceled, or abandon (the lease is gone: write nothing).

Owns the reading of the handler signals (brooq.job: Delay, PreserveAttempt, CancelJob,
raised directly or as a __cause__ at any depth) and of brooq's interruptions
(AttemptTimeout, LeaseLost), and the text of last_error (`describe`, `bounded`).

Pure: no I/O, no clock, no randomness of its own (the jitter draw is passed in). Must
never decide dead: whether a failed attempt was the last one is for job_set_failed to
say, in the same statement that writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from brooq.handlers import Policy
from brooq.job import AttemptTimeout, CancelJob, Delay, LeaseLost, PreserveAttempt
from brooq.worker.retry import backoff, delay_seconds

LAST_ERROR_MAX = 2000

Kind = Literal["done", "failed", "canceled", "abandon"]


@dataclass(frozen=True)
class Outcome:
    """What to write. ``failed`` becomes dead in SQL when the attempts are used up
    (unless ``refund``); ``abandon`` writes nothing (the lease is gone)."""

    kind: Kind
    delay: float = 0.0
    refund: bool = False
    error: str | None = None


DONE = Outcome("done")  # the common case, made once (a frozen dataclass is slow to build)


def bounded(text: str, limit: int = LAST_ERROR_MAX) -> str:
    suffix = " ... [truncated]"
    return text if len(text) <= limit else text[: limit - len(suffix)] + suffix


def describe(exc: BaseException) -> str:
    """``Type: message`` for last_error, bounded in length."""
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "brooq.job"):
        name = f"{module}.{name}"
    message = str(exc)
    return bounded(f"{name}: {message}" if message else name)


def find_signal(exc: BaseException) -> BaseException | None:
    """A brooq signal raised directly or as the __cause__ (at any depth) of ``exc``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, Delay | PreserveAttempt | CancelJob | LeaseLost | AttemptTimeout):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


def decide(exc: BaseException | None, attempts: int, policy: Policy, draw: float) -> Outcome:
    """The outcome of one attempt. ``draw`` in [0, 1) is the jitter draw."""
    if exc is None:
        return DONE
    signal = find_signal(exc)
    if isinstance(signal, LeaseLost):
        return Outcome("abandon")
    if isinstance(signal, CancelJob):
        return Outcome("canceled", error=describe(exc))
    if isinstance(signal, Delay):
        return Outcome(
            "failed",
            delay=delay_seconds(signal.seconds, policy.backoff_max),
            error=describe(exc),
        )
    wait = _jittered(attempts, policy, draw)
    if isinstance(signal, PreserveAttempt):
        return Outcome("failed", delay=wait, refund=True, error=describe(exc))
    if isinstance(signal, AttemptTimeout):
        return Outcome(
            "failed",
            delay=wait,
            error=bounded(f"AttemptTimeout: attempt_timeout {policy.attempt_timeout:g}s exceeded"),
        )
    return Outcome("failed", delay=wait, error=describe(exc))


def _jittered(attempts: int, policy: Policy, draw: float) -> float:
    return backoff(attempts, policy.backoff_base, policy.backoff_max, draw)
