"""Child jobs of durable handlers against a real PostgreSQL, run by brooq.testing's drain:
``claim.spawn`` makes a child once per call site whatever the attempts, ``claim.wait_jobs``
parks the parent (no attempt spent) until every child ended, then returns their records in
the order given; a failed child never cancels its parent, and the children are never the
parent's upstream jobs."""

from __future__ import annotations

from typing import Any

import psycopg

import brooq
import brooq.testing
from tests.db.test_durable_steps import drain, row

Conn = psycopg.Connection[Any]


def handlers(queue: brooq.Queue, ran: list[str]) -> None:
    @queue.handler("c.parent", max_attempts=3, backoff_base="1ms", backoff_max="1ms")
    def parent(claim: brooq.Claim[Any]) -> Any:
        ran.append(f"parent:{claim.attempt}")
        ids = [claim.spawn(brooq.Job("c.child", {"i": i})) for i in range(3)]
        ids.append(claim.spawn(brooq.Job("c.bad")))
        if claim.attempt == 1 and claim.payload.get("fail_after_spawn"):
            raise ConnectionError("after the spawns")
        records = claim.wait_jobs(reversed(ids))
        return [[str(r.id), r.topic, r.state, r.result, r.last_error] for r in records]

    @queue.handler("c.child")
    def child(claim: brooq.Claim[Any]) -> Any:
        ran.append(f"child:{claim.payload['i']}")
        return claim.payload["i"] * 10

    @queue.handler("c.bad", max_attempts=1)
    def bad(claim: brooq.Claim[Any]) -> Any:
        raise ValueError("this child fails")

    @queue.handler("c.prep")
    def prep(claim: brooq.Claim[Any]) -> Any:
        return None


def test_a_parent_waits_for_its_children_and_reads_their_records(
    queue: brooq.Queue, db: Conn
) -> None:
    ran: list[str] = []
    handlers(queue, ran)
    # A workflow's job (on_upstream_failure 'cancel'): a failed child still never cancels it.
    [(_, _), (parent_id, _)] = queue.enqueue_many(
        [prep := brooq.Job("c.prep"), brooq.Job("c.parent", {}, after=[prep])]
    )
    drain(queue, db, parent_id)
    got = row(db, parent_id)
    assert got["state"] == "done" and got["attempts"] == 1
    children = db.execute(
        "SELECT id, topic FROM job_all WHERE topic IN ('c.child', 'c.bad') ORDER BY id"
    ).fetchall()
    assert len(children) == 4
    result = got["result"]
    assert [r[1:4] for r in result] == [
        ["c.bad", "dead", None],
        ["c.child", "done", 20],
        ["c.child", "done", 10],
        ["c.child", "done", 0],
    ]
    assert "this child fails" in result[0][4]
    assert ran.count("parent:1") == 2  # parked once, woken once
    assert [u.topic for u in queue.upstream(parent_id)] == ["c.prep"]


def test_a_parent_that_fails_after_spawning_makes_its_children_once(
    queue: brooq.Queue, db: Conn
) -> None:
    ran: list[str] = []
    handlers(queue, ran)
    parent_id, _ = queue.enqueue(brooq.Job("c.parent", {"fail_after_spawn": True}))
    drain(queue, db, parent_id)
    assert row(db, parent_id)["state"] == "done"
    assert db.execute(
        "SELECT count(*) FROM job_all WHERE topic IN ('c.child', 'c.bad')"
    ).fetchone() == (4,)
    assert sorted(r for r in ran if r.startswith("child")) == ["child:0", "child:1", "child:2"]


def test_waiting_for_jobs_that_all_ended_returns_at_once(queue: brooq.Queue, db: Conn) -> None:
    @queue.handler("c.done")
    def done(claim: brooq.Claim[Any]) -> Any:
        return "d"

    @queue.handler("c.reader", max_attempts=1)
    def reader(claim: brooq.Claim[Any]) -> Any:
        return [r.result for r in claim.wait_jobs(claim.payload["ids"])]

    first, _ = queue.enqueue(brooq.Job("c.done"))
    brooq.testing.drain(queue)
    reader_id, _ = queue.enqueue(brooq.Job("c.reader", {"ids": [str(first)]}))
    assert brooq.testing.drain(queue) == {"done": 1}
    assert row(db, reader_id)["result"] == ["d"]


def test_waiting_for_a_job_that_does_not_exist_is_refused(queue: brooq.Queue, db: Conn) -> None:
    @queue.handler("c.missing", max_attempts=1)
    def missing(claim: brooq.Claim[Any]) -> Any:
        return claim.wait_jobs(["01a242e8-0000-7000-8000-000000000000"])

    job_id, _ = queue.enqueue(brooq.Job("c.missing"))
    brooq.testing.drain(queue)
    got = row(db, job_id)
    assert got["state"] == "dead"
    assert "wait_jobs names job 01a242e8-0000-7000-8000-000000000000" in got["last_error"]


def test_an_async_parent_awaits_spawn_and_wait_jobs(queue: brooq.Queue, db: Conn) -> None:
    """The same operations, awaited in an ``async def`` handler: children made once though
    the parent runs twice (parked, then woken), their records in the order given."""
    ran: list[str] = []

    @queue.handler("c.async_parent")
    async def parent(claim: brooq.Claim[Any]) -> Any:
        ran.append(f"parent:{claim.attempt}")
        ids = [await claim.spawn(brooq.Job("c.async_child", {"i": i})) for i in range(3)]
        records = await claim.wait_jobs(ids)
        return [[r.state, r.result] for r in records]

    @queue.handler("c.async_child")
    async def child(claim: brooq.Claim[Any]) -> Any:
        ran.append(f"child:{claim.payload['i']}")
        return claim.payload["i"] + 1

    parent_id, _ = queue.enqueue(brooq.Job("c.async_parent"))
    drain(queue, db, parent_id)
    got = row(db, parent_id)
    assert got["state"] == "done" and got["attempts"] == 1
    assert got["result"] == [["done", 1], ["done", 2], ["done", 3]]
    made = db.execute("SELECT count(*) FROM job_all WHERE topic = 'c.async_child'").fetchone()
    assert made == (3,)
    assert ran.count("parent:1") == 2  # parked once, woken once
    assert sorted(r for r in ran if r.startswith("child")) == ["child:0", "child:1", "child:2"]
