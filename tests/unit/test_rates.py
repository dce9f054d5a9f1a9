"""Rates: the forms rate_limit and group_rate_limit accept, brooq.Rate's bounds and words,
the allowance, and what a handler publishes of its limits."""

from __future__ import annotations

from datetime import timedelta

import pytest

import brooq
from brooq.declare.rates import ALLOWANCE_MAX, Rate, parse_rate
from brooq.errors import InvalidSettings


@pytest.mark.parametrize(
    ("text", "limit", "seconds"),
    [("50/s", 50, 1.0), ("1/m", 1, 60.0), ("3600/h", 3600, 3600.0), (" 7/s ", 7, 1.0)],
)
def test_the_text_forms(text: str, limit: int, seconds: float) -> None:
    rate = parse_rate(text, "rate_limit")
    assert (rate.limit, rate.seconds) == (limit, seconds)
    assert rate == Rate(limit, per=timedelta(seconds=seconds))


@pytest.mark.parametrize(
    "bad",
    [
        *("50/x", "50/ s", "50", "/s", "5.5/s", "-1/s", "50/sec", "fifty/s"),
        *("\u0665/s", "", None, 50, 1.5),  # an Arabic-Indic five is no digit here
    ],
)
def test_other_text_is_refused_naming_the_option_and_the_forms(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^group_rate_limit must be 'N/s', 'N/m', 'N/h'") as exc:
        parse_rate(bad, "group_rate_limit")
    assert "brooq.Rate(N, per=timedelta(...))" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_rate_object_is_taken_as_it_is() -> None:
    rate = brooq.Rate(5, per=timedelta(minutes=2))
    assert parse_rate(rate, "rate_limit") is rate
    assert str(rate) == "5/2m" and repr(rate) == "Rate(5, per=datetime.timedelta(seconds=120))"
    assert str(Rate(50)) == "50/s" and str(Rate(2, "1h")) == "2/h" and str(Rate(1, 2.5)) == "1/2.5s"
    assert rate.per == timedelta(minutes=2)
    assert rate.to_dict() == {"limit": 5, "per_seconds": 120.0, "text": "5/2m"}


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((0,), "a rate's limit must be from 1"),
        ((2**31,), "a rate's limit must be from 1 to 2,147,483,647"),
        ((True,), "a rate's limit must be a whole number"),
        ((2.0,), "a rate's limit must be a whole number"),
        ((1, timedelta(milliseconds=50)), r"a rate's period must be from 0.1s to 31d, got 0.05s"),
        ((1, timedelta(days=32)), "a rate's period must be from 0.1s to 31d"),
        ((1, "soon"), "is not a duration"),
    ],
)
def test_a_rate_out_of_bounds_is_refused(args: tuple[object, ...], text: str) -> None:
    with pytest.raises(ValueError, match=text):
        Rate(*args)  # type: ignore[arg-type]


def test_the_allowance_is_a_twentieth_of_the_period_at_most_a_quarter_second() -> None:
    assert Rate(20).allowance == pytest.approx(0.05)
    assert Rate(20).window == pytest.approx(1.05)
    assert Rate(1, 0.1).allowance == pytest.approx(0.02)  # ALLOWANCE_MIN
    assert Rate(10, timedelta(hours=1)).allowance == ALLOWANCE_MAX == 0.25


def test_a_handler_publishes_its_limits() -> None:
    queue = brooq.Queue("postgresql://unused")

    @queue.handler("a", global_limit=4, rate_limit="50/s", group_limit=1, group_rate_limit="5/m")
    def a(claim: brooq.Claim) -> None: ...

    @queue.handler("b")
    def b(claim: brooq.Claim) -> None: ...

    assert queue.handlers["a"].coordinated and not queue.handlers["b"].coordinated
    assert queue.handlers["a"].limits() == {
        "global_limit": 4,
        "rate_limit": {"limit": 50, "per_seconds": 1.0, "text": "50/s"},
        "group_limit": 1,
        "group_rate_limit": {"limit": 5, "per_seconds": 60.0, "text": "5/m"},
    }
    assert queue.handlers["b"].limits() == {}


@pytest.mark.parametrize(
    ("options", "holds_back"),
    [
        ({"global_limit": 2}, True),
        ({"rate_limit": "5/s"}, True),
        ({"group_limit": 1}, True),
        ({"group_rate_limit": "5/m"}, True),
        # a group's own limit set at runtime may hold its jobs back; the count reads the
        # topic's ready jobs only while one is set
        ({"fair_groups": True}, True),
        ({}, False),
    ],
)
def test_only_a_limit_that_can_hold_a_job_back_makes_the_master_count_them(
    options: dict[str, object], holds_back: bool
) -> None:
    """The master's stats duty counts the jobs held back (job_held_by_topic) only when a
    topic has a limit, or is claimed in turn (a group's own limit may be set at any
    time)."""
    queue = brooq.Queue("postgresql://unused")
    queue.handler("t", **options)(print)  # type: ignore[arg-type]
    assert queue.handlers["t"].holds_back is holds_back


def test_every_bad_option_is_listed_at_once() -> None:
    queue = brooq.Queue("postgresql://unused")
    with pytest.raises(InvalidSettings) as exc:
        queue.handler("t", rate_limit="1/x", group_limit=0, group_rate_limit=Rate)(print)  # type: ignore[arg-type]
    assert [p.split(":")[1].split()[0] for p in exc.value.problems] == [
        "group_limit",
        "rate_limit",
        "group_rate_limit",
    ]
