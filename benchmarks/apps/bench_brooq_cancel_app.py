"""brooq application of benchmarks/cancel_cost.py: a handler that loops in pure Python
until it is interrupted, and writes when it started and when it heard brooq.LeaseLost
(wall clock, this host) into bench_cancel."""

from __future__ import annotations

import os
import time

import brooq
import psycopg

queue = brooq.Queue()


def _note(job: str, kind: str) -> None:
    with psycopg.connect(os.environ["BENCH_DSN"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO bench_cancel (job, kind, t) VALUES (%s, %s, %s)", (job, kind, time.time())
        )


@queue.handler("bench.spin", attempt_timeout="120s", max_execution_timeout="300s")
def spin(claim: brooq.Claim) -> None:
    _note(str(claim.id), "start")
    n = 0
    try:
        while True:
            n += 1
    except brooq.LeaseLost:
        _note(str(claim.id), "lost")
        raise
