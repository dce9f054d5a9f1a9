"""From what a handler did to the outcome to write: done, failed (with its delay and
whether the attempt is refunded), canceled, or abandon (the lease is gone: write nothing).

Owns the reading of the handler signals (brooq.job: Delay, PreserveAttempt, CancelJob,
raised directly or as a __cause__ at any depth) and of brooq's interruptions
(AttemptTimeout, LeaseLost), and the text of last_error (`describe`, and `storable`: what
the database can hold of a text written by the application; its length bound is
brooq.rules's, which the master reads too).

Also owns the handler's retry policy (``retry=fn``): asked only where the default backoff
would apply (a plain exception, AttemptTimeout); the signals keep their meaning.

Pure: no I/O, no clock, no randomness of its own (the jitter draw is passed in). Must
never count attempts: whether a failed attempt was the last one is for job_set_failed to
say, in the same statement that writes it. ``final`` (a payload that cannot fit its type,
a retry policy that gives up) makes it dead whatever attempts are left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from brooq.declare.handlers import Policy, RetryPolicy
from brooq.durations import MAX_SECONDS
from brooq.job import AttemptTimeout, CancelJob, Delay, LeaseLost, Parked, PreserveAttempt
from brooq.rules import LAST_ERROR_MAX, backoff, bounded, delay_seconds

Kind = Literal["done", "failed", "canceled", "abandon", "parked"]
# How a failed attempt failed, as its error history entry says (job.errors' "kind"): the
# child writes the first three (and canceled); the master killed, worker_died and
# lease_expired (brooq.supervisor).
ErrorKind = Literal["raised", "timeout", "refused"]


@dataclass(frozen=True)
class Outcome:
    """What to write. ``failed`` becomes dead in SQL when the attempts are used up
    (unless ``refund``); ``abandon`` writes nothing (the lease is gone), nor does
    ``parked`` (the durable operation that parked the job committed it: ``parked``)."""

    kind: Kind
    delay: float = 0.0
    refund: bool = False
    error: str | None = None
    final: bool = False  # failed with no more attempts, whatever max_attempts says
    policy_error: str | None = None  # the retry policy failed: the default backoff applied
    parked: Parked | None = None  # why and until when, for the log line
    error_kind: ErrorKind = "raised"  # the error history entry's kind
    # What the error history entry keeps of the traceback (brooq.ipc.tracebacks), set by
    # brooq.worker.attempt once the outcome is known; None: none.
    traceback: str | None = None


DONE = Outcome("done")  # the common case, made once (a frozen dataclass is slow to build)


def describe(exc: BaseException) -> str:
    """``Type: message`` for last_error, bounded in length. Never raises: an exception
    whose ``str()`` fails (or returns something else than a str) is named with that."""
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "brooq.job", "brooq.job", "brooq.errors"):  # brooq's own
        name = f"{module}.{name}"
    try:
        message = str(exc)
    except Exception as failure:  # the application's __str__ is application code
        message = f"<str() raised {type(failure).__qualname__}>"
    return bounded(f"{name}: {message}" if message else name)


# What no PostgreSQL text can hold (NUL), and what is not Unicode (a lone surrogate
# cannot be encoded for the wire at all).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str, codec: str | None = None, limit: int = LAST_ERROR_MAX) -> str:
    """``text`` as the database can store it, bounded to ``limit`` characters: NUL and
    lone surrogates written as the escapes Python's repr uses (``\\x00``, ``\\udc80``),
    and, for a database whose encoding is not UTF-8 (``codec``: its Python codec), every
    character that encoding lacks as its escape (``\\u20ac`` for "€" in LATIN1). The
    rendering is faithful (the escapes say which character it was, in ASCII), so brooq's
    own write of an error cannot fail on its text."""
    text = bounded(text, limit)  # what is cut off need not be escaped
    if codec is None:
        if "\x00" not in text and (text.isascii() or not _UNSTORABLE.search(text)):
            return text
        text = _UNSTORABLE.sub(_escape, text)
    else:
        text = _UNSTORABLE.sub(_escape, text).encode(codec, "backslashreplace").decode(codec)
    return bounded(text, limit)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return "\\x00" if char == "\x00" else f"\\u{ord(char):04x}"


def find_signal(exc: BaseException) -> BaseException | None:
    """A brooq signal raised directly or as the __cause__ (at any depth) of ``exc``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(
            current, Parked | Delay | PreserveAttempt | CancelJob | LeaseLost | AttemptTimeout
        ):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


def decide(
    exc: BaseException | None,
    attempts: int,
    policy: Policy,
    draw: float,
    retry: RetryPolicy | None = None,
) -> Outcome:
    """The outcome of one attempt. ``draw`` in [0, 1) is the jitter draw; ``retry`` the
    handler's policy, consulted for a plain exception or an AttemptTimeout."""
    if exc is None:
        return DONE
    signal = find_signal(exc)
    if isinstance(signal, Parked):
        return Outcome("parked", parked=signal)
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
    if isinstance(signal, PreserveAttempt):
        wait = _jittered(attempts, policy, draw)
        return Outcome("failed", delay=wait, refund=True, error=describe(exc))
    kind: ErrorKind = "raised"
    if isinstance(signal, AttemptTimeout):
        error = bounded(f"AttemptTimeout: attempt_timeout {policy.attempt_timeout:g}s exceeded")
        kind = "timeout"
    else:
        error = describe(exc)
    if retry is None:
        return Outcome(
            "failed", delay=_jittered(attempts, policy, draw), error=error, error_kind=kind
        )
    try:
        verdict = ask_retry_policy(retry, attempts, exc)
    except RetryPolicyFailed as failed:
        wait = _jittered(attempts, policy, draw)
        return Outcome("failed", delay=wait, error=error, policy_error=str(failed), error_kind=kind)
    if verdict is None:
        return Outcome("failed", error=error, final=True, error_kind=kind)
    return Outcome("failed", delay=verdict, error=error, error_kind=kind)


class RetryPolicyFailed(Exception):
    """The retry policy raised or returned something else than a timedelta or None."""


def ask_retry_policy(retry: RetryPolicy, attempt: int, exc: BaseException) -> float | None:
    """The policy's delay in seconds, clamped to [0, 36500 days] (negative means now; the
    bound keeps available_at representable), or None: no more attempts. Not clamped to
    backoff_max, which bounds the default schedule: the policy is the schedule. Raises
    RetryPolicyFailed when the policy raised or returned anything else."""
    try:
        answer = retry(attempt, exc)
    except Exception as failure:
        raise RetryPolicyFailed(describe(failure)) from None
    if answer is None:
        return None
    if not isinstance(answer, timedelta):
        raise RetryPolicyFailed(
            f"returned {type(answer).__name__}, expected a datetime.timedelta or None"
        )
    return min(max(answer.total_seconds(), 0.0), MAX_SECONDS)


def _jittered(attempts: int, policy: Policy, draw: float) -> float:
    return backoff(attempts, policy.backoff_base, policy.backoff_max, draw)
