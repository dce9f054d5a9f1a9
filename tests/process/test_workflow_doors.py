"""Single enqueues with after, against a real brooq-master whose idle children claim
whatever becomes pending: a job named after a running job never starts before it ends,
and one named after a dead job is canceled, never run, whichever door enqueued it.
The application is tests/apps/brooq_flowapp.py (its handlers note when they start)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg

import brooq
from tests.harness import StartMaster, wait_for
from tests.process.test_workflows import notes, states

APP = "brooq_flowapp:queue"
Conn = psycopg.Connection[Any]
EACH = 40  # jobs per door


def _enqueue_all(queue: brooq.Queue, dsn: str, up: uuid.UUID) -> list[uuid.UUID]:
    """EACH jobs after ``up`` through Queue.enqueue, Queue.enqueue_async and
    brooq.enqueue on a connection in autocommit; each is checked the moment its call
    returns: it waits, or was canceled."""
    made: list[uuid.UUID] = []

    def job() -> brooq.Job:
        return brooq.Job("flow.step", {"down": True}, after=[up])

    made += [queue.enqueue(job())[0] for _ in range(EACH)]

    async def go() -> list[uuid.UUID]:
        try:
            return [(await queue.enqueue_async(job()))[0] for _ in range(EACH)]
        finally:
            await queue.close_async()

    made += asyncio.run(go())
    with psycopg.connect(dsn, autocommit=True) as conn:
        made += [brooq.enqueue(conn, job())[0] for _ in range(EACH)]
    return made


def test_a_job_after_a_running_one_starts_after_it_ends(
    queue: brooq.Queue, db: Conn, dsn: str, start_master: StartMaster
) -> None:
    start_master(workers=3, app=APP)
    up, _ = queue.enqueue(brooq.Job("flow.step", {"sleep": 3}))
    wait_for(lambda: any(j == up and n == "start" for j, n, _ in notes(db)), what="up started")
    downs = _enqueue_all(queue, dsn, up)
    ended = [at for j, n, at in notes(db) if j == up and n == "end"]
    assert not ended, "the upstream job ended during the enqueues: make it sleep longer"
    started_early = [j for j, n, _ in notes(db) if n == "start" and j in set(downs)]
    assert started_early == []
    wait_for(lambda: states(db, [up, *downs]) == ["done"] * (1 + len(downs)), what="all done")
    seen = notes(db)
    (up_end,) = [at for j, n, at in seen if j == up and n == "end"]
    assert all(at > up_end for j, n, at in seen if j in set(downs) and n == "start")


def test_a_job_after_a_dead_one_never_runs(
    queue: brooq.Queue, db: Conn, dsn: str, start_master: StartMaster
) -> None:
    start_master(workers=3, app=APP)
    up, _ = queue.enqueue(brooq.Job("flow.step", {"fail": True}))
    wait_for(lambda: states(db, [up]) == ["dead"], what="the upstream job dead")
    downs = _enqueue_all(queue, dsn, up)
    assert states(db, downs) == ["canceled"] * len(downs)
    # Give the children a claim round trip: a pending row would be claimed by now.
    probe, _ = queue.enqueue(brooq.Job("flow.step", {}))
    wait_for(lambda: states(db, [probe]) == ["done"], what="a plain job run")
    assert [j for j, n, _ in notes(db) if j in set(downs)] == []
