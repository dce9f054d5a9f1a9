"""Unit tests of the worker's pure parts, without a database or a master.

execute.decide (what a handler did -> the outcome to write) for every signal, raised or
as a __cause__, at the max_attempts boundaries and with injected jitter draws; the claim
rows read by name; the armed handler call (brooq.worker.interrupts.call) on the paths
that need no signal to arrive.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq.handlers import MAX_ATTEMPTS, Policy
from brooq.job import AttemptTimeout, CancelJob, Claim, Delay, LeaseLost, PreserveAttempt
from brooq.sql import Q
from brooq.worker import execute, interrupts, retry
from brooq.worker.child import ClaimRow, claim_row
from brooq.worker.connection import Undecodable, _decode_payload
from brooq.worker.state import ChildState

POLICY = Policy(
    max_attempts=5,
    attempt_timeout=30.0,
    max_execution_timeout=300.0,
    backoff_base=1.0,
    backoff_max=60.0,
)


def _raised(exc: BaseException) -> BaseException:
    """``exc`` as a handler leaves it: raised, with its traceback."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def _raised_from(exc: BaseException, cause: BaseException) -> BaseException:
    try:
        raise exc from cause
    except BaseException as caught:
        return caught


# -- execute.decide: each signal -----------------------------------------------------------


def test_a_handler_that_returns_is_done() -> None:
    assert execute.decide(None, 1, POLICY, 0.5) == execute.Outcome("done")
    assert execute.decide(None, 1, POLICY, 0.5) is execute.DONE  # made once


def test_a_plain_exception_fails_with_backoff_and_its_description() -> None:
    outcome = execute.decide(_raised(ValueError("bad input")), 3, POLICY, 0.0)
    # attempt 3: ceiling base * 2^2 = 4s; a draw of 0 waits half of it.
    assert outcome == execute.Outcome("failed", delay=2.0, error="ValueError: bad input")


def test_an_exception_without_message_is_described_by_its_type() -> None:
    outcome = execute.decide(_raised(RuntimeError()), 1, POLICY, 0.0)
    assert outcome.error == "RuntimeError"


def test_an_exception_of_a_module_is_named_with_it() -> None:
    class Oops(Exception):
        pass

    error = execute.decide(_raised(Oops("x")), 1, POLICY, 0.0).error
    assert error == f"{__name__}.test_an_exception_of_a_module_is_named_with_it.<locals>.Oops: x"


def test_a_long_message_is_bounded() -> None:
    outcome = execute.decide(_raised(ValueError("x" * 10_000)), 1, POLICY, 0.0)
    assert outcome.error is not None
    assert outcome.error.startswith("ValueError: xxx")
    assert outcome.error.endswith("x ... [truncated]")
    assert len(outcome.error) <= execute.LAST_ERROR_MAX


def test_a_bounded_message_is_at_most_the_limit() -> None:
    # It kept limit - 15 characters and added 16: one over the limit.
    bounded = execute.bounded("x" * 10_000)
    assert len(bounded) == execute.LAST_ERROR_MAX and bounded.endswith(" ... [truncated]")


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_keyboard_interrupt_and_system_exit_in_a_handler_fail_the_attempt(
    exc: BaseException,
) -> None:
    outcome = execute.decide(_raised(exc), 1, POLICY, 0.0)
    assert outcome.kind == "failed" and not outcome.refund
    assert outcome.error is not None and outcome.error.startswith(type(exc).__name__)


def test_delay_fails_after_the_asked_seconds_and_spends_the_attempt() -> None:
    outcome = execute.decide(_raised(Delay(12)), 1, POLICY, 0.99)
    assert outcome == execute.Outcome("failed", delay=12.0, error="Delay: delay 12s")


def test_delay_is_clamped_to_backoff_max_and_ignores_the_draw() -> None:
    assert execute.decide(_raised(Delay(3600)), 1, POLICY, 0.0).delay == 60.0
    assert execute.decide(_raised(Delay(0)), 4, POLICY, 0.7).delay == 0.0


def test_preserve_attempt_fails_with_a_refund_and_the_usual_backoff() -> None:
    outcome = execute.decide(_raised(PreserveAttempt("later")), 2, POLICY, 0.5)
    # attempt 2: ceiling 2s; a draw of 0.5 waits 1.5s.
    assert outcome == execute.Outcome(
        "failed", delay=1.5, refund=True, error="PreserveAttempt: later"
    )


def test_cancel_job_cancels_without_delay() -> None:
    outcome = execute.decide(_raised(CancelJob("obsolete")), 1, POLICY, 0.5)
    assert outcome == execute.Outcome("canceled", error="CancelJob: obsolete")


def test_lease_lost_abandons_and_writes_nothing() -> None:
    outcome = execute.decide(_raised(LeaseLost("gone")), 1, POLICY, 0.5)
    assert outcome == execute.Outcome("abandon")


def test_attempt_timeout_fails_with_the_timeout_named() -> None:
    policy = Policy(
        max_attempts=5,
        attempt_timeout=2.5,
        max_execution_timeout=300.0,
        backoff_base=1.0,
        backoff_max=60.0,
    )
    outcome = execute.decide(_raised(AttemptTimeout("x")), 1, policy, 0.0)
    assert outcome == execute.Outcome(
        "failed", delay=0.5, error="AttemptTimeout: attempt_timeout 2.5s exceeded"
    )
    assert not outcome.refund


# -- execute.decide: signals as a __cause__ -------------------------------------------------


@pytest.mark.parametrize(
    ("signal", "kind", "refund"),
    [
        (Delay(5), "failed", False),
        (PreserveAttempt(), "failed", True),
        (CancelJob(), "canceled", False),
        (LeaseLost(), "abandon", False),
        (AttemptTimeout(), "failed", False),
    ],
)
def test_a_signal_as_the_cause_chooses_the_outcome(
    signal: BaseException, kind: str, refund: bool
) -> None:
    wrapped = _raised_from(RuntimeError("wrapped"), signal)
    outcome = execute.decide(wrapped, 1, POLICY, 0.0)
    assert (outcome.kind, outcome.refund) == (kind, refund)


def test_the_description_is_of_the_raised_exception_not_of_its_cause() -> None:
    wrapped = _raised_from(RuntimeError("wrapped"), CancelJob("inner"))
    assert execute.decide(wrapped, 1, POLICY, 0.0).error == "RuntimeError: wrapped"
    wrapped = _raised_from(RuntimeError("wrapped"), Delay(7))
    assert execute.decide(wrapped, 1, POLICY, 0.0) == execute.Outcome(
        "failed", delay=7.0, error="RuntimeError: wrapped"
    )


def test_a_signal_deep_in_the_cause_chain_is_found() -> None:
    exc: BaseException = CancelJob()
    for i in range(20):
        exc = _raised_from(ValueError(f"layer {i}"), exc)
    assert execute.decide(exc, 1, POLICY, 0.0).kind == "canceled"


def test_the_nearest_signal_of_the_chain_wins() -> None:
    exc = _raised_from(Delay(3), CancelJob())
    assert execute.decide(exc, 1, POLICY, 0.0).kind == "failed"


def test_a_signal_only_in_the_context_is_not_a_signal() -> None:
    """``raise X`` inside ``except CancelJob`` (no ``from``) is a plain failure."""
    try:
        try:
            raise CancelJob()
        except CancelJob:
            raise ValueError("while handling") from None
    except ValueError as caught:
        exc: BaseException = caught
    assert exc.__context__ is not None
    assert execute.decide(exc, 1, POLICY, 0.0).kind == "failed"
    try:
        try:
            raise CancelJob()
        except CancelJob:
            raise ValueError("while handling")  # noqa: B904 - the point of the test
    except ValueError as caught:
        exc = caught
    assert isinstance(exc.__context__, CancelJob)
    assert execute.decide(exc, 1, POLICY, 0.0).kind == "failed"


def test_a_cause_cycle_ends_the_search() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert execute.find_signal(a) is None
    assert execute.decide(a, 1, POLICY, 0.0).kind == "failed"


# -- execute.decide: max_attempts boundaries ------------------------------------------------
#
# decide never turns failed into dead: job_set_failed does, in SQL, when the attempts are
# used up and the outcome carries no refund. So at and past max_attempts the outcome is
# the same as before it, with the backoff of that attempt.


@pytest.mark.parametrize("attempts", [4, 5, 6])
def test_decide_does_not_judge_the_attempts_left(attempts: int) -> None:
    outcome = execute.decide(_raised(ValueError("x")), attempts, POLICY, 0.0)
    assert outcome.kind == "failed" and not outcome.refund
    assert outcome.delay == retry.backoff_ceiling(attempts, 1.0, 60.0) / 2


@pytest.mark.parametrize("attempts", [1, POLICY.max_attempts, MAX_ATTEMPTS])
def test_preserve_attempt_refunds_at_every_boundary(attempts: int) -> None:
    outcome = execute.decide(_raised(PreserveAttempt()), attempts, POLICY, 0.0)
    assert outcome.kind == "failed" and outcome.refund


def test_cancel_at_the_last_attempt_is_still_canceled() -> None:
    outcome = execute.decide(_raised(CancelJob()), POLICY.max_attempts, POLICY, 0.0)
    assert outcome.kind == "canceled"


def test_the_largest_attempt_number_waits_backoff_max_without_overflow() -> None:
    outcome = execute.decide(_raised(ValueError("x")), MAX_ATTEMPTS, POLICY, 0.999999)
    assert outcome.delay == pytest.approx(60.0, abs=1e-4)


def test_a_single_attempt_policy_still_computes_a_first_backoff() -> None:
    once = Policy(
        max_attempts=1,
        attempt_timeout=30.0,
        max_execution_timeout=300.0,
        backoff_base=4.0,
        backoff_max=60.0,
    )
    assert execute.decide(_raised(ValueError("x")), 1, once, 0.0).delay == 2.0


# -- execute.decide: the backoff bounds with injected draws ---------------------------------


@given(
    attempts=st.integers(1, 40),
    draw=st.floats(0.0, 1.0, exclude_max=True),
    base=st.floats(1e-3, 100.0),
    maximum=st.floats(1e-3, 1e5),
)
def test_the_failure_wait_lies_in_half_to_full_ceiling(
    attempts: int, draw: float, base: float, maximum: float
) -> None:
    policy = Policy(
        max_attempts=10,
        attempt_timeout=30.0,
        max_execution_timeout=300.0,
        backoff_base=base,
        backoff_max=maximum,
    )
    ceiling = retry.backoff_ceiling(attempts, base, maximum)
    for exc in (ValueError("x"), PreserveAttempt(), AttemptTimeout()):
        wait = execute.decide(_raised(exc), attempts, policy, draw).delay
        assert ceiling / 2 <= wait <= ceiling
        assert wait == retry.backoff(attempts, base, maximum, draw)


def test_the_draw_moves_the_wait_from_half_to_full_ceiling() -> None:
    waits = [execute.decide(_raised(ValueError()), 4, POLICY, d).delay for d in (0, 0.5, 0.75)]
    assert waits == [4.0, 6.0, 7.0]  # attempt 4: ceiling 8s


def test_the_ceiling_stops_at_backoff_max() -> None:
    assert execute.decide(_raised(ValueError()), 8, POLICY, 0.0).delay == 30.0  # 128 -> 60
    assert execute.decide(_raised(ValueError()), 7, POLICY, 0.0).delay == 30.0  # 64 -> 60
    assert execute.decide(_raised(ValueError()), 6, POLICY, 0.0).delay == 16.0  # 32


# -- the claim rows, by name -----------------------------------------------------------------


def test_the_claim_row_fields_are_the_columns_of_the_claim_statement() -> None:
    """ClaimRow names the columns of each claim statement's result, in order."""
    for name in ("", "_queues", "_limited", "_results", "_queues_results", "_limited_results"):
        statement = getattr(Q, f"job_finish_and_claim{name}")
        select = re.search(r"^SELECT true AS claimed, (.*?)\nFROM", statement, re.M | re.S)
        assert select is not None, name
        columns = ["claimed"] + [c.strip() for c in select.group(1).split(",")]
        assert tuple(columns) == ClaimRow._fields, name


class _FakeResult:
    def __init__(self, names: list[str]) -> None:
        self.names = [n.encode() for n in names]
        self.nfields = len(names)

    def fname(self, i: int) -> bytes:
        return self.names[i]


class _FakeCursor:
    def __init__(self, names: list[str] | None) -> None:
        self.pgresult = None if names is None else _FakeResult(names)


def test_claim_row_makes_named_rows_from_the_positions() -> None:
    make = claim_row(_FakeCursor(list(ClaimRow._fields)))  # type: ignore[arg-type]
    job_id = uuid.uuid4()
    now = datetime.now(timezone.utc)
    row = make([True, job_id, "t", {"n": 1}, 2, "h:1:x", now, now, "bulk", 7])
    assert (row.claimed, row.id, row.topic, row.payload) == (True, job_id, "t", {"n": 1})
    assert (row.attempts, row.locked_by, row.locked_until, row.available_at) == (
        2,
        "h:1:x",
        now,
        now,
    )
    assert (row.queue, row.priority) == ("bulk", 7)


@pytest.mark.parametrize(
    "names",
    [
        None,
        ["claimed", "id", "topic", "payload", "attempts", "locked_by", "locked_until"],
        ["claimed", "id", "topic", "payload", "attempt", "locked_by", "locked_until", "at"],
        ["id", "claimed", "topic", "payload", "attempts", "locked_by", "locked_until", "x"],
    ],
)
def test_claim_row_refuses_columns_that_are_not_its_fields(names: list[str] | None) -> None:
    import psycopg

    with pytest.raises(psycopg.ProgrammingError):
        claim_row(_FakeCursor(names))  # type: ignore[arg-type]


# -- payloads json cannot read ---------------------------------------------------------------


def test_an_undecodable_payload_is_a_value_not_a_crash() -> None:
    assert _decode_payload(b'{"a": 1}') == {"a": 1}
    bad = _decode_payload(b"{not json")
    assert isinstance(bad, Undecodable) and str(bad).startswith("JSONDecodeError: ")
    deep = _decode_payload("[" * 100_000 + "]" * 100_000)
    assert isinstance(deep, Undecodable) and str(deep).startswith("RecursionError: ")
    assert len(str(deep)) <= len("RecursionError: ") + 200


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
    assert interrupts.call(ran.append, claim, POLICY, state) == (None, None)
    assert ran == [claim] and not state.in_handler
    assert interrupts.call(lambda c: {"n": 1}, claim, POLICY, state) == (None, {"n": 1})

    def fails(c: Claim) -> None:
        assert state.in_handler  # interruptions may land while the handler runs
        raise ValueError("no")

    error, value = interrupts.call(fails, claim, POLICY, state)
    assert isinstance(error, ValueError) and value is None and not state.in_handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_call_does_not_run_a_job_already_lost() -> None:
    state = ChildState()
    ran: list[Claim] = []
    lost = _claim()
    state.lost.add(lost.id)
    error, _ = interrupts.call(ran.append, lost, POLICY, state)
    assert isinstance(error, LeaseLost)
    assert ran == []
