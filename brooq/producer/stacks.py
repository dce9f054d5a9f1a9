"""The live Python stack of a running job, asked for through PostgreSQL from any host.

Owns the asking side of `brooq jobs stack ID` and `Queue.stack()`: on a connection of its
own (LISTEN needs one, and a pooled connection must not keep listening), LISTEN
brooq_stack_answer first, then insert a request and notify brooq_stack with the job id
(one statement, stack_request); the master whose child runs the job has the child write
the stack and answers the request row (brooq.supervisor.master); we take the row and
delete it. The request travels through the database, so the job may run on another host.

Must never wait longer than the timeout, or leave its request behind when it gives up
(the master's retention deletes what a killed command leaves, an hour later).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from brooq.db import CONNECT_TIMEOUT, schema_missing, unavailable
from brooq.dsn import CLIENT_ENCODING
from brooq.errors import JobNotFound, JobNotRunning, StackUnavailable
from brooq.sql import Queries, queries

__all__ = ["JobStack", "fetch_stack"]


@dataclass(frozen=True)
class JobStack:
    """A running job's stack: the worker (locked_by) that answered, and the text, a
    traceback as Python prints one (most recent call last)."""

    job_id: uuid.UUID
    worker: str
    text: str


def fetch_stack(
    dsn: str, job_id: uuid.UUID, timeout: float = 5.0, *, schema: str | None = None
) -> JobStack:
    q = queries(schema)
    try:
        conn = psycopg.connect(
            dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT, client_encoding=CLIENT_ENCODING
        )
    except psycopg.OperationalError as exc:
        raise unavailable(dsn, exc) from None
    try:
        with conn:
            return _ask(conn, job_id, timeout, q)
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None


def _ask(conn: psycopg.Connection[Any], job_id: uuid.UUID, timeout: float, q: Queries) -> JobStack:
    state = conn.execute(q.stack_job_state, {"id": job_id}).fetchone()
    if state is None:
        raise JobNotFound(f"no job with id {job_id}")
    if state[0] != "processing":
        raise JobNotRunning(f"job {job_id} is not running (state: {state[0]})")
    conn.execute(q.listen_stack_answers)  # before the request: no answer can be missed
    request = conn.execute(q.stack_request, {"job_id": job_id}).fetchone()
    assert request is not None
    request_id = int(request[0])
    deadline = time.monotonic() + timeout
    answered = False
    while not answered:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for notify in conn.notifies(timeout=left):
            # The answer names the job (a request id is only unique in one schema).
            if notify.payload == str(job_id):
                answered = True
                break
    taken = conn.execute(q.stack_take, {"id": request_id}).fetchone()
    if taken is None or taken[0] is None:
        raise StackUnavailable(
            f"no master answered for job {job_id} within {timeout:g}s (is its "
            "brooq-master running, and of a version that answers stack requests?)"
        )
    _, worker, text = taken
    if not text:
        raise StackUnavailable(f"job {job_id} ended while its stack was asked for")
    return JobStack(job_id, str(worker), str(text))
