"""Queue.enqueue_many and enqueue_many_async of an iterator (brooq.producer.insert's
streamed batch): checked and sent a block at a time, the same rows and the same refusals
as a list; a job a plain COPY cannot take sends the whole batch again as a list."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
import pytest

import brooq
from brooq.producer.insert import COPY_BLOCK

N = 2 * COPY_BLOCK + 7  # two whole blocks and a part one

Enqueue = Callable[[brooq.Queue, Iterable[Any]], list[tuple[uuid.UUID, bool]]]


def sync_door(queue: brooq.Queue, jobs: Iterable[Any]) -> list[tuple[uuid.UUID, bool]]:
    return queue.enqueue_many(jobs)


def async_door(queue: brooq.Queue, jobs: Iterable[Any]) -> list[tuple[uuid.UUID, bool]]:
    async def go() -> list[tuple[uuid.UUID, bool]]:
        try:
            return await queue.enqueue_many_async(jobs)
        finally:
            await queue.close_async()

    return asyncio.run(go())


DOORS = pytest.mark.parametrize("enqueue", [sync_door, async_door], ids=["sync", "async"])


def plain(n: int = N) -> Iterator[brooq.Job]:
    return (brooq.Job("bulk", {"n": i, "s": "\\" * (i % 3)}) for i in range(n))


def rows(db: psycopg.Connection[Any], ids: list[uuid.UUID]) -> list[tuple[Any, ...]]:
    found = {
        r[0]: r[1:]
        for r in db.execute(
            "SELECT id, payload, tags, state FROM job WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    }
    return [found[job_id] for job_id in ids]


def count(db: psycopg.Connection[Any]) -> int:
    row = db.execute("SELECT count(*) FROM job").fetchone()
    assert row is not None
    return int(row[0])


@DOORS
def test_an_iterator_is_streamed_with_every_job_in_order(
    enqueue: Enqueue, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    taken = 0
    copying: list[int] = []

    def counted() -> Iterator[brooq.Job]:
        nonlocal taken
        for job in plain():
            if taken == N - 1:  # the COPY is under way before the last job is made
                row = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND datname = current_database() AND state = 'active' "
                    "AND query LIKE '%COPY %job%FROM STDIN%'"
                ).fetchone()
                copying.append(int(row[0]) if row else 0)
            taken += 1
            yield job

    result = enqueue(queue, counted())
    assert copying == [1]
    assert taken == N and len(result) == N and all(created for _, created in result)
    ids = [job_id for job_id, _ in result]
    assert ids == sorted(ids)  # made a block at a time, still increasing
    assert rows(db, ids) == [({"n": i, "s": "\\" * (i % 3)}, None, "pending") for i in range(N)]
    assert enqueue(queue, iter([])) == []


@DOORS
def test_a_refused_job_of_a_later_block_is_named_and_nothing_is_inserted(
    enqueue: Enqueue, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    late = COPY_BLOCK + 5
    bad = (job if i != late else {"topic": "bulk"} for i, job in enumerate(plain()))
    with pytest.raises(TypeError, match=rf"^job {late}: expected a brooq.Job, not dict$"):
        enqueue(queue, bad)
    too_big = (brooq.Job("bulk", "x" * 200) if i == N - 1 else job for i, job in enumerate(plain()))
    small = brooq.Queue(queue.dsn, max_payload_bytes=100)
    try:
        with pytest.raises(brooq.InvalidPayload, match=rf"^job {N - 1}: payload is 202 bytes"):
            enqueue(small, too_big)
    finally:
        small.close()
    assert count(db) == 0


@DOORS
def test_a_job_a_plain_copy_cannot_take_sends_the_batch_as_a_list(
    enqueue: Enqueue, queue: brooq.Queue, db: psycopg.Connection[Any]
) -> None:
    """A tagged job in the second block: the first block's COPY is rolled back and every
    job goes again, in order, the tagged one with its tags; one row per job."""
    tagged = COPY_BLOCK + 3
    jobs = (
        brooq.Job("bulk", {"n": i}, tags=["t"]) if i == tagged else brooq.Job("bulk", {"n": i})
        for i in range(N)
    )
    result = enqueue(queue, jobs)
    ids = [job_id for job_id, _ in result]
    assert len(ids) == N and count(db) == N
    got = rows(db, ids)
    assert [payload for payload, _, _ in got] == [{"n": i} for i in range(N)]
    assert [i for i, (_, tags, _) in enumerate(got) if tags] == [tagged]


@DOORS
def test_strict_topics_name_the_unknown_topic_by_its_index_in_the_stream(
    enqueue: Enqueue, dsn: str, db: psycopg.Connection[Any]
) -> None:
    strict = brooq.Queue(dsn, strict_topics=True)

    @strict.handler("bulk")
    def bulk(claim: brooq.Claim) -> None:
        pass

    late = 2 * COPY_BLOCK + 1
    jobs = (brooq.Job("bulk" if i != late else "bulkk", {}) for i in range(N))
    try:
        with pytest.raises(brooq.InvalidTopic, match=rf"^job {late}: topic 'bulkk'"):
            enqueue(strict, jobs)
    finally:
        strict.close()
    assert count(db) == 0


def test_in_the_callers_transaction_an_iterator_is_checked_whole_first(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """brooq.enqueue_many and enqueue_many_async on the caller's connection take an
    iterator too, read whole and checked before anything is sent: a refused job raises,
    names its index, and leaves the caller's transaction usable (the job enqueued after it
    commits); the others are inserted in order."""
    late = COPY_BLOCK + 5
    bad = (job if i != late else "x" for i, job in enumerate(plain()))
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            with pytest.raises(TypeError, match=rf"^job {late}: expected a brooq.Job, not str$"):
                brooq.enqueue_many(conn, bad)  # type: ignore[arg-type]
            [(kept, _)] = brooq.enqueue_many(conn, iter([brooq.Job("bulk", {"after": 1})]))
        result = brooq.enqueue_many(conn, plain())
        conn.commit()
    assert count(db) == N + 1 and rows(db, [kept])[0][0] == {"after": 1}
    assert [p for p, _, _ in rows(db, [i for i, _ in result])] == [
        {"n": i, "s": "\\" * (i % 3)} for i in range(N)
    ]

    async def go() -> list[tuple[uuid.UUID, bool]]:
        async with await psycopg.AsyncConnection.connect(dsn) as aconn, aconn.transaction():
            with pytest.raises(TypeError, match=rf"^job {late}: "):
                await brooq.enqueue_many_async(
                    aconn,
                    (job if i != late else 5 for i, job in enumerate(plain())),  # type: ignore[misc]
                )
            return await brooq.enqueue_many_async(aconn, plain(3))

    assert len(asyncio.run(go())) == 3 and count(db) == N + 4
