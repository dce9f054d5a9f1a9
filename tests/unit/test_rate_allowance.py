"""The allowance of a short period (brooq.declare.rates.ALLOWANCE_MIN) against a claim's round trip,
on an injected clock (brooq.worker.pacing): a claim of Rate(1, per=100ms) answered 10 ms
after it was sent, as a loaded host answers, still starts; the share of the rate left
reachable (the period over the window) is at least 5/6 at every period."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import NamedTuple

import pytest

import brooq
from brooq.declare.rates import ALLOWANCE_MIN, MIN_PERIOD, Rate
from brooq.worker.pacing import Pacing, turns

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


class Row(NamedTuple):
    claimed: bool
    id: uuid.UUID
    topic: str
    locked_until: datetime
    available_at: datetime


@pytest.mark.parametrize(
    ("round_trip", "started"), [(0.004, True), (0.010, True), (0.019, True), (0.021, False)]
)
def test_a_short_period_claim_starts_after_a_loaded_round_trip(
    round_trip: float, started: bool
) -> None:
    q = brooq.Queue("postgresql://unused")
    q.handler("short", rate_limit=Rate(1, per=MIN_PERIOD))(print)
    clock = [100.0]
    pacing = Pacing(turns(q.handlers), clock=lambda: clock[0])
    job = uuid.uuid4()
    pacing.sift([Row(True, job, "short", NOW, NOW)], pacing.turns[0], sent_at=100.0)
    clock[0] = 100.0 + round_trip
    assert pacing.late(job) is not started


@pytest.mark.parametrize("period", [0.1, 0.2, 0.4, 1.0, 60.0, 3600.0])
def test_at_least_five_sixths_of_a_rate_stay_reachable(period: float) -> None:
    rate = Rate(1, per=period)
    assert rate.allowance >= min(ALLOWANCE_MIN, period)
    assert period / rate.window >= 5 / 6 - 1e-9
