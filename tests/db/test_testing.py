"""brooq.testing (drain, jobs, bind) and the pytest plugin's brooq_dsn, against real
PostgreSQL; the plugin through a real pytest run of a user's test file."""

from __future__ import annotations

import asyncio
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


# -- async handlers ---------------------------------------------------------------------


def async_app(dsn: str) -> brooq.Queue:
    """An application with async handlers, one sync topic, and a Queue middleware of each
    kind; ``q.ran`` records what ran, in order."""
    q = brooq.Queue(dsn)
    ran: list[str] = []
    q.ran = ran  # type: ignore[attr-defined]
    q.seen = {}  # type: ignore[attr-defined]

    @q.middleware
    def sync_mw(claim: brooq.Claim[Any], call_next: Any) -> Any:
        ran.append(f"sync-mw:{claim.topic}")
        return call_next(claim)

    @q.middleware
    async def async_mw(claim: brooq.Claim[Any], call_next: Any) -> Any:
        ran.append(f"async-mw:{claim.topic}")
        value = await call_next(claim)
        ran.append(f"async-mw-after:{claim.topic}")
        return {**value, "wrapped": True} if isinstance(value, dict) else value

    async def topic_mw(claim: brooq.Claim[Any], call_next: Any) -> Any:
        ran.append(f"topic-mw:{claim.topic}")
        return await call_next(claim)

    @q.handler("a.ok", middleware=[topic_mw])
    async def ok(claim: brooq.Claim[Any]) -> Any:
        await asyncio.sleep(0.01)  # it really suspends
        ran.append("a.ok")
        if claim.payload.get("chain"):
            claim.chain(brooq.Job("s.ok", {"from": claim.payload["n"]}))
        return {"n": claim.payload["n"]}

    @q.handler("s.ok")
    def sync_ok(claim: brooq.Claim[Any]) -> Any:
        ran.append("s.ok")
        return {"sync": claim.payload}

    @q.handler("a.fail", max_attempts=2, backoff_base="1ms", backoff_max="2ms")
    async def fail(claim: brooq.Claim[Any]) -> None:
        await asyncio.sleep(0)
        ran.append(f"a.fail:{claim.attempt}")
        raise ValueError(f"bad address {claim.attempt}")

    @q.handler("a.cancel")
    async def cancel(claim: brooq.Claim[Any]) -> None:
        raise brooq.CancelJob("not wanted")

    @q.handler("a.slow", attempt_timeout="200ms", max_attempts=1)
    async def slow(claim: brooq.Claim[Any]) -> None:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            ran.append("a.slow:cancelled")
            raise

    @q.handler("a.own-timeout", max_attempts=1)
    async def own_timeout(claim: brooq.Claim[Any]) -> None:
        raise TimeoutError("the upstream took too long")

    @q.handler("a.loop")
    async def on_the_loop(claim: brooq.Claim[Any]) -> Any:
        q.seen["loop"] = asyncio.get_running_loop()  # type: ignore[attr-defined]
        await q.seen["gate"].wait()  # type: ignore[attr-defined]  # set by the test's task
        return {"opened": True}

    @q.handler("a.hang", attempt_timeout="30s")
    async def hang(claim: brooq.Claim[Any]) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            ran.append("a.hang:ended")

    return q


@pytest.fixture
def aq(dsn: str) -> Any:
    queue = async_app(dsn)
    yield queue
    queue.close()


def test_drain_runs_an_async_handler_inside_its_async_middleware(aq: Any) -> None:
    job_id, _ = aq.enqueue(brooq.Job("a.ok", {"n": 1}))
    assert brooq.testing.drain(aq) == {"done": 1}
    # The Queue's async middleware, then the topic's, then the handler; no sync layer.
    assert aq.ran == ["async-mw:a.ok", "topic-mw:a.ok", "a.ok", "async-mw-after:a.ok"]
    record = aq.get(job_id)
    assert (record.state, record.result) == ("done", {"n": 1, "wrapped": True})


def test_drain_fails_an_async_job_as_a_sync_one(aq: Any) -> None:
    failing, _ = aq.enqueue(brooq.Job("a.fail"))
    canceled, _ = aq.enqueue(brooq.Job("a.cancel"))
    own, _ = aq.enqueue(brooq.Job("a.own-timeout"))
    # failed once (retried after 1-2 ms, in the same drain), then dead; CancelJob cancels.
    assert brooq.testing.drain(aq) == {"failed": 1, "dead": 2, "canceled": 1}
    assert aq.ran.count("a.fail:1") == 1 and aq.ran.count("a.fail:2") == 1
    record = aq.get(failing)
    assert (record.state, record.attempts) == ("dead", 2)
    assert record.last_error == "ValueError: bad address 2"
    assert [e["attempt"] for e in record.errors] == [1, 2]
    assert aq.get(canceled).state == "canceled"
    assert aq.get(canceled).last_error == "CancelJob: not wanted"
    # A TimeoutError of the handler's own is not brooq's soft limit.
    assert aq.get(own).last_error == "TimeoutError: the upstream took too long"


def test_drain_cancels_an_async_job_at_its_attempt_timeout(aq: Any) -> None:
    slow, _ = aq.enqueue(brooq.Job("a.slow"))
    started = time.monotonic()
    assert brooq.testing.drain(aq) == {"dead": 1}
    assert time.monotonic() - started < 3
    assert "a.slow:cancelled" in aq.ran  # cancelled in the handler, as wait_for does
    assert aq.get(slow).last_error == "AttemptTimeout: attempt_timeout 0.2s exceeded"

    # In another thread too: the loop's timer needs no signal.
    aq.enqueue(brooq.Job("a.slow"))
    out: list[dict[str, int]] = []
    worker = threading.Thread(target=lambda: out.append(brooq.testing.drain(aq)))
    worker.start()
    worker.join(30)
    assert out == [{"dead": 1}] and aq.ran.count("a.slow:cancelled") == 2


def test_drain_a_mixed_queue_wraps_each_handler_in_middleware_of_its_kind(aq: Any) -> None:
    aq.enqueue(brooq.Job("a.ok", {"n": 3, "chain": True}))  # chains a sync job
    assert brooq.testing.drain(aq) == {"done": 2}
    assert aq.ran == [
        "async-mw:a.ok",
        "topic-mw:a.ok",
        "a.ok",
        "async-mw-after:a.ok",
        "sync-mw:s.ok",
        "s.ok",
    ]
    [chained] = brooq.testing.jobs(aq, topic="s.ok")
    assert (chained.state, chained.result) == ("done", {"sync": {"from": 3}})


def test_drain_async_runs_on_the_callers_loop(aq: Any) -> None:
    """In a test running its own loop (as pytest-asyncio's): drain refuses the async
    topics before claiming anything, drain_async runs them on that loop."""
    job_id, _ = aq.enqueue(brooq.Job("a.loop"))
    aq.enqueue(brooq.Job("s.ok", {"n": 1}))
    aq.enqueue(brooq.Job("a.ok", {"n": 2}))

    async def test() -> tuple[dict[str, int], dict[str, int]]:
        with pytest.raises(RuntimeError, match=r"await brooq\.testing\.drain_async"):
            brooq.testing.drain(aq)
        only_sync = brooq.testing.drain(aq, topics=["s.ok"])  # no loop needed: as before
        aq.seen["gate"] = asyncio.Event()  # of this loop: it cannot be awaited on another

        async def open_gate() -> None:  # runs while the handler awaits: the loop is free
            await asyncio.sleep(0.05)
            aq.seen["gate"].set()

        opener = asyncio.create_task(open_gate())
        counts = await brooq.testing.drain_async(aq)
        await opener
        assert aq.seen["loop"] is asyncio.get_running_loop()
        return only_sync, counts

    only_sync, counts = asyncio.run(test())
    assert only_sync == {"done": 1} and counts == {"done": 2}
    assert aq.get(job_id).result == {"opened": True, "wrapped": True}
    assert [j.state for j in brooq.testing.jobs(aq)] == ["done", "done", "done"]
    assert aq.ran[:2] == ["sync-mw:s.ok", "s.ok"]


def test_drain_async_cancelled_gives_the_running_job_back(aq: Any) -> None:
    job_id, _ = aq.enqueue(brooq.Job("a.hang"))

    async def test() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(brooq.testing.drain_async(aq), 0.5)

    asyncio.run(test())
    assert aq.ran == ["async-mw:a.hang", "a.hang:ended"]  # cancelled, and it finished
    record = aq.get(job_id)
    assert (record.state, record.attempts, record.locked_by) == ("pending", 0, None)


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


def run_users_file(tmp_path: Path, source: str, **extra_env: str) -> None:
    """A user's test file of two tests, run by a pytest of its own in ``tmp_path`` with the
    plugin alone (no conftest), on the server this run uses; both must pass."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent(source))
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_")}
    env.pop("DATABASE_URL", None)
    env.update(extra_env)
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


USER_DROP_TEST = """
import os
import pathlib

import psycopg
from psycopg import conninfo

RECORD = pathlib.Path(os.environ["BROOQ_RECORD"])


def test_first(brooq_dsn, brooq_template):
    RECORD.write_text(conninfo.conninfo_to_dict(brooq_dsn)["dbname"] + " " + brooq_template)


def test_second(brooq_dsn, brooq_admin_dsn):
    first = RECORD.read_text().split()[0]
    assert conninfo.conninfo_to_dict(brooq_dsn)["dbname"] != first
    with psycopg.connect(brooq_admin_dsn, autocommit=True) as conn:
        kept = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (first,))
        assert kept.fetchone() == (1,)  # kept until the run ends
        sessions = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (first,)
        )
        assert sessions.fetchone() == (0,)  # but no session of its test is left on it
"""


def test_the_plugins_databases_are_dropped_when_the_run_ends(tmp_path: Path) -> None:
    """A test's database outlives it (no checkpoint to wait for between tests), without
    its sessions, and is gone once the run has ended, the template with it. The drop is
    checked on a shared server (BROOQ_TEST_DSN); on the embedded server of the nested run
    the server goes whole."""
    record = tmp_path / "first-database"
    run_users_file(tmp_path, USER_DROP_TEST, BROOQ_RECORD=str(record))
    shared = os.environ.get("BROOQ_TEST_DSN")
    if shared:
        with psycopg.connect(shared, autocommit=True) as conn:
            names = record.read_text().split()
            assert len(names) == 2 and names[1].startswith("brooq_tpl")
            left = conn.execute(
                "SELECT count(*) FROM pg_database WHERE datname = ANY(%s)", (names,)
            )
            assert left.fetchone() == (0,)


def test_a_users_test_file_passes_with_only_the_plugin(tmp_path: Path) -> None:
    """The plugin is found through its entry point; the user's file has no conftest."""
    run_users_file(tmp_path, USER_TEST)
