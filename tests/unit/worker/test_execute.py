"""What a handler did -> the outcome to write (brooq.worker.execute.decide), for every signal,
raised or as a __cause__, at the max_attempts boundaries, with injected jitter draws and retry
policies; and the rendering of error text that PostgreSQL's text cannot hold (storable,
describe).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import brooq
from brooq import rules
from brooq.declare.handlers import MAX_ATTEMPTS, Policy
from brooq.durations import MAX_SECONDS
from brooq.job import AttemptTimeout, CancelJob, Delay, LeaseLost, PreserveAttempt
from brooq.worker import execute

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
    assert len(outcome.error) <= rules.LAST_ERROR_MAX


def test_a_bounded_message_is_at_most_the_limit() -> None:
    # It kept limit - 15 characters and added 16: one over the limit.
    bounded = rules.bounded("x" * 10_000)
    assert len(bounded) == rules.LAST_ERROR_MAX and bounded.endswith(" ... [truncated]")


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
        "failed",
        delay=0.5,
        error="AttemptTimeout: attempt_timeout 2.5s exceeded",
        error_kind="timeout",  # the error history entry's kind
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
    assert outcome.delay == rules.backoff_ceiling(attempts, 1.0, 60.0) / 2


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
    ceiling = rules.backoff_ceiling(attempts, base, maximum)
    for exc in (ValueError("x"), PreserveAttempt(), AttemptTimeout()):
        wait = execute.decide(_raised(exc), attempts, policy, draw).delay
        assert ceiling / 2 <= wait <= ceiling
        assert wait == rules.backoff(attempts, base, maximum, draw)


def test_the_draw_moves_the_wait_from_half_to_full_ceiling() -> None:
    waits = [execute.decide(_raised(ValueError()), 4, POLICY, d).delay for d in (0, 0.5, 0.75)]
    assert waits == [4.0, 6.0, 7.0]  # attempt 4: ceiling 8s


def test_the_ceiling_stops_at_backoff_max() -> None:
    assert execute.decide(_raised(ValueError()), 8, POLICY, 0.0).delay == 30.0  # 128 -> 60
    assert execute.decide(_raised(ValueError()), 7, POLICY, 0.0).delay == 30.0  # 64 -> 60
    assert execute.decide(_raised(ValueError()), 6, POLICY, 0.0).delay == 16.0  # 32


POLICY = Policy(5, 60.0, 300.0, 1.0, 60.0)


def decide(exc: BaseException, retry: Any, attempts: int = 1) -> execute.Outcome:
    return execute.decide(exc, attempts, POLICY, 0.5, retry)


def test_a_retry_policy_returning_none_is_final() -> None:
    outcome = decide(ValueError("x"), lambda attempt, exc: None)
    assert outcome.kind == "failed" and outcome.final and outcome.error == "ValueError: x"


def test_a_retry_policy_gets_the_attempt_and_the_exception() -> None:
    got: list[tuple[int, BaseException]] = []
    exc = ValueError("x")

    def policy(attempt: int, e: BaseException) -> timedelta:
        got.append((attempt, e))
        return timedelta(seconds=7.5)

    outcome = decide(exc, policy, attempts=3)
    assert got == [(3, exc)]
    assert outcome.delay == 7.5 and not outcome.final and outcome.policy_error is None


@pytest.mark.parametrize(
    ("answer", "delay"),
    [
        (timedelta(seconds=-5), 0.0),  # the past means now
        (timedelta(days=100 * 365 + 30), MAX_SECONDS),  # kept representable
        (timedelta(hours=2), 7200.0),  # not capped by backoff_max (60 s)
    ],
)
def test_a_retry_policy_delay_is_clamped(answer: timedelta, delay: float) -> None:
    assert decide(ValueError(), lambda a, e: answer).delay == delay


@pytest.mark.parametrize(
    ("policy", "problem"),
    [
        (lambda a, e: 5, "returned int, expected a datetime.timedelta or None"),
        (lambda a, e: {}["k"], "KeyError: 'k'"),
    ],
)
def test_a_failing_retry_policy_falls_back_to_the_default_backoff(
    policy: Any, problem: str
) -> None:
    outcome = decide(ValueError("x"), policy)
    default = execute.decide(ValueError("x"), 1, POLICY, 0.5)
    assert outcome.policy_error == problem
    assert outcome.delay == default.delay and not outcome.final


def test_a_retry_policy_is_asked_for_a_timeout_but_not_for_the_signals() -> None:
    asked: list[int] = []

    def policy(attempt: int, exc: BaseException) -> None:
        asked.append(attempt)
        return None

    assert decide(brooq.AttemptTimeout("t"), policy).final
    assert decide(Delay(3), policy).delay == 3 and not decide(Delay(3), policy).final
    assert decide(PreserveAttempt(), policy).refund
    assert decide(brooq.CancelJob(), policy).kind == "canceled"
    assert asked == [1]


# -- the rendering ------------------------------------------------------------------------


def test_storable_escapes_what_no_postgresql_text_holds() -> None:
    assert execute.storable("a\x00b") == "a\\x00b"
    assert execute.storable("lone \udc80 here") == "lone \\udc80 here"
    assert execute.storable("\ud83d") == "\\ud83d"
    # Valid text is given back as it is, non-ASCII included.
    assert execute.storable("café € 😀") == "café € 😀"
    text = "plain"
    assert execute.storable(text) is text


def test_storable_escapes_what_the_database_encoding_lacks() -> None:
    assert execute.storable("5 € café", "iso8859-1") == "5 \\u20ac café"
    assert execute.storable("5 € café", "ascii") == "5 \\u20ac caf\\xe9"
    assert execute.storable("nul\x00 \udc80 €", "iso8859-1") == "nul\\x00 \\udc80 \\u20ac"
    for codec in ("iso8859-1", "ascii", "cp1252"):
        rendered = execute.storable("x\x00\udc80€\u4e2d" * 50, codec)
        rendered.encode(codec)  # holds only what the encoding can
        assert "\x00" not in rendered


def test_storable_is_bounded_after_escaping() -> None:
    for text in ("\x00" * 5000, "€" * 5000, "a" * 5000):
        for codec in (None, "ascii"):
            rendered = execute.storable(text, codec, limit=100)
            assert len(rendered) <= 100
            assert rendered.endswith(" ... [truncated]")


def test_describe_never_raises() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    class NotText(Exception):
        def __str__(self) -> Any:
            return 42

    assert execute.describe(Unprintable()).endswith("Unprintable: <str() raised RuntimeError>")
    assert execute.describe(NotText()).endswith("NotText: <str() raised TypeError>")
