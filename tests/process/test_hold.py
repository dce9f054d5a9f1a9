"""A held job under two running masters: while jobs beside it are claimed and done it
stays on hold, unclaimed; released, it runs once. A cancel ends a held job for good."""

from __future__ import annotations

import psycopg

import brooq
from tests.harness import StartMaster, executions, wait_for


def _state(db: psycopg.Connection, job_id: object) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def test_two_masters_leave_a_held_job_alone_until_it_is_released(
    queue: brooq.Queue, db: psycopg.Connection, start_master: StartMaster
) -> None:
    masters = [start_master(workers=2) for _ in range(2)]
    for m in masters:
        m.wait_ready(2)
    held = queue.enqueue(brooq.Job("t.ok", {"held": True}, held=True))[0]
    dropped = queue.enqueue(brooq.Job("t.ok", {"dropped": True}, held=True))[0]
    # Jobs enqueued after it, ahead of it in no way: every master claims them meanwhile.
    for _ in range(3):
        beside = [i for i, _ in queue.enqueue_many([brooq.Job("t.ok") for _ in range(20)])]
        wait_for(
            lambda ids=beside: all(_state(db, i) == "done" for i in ids),
            what="the jobs beside the held one done",
        )
    assert _state(db, held) == "on_hold" and executions(db, held) == 0
    assert queue.cancel(dropped) is True
    assert queue.release(held) is True
    wait_for(lambda: _state(db, held) == "done", what="the released job done")
    assert executions(db, held) == 1
    assert _state(db, dropped) == "canceled" and executions(db, dropped) == 0
    for m in masters:
        m.stop()
