"""The application of the fleet tests (tests/fleet/test_hosts.py): one master per host.

`fleet.work` records each execution in `execution` (the table tests/audit.py counts)
with the host it ran on (FLEET_HOST), over a connection of its own in autocommit: the
record is its own transaction, so it survives whatever becomes of the job's outcome, and
it crosses the same link as the child's claims.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
HOST = os.environ.get("FLEET_HOST", "?")
_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0


def record(claim: brooq.Claim) -> None:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(
            os.environ["DATABASE_URL"], autocommit=True, application_name=f"fleet {HOST}"
        )
        _conn_pid = os.getpid()
    try:
        _conn.execute(
            "INSERT INTO execution (job_id, pid, attempt, note, host) VALUES (%s, %s, %s, '', %s)",
            (claim.id, os.getpid(), claim.attempt, HOST),
        )
    except BaseException:
        # brooq.LeaseLost raised into the handler while this statement waited on a cut
        # link leaves the connection mid-command ("another command is already in
        # progress" for ever after): never reuse it.
        _conn.close()
        _conn = None
        raise


@queue.handler("fleet.work")
def work(claim: brooq.Claim) -> None:
    record(claim)
    if isinstance(claim.payload, dict) and claim.payload.get("sleep"):
        time.sleep(float(claim.payload["sleep"]))


@queue.handler("fleet.noop")
def noop(claim: brooq.Claim) -> None:
    """Nothing at all: the throughput run measures brooq's claims and outcomes alone."""
