"""The application of tests/process/test_durable.py: a handler of five steps whose child
is SIGKILLed at random moments by the test. Each step body writes a row into
`step_body` (job, step, pid, whether its record existed already: never, if recorded steps
are not run again), the even steps inside the recording transaction (`ledger`: one row
per job and step, whatever the kills), and sleeps a little so that kills land inside
bodies, between a body and its record, and between steps. A sleeping handler for the
parks."""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import psycopg

import brooq

queue = brooq.Queue()
_conn: psycopg.Connection[Any] | None = None
_conn_pid = 0
STEPS = 5


def conn() -> psycopg.Connection[Any]:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid() or _conn.closed:
        _conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _conn_pid = os.getpid()
    return _conn


def body(job_id: Any, i: int, seed: int, db: psycopg.Connection[Any] | None = None) -> int:
    (db or conn()).execute(
        "INSERT INTO step_body (job_id, step, pid, recorded_before) "
        "SELECT %s, %s, %s, EXISTS (SELECT 1 FROM brooq_job_step "
        "                           WHERE job_id = %s AND name = %s)",
        (job_id, i, os.getpid(), job_id, f"s{i}"),
    )
    time.sleep(random.uniform(0.005, 0.04))
    if db is not None:
        db.execute("INSERT INTO ledger (job_id, step) VALUES (%s, %s)", (job_id, i))
    return seed * 10 + i


@queue.handler("durable.five", max_attempts=1000, backoff_base="1ms", backoff_max="5ms")
def five(claim: brooq.Claim) -> Any:
    seed = claim.payload["seed"]
    results = []
    for i in range(STEPS):
        if i % 2 == 0:
            value = claim.step(
                f"s{i}", lambda db, i=i: body(claim.id, i, seed, db), transaction=True
            )
        else:
            value = claim.step(f"s{i}", body, claim.id, i, seed)
        results.append(value)
        time.sleep(random.uniform(0, 0.02))
    return {"results": results, "sum": sum(results)}


@queue.handler("durable.sleep", max_attempts=1)
def sleeper(claim: brooq.Claim) -> Any:
    conn().execute(
        "INSERT INTO step_body (job_id, step, pid) VALUES (%s, -1, %s)", (claim.id, os.getpid())
    )
    claim.sleep(claim.payload["for"])
    return "woke"


@queue.handler("durable.event", max_attempts=3)
def waiter(claim: brooq.Claim) -> Any:
    conn().execute(
        "INSERT INTO step_body (job_id, step, pid) VALUES (%s, -2, %s)", (claim.id, os.getpid())
    )
    return claim.wait_event(claim.payload["key"])


@queue.handler("durable.parent", max_attempts=5)
def parent(claim: brooq.Claim) -> Any:
    conn().execute(
        "INSERT INTO step_body (job_id, step, pid) VALUES (%s, -3, %s)", (claim.id, os.getpid())
    )
    n = claim.payload["children"]
    gate = claim.payload.get("gate")
    ids = [claim.spawn(brooq.Job("durable.child", {"i": i, "gate": gate})) for i in range(n)]
    if claim.payload.get("die") and claim.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # after spawning: a later attempt resumes
    records = claim.wait_jobs(ids)
    return {"sum": sum(r.result for r in records), "states": sorted({r.state for r in records})}


@queue.handler("durable.child")
def child(claim: brooq.Claim) -> Any:
    if claim.payload.get("gate"):  # parked until the test opens the gate
        claim.wait_event(claim.payload["gate"])
    return claim.payload["i"]


@queue.handler("durable.async")
async def async_waiter(claim: brooq.Claim) -> Any:
    async def fetch() -> int:
        conn().execute(
            "INSERT INTO step_body (job_id, step, pid) VALUES (%s, -4, %s)",
            (claim.id, os.getpid()),
        )
        return 41

    a = await claim.step("fetch", fetch)
    await claim.sleep("1s")
    got = await claim.wait_event(claim.payload["key"])
    return [a + 1, got]
