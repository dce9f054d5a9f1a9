"""The outcome writer (brooq.worker.outcome): a refused outcome becomes an ASCII failed attempt;
a round trip's job_done lines and counts are those of each job settled on its own."""

from __future__ import annotations

from typing import Any

import pytest

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


# -- the job_done lines of a round trip ------------------------------------------------------


def _writer(metrics: Any) -> Any:
    from brooq.ipc.board import Board
    from brooq.settings import Settings
    from brooq.worker.connection import ChildConnection
    from brooq.worker.meter import Meter
    from brooq.worker.outcome import OutcomeWriter
    from brooq.worker.state import ChildState

    settings, state = Settings(), ChildState()
    db = ChildConnection("postgresql://x@127.0.0.1:1/x", "h:1:x", settings, state)
    return OutcomeWriter("h:1:x", settings, db, state, Board(), Meter(metrics))


@pytest.mark.parametrize("fmt", ["kv", "json"])
def test_a_round_trips_done_lines_and_counts_are_those_of_settled_per_job(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """settled_done logs and counts what settled() would have, job by job: the job_done
    line of each job written, outcome_skipped for a job that was not, the outcomes
    counted by topic."""
    import datetime
    import io
    import logging
    import uuid as uuid_mod
    from contextlib import nullcontext
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from brooq import logs
    from brooq.job import Claim
    from brooq.worker import outcome

    now = datetime.datetime.now(datetime.timezone.utc)
    claims = [
        Claim(uuid_mod.uuid4(), topic, None, attempt, "h:1:x", now)
        for topic, attempt in [("a", 1), ("b.c", 3), ("a", 2), ("a", 1), ("b.c", 1)]
    ]
    durations = [0.0004, 0.0125, 1.5, 0.0, 12.3456]
    written = {c.id for i, c in enumerate(claims) if i != 3}  # the 4th was not ours
    monkeypatch.setenv("JOURNAL_STREAM", "8:1")  # no timestamps: the lines compare whole

    def run(batched: bool, in_batch: bool) -> tuple[list[str], bytes]:
        stream = io.StringIO()
        monkeypatch.setattr("sys.stderr", stream)
        logs.setup(fmt)
        registry = CollectorRegistry()
        outcomes = Counter("o_total", "o", ["topic", "outcome"], registry=registry)
        writer = _writer(SimpleNamespace(outcomes=outcomes))
        finished = [(c, d, None) for c, d in zip(claims, durations, strict=True)]
        with logs.batch(outcome.log) if in_batch else nullcontext():
            if batched:
                writer.settled_done(finished, {c.id.int for c in claims if c.id not in written})
            else:
                for claim, duration, _ in finished:
                    writer.settled(claim, "done" if claim.id in written else None, duration)
        writer.meter.flush()
        logging.getLogger("brooq").handlers[:] = []
        counted = [
            line for line in generate_latest(registry).splitlines() if b"_created" not in line
        ]
        return stream.getvalue().splitlines(), b"\n".join(counted)

    expected = run(batched=False, in_batch=False)
    assert len(expected[0]) == 5 and "event=outcome_skipped" in expected[0][3]
    assert f"job={claims[1].id} topic=b.c attempt=3 duration=0.013s" in expected[0][1]
    assert b'o_total{outcome="done",topic="a"} 2.0' in expected[1]
    assert run(batched=True, in_batch=True) == expected
    assert run(batched=True, in_batch=False) == expected  # no batch: records, the same


def test_the_done_line_names_the_job_by_the_text_the_held_list_made() -> None:
    import datetime
    import uuid as uuid_mod

    from brooq.job import Claim

    writer = _writer(None)
    job = uuid_mod.uuid4()
    writer.id_text = {job: str(job)}.__getitem__
    now = datetime.datetime.now(datetime.timezone.utc)
    other = Claim(uuid_mod.uuid4(), "a", None, 1, "h:1:x", now)
    with pytest.raises(KeyError):  # asked for the job's text, not making its own
        writer.settled_done([(other, 0.0, None)], set())
