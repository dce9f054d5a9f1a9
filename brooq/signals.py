"""The signals a handler raises to choose its outcome (Delay, PreserveAttempt,
CancelJob) and the interruptions brooq raises into a running handler (AttemptTimeout,
LeaseLost). brooq.job names them too, as does the package.

Owns: the exception classes and their words. Must never: do I/O or import from brooq.
"""

from __future__ import annotations

# Handler signals: raise them (or raise from them) to choose the outcome.


class HandlerSignal(Exception):
    """Base of the exceptions a handler raises to choose its outcome."""


class Delay(HandlerSignal):
    """Retry after ``seconds`` (clamped to backoff_max). The attempt stays spent."""

    def __init__(self, seconds: float) -> None:
        seconds = float(seconds)
        if not seconds >= 0:
            raise ValueError(f"Delay needs a non-negative number of seconds, got {seconds!r}")
        self.seconds = seconds
        super().__init__(f"delay {seconds:g}s")


class PreserveAttempt(HandlerSignal):
    """Retry later without spending this attempt; never leads to dead."""


class CancelJob(HandlerSignal):
    """The job is no longer relevant: canceled, whatever attempts remain."""


# Raised into handlers by brooq.


class Interruption(BaseException):
    """Raised into a running handler by brooq. A BaseException, so ``except Exception``
    in user code does not swallow it by accident."""


class AttemptTimeout(Interruption):
    """The handler ran past its attempt_timeout; the attempt counts as failed."""


class LeaseLost(Interruption):
    """The job is no longer ours (canceled, reaped): stop, nothing will be written."""
