"""The application of tests/process/test_short_rates.py: one topic under a rate of a short
period, ``Rate(BROOQ_RATE_LIMIT, per=BROOQ_RATE_PERIOD seconds)``. Each handler writes its
job id and the time it started into the table stamp of the test database (created by the
test)."""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
_conn: psycopg.Connection[Any] | None = None  # this child's, opened at its first job
RATE = brooq.Rate(
    int(os.environ.get("BROOQ_RATE_LIMIT", "1")),
    per=float(os.environ.get("BROOQ_RATE_PERIOD", "0.1")),
)


@queue.handler("api.short", rate_limit=RATE)
def short(claim: brooq.Claim) -> None:
    global _conn
    started = time.time_ns()
    if _conn is None or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    _conn.execute("INSERT INTO stamp (job_id, started_ns) VALUES (%s, %s)", (claim.id, started))
