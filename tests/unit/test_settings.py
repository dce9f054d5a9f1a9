"""Settings (brooq.settings): the layers (defaults, environment, overrides), every problem listed
at once, the queue lists, and the bounds of concurrency and loop_block_timeout.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq import settings
from brooq import settings as settings_mod
from brooq.errors import InvalidSettings

# -- settings ----------------------------------------------------------------------------


def test_defaults_without_environment() -> None:
    assert settings.load(environ={}) == settings.Settings()


def test_environment_layer() -> None:
    loaded = settings.load(
        environ={
            "QUEUE_WORKERS": "4",
            "QUEUE_LEASE": "45s",
            "QUEUE_POLL_INTERVAL": "250ms",
            "QUEUE_ATTEMPT_TIMEOUT": "2m",
            "QUEUE_MAX_EXECUTION_TIMEOUT": "1h",
            "QUEUE_OPS_ADDR": "0.0.0.0:9000",
            "UNRELATED": "ignored",
        }
    )
    assert (loaded.workers, loaded.lease, loaded.poll_interval) == (4, 45.0, 0.25)
    assert (loaded.attempt_timeout, loaded.max_execution_timeout) == (120.0, 3600.0)
    assert loaded.ops_addr == "0.0.0.0:9000"
    assert loaded.renew_period == 15.0


@pytest.mark.parametrize("empty", ["", "   ", "\t"])
def test_empty_environment_value_counts_as_unset(empty: str) -> None:
    environ = {var: empty for var in settings.ENVIRONMENT}
    # The one exception: QUEUE_OPS_ADDR= turns the ops surface off.
    assert settings.load(environ=environ) == settings.Settings(ops_addr="")
    del environ["QUEUE_OPS_ADDR"]
    assert settings.load(environ=environ) == settings.Settings()
    assert settings.getenv("QUEUE_LEASE", {"QUEUE_LEASE": empty}) is None
    assert settings.getenv("QUEUE_LEASE", {"QUEUE_LEASE": "5s"}) == "5s"


def test_layers_in_order_defaults_environment_overrides_flags() -> None:
    environ = {"QUEUE_WORKERS": "3", "QUEUE_LEASE": "40s", "QUEUE_MAX_ATTEMPTS": "7"}
    loaded = settings.load(
        environ=environ,
        overrides={"workers": 5, "lease": timedelta(seconds=50)},
        flags={"workers": 8, "lease": None},  # None: the flag was not given
    )
    assert loaded.workers == 8  # flag beats Queue(...) beats environment
    assert loaded.lease == 50.0  # Queue(...) beats environment; an absent flag changes nothing
    assert loaded.max_attempts == 7  # environment beats the default
    assert loaded.poll_interval == settings.Settings().poll_interval


def test_numbers_in_code_are_seconds_but_the_environment_needs_a_unit() -> None:
    assert settings.load(environ={}, overrides={"lease": 12}).lease == 12.0
    with pytest.raises(InvalidSettings) as info:
        settings.load(environ={"QUEUE_LEASE": "12"})
    assert len(info.value.problems) == 1
    assert "QUEUE_LEASE" in info.value.problems[0] and "'12s'" in info.value.problems[0]


def test_every_problem_is_listed_at_once() -> None:
    environ = {
        "QUEUE_LEASE": "0s",
        "QUEUE_WORKERS": "0",
        "QUEUE_ATTEMPT_TIMEOUT": "10m",
        "QUEUE_MAX_EXECUTION_TIMEOUT": "5m",
        "QUEUE_POLL_INTERVAL": "120",
    }
    with pytest.raises(InvalidSettings) as info:
        settings.load(environ=environ)
    problems = info.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "QUEUE_POLL_INTERVAL" in text and "'120s'" in text
    assert any(p.startswith("workers must be at least 1") for p in problems)
    assert any(p.startswith("lease must be positive") for p in problems)
    assert any(
        "attempt_timeout (600s) must not exceed max_execution_timeout (300s)" in p for p in problems
    )
    # The message lists them all too, one a line.
    assert str(info.value).count("\n  - ") == 4


def test_problems_from_every_layer_are_collected() -> None:
    with pytest.raises(InvalidSettings) as info:
        settings.load(
            environ={"QUEUE_MAX_ATTEMPTS": "many", "QUEUE_BACKOFF_BASE": "2m"},
            overrides={"workers": "x", "lease": True, "nonsense": 1},
            flags={"graceful_timeout": -1, "ops_addr": "localhost"},
        )
    problems = info.value.problems
    text = "\n".join(problems)
    assert "QUEUE_MAX_ATTEMPTS='many'" in text
    assert "Queue(workers=...)" in text and "Queue(lease=...)" in text
    assert "unknown setting 'nonsense'" in text
    assert "graceful_timeout must be positive" in text
    assert "backoff_base (120s) must not exceed backoff_max (60s)" in text
    assert "ops_addr must be HOST:PORT" in text
    assert len(problems) == 7, problems


@pytest.mark.parametrize(
    ("environ", "overrides"),
    [
        ({}, {"lease": 10**400}),  # float() of it raised OverflowError
        ({"QUEUE_LEASE": "1" * 400 + "s"}, {}),  # parsed as inf and accepted
        ({}, {"lease": float("inf")}),
    ],
)
def test_absurd_durations_are_settings_problems(
    environ: dict[str, str], overrides: dict[str, Any]
) -> None:
    with pytest.raises(InvalidSettings) as info:
        settings.load(environ=environ, overrides=overrides)
    assert len(info.value.problems) == 1 and "lease" in info.value.problems[0].lower()


@given(st.dictionaries(st.sampled_from(sorted(settings.ENVIRONMENT)), st.text(max_size=12)))
def test_load_never_raises_anything_but_invalid_settings(environ: dict[str, str]) -> None:
    try:
        loaded = settings.load(environ=environ)
    except InvalidSettings as exc:
        assert exc.problems
    else:
        assert settings.validate(loaded) == []


def test_concurrency_and_loop_block_timeout_are_bounded() -> None:
    s = settings_mod.load(environ={"QUEUE_CONCURRENCY": "250", "QUEUE_LOOP_BLOCK_TIMEOUT": "2s"})
    assert s.concurrency == 250 and s.loop_block_timeout == 2.0 and s.async_workers == 1
    assert settings_mod.Settings().concurrency == 100
    with pytest.raises(InvalidSettings) as info:
        settings_mod.load(
            environ={
                "QUEUE_CONCURRENCY": "0",
                "QUEUE_ASYNC_WORKERS": "0",
                "QUEUE_LOOP_BLOCK_TIMEOUT": "500ms",
            }
        )
    assert info.value.problems == [
        "concurrency must be at least 1, got 0",
        "async_workers must be at least 1, got 0",
        "loop_block_timeout must be at least 1s, got 0.5s",
    ]
    with pytest.raises(InvalidSettings) as info:
        settings_mod.load(flags={"concurrency": 10_001})
    assert info.value.problems == ["concurrency must be at most 10000, got 10001"]


@pytest.mark.parametrize(
    ("raw", "problems"),
    [
        ("default=0", ["the weight of queue 'default' must be at least 1, got 0"]),
        ("default=-1", ["must be at least 1, got -1"]),
        ("default=x", ["the weight of queue 'default' must be an integer, got 'x'"]),
        ("a,a=2", ["queue 'a' is named twice"]),
        ("Bad", ["queue 'Bad' does not match"]),
        ("a,,b", ["an empty queue name"]),
        ("a=0,b=y,a", ["'a' must be at least 1", "'b' must be an integer", "'a' is named twice"]),
    ],
)
def test_bad_queue_lists_name_every_problem(raw: str, problems: list[str]) -> None:
    with pytest.raises(InvalidSettings) as refused:
        settings_mod.load(environ={"QUEUE_QUEUES": raw})
    found = refused.value.problems
    assert len(found) == len(problems), found
    for text, problem in zip(problems, found, strict=True):
        assert text in problem and problem.startswith("QUEUE_QUEUES="), problem


def test_queue_lists_in_every_form() -> None:
    load = settings_mod.load
    assert load(environ={"QUEUE_QUEUES": " default=4 , bulk "}).queues == (
        ("default", 4),
        ("bulk", 1),
    )
    assert load(overrides={"queues": {"a": 2, "b": 1}}).queues == (("a", 2), ("b", 1))
    assert load(flags={"queues": "c=3"}).queues == (("c", 3),)
    assert load(overrides={"queues": ["a", ("b", 5)]}).queues == (("a", 1), ("b", 5))
    with pytest.raises(InvalidSettings, match="must be an integer"):
        load(overrides={"queues": {"a": True}})
    assert load(environ={}).queues == ()


# -- QUEUE_OPS_ADDR= turns the ops surface off -----------------------------------------------


def test_empty_ops_addr_in_the_environment_means_off() -> None:
    assert settings_mod.load(environ={}).ops_addr == "127.0.0.1:8090"
    assert settings_mod.load(environ={"QUEUE_OPS_ADDR": ""}).ops_addr == ""
    assert settings_mod.load(environ={"QUEUE_OPS_ADDR": "  "}).ops_addr == ""
    # Every other variable: empty is still unset.
    assert settings_mod.load(environ={"QUEUE_LEASE": ""}).lease == 30.0
