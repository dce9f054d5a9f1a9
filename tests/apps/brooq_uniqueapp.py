"""The application of tests/process/test_debounce.py: one handler that writes what it ran
with (its payload, when it started and ended) into the table `execution`, over a
connection of its own (autocommit), and sleeps as long as its payload asks."""

from __future__ import annotations

import json
import os
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


@queue.handler("u.run")
def run(claim: brooq.Claim) -> None:
    record(claim, "start " + json.dumps(claim.payload, sort_keys=True))
    time.sleep(float(claim.payload.get("sleep", 0)))
    record(claim, "end")
