"""Durable handlers' steps and sleeps against a real PostgreSQL, run by brooq.testing's
drain (the same backend a child sets, brooq.worker.durable): a recorded step never runs
again, its record is the lease's, a sleep parks the job without spending an attempt."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq
import brooq.migrate
import brooq.testing
from brooq.errors import MigrationError

Conn = psycopg.Connection[Any]


def row(db: Conn, job_id: uuid.UUID) -> dict[str, Any]:
    cur = db.execute(
        "SELECT state, attempts, locked_by, parked, available_at, last_error, result "
        "FROM job_all WHERE id = %s",
        (job_id,),
    )
    names = [d.name for d in cur.description or ()]
    found = cur.fetchone()
    assert found is not None
    return dict(zip(names, found, strict=True))


def drain(queue: brooq.Queue, db: Conn, job_id: uuid.UUID) -> None:
    """Drain until the job ended (a retry's backoff of a millisecond may not have passed
    when one drain looks)."""
    deadline = time.monotonic() + 30
    while row(db, job_id)["state"] not in ("done", "dead", "canceled"):
        assert time.monotonic() < deadline, row(db, job_id)
        brooq.testing.drain(queue)
        db.rollback()


def steps(db: Conn, job_id: uuid.UUID) -> list[str]:
    rows = db.execute(
        "SELECT name FROM brooq_job_step WHERE job_id = %s ORDER BY created_at, name", (job_id,)
    )
    return [r[0] for r in rows.fetchall()]


def test_a_recorded_step_never_runs_again(queue: brooq.Queue, db: Conn) -> None:
    ran: list[str] = []

    @queue.handler("d.steps", max_attempts=5, backoff_base="1ms", backoff_max="1ms")
    def handler(claim: brooq.Claim[Any]) -> Any:
        a = claim.step("a", lambda: ran.append("a") or 1)
        b = claim.step("b", lambda x: ran.append("b") or {"x": x + 1}, a)
        if claim.attempt == 1:
            raise ConnectionError("after b")
        c = claim.step("c", lambda: ran.append("c") or (1, 2))  # a tuple comes back a list
        if claim.attempt == 2:
            raise ConnectionError("after c")
        return {"a": a, "b": b, "c": c}

    job_id, _ = queue.enqueue(brooq.Job("d.steps"))
    drain(queue, db, job_id)
    assert ran == ["a", "b", "c"]
    got = row(db, job_id)
    assert got["state"] == "done" and got["attempts"] == 3
    assert got["result"] == {"a": 1, "b": {"x": 2}, "c": [1, 2]}
    assert steps(db, job_id) == ["a", "b", "c"]


def test_a_step_in_the_recording_transaction_writes_once(queue: brooq.Queue, db: Conn) -> None:
    db.execute("CREATE TABLE app_ledger (job uuid, n int)")
    db.commit()

    @queue.handler("d.tx", max_attempts=3, backoff_base="1ms", backoff_max="1ms")
    def handler(claim: brooq.Claim[Any]) -> Any:
        def write(conn: Conn, n: int) -> int:
            conn.execute("INSERT INTO app_ledger VALUES (%s, %s)", (claim.id, n))
            return n

        n = claim.step("ledger", write, 7, transaction=True)
        if claim.attempt == 1:
            raise ConnectionError("after the ledger")
        return n

    job_id, _ = queue.enqueue(brooq.Job("d.tx"))
    drain(queue, db, job_id)
    assert row(db, job_id)["state"] == "done"
    assert db.execute("SELECT count(*) FROM app_ledger").fetchone() == (1,)


def test_a_step_that_raised_is_not_recorded_and_its_writes_roll_back(
    queue: brooq.Queue, db: Conn
) -> None:
    db.execute("CREATE TABLE app_ledger (n int)")
    db.commit()
    calls: list[int] = []

    @queue.handler("d.raise", max_attempts=3, backoff_base="1ms", backoff_max="1ms")
    def handler(claim: brooq.Claim[Any]) -> Any:
        def write(conn: Conn) -> int:
            conn.execute("INSERT INTO app_ledger VALUES (1)")
            calls.append(claim.attempt)
            if claim.attempt == 1:
                raise ConnectionError("in the step")
            return 1

        return claim.step("ledger", write, transaction=True)

    job_id, _ = queue.enqueue(brooq.Job("d.raise"))
    drain(queue, db, job_id)
    assert calls == [1, 2]
    assert row(db, job_id)["state"] == "done"
    assert db.execute("SELECT count(*) FROM app_ledger").fetchone() == (1,)


def test_an_unencodable_result_and_a_name_used_twice_are_refused(
    queue: brooq.Queue, db: Conn
) -> None:
    @queue.handler("d.object", max_attempts=1)
    def unencodable(claim: brooq.Claim[Any]) -> Any:
        return claim.step("thing", object)

    @queue.handler("d.twice", max_attempts=1)
    def twice(claim: brooq.Claim[Any]) -> Any:
        claim.step("same", lambda: 1)
        return claim.step("same", lambda: 2)

    @queue.handler("d.internal", max_attempts=1)
    def internal(claim: brooq.Claim[Any]) -> Any:
        return claim.step("__sleep:0", lambda: 1)

    first, _ = queue.enqueue(brooq.Job("d.object"))
    second, _ = queue.enqueue(brooq.Job("d.twice"))
    third, _ = queue.enqueue(brooq.Job("d.internal"))
    brooq.testing.drain(queue)
    got = row(db, first)
    assert got["state"] == "dead"
    assert "the result of step 'thing' is not JSON-serialisable" in got["last_error"]
    assert steps(db, first) == []
    got = row(db, second)
    assert got["state"] == "dead"
    assert "step name 'same' is used twice" in got["last_error"]
    assert steps(db, second) == ["same"]
    assert "names starting with '__' are brooq's own" in row(db, third)["last_error"]


def test_a_step_that_raised_may_be_called_again_in_the_same_run(
    queue: brooq.Queue, db: Conn
) -> None:
    calls: list[int] = []

    @queue.handler("d.again", max_attempts=1)
    def handler(claim: brooq.Claim[Any]) -> Any:
        def flaky() -> int:
            calls.append(1)
            if len(calls) < 3:
                raise ConnectionError("not yet")
            return len(calls)

        for _ in range(3):
            try:
                return claim.step("flaky", flaky)
            except ConnectionError:
                continue
        return None

    job_id, _ = queue.enqueue(brooq.Job("d.again"))
    assert brooq.testing.drain(queue) == {"done": 1}
    assert row(db, job_id)["result"] == 3
    assert steps(db, job_id) == ["flaky"]


def test_a_step_after_the_lease_was_lost_records_nothing(queue: brooq.Queue, db: Conn) -> None:
    @queue.handler("d.lost")
    def handler(claim: brooq.Claim[Any]) -> Any:
        with psycopg.connect(queue.dsn, autocommit=True) as other:  # the reaper, say
            other.execute(
                "UPDATE job SET state = 'pending', locked_by = NULL, locked_until = NULL "
                "WHERE id = %s",
                (claim.id,),
            )
        return claim.step("late", lambda: 1)

    job_id, _ = queue.enqueue(brooq.Job("d.lost"))
    brooq.testing.drain(queue, max_jobs=1)
    assert steps(db, job_id) == []
    assert row(db, job_id)["state"] == "pending"


def test_a_sleep_parks_the_job_and_resumes_past_its_wake_time(queue: brooq.Queue, db: Conn) -> None:
    ran: list[str] = []

    @queue.handler("d.sleep", max_attempts=1)
    def handler(claim: brooq.Claim[Any]) -> Any:
        claim.step("before", lambda: ran.append("before"))
        claim.sleep("1h")
        claim.step("after", lambda: ran.append("after"))
        return "woke"

    job_id, _ = queue.enqueue(brooq.Job("d.sleep"))
    started = datetime.now(timezone.utc)
    assert brooq.testing.drain(queue) == {}
    got = row(db, job_id)
    assert got["state"] == "pending" and got["locked_by"] is None and got["attempts"] == 0
    assert got["parked"] == "sleep"
    assert started + timedelta(minutes=59) < got["available_at"] < started + timedelta(hours=2)
    assert ran == ["before"]
    # Its wake time comes: the sleep returns at once, the step before it is not run again.
    db.execute("UPDATE brooq_job_step SET result = to_jsonb(now()::text) WHERE name = '__sleep:0'")
    db.execute("UPDATE job SET available_at = now() WHERE id = %s", (job_id,))
    db.commit()
    assert brooq.testing.drain(queue) == {"done": 1}
    got = row(db, job_id)
    assert got["state"] == "done" and got["attempts"] == 1 and got["result"] == "woke"
    assert ran == ["before", "after"]
    assert steps(db, job_id) == ["before", "__sleep:0", "after"]


def test_sleep_until_refuses_a_naive_datetime(queue: brooq.Queue, db: Conn) -> None:
    @queue.handler("d.naive", max_attempts=1)
    def handler(claim: brooq.Claim[Any]) -> Any:
        claim.sleep_until(datetime.now())  # naive: the point

    job_id, _ = queue.enqueue(brooq.Job("d.naive"))
    brooq.testing.drain(queue)
    assert "NaiveDatetime" in row(db, job_id)["last_error"]


def test_a_sleep_already_past_returns_at_once(queue: brooq.Queue, db: Conn) -> None:
    @queue.handler("d.past", max_attempts=1)
    def handler(claim: brooq.Claim[Any]) -> Any:
        claim.sleep_until(datetime.now(timezone.utc) - timedelta(seconds=1))
        claim.sleep(0)
        return 1

    job_id, _ = queue.enqueue(brooq.Job("d.past"))
    assert brooq.testing.drain(queue) == {"done": 1}
    assert steps(db, job_id) == ["__sleep:0", "__sleep:1"]


@pytest.mark.parametrize("drain_async", [False, True])
def test_async_handlers_await_the_same_operations(
    queue: brooq.Queue, db: Conn, drain_async: bool
) -> None:
    ran: list[str] = []

    async def fetch(x: int) -> int:
        ran.append("fetch")
        await asyncio.sleep(0)
        return x * 2

    @queue.handler("d.async", max_attempts=3, backoff_base="1ms", backoff_max="1ms")
    async def handler(claim: brooq.Claim[Any]) -> Any:
        a = await claim.step("fetch", fetch, 21)
        b = await claim.step("plain", lambda: ran.append("plain") or "p")
        if claim.attempt == 1:
            raise ConnectionError("after the steps")
        await claim.sleep(0)
        return [a, b]

    job_id, _ = queue.enqueue(brooq.Job("d.async"))
    if drain_async:
        asyncio.run(brooq.testing.drain_async(queue))
    drain(queue, db, job_id)
    got = row(db, job_id)
    assert got["state"] == "done" and got["result"] == [42, "p"]
    assert ran == ["fetch", "plain"]


def test_a_connection_lost_between_a_step_and_its_record_runs_it_again_recorded_once(
    queue: brooq.Queue, db: Conn
) -> None:
    """pg_terminate_backend of the backend's connection after the step's body ended and
    before its record: not recorded, the attempt fails, the next runs the body again and
    records it once (on a new connection)."""
    bodies: list[int] = []

    @queue.handler("d.cut", max_attempts=3, backoff_base="1ms", backoff_max="1ms")
    def handler(claim: brooq.Claim[Any]) -> Any:
        claim.step("warm", lambda: None)  # the backend's connection is open from here

        def body() -> int:
            bodies.append(claim.attempt)
            if claim.attempt == 1:
                pid = brooq.Claim.durable._conn().info.backend_pid
                with psycopg.connect(queue.dsn, autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            return len(bodies)

        return claim.step("cut", body)

    job_id, _ = queue.enqueue(brooq.Job("d.cut"))
    drain(queue, db, job_id)
    got = row(db, job_id)
    assert got["state"] == "done" and got["result"] == 2 and got["attempts"] == 2
    assert bodies == [1, 2]
    assert steps(db, job_id) == ["warm", "cut"]


@pytest.mark.parametrize("parked", ["sleep", "event", "jobs"])
def test_the_down_step_refuses_while_a_job_is_parked(
    queue: brooq.Queue, db: Conn, dsn: str, parked: str
) -> None:
    @queue.handler("d.park")
    def handler(claim: brooq.Claim[Any]) -> Any:
        if parked == "sleep":
            claim.sleep("1h")
        elif parked == "event":
            claim.wait_event("k")
        else:
            claim.wait_jobs([claim.spawn(brooq.Job("d.never"))])

    job_id, _ = queue.enqueue(brooq.Job("d.park"))
    brooq.testing.drain(queue, topics=["d.park"])
    assert row(db, job_id)["parked"] == parked
    db.rollback()
    with pytest.raises(MigrationError, match="jobs are parked"):
        brooq.migrate.down(dsn, to=16)
    db.execute("UPDATE job SET state = 'canceled'")
    db.commit()
    brooq.migrate.down(dsn, to=16)
    assert db.execute("SELECT to_regclass('brooq_job_step')").fetchone() == (None,)


def test_a_retried_job_keeps_its_steps_unless_retried_fresh(queue: brooq.Queue, db: Conn) -> None:
    ran: list[str] = []

    @queue.handler("d.retry", max_attempts=1)
    def handler(claim: brooq.Claim[Any]) -> Any:
        claim.step("costly", lambda: ran.append("costly"))
        if len(ran) < 3 and claim.payload.get("fail", True):
            raise ValueError("fails after the costly step")
        return len(ran)

    job_id, _ = queue.enqueue(brooq.Job("d.retry"))
    brooq.testing.drain(queue)
    assert row(db, job_id)["state"] == "dead" and ran == ["costly"]
    db.rollback()
    assert queue.retry(job_id)  # kept: the step is not run again, the job dies again
    brooq.testing.drain(queue)
    assert row(db, job_id)["state"] == "dead" and ran == ["costly"]
    db.rollback()
    assert queue.retry(job_id, fresh=True)  # forgotten: the step runs again
    brooq.testing.drain(queue)
    assert row(db, job_id)["state"] == "dead" and ran == ["costly", "costly"]
    db.rollback()
    assert queue.retry(job_id, fresh=True)
    brooq.testing.drain(queue)
    assert row(db, job_id)["state"] == "done" and ran == ["costly"] * 3
    assert not queue.retry(job_id, fresh=True)  # done: nothing moves, nothing forgotten
    assert steps(db, job_id) == ["costly"]


def test_a_step_name_the_record_cannot_key_is_refused(queue: brooq.Queue, db: Conn) -> None:
    @queue.handler("d.names", max_attempts=1)
    def handler(claim: brooq.Claim[Any]) -> Any:
        name = {"nul": "a\x00b", "long": "n" * 1025}[claim.payload]
        return claim.step(name, lambda: 1)

    nul, _ = queue.enqueue(brooq.Job("d.names", "nul"))
    long, _ = queue.enqueue(brooq.Job("d.names", "long"))
    brooq.testing.drain(queue)
    assert "at most 1024 characters, no \\x00" in row(db, nul)["last_error"]
    assert "at most 1024 characters" in row(db, long)["last_error"]
