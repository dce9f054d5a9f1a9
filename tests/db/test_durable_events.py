"""Events durable handlers wait for, against a real PostgreSQL, run by brooq.testing's
drain: the first emit of a key wins, an emit before the wait is kept, a wait parks the job
(no attempt spent) until the emit, which releases it in the emitter's transaction (a
rollback releases nothing), a timeout counts from the wait's first call."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq
import brooq.testing
from tests.db.test_durable_steps import drain, row, steps

Conn = psycopg.Connection[Any]


def waits(db: Conn) -> list[tuple[Any, ...]]:
    return db.execute("SELECT job_id, key FROM brooq_event_wait ORDER BY since").fetchall()


def waiter(queue: brooq.Queue, ran: list[str]) -> None:
    @queue.handler("e.wait", max_attempts=1)
    def handler(claim: brooq.Claim[Any]) -> Any:
        ran.append("top")
        claim.step("before", lambda: ran.append("before"))
        timeout = claim.payload.get("timeout")
        try:
            got = claim.wait_event(claim.payload["key"], timeout=timeout)
        except brooq.WaitTimeout as exc:
            return {"timed_out": str(exc)}
        return {"got": got}


def test_the_first_emit_wins_and_is_kept_for_a_later_wait(queue: brooq.Queue, db: Conn) -> None:
    ran: list[str] = []
    waiter(queue, ran)
    assert queue.emit_event("order-1", {"approved": True}) is True
    assert queue.emit_event("order-1", {"approved": False}) is False
    job_id, _ = queue.enqueue(brooq.Job("e.wait", {"key": "order-1"}))
    assert brooq.testing.drain(queue) == {"done": 1}
    assert row(db, job_id)["result"] == {"got": {"approved": True}}
    assert ran == ["top", "before"]


def test_a_wait_parks_until_the_emit_releases_it(queue: brooq.Queue, db: Conn) -> None:
    ran: list[str] = []
    waiter(queue, ran)
    job_id, _ = queue.enqueue(brooq.Job("e.wait", {"key": "k"}))
    assert brooq.testing.drain(queue) == {}
    got = row(db, job_id)
    assert got["state"] == "waiting" and got["locked_by"] is None and got["attempts"] == 0
    assert got["parked"] == "event"
    assert waits(db) == [(job_id, "k")]
    assert brooq.testing.drain(queue) == {}  # nothing to run while it waits
    assert queue.emit_event("k", [1, 2]) is True
    db.rollback()
    assert row(db, job_id)["state"] == "pending" and waits(db) == []
    assert brooq.testing.drain(queue) == {"done": 1}
    got = row(db, job_id)
    assert got["result"] == {"got": [1, 2]} and got["attempts"] == 1
    assert ran == ["top", "before", "top"]  # the step before the wait ran once
    assert steps(db, job_id) == ["before", "__event:k"]


def test_an_emit_in_a_rolled_back_transaction_releases_nothing(
    queue: brooq.Queue, db: Conn
) -> None:
    waiter(queue, [])
    job_id, _ = queue.enqueue(brooq.Job("e.wait", {"key": "tx"}))
    brooq.testing.drain(queue)
    with psycopg.connect(queue.dsn) as conn:
        assert brooq.emit_event(conn, "tx", {"n": 1}) is True
        conn.rollback()
    assert row(db, job_id)["state"] == "waiting"
    assert db.execute("SELECT count(*) FROM brooq_event").fetchone() == (0,)
    db.rollback()
    with psycopg.connect(queue.dsn) as conn, conn.cursor() as cur:
        assert brooq.emit_event(cur, "tx", {"n": 2}) is True
        assert row(db, job_id)["state"] == "waiting"  # not before the commit
        db.rollback()
    assert row(db, job_id)["state"] == "pending"
    db.rollback()
    drain(queue, db, job_id)
    assert row(db, job_id)["result"] == {"got": {"n": 2}}


def test_the_async_doors_emit_too(queue: brooq.Queue, db: Conn) -> None:
    waiter(queue, [])
    first, _ = queue.enqueue(brooq.Job("e.wait", {"key": "a1"}))
    second, _ = queue.enqueue(brooq.Job("e.wait", {"key": "a2"}))
    brooq.testing.drain(queue)

    async def emit() -> tuple[bool, bool, bool]:
        one = await queue.emit_event_async("a1", "x")
        async with await psycopg.AsyncConnection.connect(queue.dsn) as conn:
            two = await brooq.emit_event_async(conn, "a2", "y")
            again = await brooq.emit_event_async(conn, "a2", "z")
        return one, two, again

    assert asyncio.run(emit()) == (True, True, False)
    assert brooq.testing.drain(queue) == {"done": 2}
    assert row(db, first)["result"] == {"got": "x"}
    assert row(db, second)["result"] == {"got": "y"}


def test_a_timeout_counts_from_the_first_call_then_raises(queue: brooq.Queue, db: Conn) -> None:
    waiter(queue, [])
    job_id, _ = queue.enqueue(brooq.Job("e.wait", {"key": "late", "timeout": "1h"}))
    started = datetime.now(timezone.utc)
    brooq.testing.drain(queue)
    got = row(db, job_id)
    assert got["state"] == "pending" and got["parked"] == "event" and got["attempts"] == 0
    assert started + timedelta(minutes=59) < got["available_at"] < started + timedelta(hours=2)
    # The deadline passes with no emit: the wait raises WaitTimeout in the handler.
    db.execute(
        "UPDATE brooq_job_step SET result = to_jsonb(now()::text) "
        "WHERE name = '__event_deadline:late'"
    )
    db.execute("UPDATE job SET available_at = now() WHERE id = %s", (job_id,))
    db.commit()
    assert brooq.testing.drain(queue) == {"done": 1}
    assert "no event was emitted under key 'late'" in row(db, job_id)["result"]["timed_out"]
    assert waits(db) == []
    assert queue.emit_event("late") is True  # nothing waits any more
    db.rollback()
    assert row(db, job_id)["state"] == "done"


def test_an_emit_before_the_deadline_releases_a_wait_with_a_timeout(
    queue: brooq.Queue, db: Conn
) -> None:
    waiter(queue, [])
    job_id, _ = queue.enqueue(brooq.Job("e.wait", {"key": "soon", "timeout": "1h"}))
    brooq.testing.drain(queue)
    assert row(db, job_id)["state"] == "pending"
    queue.emit_event("soon", 5)
    assert brooq.testing.drain(queue) == {"done": 1}
    assert row(db, job_id)["result"] == {"got": 5}


@pytest.mark.parametrize(
    ("key", "words"),
    [("", "must not be empty"), (7, "must be a string"), ("a\x00b", "\\x00"), ("k" * 1025, "1025")],
)
def test_a_bad_key_is_refused_naming_it(queue: brooq.Queue, key: Any, words: str) -> None:
    with pytest.raises(ValueError, match="key") as info:
        queue.emit_event(key)
    assert words in str(info.value)


def test_an_unencodable_payload_is_refused(queue: brooq.Queue) -> None:
    with pytest.raises(brooq.InvalidPayload, match="the event's payload"):
        queue.emit_event("k", object())


def test_an_emit_names_no_job_it_does_not_wait_for(queue: brooq.Queue, db: Conn) -> None:
    """A pending job whose parked word is stale (it was claimed again since) and has no
    wait row is left alone by an emit."""
    job_id, _ = queue.enqueue(brooq.Job("e.other"))
    db.execute("UPDATE job SET parked = 'event' WHERE id = %s", (job_id,))
    db.commit()
    before = row(db, job_id)["available_at"]
    queue.emit_event("any")
    db.rollback()
    assert row(db, job_id)["available_at"] == before
    assert isinstance(job_id, uuid.UUID)


def test_a_parked_job_is_canceled_at_once_and_an_emit_then_leaves_it(
    queue: brooq.Queue, db: Conn
) -> None:
    waiter(queue, [])
    job_id, _ = queue.enqueue(brooq.Job("e.wait", {"key": "gone"}))
    brooq.testing.drain(queue)
    assert row(db, job_id)["state"] == "waiting"
    db.rollback()
    queue.cancel(job_id)
    assert queue.emit_event("gone", 1) is True
    db.rollback()
    assert row(db, job_id)["state"] == "canceled"
    assert brooq.testing.drain(queue) == {}
