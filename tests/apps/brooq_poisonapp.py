"""Handlers whose failures carry text a database cannot hold as given, for the tests of
outcome writing (tests/process/test_outcome_text.py), under a real brooq-master.

Each handler records its execution in the table `execution` (tests/harness.prepare), so
the tests count how often each job ran. The error texts: a NUL, a lone surrogate, a
character LATIN1 lacks, an exception whose str() raises, a result LATIN1 cannot hold.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0
_aconn: psycopg.AsyncConnection[Any] | None = None
_aconn_pid = 0


def fast_retry(q: brooq.Queue, topic: str) -> Any:
    """Two attempts, 100 ms apart: a poisoned job is dead within a second."""
    return q.handler(topic, max_attempts=2, backoff_base="100ms", backoff_max="100ms")


def record(claim: brooq.Claim) -> None:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _conn_pid = os.getpid()
    _conn.execute(
        "INSERT INTO execution (job_id, pid, attempt) VALUES (%s, %s, %s)",
        (claim.id, os.getpid(), claim.attempt),
    )


async def record_async(claim: brooq.Claim) -> None:
    global _aconn, _aconn_pid
    if _aconn is None or _aconn_pid != os.getpid() or _aconn.closed:
        _aconn = await psycopg.AsyncConnection.connect(os.environ["DATABASE_URL"], autocommit=True)
        _aconn_pid = os.getpid()
    await _aconn.execute(
        "INSERT INTO execution (job_id, pid, attempt) VALUES (%s, %s, %s)",
        (claim.id, os.getpid(), claim.attempt),
    )


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


# What each p.fail job raises, by its payload's "kind".
POISON: dict[str, BaseException] = {
    "nul": ValueError("before\x00after"),
    "surrogate": ValueError("lone \udc80 surrogate"),
    "cancel": brooq.CancelJob("stop\x00here"),
    "unprintable": Unprintable(),
    "euro": ValueError("costs 5 € au café"),
}


@fast_retry(queue, "p.fail")
def fail(claim: brooq.Claim) -> None:
    record(claim)
    raise POISON[claim.payload["kind"]]


@fast_retry(queue, "p.result")
def result(claim: brooq.Claim) -> Any:
    """Returns the payload's "s", or "€" (which a LATIN1 database cannot hold, nor a
    payload carry there) when the payload says "euro"."""
    record(claim)
    return {"s": "€" if claim.payload.get("euro") else claim.payload["s"]}


@fast_retry(queue, "p.hook_exit")
def hook_exit(claim: brooq.Claim) -> None:
    """Succeeds, but its on_success hook ends the process while done is being written."""
    record(claim)
    claim.on_success(lambda conn: os._exit(7))


@queue.handler("p.ok")
def ok(claim: brooq.Claim) -> None:
    record(claim)


aio = brooq.Queue()


@fast_retry(aio, "a.fail")
async def a_fail(claim: brooq.Claim) -> None:
    await record_async(claim)
    await asyncio.sleep(0.05)
    raise POISON[claim.payload["kind"]]


@aio.handler("a.ok")
async def a_ok(claim: brooq.Claim) -> None:
    await record_async(claim)
    await asyncio.sleep(float(claim.payload.get("s", 0.05)))
