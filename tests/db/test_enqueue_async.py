"""Async producers: queue.enqueue_async and queue.enqueue_many_async on the
Queue's async pool, and brooq.enqueue_many_async in the caller's transaction; real
PostgreSQL, a real fork."""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

import brooq


@dataclass
class Mail:
    to: str


def app_queue(dsn: str) -> brooq.Queue:
    q = brooq.Queue(dsn)

    @q.handler("mail.send", queue="bulk", payload=Mail)
    def send(claim: brooq.Claim[Mail]) -> None:
        return None

    return q


def rows(db: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return db.execute(
        "SELECT topic, queue, idempotency_key, available_at > now() FROM job_all ORDER BY id"
    ).fetchall()


def test_enqueue_async_goes_to_the_handlers_queue_and_keeps_keys(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    q = app_queue(dsn)

    async def main() -> tuple[tuple[uuid.UUID, bool], tuple[uuid.UUID, bool]]:
        try:
            first = await q.enqueue_async(brooq.Job("mail.send", Mail("a@b"), idempotency_key="k"))
            again = await q.enqueue_async(brooq.Job("mail.send", Mail("a@b"), idempotency_key="k"))
            return first, again
        finally:
            await q.close_async()

    first, again = asyncio.run(main())
    assert first[1] is True and again == (first[0], False)
    assert rows(db) == [("mail.send", "bulk", "k", False)]


def test_enqueue_async_checks_a_typed_payload_before_any_io(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    q = app_queue(dsn)

    async def main() -> None:
        with pytest.raises(brooq.PayloadMismatch, match=r"^payload\.to: expected str, got int"):
            await q.enqueue_async(brooq.Job("mail.send", {"to": 5}))
        with pytest.raises(brooq.PayloadMismatch, match=r"^job 1: payload\.to"):
            await q.enqueue_many_async(
                [brooq.Job("mail.send", {"to": "x"}), brooq.Job("mail.send", {})]
            )
        assert q._pools._apool is None  # refused before the pool was even opened

    asyncio.run(main())
    assert rows(db) == []


def test_enqueue_many_async_copies_ready_and_scheduled_jobs_and_resolves_keys(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    q = app_queue(dsn)
    later = datetime.now(timezone.utc) + timedelta(hours=1)

    async def main() -> tuple[list[Any], list[Any]]:
        try:
            copied = await q.enqueue_many_async(
                [
                    brooq.Job("mail.send", Mail("1")),
                    brooq.Job("other", {"n": 2}, available_at=later),
                    brooq.Job("mail.send", Mail("3"), queue="urgent"),
                ]
            )
            keyed = await q.enqueue_many_async(
                [
                    brooq.Job("other", key_payload, idempotency_key=key)
                    for key_payload, key in (({"n": 4}, "a"), ({"n": 5}, "a"), ({"n": 6}, "b"))
                ]
            )
            return copied, keyed
        finally:
            await q.close_async()

    copied, keyed = asyncio.run(main())
    assert all(created for _, created in copied) and len({i for i, _ in copied}) == 3
    assert [created for _, created in keyed] == [True, False, True]
    assert keyed[1][0] == keyed[0][0]
    assert sorted(rows(db), key=str) == sorted(
        [
            ("mail.send", "bulk", None, False),
            ("mail.send", "urgent", None, False),
            ("other", "default", "a", False),
            ("other", "default", "b", False),
            ("other", "default", None, True),  # the scheduled one
        ],
        key=str,
    )


def test_the_async_pool_follows_the_event_loop_and_the_process(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A pool belongs to the loop and the process that opened it: a second asyncio.run
    and a forked child each get their own, and the parent's keeps working."""
    q = app_queue(dsn)
    asyncio.run(q.enqueue_async(brooq.Job("other", {"n": 1})))
    inherited = q._pools._apool
    asyncio.run(q.enqueue_async(brooq.Job("other", {"n": 2})))  # a new loop: a new pool
    assert q._pools._apool is not None and q._pools._apool is not inherited
    pid = os.fork()
    if pid == 0:  # the child: its own pool, never the parent's sockets
        code = 1
        try:
            asyncio.run(q.enqueue_async(brooq.Job("other", {"n": 3})))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

    async def last() -> None:
        await q.enqueue_async(brooq.Job("other", {"n": 4}))
        await q.close_async()

    asyncio.run(last())
    got = db.execute("SELECT payload->>'n' FROM job_all ORDER BY id").fetchall()
    assert [r[0] for r in got] == ["1", "2", "3", "4"]


def test_module_level_enqueue_many_async_is_in_the_callers_transaction(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await brooq.enqueue_many_async(conn, [brooq.Job("other", {"n": i}) for i in range(3)])
            await conn.rollback()
            await brooq.enqueue_many_async(conn, [brooq.Job("other", {"n": 9})])
            await conn.commit()

    asyncio.run(main())
    assert db.execute("SELECT payload->>'n' FROM job_all").fetchall() == [("9",)]
