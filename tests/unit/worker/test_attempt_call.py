"""The armed handler call (brooq.worker.attempt.call) on the paths that need no signal to
arrive.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from brooq.declare.handlers import Policy
from brooq.job import Claim, LeaseLost
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


def test_call_returns_what_the_handler_raised_and_disarms() -> None:
    import signal

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
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_call_does_not_run_a_job_already_lost() -> None:
    state = ChildState()
    ran: list[Claim] = []
    lost = _claim()
    state.lost.add(lost.id)
    error, _ = attempt.call(ran.append, lost, POLICY, state)
    assert isinstance(error, LeaseLost)
    assert ran == []
