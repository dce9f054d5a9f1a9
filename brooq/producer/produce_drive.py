"""The drivers of brooq.producer.produce's insert generators: the I/O, and nothing else but the
transaction a graph needs.

``drive`` runs the steps on a cursor of the caller's connection (``drive_async`` on an
AsyncCursor). ``drive_graph`` (and ``drive_graph_async``) runs the steps of a batch
holding jobs with ``after``, whose rows and edges must commit together: nothing may see
a job of the graph before its edges, or a child would claim it as the plain pending row
it is between its INSERT and brooq_job_after. On a connection in autocommit outside a
transaction (a Queue's pooled one, a caller's, Django's outside ``atomic``) each
statement would be its own transaction, so brooq opens one around the steps: it owns
that transaction, and runs it again, whole, when PostgreSQL breaks a deadlock with a
child writing the outcomes of the jobs named (brooq_job_after locks them in id order,
a batched done in its own), at most DEADLOCK_ROUNDS times. In the caller's transaction
nothing is retried: the deadlock is EnqueueDeadlock, for the caller to roll back and
run again. An upstream job deleted while the graph was written (brooq_job_after's
foreign_key_violation) is InvalidAfter, nothing of the graph committed.

Owns: running steps on a cursor, the graph's transaction and its retries, and brooq's
errors for what the graph's statements raise.
Must never: commit or roll back a transaction it did not open, or retry one it does not
own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import class_row

from brooq.db import read_only, schema_missing
from brooq.errors import EnqueueDeadlock, InvalidAfter
from brooq.producer.produce_steps import Copy, Keyed, KeyedId, One, R, Steps
from brooq.producer.targets import AsyncTarget, Target, async_cursor, cursor

# A graph's transaction, run again after a deadlock: each round found workers ending
# the jobs it names at that moment; the next one waits for them instead.
DEADLOCK_ROUNDS = 3

_IDLE = TransactionStatus.IDLE
# brooq_job_after's message for an id that is no job (migration 0013).
_NO_JOB = "after names job "


def drive(target: Target, steps: Steps[R]) -> R:
    """Run ``steps`` on a cursor of the caller's connection."""
    try:
        with cursor(target) as cur:
            answer: Any = None
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration as done:
                    result: R = done.value
                    return result
                if isinstance(step, One):  # first: a single enqueue's only kind
                    answer = cur.execute(step.statement, step.params).fetchone()
                elif isinstance(step, Copy):
                    with cur.copy(step.statement) as copy:
                        if isinstance(step.rows, str):
                            copy.write(step.rows)
                        else:
                            for row in step.rows:
                                copy.write_row(row)
                    answer = None
                elif isinstance(step, Keyed):
                    with cur.connection.cursor(row_factory=class_row(KeyedId)) as by_key:
                        answer = by_key.execute(step.statement, step.params).fetchall()
                else:
                    answer = cur.execute(step.statement, step.params).fetchall()
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None
    except psycopg.errors.ReadOnlySqlTransaction:  # a standby: say which, and what to do
        conn = target if isinstance(target, psycopg.Connection) else target.connection
        raise read_only(conn) from None


async def drive_async(target: AsyncTarget, steps: Steps[R]) -> R:
    """``drive`` on an AsyncCursor: the same steps, awaited."""
    try:
        async with async_cursor(target) as cur:
            answer: Any = None
            while True:
                try:
                    step = steps.send(answer)
                except StopIteration as done:
                    result: R = done.value
                    return result
                if isinstance(step, One):
                    await cur.execute(step.statement, step.params)
                    answer = await cur.fetchone()
                elif isinstance(step, Copy):
                    async with cur.copy(step.statement) as copy:
                        if isinstance(step.rows, str):
                            await copy.write(step.rows)
                        else:
                            for row in step.rows:
                                await copy.write_row(row)
                    answer = None
                elif isinstance(step, Keyed):
                    async with cur.connection.cursor(row_factory=class_row(KeyedId)) as by_key:
                        await by_key.execute(step.statement, step.params)
                        answer = await by_key.fetchall()
                else:
                    await cur.execute(step.statement, step.params)
                    answer = await cur.fetchall()
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None
    except psycopg.errors.ReadOnlySqlTransaction:
        conn = target if isinstance(target, psycopg.AsyncConnection) else target.connection
        raise read_only(conn) from None


def drive_graph(target: Target, make: Callable[[], Steps[R]]) -> R:
    """The steps ``make()`` returns, in one transaction: brooq's own (retried after a
    deadlock) when the connection is in autocommit outside a transaction, else the
    caller's."""
    conn = target if isinstance(target, psycopg.Connection) else target.connection
    owned = conn.autocommit and conn.info.transaction_status == _IDLE
    for round_ in range(1, DEADLOCK_ROUNDS + 1):
        try:
            if not owned:
                return drive(target, make())
            with conn.transaction():
                return drive(target, make())
        except psycopg.errors.DeadlockDetected as exc:
            if owned and round_ < DEADLOCK_ROUNDS:
                continue
            raise _deadlocked(owned) from exc
        except psycopg.errors.ForeignKeyViolation as exc:
            if (gone := _upstream_gone(exc, owned)) is None:
                raise
            raise gone from exc
    raise AssertionError("unreachable")  # pragma: no cover


async def drive_graph_async(target: AsyncTarget, make: Callable[[], Steps[R]]) -> R:
    """``drive_graph`` on an AsyncConnection or AsyncCursor."""
    conn = target if isinstance(target, psycopg.AsyncConnection) else target.connection
    owned = conn.autocommit and conn.info.transaction_status == _IDLE
    for round_ in range(1, DEADLOCK_ROUNDS + 1):
        try:
            if not owned:
                return await drive_async(target, make())
            async with conn.transaction():
                return await drive_async(target, make())
        except psycopg.errors.DeadlockDetected as exc:
            if owned and round_ < DEADLOCK_ROUNDS:
                continue
            raise _deadlocked(owned) from exc
        except psycopg.errors.ForeignKeyViolation as exc:
            if (gone := _upstream_gone(exc, owned)) is None:
                raise
            raise gone from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _deadlocked(owned: bool) -> EnqueueDeadlock:
    if owned:
        return EnqueueDeadlock(
            "could not enqueue the jobs with after: each of "
            f"{DEADLOCK_ROUNDS} tries deadlocked with workers writing the outcomes of "
            "the jobs they name (nothing was written); enqueue them again"
        )
    return EnqueueDeadlock(
        "could not enqueue the jobs with after: the caller's transaction deadlocked with "
        "workers writing the outcomes of the jobs they name, and is aborted: roll it back "
        "and run it again"
    )


def _upstream_gone(exc: psycopg.errors.ForeignKeyViolation, owned: bool) -> InvalidAfter | None:
    """InvalidAfter for brooq_job_after's refusal of an id that is no job; None for any
    other foreign key's violation (raised as it is)."""
    message = exc.diag.message_primary or ""
    if not message.startswith(_NO_JOB):
        return None
    if owned:
        return InvalidAfter(f"{message} (deleted meanwhile); nothing was written")
    return InvalidAfter(
        f"{message} (deleted meanwhile); the caller's transaction is aborted: roll it back"
    )
