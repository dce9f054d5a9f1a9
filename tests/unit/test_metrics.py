"""brooq.metrics.Tally writes what the same observations would have written directly."""

from __future__ import annotations

# -- metrics tallied per batch -----------------------------------------------------------


def test_tally_writes_what_the_same_observations_would_have() -> None:
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from brooq.metrics import Tally

    def exposition(tallied: bool, values: list[float]) -> bytes:
        registry = CollectorRegistry()
        hist = Histogram("h_seconds", "h", ["topic"], buckets=(0.01, 0.1, 1.0), registry=registry)
        count = Counter("c_total", "c", ["topic", "outcome"], registry=registry)
        tally = Tally()
        for i, v in enumerate(values):
            topic = "a" if i % 3 else "b"
            if tallied:
                tally.observe(hist, topic, v)
                tally.inc(count, topic, "done")
                if i % 4 == 0:
                    tally.flush()
            else:
                hist.labels(topic).observe(v)
                count.labels(topic, "done").inc()
        tally.flush()
        tally.flush()  # a second flush adds nothing
        lines = generate_latest(registry).splitlines()
        return b"\n".join(line for line in lines if b"_created" not in line)

    # bucket edges, in between, above the last bound, zero
    values = [0.0, 0.01, 0.0100001, 0.05, 0.1, 0.5, 1.0, 1.5, 100.0, 0.001] * 7
    assert exposition(True, values) == exposition(False, values)
    assert b'h_seconds_bucket{le="0.01",topic="b"}' in exposition(True, values)


def test_a_childs_attempts_claims_and_outcomes_tally_what_direct_writes_would() -> None:
    """Meter (brooq.worker.meter): each attempt's duration and peak RSS, the claims and
    the outcomes counted per topic, come out as the same observations made one by one."""
    import datetime
    import uuid
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    from brooq.job import Claim
    from brooq.worker.meter import Meter

    now = datetime.datetime.now(datetime.timezone.utc)
    topics = ["a", "b", "a", "a", "c", "b"] * 5
    claims = [Claim(uuid.uuid4(), t, None, 1, "h:1:x", now) for t in topics]
    durations = [i * i / 4096 for i in range(len(topics))]  # sums exact in binary

    def metrics(registry: CollectorRegistry) -> SimpleNamespace:
        def hist(name: str) -> Histogram:
            buckets = (0.001, 0.01, 0.1, 1e9)
            return Histogram(name, name, ["topic"], buckets=buckets, registry=registry)

        return SimpleNamespace(
            claims=Counter("c_total", "c", ["topic"], registry=registry),
            outcomes=Counter("o_total", "o", ["topic", "outcome"], registry=registry),
            attempt_duration=hist("d"),
            attempt_cpu=hist("cpu"),
            attempt_rss=hist("rss"),
            busy=Gauge("busy", "b", registry=registry),
            child_jobs=Gauge("jobs", "j", registry=registry),
        )

    def exposition(registry: CollectorRegistry) -> bytes:
        lines = generate_latest(registry).splitlines()
        return b"\n".join(line for line in lines if b"_created" not in line)

    tallied, direct = CollectorRegistry(), CollectorRegistry()
    meter, m = Meter(metrics(tallied)), metrics(direct)  # type: ignore[arg-type]
    for batch in (claims[:7], claims[7:]):
        meter.claimed(batch)
        for c in batch:
            m.claims.labels(c.topic).inc()
        for i, c in enumerate(batch):
            duration = durations[claims.index(c)]
            meter.attempt(c.topic, duration, None, 1000.0 + i)  # async: no CPU series
            m.attempt_duration.labels(c.topic).observe(duration)
            m.attempt_rss.labels(c.topic).observe(meter.peak_rss)
        meter.outcome("a", "done", 3)
        for _ in range(3):
            m.outcomes.labels("a", "done").inc()
    m.busy.set(1)
    m.child_jobs.set(1)
    meter.flush()
    assert exposition(tallied) == exposition(direct)
    assert b'c_total{topic="a"} 15.0' in exposition(tallied)
    assert meter.peak_rss > 0
