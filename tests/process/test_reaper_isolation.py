"""One job whose write fails never stops the master's writes for the others: the reaper
keeps returning every other expired lease, the crash accounting every other dead
child's job; and a job whose end cancels a long chain is written by both, in one
statement, like any other (a real brooq-master, brooq_testapp).

The failing write is made deterministic with a trigger of the test's own, raising for
one job id (an application's trigger, or any fault of one row, does the same)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg

import brooq
from tests.harness import MasterProcess, executions, wait_for

StartMaster = Callable[..., MasterProcess]


def refuse_writes_of(db: psycopg.Connection[Any], job_id: uuid.UUID, states: str) -> None:
    """Every UPDATE that moves ``job_id`` into one of ``states`` raises."""
    db.execute(
        f"""
        CREATE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'refused for job %', NEW.id;
        END $$;
        CREATE TRIGGER refuse_one BEFORE UPDATE ON job FOR EACH ROW
            WHEN (NEW.id = '{job_id}' AND NEW.state IN ({states}))
            EXECUTE FUNCTION refuse_one();
        """
    )


def expired(db: psycopg.Connection[Any], topic: str) -> uuid.UUID:
    """A job of ``topic`` held by a worker that vanished: its lease expired."""
    row = db.execute(
        "INSERT INTO job (topic, state, attempts, locked_by, locked_until) "
        "VALUES (%s, 'processing', 1, 'gone-host', now() - interval '1 s') RETURNING id",
        (topic,),
    ).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def state_of(db: psycopg.Connection[Any], job_id: uuid.UUID) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_the_reaper_reaps_the_other_topics_when_one_row_fails(
    db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    bad = expired(db, "elsewhere.bad")
    refuse_writes_of(db, bad, "'pending', 'dead'")
    good = [expired(db, "elsewhere.one"), expired(db, "elsewhere.two")]
    m = start_master(workers=1)
    wait_for(
        lambda: all(state_of(db, j) == "pending" for j in good),
        what="the other expired leases reaped",
    )
    wait_for(lambda: f"event=reap_failed job={bad}" in m.log(), what="the bad row logged")
    assert state_of(db, bad) == "processing"
    # Held back, it no longer fails the statement for all: a lease expiring later is
    # reaped by it, without the job-by-job pass.
    passes = m.log().count("event=reap_one_by_one")
    later = expired(db, "elsewhere.three")
    wait_for(lambda: state_of(db, later) == "pending", what="a later expired lease reaped")
    assert m.log().count("event=reap_one_by_one") == passes
    assert m.log().count(f"event=reap_failed job={bad}") == 1  # held back meanwhile


def test_a_refused_settlement_holds_up_no_other(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """The failed attempt of the job a dead child ran cannot be written (refused for
    it); the next child's death is written all the same, the refused one is given up
    after its tries, named in the log, and left to the reaper."""
    bad, _ = queue.enqueue(brooq.Job("t.exit", {"n": 1}))
    refuse_writes_of(db, bad, "'failed', 'dead'")
    m = start_master(workers=1)
    wait_for(lambda: executions(db, bad) >= 1, what="the first child dead")
    good, _ = queue.enqueue(brooq.Job("t.exit", {"n": 2}))

    def charged() -> bool:
        row = db.execute("SELECT errors FROM job_all WHERE id = %s", (good,)).fetchone()
        return row is not None and any(
            "worker exited with status 7" in e["error"] for e in (row[0] or [])
        )

    wait_for(charged, timeout=30, what="the next dead child's job charged")
    wait_for(lambda: f"event=settlement_skipped job={bad}" in m.log(), timeout=60, what="given up")


def test_crash_accounting_writes_dead_for_the_head_of_a_2000_chain(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """t.exit ends its child at each attempt (3 of them): the master writes each failed
    attempt, the last one dead, which cancels the 2,000 jobs waiting behind it."""
    jobs = [brooq.Job("t.exit", {})]
    for i in range(2000):
        jobs.append(brooq.Job("sink", {"i": i}, after=[jobs[-1]]))
    head = queue.enqueue_many(jobs)[0][0]
    m = start_master(workers=1)
    wait_for(lambda: state_of(db, head) == "dead", timeout=40, what="the head dead")
    assert db.execute(
        "SELECT state, count(*) FROM job_all WHERE topic = 'sink' GROUP BY 1"
    ).fetchall() == [("canceled", 2000)]
    assert "event=maintenance_error" not in m.log()
