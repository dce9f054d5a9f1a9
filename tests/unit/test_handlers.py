"""Handler registration (brooq.declare.handlers): options in seconds with settings as
fallback, every problem reported at once, middleware of the right kind, payload types,
queue and options.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

import pytest

import brooq
from brooq import settings
from brooq.declare import handlers
from brooq.declare.handlers import build
from brooq.errors import InvalidSettings, InvalidTopic

# -- handler registration ----------------------------------------------------------------


def _build(**options: Any) -> handlers.Handler:
    given_options = {
        "max_attempts": None,
        "attempt_timeout": None,
        "max_execution_timeout": None,
        "backoff_base": None,
        "backoff_max": None,
    }
    given_options.update(options)
    return handlers.build("report.render", lambda claim: None, **given_options)


def test_handler_options_in_seconds_and_fallback_to_settings() -> None:
    h = _build(max_attempts=3, attempt_timeout="10s", backoff_max=timedelta(minutes=2))
    assert (h.max_attempts, h.attempt_timeout, h.backoff_max) == (3, 10.0, 120.0)
    policy = h.policy(settings.Settings(max_execution_timeout=600.0, backoff_base=2.0))
    assert policy == handlers.Policy(
        max_attempts=3,
        attempt_timeout=10.0,
        max_execution_timeout=600.0,
        backoff_base=2.0,
        backoff_max=120.0,
    )
    assert handlers.policy_problems("report.render", policy) == []


def test_handler_attempt_timeout_above_max_execution_timeout() -> None:
    with pytest.raises(InvalidSettings) as info:
        _build(attempt_timeout="10m", max_execution_timeout="5m")
    assert info.value.problems == [
        "report.render: attempt_timeout (600s) must not exceed max_execution_timeout (300s)"
    ]


def test_handler_problems_are_all_reported() -> None:
    with pytest.raises(InvalidSettings) as info:
        _build(
            max_attempts=0,
            attempt_timeout="10m",
            max_execution_timeout="5m",
            backoff_base=0,
            backoff_max=-1,
        )
    problems = info.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "max_attempts must be at least 1, got 0" in text
    assert "backoff_base must be positive, got 0s" in text
    assert "backoff_max must be positive, got -1s" in text
    assert "attempt_timeout (600s) must not exceed max_execution_timeout (300s)" in text
    assert all(p.startswith("report.render: ") for p in problems)


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": True},
        {"max_attempts": "3"},
        {"max_attempts": -2},
        {"attempt_timeout": "30"},
        {"attempt_timeout": "soon"},
        {"attempt_timeout": 0},
        {"max_execution_timeout": timedelta(seconds=-1)},
        {"backoff_base": "1m", "backoff_max": "1s"},
        {"backoff_base": 10**400},
    ],
)
def test_bad_handler_options(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidSettings) as info:
        _build(**options)
    assert len(info.value.problems) == 1, info.value.problems


def test_queue_handler_validates_at_registration() -> None:
    q = brooq.Queue("postgresql://nobody@127.0.0.1:1/nothing")
    with pytest.raises(InvalidSettings):
        q.handler("a", attempt_timeout="10m", max_execution_timeout="5m")(lambda claim: None)
    with pytest.raises(InvalidTopic):
        q.handler("Not A Topic")(lambda claim: None)
    assert q.handlers == {}


def test_policy_problems_for_settings_fallbacks() -> None:
    h = _build(attempt_timeout="10m")
    policy = h.policy(settings.Settings(max_execution_timeout=300.0))
    assert handlers.policy_problems("t", policy) == [
        "t: attempt_timeout (600s) must not exceed max_execution_timeout (300s)"
    ]


# -- middleware kinds, the async chain -------------------------------------------------------------


async def ahandler(claim: Any) -> Any:
    return ["handler"]


def test_a_middleware_of_the_other_kind_is_refused_naming_the_topic_and_index() -> None:
    queue = brooq.Queue()

    def sync_mw(claim: Any, call_next: Any) -> Any:
        return call_next(claim)

    async def async_mw(claim: Any, call_next: Any) -> Any:
        return await call_next(claim)

    with pytest.raises(InvalidSettings) as info:
        queue.handler("a.t", middleware=[async_mw, sync_mw])(ahandler)
    assert info.value.problems == [
        "a.t: middleware[1] is a sync function and the handler is async: its "
        "call_next(claim) would return before the job ran; write it as async def "
        "fn(claim, call_next)"
    ]
    with pytest.raises(InvalidSettings) as info:
        queue.handler("s.t", middleware=[async_mw])(lambda claim: None)
    assert "s.t: middleware[0] is async and the handler is sync" in info.value.problems[0]
    # Global middleware of either kind is taken: each wraps the handlers of its kind.
    queue.middleware(sync_mw)
    queue.middleware(async_mw)
    assert len(queue.middlewares) == 2


def test_async_kind_is_seen_through_partials_and_callable_objects() -> None:
    queue = brooq.Queue()

    class Handler:
        async def __call__(self, claim: Any) -> None:
            return None

    async def with_arg(extra: int, claim: Any) -> None:
        return None

    queue.handler("a.partial")(functools.partial(with_arg, 1))
    queue.handler("a.object")(Handler())
    queue.handler("s.plain")(lambda claim: None)
    kinds = {t: h.is_async for t, h in queue.handlers.items()}
    assert kinds == {"a.partial": True, "a.object": True, "s.plain": False}


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


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"global_limit": 0}, "global_limit must be from 1"),
        ({"global_limit": -3}, "global_limit must be from 1"),
        ({"global_limit": 2.5}, "global_limit must be an integer"),
        ({"global_limit": True}, "global_limit must be an integer"),
        ({"global_limit": 2**31}, "global_limit must be at most"),
        ({"group_limit": 0}, "t: group_limit must be from 1"),
        ({"group_limit": "2"}, "t: group_limit must be an integer from 1"),
        ({"rate_limit": "50/x"}, r"t: rate_limit must be 'N/s', 'N/m', 'N/h'"),
        ({"rate_limit": 50}, r"t: rate_limit must be 'N/s'.* got 50"),
        ({"rate_limit": "0/s"}, "t: rate_limit: a rate's limit must be from 1"),
        ({"group_rate_limit": "5 per second"}, r"t: group_rate_limit must be 'N/s'"),
        ({"group_rate_limit": "-1/m"}, r"t: group_rate_limit must be 'N/s'"),
        ({"queue": "Not ok"}, "t: queue 'Not ok' does not match"),
    ],
)
def test_bad_handler_options_are_refused(kwargs: dict[str, Any], text: str) -> None:
    queue = brooq.Queue("postgresql://unused")
    with pytest.raises(InvalidSettings, match=text):
        queue.handler("t", **kwargs)(print)
    assert queue.handlers == {}
