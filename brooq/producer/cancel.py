"""``brooq.cancel`` and ``cancel_async``: a job canceled in the caller's transaction, so that
it is canceled exactly when the caller's own change commits (an order called off, and its
jobs with it), and not at all on a rollback.

The statement is job_cancel, the one Queue.cancel, the CLI, the page and the admin
endpoint send: a processing job's handler is interrupted with brooq.LeaseLost once the
transaction commits (its NOTIFY is delivered then), never before.

Owns: those two functions (the targets brooq.enqueue takes: psycopg, Django, SQLAlchemy).
Must never: commit, roll back or change the caller's connection (brooq.producer.targets).
"""

from __future__ import annotations

import uuid

import psycopg

from brooq.job import CANCELABLE_STATES, parse_job_id
from brooq.producer.targets import AnyTarget, AsyncTarget, async_cursor, cursor, resolve_target
from brooq.sql import queries

__all__ = ["cancel", "cancel_async"]


def _params(job_id: uuid.UUID | str) -> dict[str, object]:
    return {"id": parse_job_id(job_id), "from_states": list(CANCELABLE_STATES)}


def cancel(target: AnyTarget, job_id: uuid.UUID | str, *, schema: str | None = None) -> bool:
    """Cancel ``job_id`` in the caller's transaction (pending, failed, processing or
    waiting -> canceled; the jobs waiting on it follow at the same commit). False when the
    job is unknown or already finished. A running handler gets brooq.LeaseLost once the
    transaction commits; a rollback cancels nothing. InvalidJobId before any I/O."""
    params = _params(job_id)
    if not isinstance(target, psycopg.Connection | psycopg.Cursor):
        target = resolve_target(target, "brooq.cancel")
    return cursor(target).execute(queries(schema).job_cancel, params).fetchone() is not None


async def cancel_async(
    target: AsyncTarget, job_id: uuid.UUID | str, *, schema: str | None = None
) -> bool:
    """``cancel`` for a psycopg AsyncConnection or AsyncCursor."""
    params = _params(job_id)
    cur = async_cursor(target)
    await cur.execute(queries(schema).job_cancel, params)
    return await cur.fetchone() is not None
