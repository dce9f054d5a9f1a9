"""The application of tests/process/test_rate_limits.py: a topic under a rate_limit, one
under a group_limit and one whose groups are taken in turn (fair_groups). Each handler
takes its start stamp first thing, runs, and then writes (topic, job id, start, end,
master pid) into the table stamp of the test database (created by the test), outside
the stamped span."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
_conn: psycopg.Connection[Any] | None = None  # this child's, opened at its first job


def record(claim: brooq.Claim, started: int) -> None:
    global _conn
    ended = time.time_ns()
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    _conn.execute(
        "INSERT INTO stamp (topic, job_id, started_ns, ended_ns, master) "
        "VALUES (%s, %s, %s, %s, %s)",
        (claim.topic, claim.id, started, ended, os.getppid()),
    )


@queue.handler("api.rated", rate_limit=os.environ.get("BROOQ_RATE", "20/s"))
def rated(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(float(os.environ.get("BROOQ_JOB_SLEEP", "0.01")))
    record(claim, started)


@queue.handler("tenant.work", group_limit=int(os.environ.get("BROOQ_GROUP_LIMIT", "1")))
def tenant_work(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(float(os.environ.get("BROOQ_JOB_SLEEP", "0.01")))
    record(claim, started)


# Groups taken in turn, no cap: one tenant's backlog never holds the others back.
@queue.handler("tenant.fair", fair_groups=True)
def tenant_fair(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(float(os.environ.get("BROOQ_JOB_SLEEP", "0.01")))
    record(claim, started)


# A rate per group (a tenant's plan may replace it: brooq limits set --rate).
@queue.handler("tenant.rated", group_rate_limit=os.environ.get("BROOQ_GROUP_RATE", "100/s"))
def tenant_rated(claim: brooq.Claim) -> None:
    started = time.time_ns()
    time.sleep(float(os.environ.get("BROOQ_JOB_SLEEP", "0.01")))
    record(claim, started)


@queue.handler("api.rated.async", rate_limit=os.environ.get("BROOQ_RATE", "20/s"))
async def rated_async(claim: brooq.Claim) -> None:
    started = time.time_ns()
    await asyncio.sleep(float(os.environ.get("BROOQ_JOB_SLEEP", "0.01")))
    record(claim, started)
