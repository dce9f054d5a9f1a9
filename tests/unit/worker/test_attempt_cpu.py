"""The CPU an attempt is charged (brooq_attempt_cpu_seconds, brooq.worker.attempt and
brooq.worker.meter): consecutive attempts of a batch share one reading of the clock, so
none of the child's CPU between the first start and the last end is lost or counted twice;
after a round trip, a write or a release the next attempt reads the clock again."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from brooq.declare.handlers import Handler
from brooq.ipc.board import Board
from brooq.job import Claim
from brooq.worker.attempt import Attempts
from brooq.worker.meter import Meter
from tests.unit.worker.test_attempt_call import POLICY


def _meter() -> tuple[Meter, Histogram]:
    registry = CollectorRegistry()
    cpu = Histogram("cpu", "cpu", ["topic"], buckets=(0.001, 1e9), registry=registry)
    metrics: Any = SimpleNamespace(
        claims=Counter("c_total", "c", ["topic"], registry=registry),
        outcomes=Counter("o_total", "o", ["topic", "outcome"], registry=registry),
        attempt_duration=Histogram("d", "d", ["topic"], registry=registry),
        attempt_cpu=cpu,
        attempt_rss=Histogram("rss", "rss", ["topic"], registry=registry),
        busy=Gauge("busy", "b", registry=registry),
        child_jobs=Gauge("jobs", "j", registry=registry),
    )
    return Meter(metrics), cpu


def _attempts(meter: Meter) -> Attempts:
    handler = Handler("t", lambda claim: None, None, None, None, None, None)
    return Attempts(Board(), meter, {"t": handler}, 1 << 20, set(), measure_cpu=True)


def _run(attempts: Attempts, work: float) -> None:
    claim: Claim[Any] = Claim(uuid.uuid4(), "t", None, 1, "h:1:x", datetime.now(timezone.utc))
    started = time.monotonic()
    assert attempts.begin(claim, POLICY, started) is None
    spin_until = time.process_time() + work
    while time.process_time() < spin_until:
        pass
    attempts.end(claim, POLICY, None, None, None, started)


def _charged(meter: Meter, cpu: Histogram) -> tuple[float, float]:
    meter.flush()
    count = sum = 0.0
    for metric in cpu.collect():
        for s in metric.samples:
            if s.name == "cpu_count":
                count = s.value
            elif s.name == "cpu_sum":
                sum = s.value
    return count, sum


def test_attempts_of_a_batch_share_a_reading_and_lose_nothing_between_them() -> None:
    meter, cpu = _meter()
    attempts = _attempts(meter)
    _run(attempts, 0.0)  # the first reads the peak RSS, a system call of its own
    assert attempts.cpu_mark is None
    count_before, charged_before = _charged(meter, cpu)
    first = time.process_time()
    for _ in range(5):
        _run(attempts, 0.002)
        between = time.process_time() + 0.003  # brooq's own steps between two attempts
        while time.process_time() < between:
            pass
    last_end = attempts.cpu_mark
    assert last_end is not None
    count, charged = _charged(meter, cpu)
    count, charged = count - count_before, charged - charged_before
    # Every attempt after the first counts from the last one's end: the 3 ms between
    # them are charged (to the next), so the sum is the clock's whole span.
    assert count == 5
    assert abs(charged - (last_end - first)) < 0.001
    assert charged >= 5 * 0.002 + 4 * 0.003


def test_after_a_round_trip_the_next_attempt_reads_the_clock() -> None:
    meter, cpu = _meter()
    attempts = _attempts(meter)
    for _ in range(3):
        _run(attempts, 0.002)
        attempts.forget_cpu()  # as the child does before a round trip, a write, a release
        outside = time.process_time() + 0.010
        while time.process_time() < outside:
            pass
    count, charged = _charged(meter, cpu)
    assert count == 3
    assert 3 * 0.002 <= charged < 3 * 0.002 + 0.005  # none of the 30 ms outside


def test_without_metrics_no_clock_is_read() -> None:
    attempts = _attempts(Meter(None))
    _run(attempts, 0.0)
    assert attempts.measure_cpu is False and attempts.cpu_mark is None
