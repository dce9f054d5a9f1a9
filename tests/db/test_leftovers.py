"""What the master gives back once a dead child's database sessions are gone
(brooq.supervisor.leftovers), against a real database: a session still holding a claim
is ended (its claim rolled back), a claim that committed is given back with the attempt
refunded, and the job the child was running is left to its own settlement."""

from __future__ import annotations

import time
import uuid
from typing import Any

import psycopg

import brooq
from brooq.declare.handlers import Policy
from brooq.ipc import protocol
from brooq.supervisor.accounting import Accounting
from brooq.supervisor.childproc import ChildProc
from brooq.supervisor.connections import Connections
from brooq.supervisor.leftovers import Leftovers, session_name
from tests.harness import wait_for

CLAIM = (
    "UPDATE job SET state = 'processing', attempts = attempts + 1, locked_by = %s, "
    "locked_until = now() + interval '1 hour' WHERE id = ANY(%s)"
)


def leftovers(dsn: str) -> tuple[Leftovers, Connections]:
    conns = Connections(dsn, schema_verified=True, wake=lambda: None, reconnected=lambda: None)
    accounting = Accounting(conns, {}, Policy(5, 60, 120, 1, 60), None)
    return Leftovers(conns, accounting, 60.0, None, time.monotonic), conns


def dead_child(identity: str, kill_job: uuid.UUID | None = None) -> ChildProc:
    return ChildProc(
        pid=1,
        identity=identity,
        generation=0,
        to_child=-1,
        reader=protocol.LineReader(-1),
        stack_file="",
        born=0.0,
        kill_job=kill_job,
    )


def jobs(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT state, attempts, locked_by, lease_expiries FROM job_all WHERE id = ANY(%s) "
        "ORDER BY created_at, id",
        (ids,),
    ).fetchall()


def settle(watch: Leftovers) -> None:
    def done() -> bool:
        watch.service((), ())
        return not watch.dead

    wait_for(done, timeout=10, what="the leftovers settled")


def test_a_session_still_claiming_is_ended_and_its_claim_rolled_back(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    identity = f"host:1:{uuid.uuid4().hex[:6]}"
    ids = [queue.enqueue(brooq.Job("t.ok"))[0] for _ in range(3)]
    session = psycopg.connect(dsn, application_name=session_name(identity))
    session.execute(CLAIM, (identity, ids))  # not committed: the claim still runs
    watch, conns = leftovers(dsn)
    watch.died(dead_child(identity))
    settle(watch)
    assert jobs(db, ids) == [("pending", 0, None, 0)] * 3
    assert session.closed or session.broken or _gone(session)
    conns.close()


def test_a_claim_committed_after_the_death_comes_back_uncharged(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    identity = f"host:2:{uuid.uuid4().hex[:6]}"
    ids = [queue.enqueue(brooq.Job("t.ok"))[0] for _ in range(4)]
    with psycopg.connect(dsn, autocommit=True, application_name=session_name(identity)) as s:
        s.execute(CLAIM, (identity, ids))  # committed; the session lingers
        watch, conns = leftovers(dsn)
        running = ids[0]  # the job it was running: its own settlement's, not given back
        watch.died(dead_child(identity, kill_job=running))
        settle(watch)
    assert jobs(db, ids) == [("processing", 1, identity, 0)] + [("pending", 0, None, 0)] * 3
    conns.close()


def test_another_workers_jobs_are_not_touched(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    ids = [queue.enqueue(brooq.Job("t.ok"))[0] for _ in range(2)]
    db.execute(CLAIM, ("host:3:alive", ids))
    watch, conns = leftovers(dsn)
    watch.died(dead_child("host:3:dead"))
    settle(watch)
    assert jobs(db, ids) == [("processing", 1, "host:3:alive", 0)] * 2
    conns.close()


def _gone(session: psycopg.Connection[Any]) -> bool:
    try:
        session.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False
