"""The application of tests/process/test_workflows.py: handlers that write when they
started and ended into the table `execution` (a connection of their own, autocommit),
one that fails for good, one whose child is SIGKILLed inside the transaction writing its
first attempt's `done`, and a no-op for large fan-ins."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0


def record(claim: brooq.Claim, note: str) -> None:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _conn_pid = os.getpid()
    _conn.execute(
        "INSERT INTO execution (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (claim.id, os.getpid(), claim.attempt, note),
    )


@queue.handler("flow.step", max_attempts=1)
def step(claim: brooq.Claim) -> Any:
    record(claim, "start")
    time.sleep(float((claim.payload or {}).get("sleep", 0)))
    if (claim.payload or {}).get("fail"):
        raise RuntimeError("this step fails")
    record(claim, "end")
    return {"step": claim.payload}


@queue.handler("flow.kill", max_attempts=3)
def kill(claim: brooq.Claim) -> None:
    record(claim, "start")
    if claim.attempt == 1:
        # In the transaction that writes `done` (and with it the release of what waits),
        # after that UPDATE ran: the child dies before the commit.
        claim.on_success(lambda conn: os.kill(os.getpid(), signal.SIGKILL))


@queue.handler("flow.noop")
def noop(claim: brooq.Claim) -> None:
    pass


@queue.handler("flow.merge")
def merge(claim: brooq.Claim) -> Any:
    record(claim, "start")
    up = [
        {"id": str(u.id), "topic": u.topic, "state": u.state, "result": u.result}
        for u in claim.upstream
    ]
    record(claim, "end")
    return up
