"""The ordering of the time limits (brooq.settings), for settings and handler options alike."""

from __future__ import annotations

import pytest

from brooq import settings
from brooq.declare import handlers
from brooq.errors import InvalidSettings

# -- the ordering of timeouts and backoff ---------------------------------------------------


def test_ordering_problems_word_each_pair() -> None:
    seconds = {
        "attempt_timeout": 600.0,
        "max_execution_timeout": 300.0,
        "backoff_base": 120.0,
        "backoff_max": 60.0,
    }
    assert settings.ordering_problems(seconds) == [
        "attempt_timeout (600s) must not exceed max_execution_timeout (300s)",
        "backoff_base (120s) must not exceed backoff_max (60s)",
    ]
    assert settings.ordering_problems(seconds, prefix="t: ") == [
        "t: attempt_timeout (600s) must not exceed max_execution_timeout (300s)",
        "t: backoff_base (120s) must not exceed backoff_max (60s)",
    ]


@pytest.mark.parametrize(
    "seconds",
    [
        {"attempt_timeout": 60.0, "max_execution_timeout": 60.0},  # equal is fine
        {"attempt_timeout": 600.0, "max_execution_timeout": None},  # unset: not judged
        {"attempt_timeout": None, "max_execution_timeout": 1.0},
        {"attempt_timeout": 600.0, "max_execution_timeout": 0.0},  # "must be positive" instead
        {"backoff_base": 5.0, "backoff_max": -1.0},
        {},
    ],
)
def test_ordering_problems_judge_only_complete_positive_pairs(
    seconds: dict[str, float | None],
) -> None:
    assert settings.ordering_problems(seconds) == []


def test_settings_and_handlers_word_the_ordering_alike() -> None:
    values = {"attempt_timeout": 600.0, "max_execution_timeout": 300.0}
    expected = settings.ordering_problems(values)
    with pytest.raises(InvalidSettings) as from_settings:
        settings.load(environ={}, overrides=values)
    assert from_settings.value.problems == expected
    with pytest.raises(InvalidSettings) as from_handler:
        handlers.build(
            "t",
            lambda claim: None,
            max_attempts=None,
            attempt_timeout="10m",
            max_execution_timeout="5m",
            backoff_base=None,
            backoff_max=None,
        )
    assert from_handler.value.problems == [f"t: {p}" for p in expected]
    bad_policy = handlers.Policy(5, 600.0, 300.0, 1.0, 60.0)
    assert handlers.policy_problems("t", bad_policy) == [f"t: {p}" for p in expected]


def test_resolve_prefers_what_was_given() -> None:
    defaults = {
        "attempt_timeout": 60.0,
        "max_execution_timeout": 300.0,
        "backoff_base": 1.0,
        "backoff_max": 60.0,
    }
    assert settings.resolve({}, defaults) == defaults
    given = {
        "attempt_timeout": 5.0,
        "max_execution_timeout": 10.0,
        "backoff_base": 2.0,
        "backoff_max": 3.0,
    }
    assert settings.resolve(given, defaults) == given


def test_resolve_caps_an_unset_lower_limit_by_the_upper_one_given() -> None:
    defaults = {
        "attempt_timeout": 60.0,
        "max_execution_timeout": 300.0,
        "backoff_base": 1.0,
        "backoff_max": 60.0,
    }
    given: dict[str, float | None] = {"max_execution_timeout": 30.0, "backoff_max": 0.5}
    assert settings.resolve(given, defaults) == {
        "attempt_timeout": 30.0,
        "max_execution_timeout": 30.0,
        "backoff_base": 0.5,
        "backoff_max": 0.5,
    }
    # A lower limit given is never capped: the ordering check reports it instead.
    given = {"attempt_timeout": 600.0}
    assert settings.resolve(given, defaults)["attempt_timeout"] == 600.0


def test_a_handler_policy_uses_the_capping_rule() -> None:
    handler = handlers.build(
        "t",
        lambda claim: None,
        max_attempts=None,
        attempt_timeout=None,
        max_execution_timeout="30s",
        backoff_base=None,
        backoff_max="500ms",
    )
    policy = handler.policy(settings.Settings())
    assert policy == handlers.Policy(
        max_attempts=5,
        attempt_timeout=30.0,
        max_execution_timeout=30.0,
        backoff_base=0.5,
        backoff_max=0.5,
    )
    assert handlers.policy_problems("t", policy) == []
