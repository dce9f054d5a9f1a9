"""debounce against a real PostgreSQL: a burst of enqueues folded into the key's job that
has not started (its payload the last one, its start `debounce` after the last); while
the key's job runs, one waiting job that takes every later enqueue and moves up when the
running job ends (however it ends), never before; racing producers; the races between
a producer's commit and the end of the key's job; the master's pass for a waiting job
left with no job before it.

The transitions are the real statements, as in tests/db/test_unique.py."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import brooq
from brooq.sql import Q
from brooq.supervisor import maintenance
from tests.db.test_unique import active, claim, fail, finish, state

Conn = psycopg.Connection[Any]
FAR = 9999  # the year of a waiting job's available_at


@pytest.fixture
def conn(connect: Callable[..., Conn]) -> Conn:
    return connect()


def row(db: Conn, job_id: uuid.UUID) -> dict[str, Any]:
    found = db.execute(
        "SELECT *, now() AS now, available_at <= now() AS ready FROM job_all WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return dict(found)


def debounced(payload: object, seconds: float = 2.0, key: str = "k") -> brooq.Job:
    return brooq.Job("t", payload, unique_key=key, debounce=timedelta(seconds=seconds))


def running(queue: brooq.Queue, conn: Conn, payload: object = "first") -> uuid.UUID:
    """The key's job, claimed: processing."""
    head, _ = queue.enqueue(debounced(payload))
    conn.execute("UPDATE job SET available_at = now() WHERE id = %s", (head,))
    assert claim(conn) == [head]
    return head


def at_once(conns: list[Conn], job_of: Callable[[int], brooq.Job]) -> list[tuple[uuid.UUID, bool]]:
    """Each connection enqueues its job (``job_of(n)``) at the same moment, from a thread
    of its own; every answer."""
    barrier = threading.Barrier(len(conns))
    answers: list[tuple[uuid.UUID, bool]] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            barrier.wait(10)
            answers.append(brooq.enqueue(conns[n], job_of(n)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(answers) == len(conns)
    return answers


def test_a_burst_becomes_one_job_with_the_last_payload(queue: brooq.Queue, conn: Conn) -> None:
    first, created = queue.enqueue(debounced({"n": 0}))
    assert created
    before = row(conn, first)
    assert not before["ready"]
    assert (before["available_at"] - before["now"]).total_seconds() == pytest.approx(2, abs=0.5)
    time.sleep(0.3)
    for n in range(1, 5):
        assert queue.enqueue(debounced({"n": n})) == (first, False)
    after = row(conn, first)
    assert after["payload"] == {"n": 4}
    assert (after["available_at"] - after["now"]).total_seconds() == pytest.approx(2, abs=0.5)
    assert after["available_at"] > before["available_at"]  # moved, not kept
    assert active(conn, "k") == [first] and claim(conn) == []  # not before its time
    # the batch form folds too, job by job, in order
    assert queue.enqueue_many([debounced({"n": 5}), debounced({"n": 6})]) == [(first, False)] * 2
    assert row(conn, first)["payload"] == {"n": 6}


def test_while_the_keys_job_runs_one_waiting_job_takes_the_enqueues(
    queue: brooq.Queue, conn: Conn
) -> None:
    head = running(queue, conn)
    waiting, created = queue.enqueue(debounced({"n": 1}))
    assert created and waiting != head
    for n in range(2, 6):
        assert queue.enqueue(debounced({"n": n})) == (waiting, False)
    # a plain enqueue of the key answers the waiting job (the one that runs last)
    assert queue.enqueue(brooq.Job("t", "plain", unique_key="k")) == (waiting, False)
    w = row(conn, waiting)
    assert (w["state"], w["payload"], w["available_at"].year) == ("pending", {"n": 5}, FAR)
    assert (w["start_after"] - w["now"]).total_seconds() == pytest.approx(2, abs=0.5)
    record = queue.get(waiting)
    assert record is not None and record.start_after == w["start_after"]
    assert active(conn, "k") == [head, waiting]
    conn.execute("UPDATE job SET start_after = now() - interval '1 s' WHERE id = %s", (waiting,))
    assert claim(conn) == []  # never while the key's job runs
    conn.execute("LISTEN brooq_job")
    finish(conn, [head])
    w = row(conn, waiting)
    assert (w["start_after"], w["ready"]) == (None, True)
    assert any(n.channel == "brooq_job" for n in conn.notifies(timeout=1, stop_after=1))
    assert claim(conn) == [waiting]
    # it is the key's job now: the next enqueue waits behind it
    third, created = queue.enqueue(debounced({"n": 6}))
    assert created and row(conn, third)["available_at"].year == FAR


def test_a_waiting_job_asks_for_its_start_after_the_running_one_ends(
    queue: brooq.Queue, conn: Conn
) -> None:
    head = running(queue, conn)
    waiting, _ = queue.enqueue(debounced({"n": 1}, seconds=30))
    finish(conn, [head])
    w = row(conn, waiting)
    assert not w["ready"] and w["start_after"] is None
    assert (w["available_at"] - w["now"]).total_seconds() == pytest.approx(30, abs=2)


@pytest.mark.parametrize("end", ["dead", "canceled", "reaped dead"])
def test_the_waiting_job_moves_up_however_the_keys_job_ends(
    queue: brooq.Queue, conn: Conn, end: str
) -> None:
    head = running(queue, conn)
    waiting, _ = queue.enqueue(debounced({"n": 1}, seconds=0.001))
    if end == "dead":
        assert fail(conn, head, max_attempts=1) == "dead"
    elif end == "canceled":
        assert queue.cancel(head)
    else:
        conn.execute("UPDATE job SET locked_until = now() - interval '1 s' WHERE id = %s", (head,))
        conn.execute(Q.job_reap_expired, {"max_expiries": 1}).fetchall()
    assert state(conn, head) == end.split()[-1]
    assert row(conn, waiting)["start_after"] is None
    assert claim(conn) == [waiting]


def test_a_failed_or_returned_job_keeps_the_key_and_its_waiting_job_waits(
    queue: brooq.Queue, conn: Conn
) -> None:
    """A retry, a reaped lease, a release: the key's job is still active, so its waiting
    job still waits (and still takes the enqueues); it moves up only at the end."""
    head = running(queue, conn)
    waiting, _ = queue.enqueue(debounced({"n": 1}, seconds=0.001))
    assert fail(conn, head) == "failed"
    assert queue.enqueue(debounced({"n": 2}, seconds=0.001)) == (waiting, False)
    assert claim(conn) == [head]  # the retry, not the waiting job
    conn.execute(Q.job_release_ids, {"ids": [head], "worker": "w"}).fetchall()
    assert row(conn, head)["state"] == "pending"
    # the key's job is pending again: still, the enqueue goes to the waiting job
    assert queue.enqueue(debounced({"n": 3}, seconds=0.001)) == (waiting, False)
    assert claim(conn) == [head]
    finish(conn, [head])
    assert row(conn, waiting)["payload"] == {"n": 3}
    assert claim(conn) == [waiting]


def test_racing_producers_fold_into_one_job(connect: Callable[..., Conn], conn: Conn) -> None:
    """8 producers on connections of their own, the same key at the same moment, with
    the key free, then with its job running: one job each time, every producer answered
    its id."""
    producers = 8
    conns = [connect() for _ in range(producers)]
    for phase in range(6):
        answers = at_once(conns, lambda n, phase=phase: debounced({"phase": phase, "p": n}, 0.001))
        assert len({i for i, _ in answers}) == 1, answers
        assert sum(created for _, created in answers) == 1, answers
        # Phase 0 made the key's job, each later one the job waiting behind it: the running
        # one ends (the waiting one moves up) and the key's job is claimed, for the next.
        running_ids = conn.execute("SELECT id FROM job_all WHERE state = 'processing'").fetchall()
        finish(conn, [r["id"] for r in running_ids])
        conn.execute("UPDATE job SET available_at = now() WHERE available_at < '9000-01-01'")
        assert claim(conn) == [answers[0][0]]
        counts = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'processing') AS running, "
            "count(*) FILTER (WHERE state = 'pending') AS waiting FROM job_all"
        ).fetchone()
        assert counts == {"running": 1, "waiting": 0}


def test_a_producer_committing_as_the_keys_job_ends(
    queue: brooq.Queue, connect: Callable[..., Conn], conn: Conn
) -> None:
    """The waiting job is inserted in a transaction still open when the key's job ends:
    the end cannot see it, so the insert's commit moves it up itself; and a commit that
    comes while the end is still being written waits for it, then moves it up."""
    producer = connect(autocommit=False)
    head = running(queue, conn)
    waiting, created = brooq.enqueue(producer, debounced({"n": 1}, seconds=0.001))
    assert created
    finish(conn, [head])  # committed; the waiting job is not visible to it
    producer.commit()
    assert row(conn, waiting)["start_after"] is None
    assert claim(conn) == [waiting]

    # the end of the key's job still uncommitted when the producer commits
    ender = connect(autocommit=False)
    third, _ = brooq.enqueue(producer, debounced({"n": 2}, seconds=0.001))
    finish(ender, [waiting])
    committing = threading.Thread(target=producer.commit)
    committing.start()
    time.sleep(0.3)
    assert committing.is_alive()  # waits for the end's outcome
    ender.commit()
    committing.join(10)
    assert row(conn, third)["start_after"] is None and claim(conn) == [third]


def test_an_updated_waiting_job_left_by_a_rollback_is_moved_up_by_the_master(
    queue: brooq.Queue, connect: Callable[..., Conn], conn: Conn, dsn: str
) -> None:
    """A producer updates the waiting job, the key's job ends meanwhile (its trigger skips
    the locked row), the producer rolls back: nothing before the waiting job; the master's
    reaper pass moves it up."""
    head = running(queue, conn)
    waiting, _ = queue.enqueue(debounced({"n": 1}, seconds=0.001))
    producer = connect(autocommit=False)
    assert brooq.enqueue(producer, debounced({"n": 2}, seconds=0.001)) == (waiting, False)
    started = time.monotonic()
    finish(conn, [head])
    assert time.monotonic() - started < 1.0  # the worker's outcome never waits for it
    producer.rollback()
    w = row(conn, waiting)
    assert (w["payload"], w["available_at"].year) == ({"n": 1}, FAR)
    with psycopg.connect(dsn, autocommit=True) as master:
        assert maintenance.promote_orphans(master) == 1
        assert maintenance.promote_orphans(master) == 0
    assert row(conn, waiting)["start_after"] is None and claim(conn) == [waiting]


def test_the_masters_pass_leaves_a_waiting_job_with_a_job_before_it(
    queue: brooq.Queue, conn: Conn, dsn: str
) -> None:
    running(queue, conn)
    waiting, _ = queue.enqueue(debounced({"n": 1}))
    with psycopg.connect(dsn, autocommit=True) as master:
        assert maintenance.promote_orphans(master) == 0
    assert row(conn, waiting)["available_at"].year == FAR
