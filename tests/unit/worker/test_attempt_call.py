"""The armed handler call (brooq.worker.attempt.call): the paths that need no signal to
arrive, and the soft limit's timer, set only when it would fire too late for the attempt
starting (brooq.worker.attempt.arm) and set again when it fires early (alarm).
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from brooq.declare.handlers import Policy
from brooq.job import AttemptTimeout, Claim, LeaseLost
from brooq.worker import attempt
from brooq.worker.state import ChildState

POLICY = Policy(
    max_attempts=5,
    attempt_timeout=30.0,
    max_execution_timeout=300.0,
    backoff_base=1.0,
    backoff_max=60.0,
)


# -- the armed handler call, on the paths that need no signal --------------------------------


def _claim(payload: Any = None) -> Claim:
    return Claim(
        id=uuid.uuid4(),
        topic="t",
        payload=payload,
        attempt=1,
        locked_by="h:1:x",
        locked_until=datetime.now(timezone.utc),
    )


def test_call_returns_what_the_handler_raised_and_leaves_no_deadline() -> None:
    state = ChildState()
    ran: list[Claim] = []
    claim = _claim()
    assert attempt.call(ran.append, claim, POLICY, state) == (None, None)
    assert ran == [claim] and not state.in_handler
    assert attempt.call(lambda c: {"n": 1}, claim, POLICY, state) == (None, {"n": 1})

    def fails(c: Claim) -> None:
        assert state.in_handler  # interruptions may land while the handler runs
        raise ValueError("no")

    error, value = attempt.call(fails, claim, POLICY, state)
    assert isinstance(error, ValueError) and value is None and not state.in_handler
    assert state.deadline == attempt.NEVER  # the timer, if it fires, finds nothing to do
    signal.setitimer(signal.ITIMER_REAL, 0)


def test_call_does_not_run_a_job_already_lost() -> None:
    state = ChildState()
    ran: list[Claim] = []
    lost = _claim()
    state.lost.add(lost.id)
    error, _ = attempt.call(ran.append, lost, POLICY, state)
    assert isinstance(error, LeaseLost)
    assert ran == []


# -- the soft limit's timer ------------------------------------------------------------------


@pytest.fixture
def armed() -> Iterator[ChildState]:
    """A ChildState whose SIGALRM is the child's (attempt.alarm); the timer cleared after."""
    state = ChildState()
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: attempt.alarm(state))
    try:
        yield state
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _policy(timeout: float) -> Policy:
    return Policy(
        max_attempts=5,
        attempt_timeout=timeout,
        max_execution_timeout=300.0,
        backoff_base=1.0,
        backoff_max=60.0,
    )


def _spins(seconds: float) -> Any:
    """A handler that runs ``seconds`` unless interrupted; returns how long it ran."""

    def handler(c: Claim) -> float:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            time.sleep(0.005)
        return time.monotonic() - started

    return handler


def test_the_timer_is_set_once_for_attempts_of_one_timeout(armed: ChildState) -> None:
    """The second attempt's deadline is later than the timer set by the first: the timer
    is left as it is (no system call), and fires where the first one set it."""
    attempt.call(lambda c: None, _claim(), POLICY, armed)
    first = armed.alarm_at
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert 0 < left <= 30 and first < attempt.NEVER
    attempt.call(lambda c: None, _claim(), POLICY, armed)
    assert armed.alarm_at == first
    assert signal.getitimer(signal.ITIMER_REAL)[0] <= left


def test_a_timer_left_by_an_ended_attempt_fires_into_nothing(armed: ChildState) -> None:
    attempt.call(lambda c: None, _claim(), _policy(0.05), armed)
    deadline = time.monotonic() + 5
    while armed.alarm_at != attempt.NEVER:  # fired: alarm() cleared it, raising nothing
        assert time.monotonic() < deadline, "the timer never fired"
        time.sleep(0.01)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # not set again


def test_a_timer_set_for_an_earlier_attempt_is_set_again_for_the_running_one(
    armed: ChildState,
) -> None:
    """The timer fires at the first attempt's deadline while the second runs, whose
    deadline is later: no AttemptTimeout then, but at its own deadline."""
    attempt.call(lambda c: None, _claim(), _policy(0.05), armed)
    error, ran = attempt.call(_spins(5.0), _claim(), _policy(0.3), armed)
    assert isinstance(error, AttemptTimeout) and ran is None
    assert armed.deadline == attempt.NEVER and not armed.in_handler


def test_a_shorter_timeout_than_the_timer_sets_it_sooner(armed: ChildState) -> None:
    attempt.call(lambda c: None, _claim(), _policy(60.0), armed)
    started = time.monotonic()
    error, _ = attempt.call(_spins(10.0), _claim(), _policy(0.05), armed)
    assert isinstance(error, AttemptTimeout)
    assert time.monotonic() - started < 5.0  # its own 0.05 s, not the first's 60 s


def test_the_running_attempt_is_not_stopped_before_its_deadline(armed: ChildState) -> None:
    """The early firing (at 0.05 s) lets the second attempt (1 s limit) run on: a
    handler of 0.2 s returns what it returned."""
    attempt.call(lambda c: None, _claim(), _policy(0.05), armed)
    error, ran = attempt.call(_spins(0.2), _claim(), _policy(1.0), armed)
    assert error is None and ran >= 0.2
