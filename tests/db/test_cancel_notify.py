"""job_cancel notifies brooq_cancel for a processing job, and for nothing else: once, with
the job id, when the cancel commits (never on a rollback); a row that changed state under
the cancel is judged by its state then, as the UPDATE judges it."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

import brooq
from brooq.ipc.channel import CANCEL_CHANNEL
from brooq.job import STATES
from brooq.operator import changes
from tests.db.test_transitions import _job_in


def _heard(listener: psycopg.Connection[Any], wait: float = 0.3) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=wait) if n.channel == CANCEL_CHANNEL]


@pytest.fixture
def listener(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"LISTEN {CANCEL_CHANNEL}")
        yield conn


@pytest.mark.parametrize("state", STATES)
def test_only_a_processing_jobs_cancel_notifies(
    queue: brooq.Queue, db: psycopg.Connection[Any], listener: Any, state: str
) -> None:
    job_id = _job_in(db, state)
    moved = queue.cancel(job_id)
    heard = _heard(listener)
    assert heard == ([str(job_id)] if state == "processing" else []), (state, moved)
    if state == "processing":
        assert moved is True


def test_the_notification_waits_for_the_commit_and_a_rollback_sends_none(
    dsn: str, db: psycopg.Connection[Any], listener: Any
) -> None:
    job_id = _job_in(db, "processing")
    with psycopg.connect(dsn) as conn:
        assert changes.cancel(conn, job_id) is True
        assert _heard(listener) == []
        conn.rollback()
    assert _heard(listener) == []
    with psycopg.connect(dsn) as conn:
        assert changes.cancel(conn, job_id) is True
        assert _heard(listener) == []
        conn.commit()
    assert _heard(listener) == [str(job_id)]
    # Canceled already: a second cancel changes nothing and says nothing.
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert changes.cancel(conn, job_id) is False
    assert _heard(listener) == []


@pytest.mark.parametrize(
    ("then", "moved", "notified"), [("done", False, False), ("processing", True, True)]
)
def test_a_row_changed_under_the_cancel_is_judged_by_its_state_then(
    dsn: str, db: psycopg.Connection[Any], listener: Any, then: str, moved: bool, notified: bool
) -> None:
    """The holder writes its outcome (or renews) while the cancel waits for the row."""
    job_id = _job_in(db, "processing")
    holder = psycopg.connect(dsn)
    holder.execute("UPDATE job SET state = %s, updated_at = now() WHERE id = %s", (then, job_id))
    answer: list[bool] = []
    with psycopg.connect(dsn, autocommit=True) as canceler:
        thread = threading.Thread(target=lambda: answer.append(changes.cancel(canceler, job_id)))
        thread.start()
        deadline = time.monotonic() + 10
        while not db.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "
            "'%%prior%%'"
        ).fetchone():
            assert time.monotonic() < deadline, "the cancel never waited for the row"
            time.sleep(0.01)
        holder.commit()
        holder.close()
        thread.join(10)
    assert answer == [moved]
    assert _heard(listener) == ([str(job_id)] if notified else [])
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row == (("canceled",) if moved else (then,))


def test_an_unknown_id_notifies_nothing(queue: brooq.Queue, listener: Any) -> None:
    assert queue.cancel(uuid.uuid4()) is False
    assert _heard(listener) == []


def test_brooq_cancel_joins_the_callers_transaction(
    dsn: str, db: psycopg.Connection[Any], listener: Any
) -> None:
    job_id = _job_in(db, "processing")
    with psycopg.connect(dsn) as conn:
        assert brooq.cancel(conn, str(job_id)) is True
        conn.rollback()
    assert _heard(listener) == [] and _state(db, job_id) == "processing"
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        assert brooq.cancel(cur, job_id) is True  # a cursor: its connection's transaction
        assert _state(db, job_id) == "processing" and _heard(listener) == []
        conn.commit()
    assert _heard(listener) == [str(job_id)] and _state(db, job_id) == "canceled"
    with psycopg.connect(dsn) as conn:
        assert brooq.cancel(conn, job_id) is False  # finished: nothing to cancel
        assert brooq.cancel(conn, uuid.uuid4()) is False


def test_brooq_cancel_async_and_its_refusals(
    dsn: str, db: psycopg.Connection[Any], listener: Any
) -> None:
    import asyncio

    job_id = _job_in(db, "pending")

    async def cancel() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            moved = await brooq.cancel_async(conn, job_id)
            await conn.commit()
            return moved

    assert asyncio.run(cancel()) is True
    assert _state(db, job_id) == "canceled" and _heard(listener) == []  # it was pending
    with pytest.raises(brooq.InvalidJobId):
        brooq.cancel(db, "not-a-uuid")
    with pytest.raises(TypeError, match=r"brooq\.cancel takes"):
        brooq.cancel(object(), job_id)  # type: ignore[arg-type]


def _state(db: psycopg.Connection[Any], job_id: Any) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])
