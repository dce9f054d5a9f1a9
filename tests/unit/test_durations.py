"""Durations (brooq.durations): parsing, the refusals and their hints, to_seconds,
format_seconds.
"""

from __future__ import annotations

from datetime import timedelta
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brooq.durations import format_seconds, parse_duration_string, to_seconds

# -- durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("2.5s", 2.5),
        ("1m30s", 90.0),
        ("1d", 86400.0),
        ("0s", 0.0),
        ("  45s ", 45.0),
        ("1h1m1s1ms", 3661.001),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration_string(text) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize("bare", ["120", "1.5", " 30 "])
def test_bare_number_is_rejected_with_a_hint(bare: str) -> None:
    with pytest.raises(ValueError, match="no unit") as info:
        parse_duration_string(bare)
    assert f"'{bare.strip()}s'" in str(info.value)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "s",
        "abc",
        "5x",
        "-5s",
        "+5s",
        "5s5",
        "1e3s",
        "1h 30m",
        "5 s",
        ".5s",
        "5.s",
        "inf s",
        "infs",
        "nan",
        "5S",
        "\u0665s",  # ARABIC-INDIC DIGIT FIVE: ASCII digits only
        "\uff15s",  # FULLWIDTH DIGIT FIVE
        "1" * 400 + "s",  # float("1" * 400) is inf
    ],
)
def test_garbage_durations_are_rejected(garbage: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_string(garbage)
    with pytest.raises(ValueError):
        to_seconds(garbage)


def test_to_seconds_accepts_timedelta_numbers_and_strings() -> None:
    assert to_seconds(timedelta(minutes=2, milliseconds=500)) == 120.5
    assert to_seconds(5) == 5.0 and isinstance(to_seconds(5), float)
    assert to_seconds(2.5) == 2.5
    assert to_seconds("3m") == 180.0
    assert to_seconds(timedelta(0)) == 0.0


@pytest.mark.parametrize(
    "value", [True, False, None, float("inf"), float("-inf"), float("nan"), [1], b"5s", 10**400]
)
def test_to_seconds_rejects_non_durations_with_value_error(value: Any) -> None:
    with pytest.raises(ValueError):
        to_seconds(value)


def test_to_seconds_of_a_huge_int_does_not_overflow_or_echo_it() -> None:
    # float(10**5000) raises OverflowError and repr(10**5000) raises ValueError by itself.
    with pytest.raises(ValueError, match="integer this large") as info:
        to_seconds(10**5000)
    assert len(str(info.value)) < 200


def test_bare_number_refused_when_asked() -> None:
    with pytest.raises(ValueError, match="no unit"):
        to_seconds(5, allow_bare_number=False)


_UNIT_SECONDS = {"ms": Fraction(1, 1000), "s": 1, "m": 60, "h": 3600, "d": 86400}


@given(
    st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(_UNIT_SECONDS))), min_size=1)
)
def test_composed_durations_parse_to_their_sum(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum(n * _UNIT_SECONDS[unit] for n, unit in parts)
    assert parse_duration_string(text) == pytest.approx(float(expected), rel=1e-12)


@given(st.integers(0, 10**7))
def test_format_seconds_round_trips(seconds: int) -> None:
    assert parse_duration_string(format_seconds(seconds)) == seconds
