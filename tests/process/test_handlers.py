"""The handler model with real processes: middleware order around real children, typed
payloads (round trip, a mismatch going dead unrun, validation at enqueue), stored
results, and retry policies. The application is tests/apps/brooq_handlersapp.py."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
from tests.apps import brooq_handlersapp as app
from tests.harness import MasterProcess, StartMaster, wait_for

APP = "brooq_handlersapp:queue"


@pytest.fixture
def typed_queue(dsn: str) -> Iterator[brooq.Queue]:
    """A producer's Queue with the application's handlers (so typed topics are checked)."""
    q = brooq.Queue(dsn)
    q.handlers.update(app.queue.handlers)
    yield q
    q.close()


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "trace"
    path.mkdir()
    return path


def start(start_master: StartMaster, trace_dir: Path, workers: int = 1) -> MasterProcess:
    return start_master(workers=workers, app=APP, env={"BROOQ_TRACE": str(trace_dir)})


def traced(trace_dir: Path, job_id: uuid.UUID) -> list[tuple[str, str]]:
    """(what, detail) of one job's trace lines, in the order they were written."""
    out = []
    for path in sorted(trace_dir.glob("*.log")):
        for line in path.read_text().splitlines():
            jid, what, detail = [*line.split(" ", 2), ""][:3]
            if jid == str(job_id):
                out.append((what, detail))
    return out


def row(db: psycopg.Connection[Any], job_id: uuid.UUID) -> dict[str, Any]:
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    found = cur.execute(
        "SELECT state, attempts, last_error, result FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert found is not None
    return found


def state_of(db: psycopg.Connection[Any], job_id: uuid.UUID) -> str:
    return str(row(db, job_id)["state"])


def test_middleware_nests_in_registration_order_and_sees_results_and_errors(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    m = start(start_master, trace_dir)
    ok, _ = queue.enqueue(brooq.Job("h.order"))
    bad, _ = queue.enqueue(brooq.Job("h.fails"))
    wait_for(lambda: state_of(db, ok) == "done", what="h.order done")
    wait_for(lambda: state_of(db, bad) == "dead", what="h.fails dead")
    assert [what for what, _ in traced(trace_dir, ok)] == [
        "in:g1",
        "in:g2",
        "in:topic",
        "handler",
        "out:topic",
        "out:g2",
        "out:g1",
    ]
    # Every layer saw what the handler returned, and it is what was stored.
    assert {d for w, d in traced(trace_dir, ok) if w.startswith("out:")} == {"{'n': 42}"}
    assert row(db, ok)["result"] == {"n": 42}
    assert traced(trace_dir, bad) == [
        ("in:g1", "NoneType"),
        ("in:g2", "NoneType"),
        ("handler", ""),
        ("raised:g2", "ValueError"),
        ("raised:g1", "ValueError"),
    ]
    assert row(db, bad)["last_error"] == "ValueError: boom"
    m.stop()


def test_a_middleware_that_swallows_the_error_makes_the_job_done(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    start(start_master, trace_dir)
    job_id, _ = queue.enqueue(brooq.Job("h.swallowed"))
    wait_for(lambda: state_of(db, job_id) == "done", what="done")
    assert row(db, job_id)["result"] == "swallowed"


def test_the_soft_timeout_covers_the_middleware(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    start(start_master, trace_dir)
    job_id, _ = queue.enqueue(brooq.Job("h.slow-middleware"))
    wait_for(lambda: state_of(db, job_id) == "dead", what="dead by the soft timeout")
    assert row(db, job_id)["last_error"] == "AttemptTimeout: attempt_timeout 0.3s exceeded"
    assert [w for w, _ in traced(trace_dir, job_id)] == ["in:g1", "in:g2"]


def signup(**changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "user_id": 7,
        "email": "ada@example.com",
        "address": {"city": "London", "zip": "N1"},
        "tags": ["new"],
    }
    payload.update(changes)
    return payload


def test_a_typed_payload_round_trips_as_an_instance(
    typed_queue: brooq.Queue,
    db: psycopg.Connection[Any],
    start_master: StartMaster,
    trace_dir: Path,
) -> None:
    start(start_master, trace_dir)
    sent = app.Signup(7, "ada@example.com", app.Address("London", "N1"), ["new"])
    job_id, _ = typed_queue.enqueue(brooq.Job("h.typed", sent))
    # The result, read back across processes by queue.wait.
    record = typed_queue.wait(job_id, timeout=20)
    assert (record.state, record.result) == ("done", {"user_id": 7, "welcomed": True})
    lines = traced(trace_dir, job_id)
    # The middleware sees the instance too: decoded before the chain.
    assert lines[0] == ("in:g1", "Signup")
    assert ("handler", f"Signup:{sent!r}") in lines
    assert row(db, job_id)["result"] == {"user_id": 7, "welcomed": True}
    stored = db.execute("SELECT payload FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert stored == (signup(),)


def test_a_payload_that_does_not_fit_goes_dead_unrun(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    """Inserted past the Queue's check (brooq.enqueue knows no handlers): the child refuses
    it before the middleware and the handler, dead at its first claim."""
    with psycopg.connect(queue.dsn) as conn:
        job_id, _ = brooq.enqueue(conn, brooq.Job("h.typed", signup(user_id="seven")))
    start(start_master, trace_dir)
    wait_for(lambda: state_of(db, job_id) == "dead", what="dead")
    found = row(db, job_id)
    assert found["attempts"] == 1
    assert found["last_error"] == (
        "PayloadMismatch: payload.user_id: expected int, got str (Signup)"
    )
    assert traced(trace_dir, job_id) == []


def test_a_queue_with_a_typed_handler_refuses_a_payload_that_does_not_fit(
    typed_queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    with pytest.raises(brooq.PayloadMismatch, match=r"^payload\.address\.zip: expected str"):
        typed_queue.enqueue(brooq.Job("h.typed", signup(address={"city": "x", "zip": 1})))
    # A dataclass built with the wrong types is caught as well: the check reads the JSON.
    with pytest.raises(brooq.PayloadMismatch, match=r"payload\.user_id: expected int"):
        typed_queue.enqueue(
            brooq.Job("h.typed", app.Signup("7", "e", app.Address("c", "z")))  # type: ignore[arg-type]
        )
    with pytest.raises(brooq.PayloadMismatch, match=r"^job 1: payload\.email"):
        typed_queue.enqueue_many(
            [brooq.Job("h.typed", signup()), brooq.Job("h.typed", signup(email=None))]
        )
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (0,)


@pytest.mark.parametrize(
    ("topic", "error"),
    [
        (
            "h.too-big",
            r"^InvalidResult: result is \d+ bytes encoded as JSON; the limit is 1048576$",
        ),
        ("h.unserialisable", r"^InvalidResult: result is not JSON-serialisable: "),
    ],
)
def test_a_result_that_cannot_be_stored_fails_the_attempt(
    queue: brooq.Queue,
    db: psycopg.Connection[Any],
    start_master: StartMaster,
    trace_dir: Path,
    topic: str,
    error: str,
) -> None:
    start(start_master, trace_dir)
    job_id, _ = queue.enqueue(brooq.Job(topic))
    wait_for(lambda: state_of(db, job_id) == "dead", what="dead")
    found = row(db, job_id)
    assert re.match(error, found["last_error"]), found["last_error"]
    assert found["result"] is None
    # The chained job of the failed attempt was not written.
    assert db.execute("SELECT count(*) FROM job_all").fetchone() == (1,)


def test_results_are_stored_from_batched_round_trips(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    """Short jobs are claimed and finished in batches: the results ride the batched done
    (the _results statements), each in its own row, mixed with jobs that return None."""
    jobs = [brooq.Job("h.sum", {"a": i, "b": 1}) for i in range(200)]
    jobs += [brooq.Job("h.swallowed") for _ in range(20)]
    ids = [job_id for job_id, _ in queue.enqueue_many(jobs)]
    m = start(start_master, trace_dir, workers=2)
    wait_for(
        lambda: (
            db.execute("SELECT count(*) FROM job_all WHERE state = 'done'").fetchone() == (220,)
        ),
        what="all done",
    )
    results = dict(db.execute("SELECT id, result FROM job_all").fetchall())
    assert [results[i] for i in ids[:200]] == [{"sum": i + 1} for i in range(200)]
    assert {results[i] for i in ids[200:]} == {"swallowed"}
    # Batches did form: jobs written `done` by one statement share its now().
    widest = db.execute(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM job_all WHERE state = 'done' "
        "GROUP BY updated_at) AS rounds"
    ).fetchone()
    assert widest is not None and widest[0] > 1
    m.stop()


def test_a_retry_policy_that_gives_up_makes_the_job_dead_at_once(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    start(start_master, trace_dir)
    job_id, _ = queue.enqueue(brooq.Job("h.give-up"))
    wait_for(lambda: state_of(db, job_id) == "dead", what="dead")
    assert row(db, job_id)["attempts"] == 1
    assert traced(trace_dir, job_id) == [
        ("in:g1", "NoneType"),
        ("in:g2", "NoneType"),
        ("handler", "1"),
        ("raised:g2", "RuntimeError"),
        ("raised:g1", "RuntimeError"),
    ]


def test_a_retry_policy_schedules_the_next_attempts(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    start(start_master, trace_dir)
    job_id, _ = queue.enqueue(brooq.Job("h.policy"))
    wait_for(lambda: state_of(db, job_id) == "dead", what="dead after the policy gave up")
    assert row(db, job_id)["attempts"] == 3  # of max_attempts 10
    assert [d for w, d in traced(trace_dir, job_id) if w == "handler"] == ["1", "2", "3"]


def test_a_failing_retry_policy_falls_back_to_the_backoff(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster, trace_dir: Path
) -> None:
    m = start(start_master, trace_dir)
    job_id, _ = queue.enqueue(brooq.Job("h.broken-policy"))
    wait_for(lambda: state_of(db, job_id) == "dead", what="dead after max_attempts")
    assert row(db, job_id)["attempts"] == 2
    assert "event=retry_policy_failed" in m.log()
    assert "KeyError: 'policy bug'" in m.log()
