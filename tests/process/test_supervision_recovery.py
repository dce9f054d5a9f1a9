"""Supervision faults against a real brooq-master: a crash storm after ready,
a child hung outside its handler, the rest of a batch given back while a long job runs,
and children writing what they finished when their master vanishes. Each test failed on
the code before its fix (see the docstrings)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import brooq
from tests.harness import StartMaster, executions, states, wait_for

LEASE = 2.0  # tests.harness.FAST


def job_state(db: psycopg.Connection[Any], job_id: uuid.UUID) -> tuple[str, int, str | None]:
    row = db.execute(
        "SELECT state, attempts, locked_by FROM job_all WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def child_backends(db: psycopg.Connection[Any]) -> list[int]:
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'brooq-child%%' "
        "AND datname = current_database() ORDER BY pid"
    ).fetchall()
    return [r[0] for r in rows]


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """A PostgreSQL backend frozen (SIGSTOP): its client's next statement hangs."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_children_crashing_after_ready_back_off_and_end_the_master(
    db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    """Children that say ready and then crash on every claim (here: the job table was
    renamed under a running master) used to be respawned at once, for ever: hundreds of
    crashes a second. Now each death outside a job delays the next fork and a streak of
    five ends the master with exit 3 and the reason."""
    m = start_master(workers=2)
    m.wait_ready(2)
    wait_for(lambda: "event=ops_listening" in m.log(), what="the master up")
    db.execute("ALTER TABLE job RENAME TO job_gone")
    started = time.monotonic()
    try:
        code = m.wait(timeout=30)
    finally:
        db.execute("ALTER TABLE job_gone RENAME TO job")
    took = time.monotonic() - started
    log = m.log()
    crashes = log.count("event=child_crashed")
    assert code == 3, log[-3000:]
    assert "event=master_fatal" in log and "children in a row died" in log
    assert 5 <= crashes <= 6, f"{crashes} crashes"
    # Each death before the fatal one delayed the next fork, doubling from 0.5 s.
    delays = re.findall(r"event=respawn_delayed delay=([0-9.]+)s deaths_in_a_row=(\d+)", log)
    assert delays == [("0.5", "1"), ("1.0", "2"), ("2.0", "3"), ("4.0", "4")], delays
    # The backoff, 0.5 + 1 + 2 + 4 s between the forks, is what spaced the deaths.
    assert took >= 3.0, f"the storm lasted {took:.1f}s: no backoff"
    print(f"storm: {crashes} crashes in {took:.1f}s, then exit {code}")


def test_a_child_hung_outside_its_handler_is_killed_and_its_jobs_return(
    db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    """One child's PostgreSQL backend frozen while the child runs a handler: the child's
    next round trip (writing the job's done) hangs. The master used to renew the job's
    lease for ever and watch only children inside a handler, so the job stayed
    processing. Now a child that holds jobs without progress for longer than the lease is
    killed and its jobs go back with the attempt refunded, to run on a new child."""
    m = start_master(workers=1)
    m.wait_ready(1)
    job_id, _ = queue.enqueue(brooq.Job("t.slow", {"seconds": 0.5}))
    wait_for(lambda: executions(db, job_id) == 1, what="the handler started")
    (backend,) = child_backends(db)
    with stopped(backend):
        frozen = time.monotonic()
        wait_for(
            lambda: job_state(db, job_id)[0] != "processing" or executions(db, job_id) == 2,
            timeout=LEASE + 6,
            what="the job back from the hung child",
        )
        returned = time.monotonic() - frozen
        wait_for(lambda: job_state(db, job_id)[0] == "done", timeout=10, what="done")
    log = m.log()
    assert "reason=stalled" in log and "event=child_killed" in log
    assert "stack (most recent call first)" in log or "File " in log  # where it hung
    state, attempts, _ = job_state(db, job_id)
    assert (state, attempts) == ("done", 1)  # the hung child's attempt was refunded
    assert executions(db, job_id) == 2
    assert returned < LEASE + 3, f"returned after {returned:.1f}s"
    print(f"hung child: its job returned {returned:.1f}s after its backend froze")


def test_the_rest_of_a_batch_goes_back_while_a_long_job_runs(
    db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    """docs/design.md: a job running longer than 0.5 s gives back the rest of its batch at
    once. It used to be given back only after the long job returned. With one child and
    short jobs the claims grow 1, 2, 4, 8: the long job comes with others claimed."""
    # A first job alone, so that its cold start (imports, first statements: 70 ms under a
    # loaded machine) does not count as a job's duration in the batches below.
    warm, _ = queue.enqueue(brooq.Job("t.ok"))
    m = start_master(workers=1)
    m.wait_ready(1)
    wait_for(lambda: executions(db, warm) == 1, what="the first job run")
    quick = [brooq.Job("t.ok") for _ in range(7)]
    after = [brooq.Job("t.ok") for _ in range(24)]
    ids = [i for i, _ in queue.enqueue_many([*quick, brooq.Job("t.slow", {"seconds": 3}), *after])]
    long_id = ids[7]
    wait_for(lambda: executions(db, long_id) == 1, what="the long job started")
    started = time.monotonic()
    # The jobs claimed after it in its batch, not started (how many depends on how the
    # batches grew: 1, 2, 4, then 8 when every job so far was short). Those before it in
    # the batch ran; their `done` waits for the next round trip.
    rows = db.execute(
        "SELECT id FROM job WHERE state = 'processing' AND id = ANY(%s) AND locked_by = "
        "(SELECT locked_by FROM job WHERE id = %s)",
        (ids[8:], long_id),
    ).fetchall()
    batchmates = [r[0] for r in rows]
    assert batchmates, "the long job came alone in its batch"

    def given_back() -> bool:
        return all(job_state(db, i)[2] is None for i in batchmates)

    wait_for(given_back, timeout=2.0, what="the batchmates given back")
    assert time.monotonic() - started < 2.0
    assert job_state(db, long_id)[0] == "processing"  # still running
    for i in batchmates:
        assert job_state(db, i)[:2] == ("pending", 0)  # attempt refunded, claimable
    count = len(batchmates)
    assert re.search(rf"event=batch_given_back pid=\d+ job={long_id} count={count}", m.log())
    wait_for(lambda: states(db) == {"done": 33}, timeout=15, what="all done")
    assert executions(db) == 32 and executions(db, long_id) == 1  # nothing ran twice
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_children_write_what_they_finished_when_the_master_vanishes(
    db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    """A child writes `done` of a short job with its next claim. When the master vanished
    (kill -9), children exited without writing what they had finished although the
    database was up; with no master left those jobs stayed processing until some reaper
    ran them again. Now the child writes them, gives back what it had not started, and
    exits."""
    # Claims of 1, 2, 4, then 8: q8 and then the slow job open the fourth batch.
    jobs = [brooq.Job("t.ok") for _ in range(8)]
    jobs += [brooq.Job("t.slow", {"seconds": 0.3})] + [brooq.Job("t.ok") for _ in range(10)]
    ids = [i for i, _ in queue.enqueue_many(jobs)]
    slow_id = ids[8]
    m = start_master(workers=1)
    m.wait_ready(1)
    wait_for(lambda: executions(db, slow_id) == 1, interval=0.01, what="the slow job running")
    m.signal(signal.SIGKILL)
    m.wait()
    # q8 finished before the slow job (its done unwritten), the slow job finishes now;
    # the rest of the batch was never started.
    wait_for(
        lambda: job_state(db, ids[7])[0] == "done" and job_state(db, slow_id)[0] == "done",
        timeout=LEASE,
        what="the finished jobs written",
    )
    wait_for(lambda: "processing" not in states(db), timeout=LEASE, what="nothing held")
    s = states(db)
    assert s.get("done", 0) == 9 and s.get("pending", 0) == 10, s
    assert executions(db) == 8 and executions(db, slow_id) == 1


@pytest.fixture(autouse=True)
def _no_stopped_backends(db: psycopg.Connection[Any]) -> Iterator[None]:
    yield
    for pid in child_backends(db):  # a failed test must not leave a frozen backend
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


def test_a_job_of_a_vanished_host_gets_its_attempt_back(
    db: psycopg.Connection[Any], queue: brooq.Queue, start_master: StartMaster
) -> None:
    """The README promises that an expired lease never spends an attempt. A job claimed by
    a host that vanished (attempt 1 charged at claim, lease run out), reaped, then failing
    on every run used to be dead after max_attempts - 1 executions. Now the reaper refunds
    the attempt: t.fail (max_attempts=3) runs three times. A job whose lease expired as
    often as QUEUE_MAX_LEASE_EXPIRIES allows is dead with the reason instead."""
    lost, _ = queue.enqueue(brooq.Job("t.fail"))
    bound, _ = queue.enqueue(brooq.Job("t.ok"))
    db.execute(
        "UPDATE job SET state = 'processing', attempts = 1, locked_by = 'gone:1:abc', "
        "locked_until = now() - interval '1 second' WHERE id = ANY(%s)",
        ([lost, bound],),
    )
    db.execute("UPDATE job SET lease_expiries = 2 WHERE id = %s", (bound,))
    m = start_master(workers=1, env={"QUEUE_MAX_LEASE_EXPIRIES": "3"})
    wait_for(lambda: job_state(db, lost)[0] == "dead", timeout=15, what="t.fail dead")
    assert executions(db, lost) == 3
    assert job_state(db, bound)[0] == "dead" and executions(db, bound) == 0
    row = db.execute("SELECT last_error, lease_expiries FROM job_all WHERE id = %s", (bound,))
    assert row.fetchone() == (
        "lease expired 3 times: the workers running it vanished (host lost or frozen?)",
        3,
    )
    assert f"event=job_dead job={bound} topic=t.ok reason=lease_expired expiries=3" in m.log()
