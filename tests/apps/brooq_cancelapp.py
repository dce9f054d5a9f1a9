"""The application of the cancel tests: handlers that run until they are told to stop.

Each records in the table `execution` (its own autocommit connection) 'start' when it
begins, 'lease_lost' with the time it heard brooq.LeaseLost (an async handler: its task's
cancellation), and 'swallowed' when it heard it and went on. A sync app and an async one
in one module: a master of `brooq_cancelapp:queue` runs one async child and the rest sync.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0

# Long enough that only an interruption ends them within a test.
LIMITS = {"attempt_timeout": "120s", "max_execution_timeout": "300s"}


def record(claim: brooq.Claim, note: str) -> None:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _conn_pid = os.getpid()
    _conn.execute(
        "INSERT INTO execution (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (claim.id, os.getpid(), claim.attempt, note),
    )


@queue.handler("c.sleep", **LIMITS)
def sleep_loop(claim: brooq.Claim) -> None:
    """Sleeps in short steps for a minute."""
    record(claim, "start")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.2)
    except brooq.LeaseLost:
        record(claim, "lease_lost")
        raise
    record(claim, "end")


@queue.handler("c.spin", **LIMITS)
def spin(claim: brooq.Claim) -> None:
    """A pure Python loop that never ends by itself."""
    record(claim, "start")
    n = 0
    try:
        while True:
            n += 1
    except brooq.LeaseLost:
        record(claim, "lease_lost")
        raise


@queue.handler("c.stubborn", **LIMITS)
def stubborn(claim: brooq.Claim) -> None:
    """Hears LeaseLost and goes on, as a handler with a bare ``except`` would."""
    record(claim, "start")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            time.sleep(0.2)
        except brooq.LeaseLost:
            record(claim, "swallowed")
    record(claim, "end")


@queue.handler("c.async", **LIMITS)
async def async_sleep(claim: brooq.Claim) -> None:
    """Awaits for a minute."""
    await asyncio.to_thread(record, claim, "start")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await asyncio.to_thread(record, claim, "lease_lost")
        raise
    await asyncio.to_thread(record, claim, "end")


@queue.handler("c.async_stubborn", **LIMITS)
async def async_stubborn(claim: brooq.Claim) -> None:
    """Hears its cancellation and goes on awaiting."""
    await asyncio.to_thread(record, claim, "start")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            await asyncio.to_thread(record, claim, "swallowed")
    await asyncio.to_thread(record, claim, "end")
