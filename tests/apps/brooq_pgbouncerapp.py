"""The application of tests/pgbouncer/test_pgbouncer.py: a brooq-master whose DATABASE_URL is a
PgBouncer in transaction mode. Its handlers write through the pooler too (prepared
statements off, as an application behind PgBouncer 1.18 must), and a done job's
on_success hook records the transaction's synchronous_commit: brooq's session settings
reach the pooled transactions they are meant for.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
queue.periodic("tick", every="1s", job=brooq.Job("pgb.tick"))
_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0


def _record(claim: brooq.Claim, note: str) -> None:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=None)
        _conn_pid = os.getpid()
    _conn.execute(
        "INSERT INTO execution (job_id, pid, attempt, note) VALUES (%s, %s, %s, %s)",
        (claim.id, os.getpid(), claim.attempt, note),
    )


@queue.handler("pgb.ok")
def ok(claim: brooq.Claim) -> None:
    _record(claim, "ok")

    def hook(conn: psycopg.Connection[Any]) -> None:
        row = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
        conn.execute(
            "INSERT INTO side_effect (job_id, planner) VALUES (%s, %s)",
            (claim.id, row[0] if row else None),
        )

    claim.on_success(hook)


@queue.handler("pgb.flaky", max_attempts=5, backoff_base="50ms", backoff_max="100ms")
def flaky(claim: brooq.Claim) -> None:
    _record(claim, "flaky")
    if claim.attempt < 3:
        raise RuntimeError(f"attempt {claim.attempt} fails")


@queue.handler("pgb.doomed", max_attempts=2, backoff_base="50ms", backoff_max="100ms")
def doomed(claim: brooq.Claim) -> None:
    _record(claim, "doomed")
    raise RuntimeError("always")


@queue.handler("pgb.async")
async def in_an_async_child(claim: brooq.Claim) -> None:
    """Run by the async child (one of the three): its claims go through the pooler too."""


@queue.handler("pgb.tick")
def tick(claim: brooq.Claim) -> None:
    """The periodic schedule's job: its rows are what the test looks at."""
