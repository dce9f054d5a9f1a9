"""The rules master and children share (brooq.rules): the backoff's ceiling doubling to its
maximum, the jitter, the clamped delay.
"""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from brooq import rules

# -- backoff -----------------------------------------------------------------------------


def test_backoff_ceiling_doubles_until_the_maximum() -> None:
    ceilings = [rules.backoff_ceiling(a, 1.0, 60.0) for a in range(1, 9)]
    assert ceilings == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert rules.backoff_ceiling(0, 1.0, 60.0) == 1.0  # never below base


@pytest.mark.parametrize("attempts", [1000, 1024, 1025, 1100, 10_000, 10**9])
def test_backoff_of_huge_attempt_numbers_is_the_maximum(attempts: int) -> None:
    assert rules.backoff_ceiling(attempts, 1.0, 60.0) == 60.0
    assert 30.0 <= rules.backoff(attempts, 1.0, 60.0, random.Random(attempts).random()) <= 60.0


def test_jitter_spans_half_to_full_ceiling() -> None:
    assert rules.backoff(4, 1.0, 60.0, 0.0) == 4.0
    assert rules.backoff(4, 1.0, 60.0, 0.5) == 6.0
    assert rules.backoff(4, 1.0, 60.0, 0.999999) == pytest.approx(8.0, abs=1e-5)


def test_jitter_actually_varies() -> None:
    rand = random.Random(7)
    waits = {rules.backoff(5, 1.0, 60.0, rand.random()) for _ in range(50)}
    assert len(waits) > 40
    assert all(8.0 <= w <= 16.0 for w in waits)


def test_delay_is_clamped() -> None:
    assert rules.delay_seconds(5.0, 60.0) == 5.0
    assert rules.delay_seconds(3600.0, 60.0) == 60.0
    assert rules.delay_seconds(-1.0, 60.0) == 0.0


@given(
    attempts=st.integers(1, 20_000),
    base=st.floats(1e-3, 1e6),
    spread=st.floats(1.0, 1e6),
    r=st.floats(0.0, 1.0, exclude_max=True),
)
@example(attempts=10_000, base=1.0, spread=60.0, r=0.0)
@example(attempts=1024, base=1e6, spread=1.0, r=0.5)
def test_backoff_property(attempts: int, base: float, spread: float, r: float) -> None:
    maximum = base * spread
    exact = min(Fraction(base) * 2 ** (attempts - 1), Fraction(maximum))
    d = rules.backoff_ceiling(attempts, base, maximum)
    assert d == float(exact)
    assert base <= d <= maximum
    # Another attempt never lowers the ceiling (once at the maximum, it stays there).
    assert d <= rules.backoff_ceiling(attempts + 1, base, maximum) <= maximum
    wait = rules.backoff(attempts, base, maximum, r)
    assert d / 2 <= wait <= d
