"""brooq.testing (drain, jobs, bind) and the pytest plugin's brooq_dsn, against real
PostgreSQL; the plugin through a real pytest run of a user's test file (issue 19)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

import brooq
import brooq.testing


def app(dsn: str) -> brooq.Queue:
    """An application's Queue: what a user's tests would import."""
    q = brooq.Queue(dsn)
    ran: list[str] = []
    q.ran = ran  # type: ignore[attr-defined]

    @q.middleware
    def note(claim: brooq.Claim[Any], call_next: Any) -> Any:
        ran.append(f"mw:{claim.topic}")
        return call_next(claim)

    @q.handler("t.ok")
    def ok(claim: brooq.Claim[Any]) -> Any:
        ran.append("t.ok")
        if claim.payload and claim.payload.get("chain"):
            claim.chain(brooq.Job("t.ok", {"n": claim.payload["n"] + 1}))
        return {"n": (claim.payload or {}).get("n")}

    @q.handler("t.flaky", max_attempts=3, backoff_base="1ms", backoff_max="2ms")
    def flaky(claim: brooq.Claim[Any]) -> None:
        ran.append(f"t.flaky:{claim.attempt}")
        if claim.attempt < 2:
            raise ConnectionError("try again")

    @q.handler("t.dead", max_attempts=1)
    def dead(claim: brooq.Claim[Any]) -> None:
        raise ValueError("never")

    @q.handler("t.cancel")
    def cancel(claim: brooq.Claim[Any]) -> None:
        raise brooq.CancelJob("not wanted")

    @q.handler("t.slow", attempt_timeout="200ms", max_attempts=1)
    def slow(claim: brooq.Claim[Any]) -> None:
        time.sleep(5)

    @q.handler("t.hook")
    def hook(claim: brooq.Claim[Any]) -> None:
        claim.on_success(
            lambda conn: conn.execute(
                "INSERT INTO execution (job_id, pid, attempt, note) VALUES (%s, 0, 1, 'hook')",
                (claim.id,),
            )
        )

    return q


@pytest.fixture
def q(dsn: str, db: psycopg.Connection[Any]) -> Any:
    db.execute(
        "CREATE TABLE IF NOT EXISTS execution (job_id uuid, pid int, attempt int, note text)"
    )
    queue = app(dsn)
    yield queue
    queue.close()


def test_drain_runs_what_is_ready_with_the_workers_semantics(q: Any) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    q.enqueue_many(
        [
            brooq.Job("t.ok", {"n": 1, "chain": True}),
            brooq.Job("t.flaky"),
            brooq.Job("t.dead"),
            brooq.Job("t.cancel"),
            brooq.Job("t.ok", {"n": 9}, available_at=later),
        ]
    )
    counts = brooq.testing.drain(q)
    # The chained job ran in the same drain; flaky failed once then (backoff 1-2 ms) ran.
    assert counts == {"done": 3, "failed": 1, "dead": 1, "canceled": 1}
    assert q.ran.count("t.ok") == 2 and "t.flaky:1" in q.ran and "t.flaky:2" in q.ran
    assert "mw:t.ok" in q.ran  # the Queue's middleware wraps every job
    states = {(j.topic, j.state) for j in brooq.testing.jobs(q)}
    assert states == {
        ("t.ok", "done"),
        ("t.flaky", "done"),
        ("t.dead", "dead"),
        ("t.cancel", "canceled"),
        ("t.ok", "pending"),  # scheduled for later: stays
    }
    done = brooq.testing.jobs(q, topic="t.ok", state="done")
    assert [j.result for j in done] == [{"n": 1}, {"n": 2}]  # oldest first
    [flaky] = brooq.testing.jobs(q, topic="t.flaky")
    assert [e["attempt"] for e in flaky.errors] == [1]
    assert brooq.testing.drain(q) == {}  # nothing left that is ready


def test_drain_honours_the_soft_timeout_and_on_success(q: Any, db: psycopg.Connection[Any]) -> None:
    slow, _ = q.enqueue(brooq.Job("t.slow"))
    hooked, _ = q.enqueue(brooq.Job("t.hook"))
    # A timer of the test's own (pytest-timeout arms one the same way) survives the drain.
    fired: list[int] = []
    before = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        started = time.monotonic()
        assert brooq.testing.drain(q) == {"dead": 1, "done": 1}
        assert time.monotonic() - started < 3
        assert 25 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        time.sleep(0.2)
        assert fired == [signal.SIGALRM]  # the test's own handler is back
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    assert q.get(slow).last_error == "AttemptTimeout: attempt_timeout 0.2s exceeded"
    assert db.execute("SELECT job_id FROM execution").fetchall() == [(hooked,)]


def test_drain_filters_topics_leaves_paused_queues_and_stops_at_max_jobs(q: Any) -> None:
    q.enqueue_many([brooq.Job("t.ok", {"n": i}) for i in range(5)] + [brooq.Job("t.dead")])
    assert brooq.testing.drain(q, topics=["t.ok"], max_jobs=2) == {"done": 2}
    q.pause("default")
    assert brooq.testing.drain(q) == {}
    q.resume("default")
    assert brooq.testing.drain(q, topics=["t.ok"]) == {"done": 3}
    assert [j.state for j in brooq.testing.jobs(q, topic="t.dead")] == ["pending"]
    with pytest.raises(ValueError, match="no handler for topic 'nope'"):
        brooq.testing.drain(q, topics=["nope"])


def test_drain_in_another_thread_runs_without_the_timer(q: Any) -> None:
    q.enqueue(brooq.Job("t.ok"))
    out: list[dict[str, int]] = []
    worker = threading.Thread(target=lambda: out.append(brooq.testing.drain(q)))
    worker.start()
    worker.join(30)
    assert out == [{"done": 1}]


def test_bind_points_an_application_queue_at_a_database_and_back(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    application = brooq.Queue("postgresql://nobody@127.0.0.1:1/nowhere")
    with brooq.testing.bind(application, dsn) as bound:
        bound.enqueue(brooq.Job("t.ok"))
    assert db.execute("SELECT count(*) FROM job").fetchone() == (1,)
    assert application.dsn == "postgresql://nobody@127.0.0.1:1/nowhere"


USER_TEST = """
import brooq
import brooq.testing
import pytest


@pytest.fixture
def queue(brooq_dsn):
    q = brooq.Queue()  # the application's, as imported: no DSN of its own

    @q.handler("signup.welcome")
    def welcome(claim):
        claim.chain(brooq.Job("signup.followup", {"user": claim.payload["user"]}))

    @q.handler("signup.followup")
    def followup(claim):
        return {"sent_to": claim.payload["user"]}

    with brooq.testing.bind(q, brooq_dsn):
        yield q


def test_welcome_chains_a_followup(queue):
    queue.enqueue(brooq.Job("signup.welcome", {"user": 7}))
    assert brooq.testing.drain(queue) == {"done": 2}
    [followup] = brooq.testing.jobs(queue, topic="signup.followup")
    assert followup.result == {"sent_to": 7}


def test_each_test_gets_a_fresh_database(queue):
    assert brooq.testing.jobs(queue) == []
"""


def test_a_users_test_file_passes_with_only_the_plugin(tmp_path: Path) -> None:
    """The plugin is found through its entry point; the user's file has no conftest."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TEST))
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.pop("DATABASE_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout
