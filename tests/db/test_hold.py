"""Jobs on hold, through every door a producer or an operator has: enqueued held
(Job(held=True): one, many, keyed or not, sync and async, the caller's connection), held
and released by id (Queue, its async forms, brooq.hold/release in the caller's
transaction) and in bulk; never claimed while held, back in its place once released;
canceled and purged like any job not yet taken; counted as on_hold."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import brooq
from brooq.errors import InvalidTransition
from brooq.ipc.channel import CHANNEL
from brooq.sql import Q
from tests.harness import ENQUEUE_DOORS, covering, enqueue_through

LEASE = 30.0


def claim(dsn: str, limit: int = 10, topics: tuple[str, ...] = ("t.h",)) -> list[uuid.UUID]:
    """What a child's claim takes now from queue default (and leaves processing)."""
    params = {
        "done": [],
        "topics": list(topics),
        "limit": limit,
        "children": 1,
        "worker": "w",
        "lease": LEASE,
        "queue": "default",
    }
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(Q.job_finish_and_claim, params).fetchall()
    return [r["id"] for r in rows if r["claimed"]]


def state(db: psycopg.Connection[Any], job_id: uuid.UUID) -> str:
    row = db.execute("SELECT state FROM job_all WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


# -- enqueued on hold --------------------------------------------------------------------------


DOORS = ENQUEUE_DOORS
LATER = datetime.now(timezone.utc) + timedelta(days=1)
# What a held job may carry besides: each takes another statement (the line's INSERT is
# the plain job's; COPY's wide form; the INSERT of keyed batches; scheduled rows).
CASES = (
    {},
    {"tags": ["vip"], "group": "acme"},
    {"idempotency_key": "k-held"},
    {"available_at": LATER, "priority": 4},
)


@pytest.mark.parametrize(("door", "case"), covering(DOORS, CASES))
def test_a_job_enqueued_held_is_on_hold_and_never_claimed(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str, door: str, case: dict[str, Any]
) -> None:
    held, plain = enqueue_through(
        door, queue, dsn, [brooq.Job("t.h", {"n": 1}, held=True, **case), brooq.Job("t.h")]
    )
    assert state(db, held) == "on_hold" and state(db, plain) == "pending"
    record = queue.get(held)
    assert record is not None and record.payload == {"n": 1}
    for name, value in case.items():
        got = getattr(record, name)
        assert (set(got) == set(value)) if name == "tags" else got == value, name
    assert claim(dsn) == [plain]  # the held one is not in the ready index
    assert queue.release(held) is True
    assert state(db, held) == "pending"
    expected = [] if "available_at" in case else [held]
    assert claim(dsn) == expected


# -- held and released -----------------------------------------------------------------------


def test_hold_keeps_the_place_in_line_and_release_gives_it_back(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    first, second = (queue.enqueue(brooq.Job("t.h", {"i": i}))[0] for i in range(2))
    before = queue.get(first)
    assert before is not None
    assert queue.hold(first) is True and queue.hold(first) is False  # already on hold
    assert claim(dsn, limit=1) == [second]
    assert queue.release(first) is True and queue.release(first) is False
    after = queue.get(first)
    assert after is not None and after.available_at == before.available_at
    assert after.attempts == 0 and after.state == "pending"
    assert claim(dsn, limit=1) == [first]


def test_a_retrying_job_held_keeps_its_attempts_and_its_backoff(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    job_id = queue.enqueue(brooq.Job("t.h"))[0]
    db.execute(
        "UPDATE job SET state = 'failed', attempts = 2, available_at = now() + interval '1 hour'"
        " WHERE id = %s",
        (job_id,),
    )
    assert queue.hold(job_id) is True
    assert queue.release(job_id) is True
    record = queue.get(job_id)
    assert record is not None and record.attempts == 2 and record.state == "pending"
    assert record.available_at > datetime.now(timezone.utc) + timedelta(minutes=59)
    assert claim(dsn) == []  # its backoff still runs


def test_release_wakes_the_masters_when_the_job_is_ready(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    ready = queue.enqueue(brooq.Job("t.h", held=True))[0]
    later = queue.enqueue(brooq.Job("t.h", held=True, available_at=LATER))[0]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        assert queue.release(later) is True
        assert [n for n in listener.notifies(timeout=0.3) if n.channel == CHANNEL] == []
        assert queue.release(ready) is True
        heard = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert heard == ["public"]


def test_the_caller_transaction_decides(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    job_id = queue.enqueue(brooq.Job("t.h"))[0]
    with psycopg.connect(dsn) as conn:
        assert brooq.hold(conn, job_id) is True
        conn.rollback()
    assert state(db, job_id) == "pending"
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        assert brooq.hold(cur, str(job_id)) is True
        assert state(db, job_id) == "pending"  # not before the commit
        conn.commit()
    assert state(db, job_id) == "on_hold"

    async def release() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            done = await brooq.release_async(conn, job_id)
            await conn.commit()
            return done

    assert asyncio.run(release()) is True and state(db, job_id) == "pending"

    async def hold_again() -> bool:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            done = await brooq.hold_async(conn, job_id)
            await conn.rollback()
            return done

    assert asyncio.run(hold_again()) is True and state(db, job_id) == "pending"
    with psycopg.connect(dsn) as conn:
        assert brooq.release(conn, job_id) is False  # not on hold
        assert brooq.hold(conn, uuid.uuid4()) is False
    with pytest.raises(brooq.InvalidJobId):
        brooq.hold(db, "not-a-uuid")
    with pytest.raises(TypeError, match=r"brooq\.hold takes"):
        brooq.hold(object(), job_id)  # type: ignore[arg-type]


def test_the_async_queue_holds_and_releases(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    job_id = queue.enqueue(brooq.Job("t.h"))[0]

    async def both() -> tuple[bool, str, bool, bool]:
        held = await queue.hold_async(job_id)
        now = (await queue.get_async(job_id)).state  # type: ignore[union-attr]
        released = await queue.release_async(job_id)
        again = await queue.release_async(job_id)
        await queue.close_async()
        return held, now, released, again

    assert asyncio.run(both()) == (True, "on_hold", True, False)
    assert state(db, job_id) == "pending"


def test_what_cannot_be_held_is_refused_and_explained(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    keyed = queue.enqueue(brooq.Job("t.h", unique_key="order-7"))[0]
    assert queue.hold(keyed) is False
    refusal = queue.explain_refusal(keyed, "hold")
    assert isinstance(refusal, InvalidTransition) and "unique_key ('order-7')" in str(refusal)
    parked = queue.enqueue(brooq.Job("t.h"))[0]
    db.execute(
        "UPDATE job SET parked = 'sleep', available_at = now() + interval '1 hour' WHERE id = %s",
        (parked,),
    )
    assert queue.hold(parked) is False
    assert "a durable handler parked it" in str(queue.explain_refusal(parked, "hold"))
    running = queue.enqueue(brooq.Job("t.h"))[0]
    db.execute(
        "UPDATE job SET state = 'processing', locked_by = 'w', locked_until = now() + "
        "interval '1 minute' WHERE id = %s",
        (running,),
    )
    assert queue.hold(running) is False
    assert str(queue.explain_refusal(running, "hold")) == (
        f"cannot hold job {running}: it is processing; only pending or failed jobs can be held"
    )
    assert str(queue.explain_refusal(running, "release")) == (
        f"cannot release job {running}: it is processing; only on_hold jobs can be released"
    )
    assert state(db, keyed) == "pending" and state(db, running) == "processing"


def test_a_held_job_is_canceled_and_purged_like_any_job_not_taken(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    one, two = (queue.enqueue(brooq.Job("t.h", held=True))[0] for _ in range(2))
    assert queue.cancel(one) is True
    assert db.execute("SELECT state FROM job_history WHERE id = %s", (one,)).fetchone() == (
        "canceled",
    )
    assert queue.release(one) is False
    assert queue.purge(topic="t.h", dry_run=True) == 1
    assert queue.purge(topic="t.h") == 1 and state(db, two) == "canceled"


def test_bulk_hold_and_release_by_topic(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    ids = [i for i, _ in queue.enqueue_many([brooq.Job("t.h", {"i": i}) for i in range(5)])]
    keyed = queue.enqueue(brooq.Job("t.h", unique_key="u"))[0]
    other = queue.enqueue(brooq.Job("t.other"))[0]
    dry = queue.hold_many(topic="t.h", state="pending", dry_run=True)
    assert (dry.matched, dry.changed) == (6, 0) and state(db, ids[0]) == "pending"
    held = queue.hold_many(topic="t.h", state="pending", batch_size=2)
    assert (held.matched, held.changed) == (6, 5)  # the keyed job is left alone
    assert {state(db, i) for i in ids} == {"on_hold"}
    assert state(db, keyed) == "pending" and state(db, other) == "pending"
    assert claim(dsn, topics=("t.h",)) == [keyed]
    with pytest.raises(InvalidTransition, match="only pending or failed jobs can be held"):
        queue.hold_many(topic="t.h", state="processing")
    released = queue.release_many(topic="t.h", batch_size=2)
    assert (released.matched, released.changed) == (5, 5)
    assert sorted(claim(dsn)) == sorted(ids)


def test_held_jobs_are_counted_on_hold_and_nowhere_else(
    queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    queue.enqueue_many([brooq.Job("t.h", held=True) for _ in range(3)])
    queue.enqueue(brooq.Job("t.h"))
    [stats] = [s for s in queue.stats() if s.topic == "t.h"]
    assert (stats.on_hold, stats.ready, stats.scheduled, stats.pending) == (3, 1, 0, 1)
    assert stats.to_dict()["on_hold"] == 3
    [default] = [q for q in queue.queues() if q.name == "default"]
    assert default.on_hold == 3 and default.ready == 1


def test_the_down_step_releases_the_held_jobs_and_the_up_step_comes_back(
    queue: brooq.Queue, db: psycopg.Connection[Any], dsn: str
) -> None:
    from brooq import migrate

    held = queue.enqueue(brooq.Job("t.h", held=True))[0]
    before = queue.get(held)
    assert before is not None
    assert [m.version for m in migrate.down(dsn, to=22)] == [31, 30, 29, 28, 27, 26, 25, 24, 23]
    assert state(db, held) == "pending"  # released, its place kept
    assert db.execute("SELECT available_at FROM job WHERE id = %s", (held,)).fetchone() == (
        before.available_at,
    )
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("UPDATE job SET state = 'on_hold' WHERE id = %s", (held,))
    assert not db.execute("SELECT 1 FROM pg_class WHERE relname = 'job_on_hold_idx'").fetchone()
    assert [m.version for m in migrate.up(dsn)] == [23, 24, 25, 26, 27, 28, 29, 30, 31]
    assert queue.hold(held) is True and state(db, held) == "on_hold"
