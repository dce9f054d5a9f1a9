"""A child's claims enter the ready index past the jobs it claimed before
(brooq.worker.floors). A job that sorts before that point when it becomes visible (its
enqueue's transaction lasted longer than the slack, so its available_at is older than
jobs claimed meanwhile) is found by the next whole read, well within a second, while the
queue stays busy."""

from __future__ import annotations

import threading
import time

import psycopg

import brooq
from brooq.worker.floors import MIN_APART, SLACK
from tests.harness import StartMaster, wait_for


def test_a_job_from_a_long_transaction_is_claimed_while_others_stream_past_it(
    queue: brooq.Queue, db: psycopg.Connection, dsn: str, start_master: StartMaster
) -> None:
    m = start_master(workers=1)
    m.wait_ready(1)
    stop = threading.Event()

    def stream() -> None:  # a job every 5 ms: the child claims all along
        while not stop.is_set():
            queue.enqueue(brooq.Job("t.ok", {"stream": True}))
            time.sleep(0.005)

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    try:
        wait_for(
            lambda: db.execute("SELECT count(*) FROM job_history").fetchone()[0] >= 20,
            what="the stream's jobs claimed and done",
        )
        with psycopg.connect(dsn) as own:  # the caller's own transaction, held open
            late, _ = brooq.enqueue(own, brooq.Job("t.ok", {"late": True}))
            time.sleep(10 * SLACK.total_seconds())  # the stream's jobs claimed meanwhile
            row = own.execute(
                "SELECT clock_timestamp() - available_at FROM job WHERE id = %s", (late,)
            ).fetchone()
            assert row is not None and row[0] > 5 * SLACK
            own.commit()
            committed = time.monotonic()
        # Claims past it kept coming: the job is below this child's floor when it commits.
        after = db.execute("SELECT count(*) FROM job_history").fetchone()[0]
        wait_for(
            lambda: db.execute("SELECT count(*) FROM job_history").fetchone()[0] > after + 20,
            what="more stream jobs claimed after the commit",
        )
        state = wait_for(
            lambda: (
                (r := db.execute("SELECT state FROM job_all WHERE id = %s", (late,)).fetchone())
                and r[0] == "done"
                and r[0]
            ),
            timeout=10,
            what="the late job done",
        )
        took = time.monotonic() - committed
    finally:
        stop.set()
        streamer.join(5)
    assert state == "done"
    # Found by a whole read (at most MIN_APART and half again after the last), not by the
    # reads from the floors, which never come back below it (nor in MAX_APART, 60 s).
    assert took < 3 * MIN_APART + 2.0, took
