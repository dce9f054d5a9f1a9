"""The async application the async process tests run under a real brooq-master.

Every handler records its execution in the table `execution` over its own connection
(one AsyncConnection per child, autocommit), with the note 'start' when it begins and
'end' when it ends, so that tests read how many ran at once from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import psycopg

import brooq

_conn: psycopg.AsyncConnection[Any] | None = None
_conn_pid = 0


async def record(claim: brooq.Claim, note: str) -> None:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
        _conn_pid = os.getpid()
    await _conn.execute(
        "INSERT INTO execution (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (claim.id, os.getpid(), claim.attempt, note),
    )


async def mark(claim: brooq.Claim, call_next: Any) -> Any:
    """An async middleware: wraps the async handlers only."""
    value = await call_next(claim)
    return {"mw": "async", "value": value} if claim.topic == "a.value" else value


def sync_mark(claim: brooq.Claim, call_next: Any) -> Any:
    """A sync middleware: wraps the sync handlers only."""
    value = call_next(claim)
    return {"mw": "sync"} if claim.topic == "s.value" else value


async def a_sleep(claim: brooq.Claim) -> None:
    await record(claim, "start")
    await asyncio.sleep(float(claim.payload["s"]))
    await record(claim, "end")


async def a_value(claim: brooq.Claim) -> int:
    return 42


async def a_soft(claim: brooq.Claim) -> None:
    await record(claim, "start")
    try:
        await asyncio.sleep(10)
    finally:
        await record(claim, "cleanup")  # brooq's cancellation lets it clean up


async def a_block(claim: brooq.Claim) -> None:
    await record(claim, "start")
    time.sleep(30)  # blocks the event loop: every sibling waits


async def a_swallow(claim: brooq.Claim) -> None:
    await record(claim, "start")
    for _ in range(100):
        with contextlib.suppress(asyncio.CancelledError):  # ignores the soft limit
            await asyncio.sleep(30)


async def a_fail(claim: brooq.Claim) -> None:
    raise ValueError("async bad input")


def s_work(claim: brooq.Claim) -> None:
    time.sleep(0.02)


def s_value(claim: brooq.Claim) -> int:
    return 1


ASYNC_HANDLERS: list[tuple[Any, str, dict[str, Any]]] = [
    (a_sleep, "a.sleep", {}),
    (a_value, "a.value", {}),
    (a_soft, "a.soft", {"attempt_timeout": "1s", "max_attempts": 1}),
    (a_block, "a.block", {"attempt_timeout": "1s", "max_attempts": 1}),
    (
        a_swallow,
        "a.swallow",
        {"attempt_timeout": "300ms", "max_execution_timeout": "2s", "max_attempts": 1},
    ),
    (a_fail, "a.fail", {"max_attempts": 1}),
]
SYNC_HANDLERS: list[tuple[Any, str, dict[str, Any]]] = [
    (s_work, "s.work", {}),
    (s_value, "s.value", {}),
]


def _build(*groups: list[tuple[Any, str, dict[str, Any]]]) -> brooq.Queue:
    q = brooq.Queue()
    q.middleware(mark)
    q.middleware(sync_mark)
    for group in groups:
        for fn, topic, options in group:
            q.handler(topic, **options)(fn)
    return q


queue = _build(ASYNC_HANDLERS)  # every handler async: every child is an async child
mixed = _build(ASYNC_HANDLERS, SYNC_HANDLERS)  # both kinds: children split by kind

# Async handlers and only a sync global middleware: the master warns at start.
skips = brooq.Queue()
skips.middleware(sync_mark)
skips.handler("a.sleep")(a_sleep)
