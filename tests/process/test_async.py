"""Async handlers under a real brooq-master: many jobs at once per child, the
soft limit and a lost lease per task, a blocked loop killed with only its job charged,
the drain, and an application with both kinds."""

from __future__ import annotations

import re
import signal
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psycopg

import brooq
from tests.harness import StartMaster, wait_for

APP = "brooq_asyncapp:queue"
MIXED = "brooq_asyncapp:mixed"


def rows(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[Any, ...]]:
    found = db.execute(
        "SELECT id, state, attempts, last_error FROM job_all WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in found}


def count(db: psycopg.Connection[Any], ids: list[uuid.UUID], state: str) -> int:
    row = db.execute(
        "SELECT count(*) FROM job_all WHERE id = ANY(%s) AND state = %s", (ids, state)
    ).fetchone()
    assert row is not None
    return int(row[0])


def enqueue(queue: brooq.Queue, jobs: list[brooq.Job]) -> list[uuid.UUID]:
    return [job_id for job_id, _ in queue.enqueue_many(jobs)]


def most_at_once(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> int:
    """The most jobs between their 'start' and 'end' records at one moment."""
    marks = db.execute(
        "SELECT at, CASE note WHEN 'start' THEN 1 ELSE -1 END FROM execution "
        "WHERE job_id = ANY(%s) AND note IN ('start', 'end') ORDER BY at, 2",
        (ids,),
    ).fetchall()
    running = best = 0
    for _, step in marks:
        running += step
        best = max(best, running)
    return best


def title_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def test_two_children_run_twenty_jobs_each_at_once(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    ids = enqueue(queue, [brooq.Job("a.sleep", {"s": 0.2}) for _ in range(200)])
    started = time.monotonic()
    m = start_master(workers=2, app=APP, args=("--concurrency", "20"))
    kids = m.wait_ready(2)
    titles = wait_for(
        lambda: [t for t in map(title_of, kids) if "async" in t and "jobs (a.sleep" in t],
        what="an async child's title with its jobs",
    )
    assert "/20 jobs (a.sleep " in titles[0]
    # Each child's jobs in brooq_child_jobs_running{pid}; busy counts children.
    addr = wait_for(lambda: re.search(r"event=ops_listening addr=(\S+)", m.log())).group(1)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as response:
            return str(response.read().decode())

    per_child = wait_for(
        lambda: [
            float(v)
            for v in re.findall(r'^brooq_child_jobs_running\{pid="\d+"\} (\S+)', scrape(), re.M)
            if float(v) > 1
        ],
        what="a child running more than one job in the metric",
    )
    assert max(per_child) <= 20
    wait_for(lambda: count(db, ids, "done") == 200, timeout=30, what="200 done")
    # One at a time that is 200 x 0.2 s / 2 children = 20 s; 2 x 20 slots make it 1 s.
    span = db.execute(
        "SELECT extract(epoch FROM max(j.updated_at) - min(e.at)) FROM job_all j, execution e "
        "WHERE j.id = ANY(%s) AND e.job_id = ANY(%s)",
        (ids, ids),
    ).fetchone()
    assert span is not None and float(span[0]) < 2.5, span
    assert most_at_once(db, ids) > 20  # more than one child's worth at once: both ran 20
    assert db.execute(
        "SELECT count(*) FROM job_all WHERE id = ANY(%s) AND attempts = 1", (ids,)
    ).fetchone() == (200,)
    assert time.monotonic() - started < 30
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_soft_limit_and_cancel_stop_one_task_while_its_siblings_finish(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    siblings = enqueue(queue, [brooq.Job("a.sleep", {"s": 1.5}) for _ in range(10)])
    [soft] = enqueue(queue, [brooq.Job("a.soft")])
    [doomed] = enqueue(queue, [brooq.Job("a.sleep", {"s": 30})])
    m = start_master(workers=1, app=APP, args=("--concurrency", "20"))
    wait_for(lambda: count(db, [doomed, soft, *siblings], "processing") == 12, what="12 running")
    assert queue.cancel(doomed)
    wait_for(lambda: rows(db, [soft])[soft][0] == "dead", what="the soft limit")
    _, attempts, error = rows(db, [soft])[soft]
    assert attempts == 1 and error == "AttemptTimeout: attempt_timeout 1s exceeded"
    notes = db.execute(
        "SELECT note FROM execution WHERE job_id = %s ORDER BY at", (soft,)
    ).fetchall()
    assert [n[0] for n in notes] == ["start", "cleanup"]  # its finally ran
    wait_for(lambda: count(db, siblings, "done") == 10, what="the siblings done")
    assert rows(db, [doomed])[doomed][0] == "canceled"
    log = m.log()
    assert f"event=lease_lost job={doomed}" in log
    assert f"event=outcome_skipped job={doomed}" not in log  # it wrote nothing
    # The cancelled task never reached its 'end'.
    assert db.execute(
        "SELECT count(*) FROM execution WHERE job_id = %s AND note = 'end'", (doomed,)
    ).fetchone() == (0,)
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_a_blocking_coroutine_gets_its_child_killed_and_only_its_attempt_charged(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    siblings = enqueue(queue, [brooq.Job("a.sleep", {"s": 3}) for _ in range(10)])
    m = start_master(workers=1, app=APP, args=("--concurrency", "20"))
    first = m.wait_ready(1)[0]
    wait_for(lambda: count(db, siblings, "processing") == 10, what="10 siblings running")
    [blocker] = enqueue(queue, [brooq.Job("a.block")])
    wait_for(lambda: rows(db, [blocker])[blocker][0] == "dead", timeout=15, what="culprit")
    _, attempts, error = rows(db, [blocker])[blocker]
    assert attempts == 1
    assert error.startswith("killed: the event loop was blocked by this job"), error
    assert "brooq_asyncapp.py" in error and "a_block" in error  # its stack
    # The siblings went back with the attempt refunded and ran again in the new child.
    wait_for(lambda: count(db, siblings, "done") == 10, timeout=20, what="siblings done")
    assert {r[1] for r in rows(db, siblings).values()} == {1}
    log = m.log()
    assert "reason=loop_blocked" in log and f"job={blocker}" in log
    assert f"because=sibling_of={blocker}" in log
    assert first not in m.children()
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_a_task_that_swallows_its_cancellation_is_stopped_by_the_hard_limit(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    [swallow] = enqueue(queue, [brooq.Job("a.swallow")])
    siblings = enqueue(queue, [brooq.Job("a.sleep", {"s": 4}) for _ in range(5)])
    m = start_master(workers=1, app=APP, args=("--concurrency", "20"))
    wait_for(lambda: rows(db, [swallow])[swallow][0] == "dead", timeout=15, what="killed")
    _, attempts, error = rows(db, [swallow])[swallow]
    assert attempts == 1 and error.startswith("killed: max_execution_timeout 2s exceeded")
    # Suspended, its thread stack shows only the loop: the await chain names it.
    assert "Task await chain" in error and "in a_swallow" in error, error
    wait_for(lambda: count(db, siblings, "done") == 5, timeout=20, what="siblings done")
    assert {r[1] for r in rows(db, siblings).values()} == {1}  # refunded, run once more
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_sigterm_drains_every_async_job_in_flight(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    ids = enqueue(queue, [brooq.Job("a.sleep", {"s": 1}) for _ in range(40)])
    m = start_master(workers=1, app=APP, args=("--concurrency", "50"))
    [child] = m.wait_ready(1)
    wait_for(lambda: "async 40/50 jobs" in title_of(child), what="40 in flight")
    m.signal(signal.SIGTERM)
    assert m.wait(timeout=10) == 0
    assert count(db, ids, "done") == 40
    assert "in_flight=40" in m.log()


def test_a_drain_past_graceful_timeout_gives_back_only_what_did_not_finish(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    quick = enqueue(queue, [brooq.Job("a.sleep", {"s": 0.5}) for _ in range(10)])
    slow = enqueue(queue, [brooq.Job("a.sleep", {"s": 30}) for _ in range(10)])
    m = start_master(
        workers=1,
        app=APP,
        args=("--concurrency", "50"),
        env={"QUEUE_GRACEFUL_TIMEOUT": "2s"},
    )
    wait_for(lambda: count(db, quick + slow, "processing") == 20, what="20 in flight")
    m.signal(signal.SIGTERM)
    assert m.wait(timeout=10) == 0  # the child gave them back itself: none left to return
    assert count(db, quick, "done") == 10
    assert {r[:2] for r in rows(db, slow).values()} == {("pending", 0)}  # refunded
    assert m.log().count("because=drain") == 10


def test_a_mixed_application_runs_both_kinds_in_children_of_their_own(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    sync_ids = enqueue(queue, [brooq.Job("s.work") for _ in range(100)])
    async_ids = enqueue(queue, [brooq.Job("a.sleep", {"s": 0.2}) for _ in range(200)])
    values = enqueue(queue, [brooq.Job("a.value"), brooq.Job("s.value")])
    m = start_master(workers=3, app=MIXED, args=("--async-workers", "1", "--concurrency", "20"))
    m.wait_ready(3)
    wait_for(lambda: count(db, sync_ids, "done") == 100, timeout=30, what="sync done")
    wait_for(lambda: count(db, async_ids, "done") == 200, timeout=30, what="async done")
    # Each kind started at once: neither waited for the other.
    firsts = db.execute(
        "SELECT topic, extract(epoch FROM min(updated_at) - (SELECT min(created_at) FROM job_all)) "
        "FROM job_all WHERE topic IN ('s.work', 'a.sleep') GROUP BY topic"
    ).fetchall()
    assert all(float(first) < 5 for _, first in firsts), firsts
    # Each middleware wrapped the handlers of its own kind only.
    results = dict(
        db.execute("SELECT topic, result FROM job_all WHERE id = ANY(%s)", (values,)).fetchall()
    )
    assert results == {"a.value": {"mw": "async", "value": 42}, "s.value": {"mw": "sync"}}
    # Two sync children, one async child.
    kinds = [("async" in title_of(pid)) for pid in m.children()]
    assert sorted(kinds) == [False, False, True]
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_the_master_says_at_start_which_handlers_no_global_middleware_wraps(
    start_master: StartMaster,
) -> None:
    m = start_master(workers=1, app="brooq_asyncapp:skips")
    wait_for(lambda: "event=middleware_skips" in m.log(), what="the warning")
    line = next(x for x in m.log().splitlines() if "event=middleware_skips" in x)
    assert "kind=async topics=1 middleware=sync_mark" in line
    assert "async def fn(claim, call_next)" in line
    m.wait_ready(1)
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_recycling_waits_for_every_job_of_the_child(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    ids = enqueue(queue, [brooq.Job("a.sleep", {"s": 0.3}) for _ in range(60)])
    m = start_master(workers=1, app=APP, args=("--concurrency", "20", "--max-jobs-per-child", "5"))
    wait_for(lambda: count(db, ids, "done") == 60, timeout=30, what="60 done")
    log = m.log()
    assert log.count("event=child_retiring") >= 2  # retired after its 5th, more than once
    assert "event=job_returned" not in log  # every job it held ran to its end
    # Each ran once: nothing was cut short and run again.
    assert {r[1] for r in rows(db, ids).values()} == {1}
    assert db.execute(
        "SELECT count(*) FROM execution WHERE job_id = ANY(%s) AND note = 'end'", (ids,)
    ).fetchone() == (60,)
    m.signal(signal.SIGTERM)
    assert m.wait() == 0


def test_claims_ahead_start_as_slots_free_and_go_back_when_none_frees(
    queue: brooq.Queue, db: psycopg.Connection[Any], start_master: StartMaster
) -> None:
    # 4 slots claim one more ahead once a job has run long (the first 4 of 1.5 s); the
    # next 4 sleep 1.5 s too, so no slot frees within the second a claim ahead may wait:
    # it goes back unstarted, attempt refunded, and runs once a slot frees.
    long = enqueue(queue, [brooq.Job("a.sleep", {"s": 1.5}) for _ in range(10)])
    m = start_master(workers=1, app=APP, args=("--concurrency", "4"))
    wait_for(lambda: count(db, long, "done") == 10, timeout=30, what="10 done")
    log = m.log()
    returned = re.findall(r"event=job_returned job=(\S+) attempt_refunded=1 because=(\S+)", log)
    assert returned and {b for _, b in returned} == {"no_slot_freed"}, returned
    assert {uuid.UUID(j) for j, _ in returned} <= set(long)
    # Given back unstarted and refunded: every job ran once, on its first attempt.
    assert {r[1] for r in rows(db, long).values()} == {1}
    assert db.execute(
        "SELECT count(*) FROM execution WHERE job_id = ANY(%s) AND note = 'start'", (long,)
    ).fetchone() == (10,)
    assert most_at_once(db, long) == 4
    m.signal(signal.SIGTERM)
    assert m.wait() == 0
