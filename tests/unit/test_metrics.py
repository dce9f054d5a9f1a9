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
