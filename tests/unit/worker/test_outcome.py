"""The outcome writer (brooq.worker.outcome): a refused outcome becomes an ASCII failed attempt."""

from __future__ import annotations

from typing import Any

from brooq.worker import execute


def test_a_refused_outcome_becomes_an_ascii_failed_attempt() -> None:
    import datetime
    import uuid as uuid_mod

    from brooq.declare.handlers import Policy
    from brooq.job import Claim
    from brooq.worker.outcome import refused_outcome

    claim: Claim[Any] = Claim(
        id=uuid_mod.uuid4(),
        topic="t",
        payload={},
        attempt=2,
        locked_by="w",
        locked_until=datetime.datetime.now(datetime.timezone.utc),
    )
    policy = Policy(
        max_attempts=5,
        attempt_timeout=60.0,
        max_execution_timeout=300.0,
        backoff_base=1.0,
        backoff_max=60.0,
    )
    canceled = execute.Outcome("canceled", error="stop: € \udc80")
    written = refused_outcome(claim, policy, canceled, ValueError("refused: ü"))
    assert written.kind == "failed" and not written.refund and written.error is not None
    assert written.error.isascii() and 1.0 <= written.delay <= 2.0  # the backoff of attempt 2
    assert written.error == (
        "brooq could not write this attempt's outcome (canceled): ValueError: refused: "
        "\\xfc; the attempt's error: stop: \\u20ac \\udc80"
    )
    final = execute.Outcome("failed", delay=7.0, error="x", final=True)
    assert refused_outcome(claim, policy, final, ValueError()).final
    assert refused_outcome(claim, policy, final, ValueError()).delay == 7.0
