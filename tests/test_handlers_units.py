"""Pure logic of the handler model: the middleware chain, the retry policy's verdicts,
registration checks, and the _results claim statements held to their base."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

import brooq
from brooq.durations import MAX_SECONDS
from brooq.handlers import Policy, build
from brooq.job import Delay, PreserveAttempt
from brooq.worker import execute
from brooq.worker.chain import compose

POLICY = Policy(5, 60.0, 300.0, 1.0, 60.0)


def test_no_middleware_is_the_handler_itself() -> None:
    def fn(claim: Any) -> None:
        return None

    assert compose(fn, ()) is fn


def test_the_first_middleware_is_outermost() -> None:
    seen: list[str] = []

    def layer(name: str) -> Any:
        def run(claim: Any, call_next: Any) -> Any:
            seen.append(f"in:{name}")
            value = call_next(claim)
            seen.append(f"out:{name}")
            return (name, value)

        return run

    def fn(claim: Any) -> str:
        seen.append("fn")
        return "v"

    runner = compose(fn, (layer("a"), layer("b"), layer("c")))
    assert runner(None) == ("a", ("b", ("c", "v")))
    assert seen == ["in:a", "in:b", "in:c", "fn", "out:c", "out:b", "out:a"]


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


def test_registration_refuses_bad_middleware_and_retry() -> None:
    def fn(claim: Any) -> None:
        return None

    def one_argument(claim: Any) -> None:
        return None

    with pytest.raises(brooq.InvalidSettings) as caught:
        build(
            "t",
            fn,
            max_attempts=None,
            attempt_timeout=None,
            max_execution_timeout=None,
            backoff_base=None,
            backoff_max=None,
            middleware=[one_argument, "nope"],  # type: ignore[list-item]
            retry=3,  # type: ignore[arg-type]
        )
    assert caught.value.problems == [
        "t: middleware[0] must be callable as fn(claim, call_next): 'one_argument' is not",
        "t: middleware[1] must be callable as fn(claim, call_next), got str",
        "t: retry must be callable as fn(attempt, exc), got int",
    ]
    queue = brooq.Queue("postgresql://nowhere/x")
    with pytest.raises(brooq.InvalidSettings, match="middleware must be callable"):
        queue.middleware(one_argument)
    assert queue.middlewares == []


def test_registration_refuses_a_payload_type_it_cannot_check() -> None:
    queue = brooq.Queue("postgresql://nowhere/x")
    with pytest.raises(brooq.InvalidSettings, match=r"^invalid settings:\n  - t: payload: "):
        queue.handler("t", payload=int)(lambda claim: None)
    assert "t" not in queue.handlers
