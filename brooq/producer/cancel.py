"""``brooq.cancel``, ``brooq.hold``, ``brooq.release`` and their ``_async`` forms: a job
canceled, put on hold or released in the caller's transaction, so that the change holds
exactly when the caller's own change commits (an order called off, and its jobs with it;
a customer's jobs held while their account is reviewed), and not at all on a rollback.

The statements are job_cancel, job_hold and job_hold_release, the ones Queue, the CLI, the
page and the admin endpoint send: a processing job's handler is interrupted with
brooq.LeaseLost once the cancel commits (its NOTIFY is delivered then), never before; a
released job's masters are woken at the commit too.

Owns: those functions (the targets brooq.enqueue takes: psycopg, Django, SQLAlchemy).
Must never: commit, roll back or change the caller's connection (brooq.producer.targets).
"""

from __future__ import annotations

import uuid

import psycopg

from brooq.job import Transition, parse_job_id
from brooq.operator.changes import transition_params, transition_statement
from brooq.producer.targets import AnyTarget, AsyncTarget, async_cursor, cursor, resolve_target
from brooq.sql import queries

__all__ = ["cancel", "cancel_async", "hold", "hold_async", "release", "release_async"]


def _change(
    target: AnyTarget, action: Transition, job_id: uuid.UUID | str, schema: str | None
) -> bool:
    params = transition_params(action, parse_job_id(job_id))
    if not isinstance(target, psycopg.Connection | psycopg.Cursor):
        target = resolve_target(target, f"brooq.{action}")
    statement = transition_statement(action, queries(schema))
    return cursor(target).execute(statement, params).fetchone() is not None


async def _change_async(
    target: AsyncTarget, action: Transition, job_id: uuid.UUID | str, schema: str | None
) -> bool:
    params = transition_params(action, parse_job_id(job_id))
    cur = async_cursor(target)
    await cur.execute(transition_statement(action, queries(schema)), params)
    return await cur.fetchone() is not None


def cancel(target: AnyTarget, job_id: uuid.UUID | str, *, schema: str | None = None) -> bool:
    """Cancel ``job_id`` in the caller's transaction (pending, failed, processing, waiting
    or on_hold -> canceled; the jobs waiting on it follow at the same commit). False when
    the job is unknown or already finished. A running handler gets brooq.LeaseLost once
    the transaction commits; a rollback cancels nothing. InvalidJobId before any I/O."""
    return _change(target, "cancel", job_id, schema)


async def cancel_async(
    target: AsyncTarget, job_id: uuid.UUID | str, *, schema: str | None = None
) -> bool:
    """``cancel`` for a psycopg AsyncConnection or AsyncCursor."""
    return await _change_async(target, "cancel", job_id, schema)


def hold(target: AnyTarget, job_id: uuid.UUID | str, *, schema: str | None = None) -> bool:
    """Put ``job_id`` on hold in the caller's transaction (pending or failed -> on_hold:
    no worker claims it until released). False as Queue.hold answers False; a rollback
    holds nothing."""
    return _change(target, "hold", job_id, schema)


async def hold_async(
    target: AsyncTarget, job_id: uuid.UUID | str, *, schema: str | None = None
) -> bool:
    """``hold`` for a psycopg AsyncConnection or AsyncCursor."""
    return await _change_async(target, "hold", job_id, schema)


def release(target: AnyTarget, job_id: uuid.UUID | str, *, schema: str | None = None) -> bool:
    """Release held ``job_id`` in the caller's transaction (on_hold -> pending, its place
    in line kept). False when the job is unknown or not on hold."""
    return _change(target, "release", job_id, schema)


async def release_async(
    target: AsyncTarget, job_id: uuid.UUID | str, *, schema: str | None = None
) -> bool:
    """``release`` for a psycopg AsyncConnection or AsyncCursor."""
    return await _change_async(target, "release", job_id, schema)
