"""The pooled connection's check (brooq/producer/poolcheck.py): no round trip for a connection in
use a moment ago, and still no broken connection handed out."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

import brooq
from brooq.producer import poolcheck
from tests.harness import terminate_backend


def _pooled_pid(queue: brooq.Queue) -> int:
    with queue.connection() as conn:
        return conn.info.backend_pid


@pytest.fixture
def no_idle_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the socket can tell: however long the test takes, no connection counts as
    idle long enough for the round trip."""
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 3600.0)


@pytest.mark.usefixtures("no_idle_check")
def test_a_connection_the_server_ended_while_pooled_is_replaced_before_an_enqueue(
    queue: brooq.Queue, connect: Any
) -> None:
    # Queue.enqueue has a connection of its own (test_enqueue_line.py); an enqueue in the
    # Queue's transaction is the pool's.
    pid = _pooled_pid(queue)  # the pool is open and its connection handed out once
    terminate_backend(connect(autocommit=True), pid)
    with queue.transaction() as conn:  # not DatabaseUnavailable
        job_id, created = brooq.enqueue(conn, brooq.Job("t"))
    assert created is True and queue.get(job_id) is not None
    assert _pooled_pid(queue) != pid


@pytest.mark.usefixtures("no_idle_check")
def test_the_async_pool_replaces_a_connection_the_server_ended(
    queue: brooq.Queue, connect: Any
) -> None:
    async def go() -> None:
        try:
            await queue.enqueue_async(brooq.Job("t"))
            async with queue._pools.async_connection() as conn:
                pid = conn.info.backend_pid
            terminate_backend(connect(autocommit=True), pid)
            job_id, created = await queue.enqueue_async(brooq.Job("t"))
            assert created is True and queue.get(job_id) is not None
        finally:
            await queue.close_async()

    asyncio.run(go())


def test_only_a_suspect_connection_gets_the_round_trip(
    dsn: str, connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 3600.0)
    conn = connect(autocommit=True)
    assert poolcheck.suspect(conn) is True  # never handed out before
    assert poolcheck.suspect(conn) is False  # handed out a moment ago, nothing to read
    conn.execute("SELECT 1")
    assert poolcheck.suspect(conn) is False
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 0.0)
    time.sleep(0.01)
    assert poolcheck.suspect(conn) is True  # idle longer than IDLE_CHECK_S
    monkeypatch.setattr(poolcheck, "IDLE_CHECK_S", 3600.0)
    in_tx = connect(autocommit=False)
    poolcheck.suspect(in_tx)
    in_tx.execute("SELECT 1")  # a transaction left open
    assert poolcheck.suspect(in_tx) is True
    in_tx.rollback()
    terminate_backend(connect(autocommit=True), conn.info.backend_pid)
    assert poolcheck.suspect(conn) is True  # the FATAL message / end of stream waits
    with pytest.raises(psycopg.OperationalError):
        poolcheck.check_connection(conn)
