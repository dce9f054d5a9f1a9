"""A child killed while its claim runs: the claim is its database session's, which may
commit after the child died and after the master gave back what the child held. Those
jobs never started: they come back at once, with no attempt spent and no lease expiry
counted, not when their lease runs out."""

from __future__ import annotations

import os
import signal

import psycopg

import brooq
from tests.harness import StartMaster, executions, wait_for

LOCK = 4242

# Every claim (pending -> processing) waits for a shared hold of an advisory lock the
# test keeps: the child's claim statement blocks, inside its transaction, where the test
# wants it.
GATE = f"""
CREATE FUNCTION claim_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({LOCK});
    RETURN NEW;
END;
$$;
CREATE TRIGGER claim_gate BEFORE UPDATE ON job FOR EACH ROW
WHEN (OLD.state = 'pending' AND NEW.state = 'processing') EXECUTE FUNCTION claim_gate();
"""


def test_a_claim_that_commits_after_its_child_died_comes_back_at_once_uncharged(
    queue: brooq.Queue, db: psycopg.Connection, dsn: str, start_master: StartMaster
) -> None:
    db.execute(GATE)
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        # A lease far longer than the wait below: a job back only through its expiry
        # would fail the test.
        m = start_master(workers=1, env={"QUEUE_LEASE": "120s"})
        child = m.wait_ready(1)[0]
        ids = [queue.enqueue(brooq.Job("t.ok"))[0] for _ in range(5)]
        wait_for(
            lambda: db.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'brooq-child %%' "
                "AND wait_event_type = 'Lock' AND state = 'active'"
            ).fetchone(),
            what="the child's claim waiting on the gate",
        )
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: f"event=child_exited pid={child}" in m.log(), what="child reaped")
        holder.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
    rows = wait_for(
        lambda: (
            (
                r := db.execute(
                    "SELECT state, attempts, lease_expiries FROM job_all WHERE id = ANY(%s)", (ids,)
                ).fetchall()
            )
            and all(s == "done" for s, _, _ in r)
            and r
        ),
        timeout=40,
        what="every job done before any lease could expire",
    )
    assert sorted(rows) == [("done", 1, 0)] * 5  # one attempt each: the one that ran
    assert executions(db) == 5
    m.signal(signal.SIGTERM)
    assert m.wait() == 0
