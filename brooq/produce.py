"""The producer side: put jobs into the job table, alone or inside the caller's transaction.

Every function here takes a psycopg Connection or Cursor that the caller owns; nothing
is committed here. Queue.enqueue wraps these in a pooled connection and a transaction.
``enqueue`` and ``enqueue_many`` also take a Django connection or a SQLAlchemy Session or
Connection on psycopg 3, whose psycopg connection (and so transaction) they use.

Owns: the insert path (job_insert, job_insert_many, job_copy_*), the idempotency-key
lookups after a conflict, and the checks a job passes before any I/O.
Must never: commit, roll back or change the caller's connection (its row_factory
included: statements run on a cursor of their own), or read a job once inserted beyond
the ids; import Django or SQLAlchemy (an object is one of theirs only if its module is
already in ``sys.modules``, as brooq/payloads.py finds pydantic).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from psycopg.rows import class_row, scalar_row

from brooq.db import schema_missing
from brooq.errors import BrooqError, InvalidJob
from brooq.ids import uuid7, uuid7_many
from brooq.job import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_QUEUE, Job, check_payload_size
from brooq.sql import Q, Queries, queries

if TYPE_CHECKING:
    from brooq.handlers import Handler

Target = psycopg.Connection[Any] | psycopg.Cursor[Any]
AsyncTarget = psycopg.AsyncConnection[Any] | psycopg.AsyncCursor[Any]
# What brooq.enqueue and brooq.enqueue_many take: a Target, or a Django connection or a
# SQLAlchemy Session/Connection on psycopg 3 (told apart at run time: typed ``object`` so
# that a type checker accepts them without brooq naming the frameworks' types).
AnyTarget = Target | object

# A conflicting row can vanish between our INSERT and our SELECT (retention deleted it):
# then the INSERT is tried again. Two rounds are plenty; more means something is wrong.
_KEY_ROUNDS = 3


class _KeyedId(NamedTuple):
    """A row of job_get_ids_by_keys: the job already holding (topic, key)."""

    topic: str
    key: str | None  # never None here (the lookup joins on it), typed as Job.idempotency_key
    id: uuid.UUID


def check_job(job: object, max_payload_bytes: int, handlers: Handlers | None = None) -> Job:
    """``job`` if it can be enqueued, else the error that says why (before any I/O). With
    ``handlers`` (a Queue's), the payload of a typed topic must fit its handler's type:
    it is checked as the worker will read it (the JSON text), so a dataclass built with
    wrong types is caught too (PayloadMismatch names the field)."""
    if not isinstance(job, Job):
        raise TypeError(f"expected a brooq.Job, not {type(job).__name__}")
    check_payload_size(job.payload_json, max_payload_bytes)
    if handlers:
        handler = handlers.get(job.topic)
        if handler is not None and handler.codec is not None:
            handler.codec.decode(json.loads(job.payload_json))
    return job


def check_jobs(
    jobs: Iterable[object], max_payload_bytes: int, handlers: Handlers | None = None
) -> list[Job]:
    """``check_job`` for each job of a batch; the error names the job by its index in the
    batch ("job 3: payload is ..."), keeping its class."""
    checked: list[Job] = []
    for index, job in enumerate(jobs):
        try:
            checked.append(check_job(job, max_payload_bytes, handlers))
        except InvalidJob as exc:
            raise type(exc)(f"job {index}: {exc}") from None
        except TypeError as exc:
            raise TypeError(f"job {index}: {exc}") from None
    return checked


# A Queue's handlers by topic (their queue is where a job naming none goes); empty for
# brooq.enqueue, which knows no handlers.
Handlers = Mapping[str, "Handler"]
_NO_HANDLERS: Handlers = {}


def queue_of(job: Job, handlers: Handlers) -> str:
    """The queue a job goes to: its own, else its handler's, else "default"."""
    if job.queue:
        return job.queue
    handler = handlers.get(job.topic)
    return handler.queue if handler is not None else DEFAULT_QUEUE


def _params(job: Job, job_id: uuid.UUID, handlers: Handlers) -> dict[str, Any]:
    return {
        "id": job_id,
        "topic": job.topic,
        "payload": job.payload_json,
        "key": job.idempotency_key,
        "available_at": job.available_at,
        "queue": queue_of(job, handlers),
        "priority": job.priority,
    }


def _cursor(target: Target) -> psycopg.Cursor[Any]:
    """A new cursor on the caller's connection, so in the caller's transaction, that
    returns the id column itself (scalar_row: every statement here answers ids) whatever
    row_factory the caller chose (dict_row, class_row, ...) and whatever kind of cursor
    was passed (a server-side one cannot run an INSERT)."""
    conn = target if isinstance(target, psycopg.Connection) else target.connection
    return conn.cursor(row_factory=scalar_row)


_ACCEPTED = (
    "a psycopg Connection or Cursor, a Django connection or a SQLAlchemy "
    "Session/Connection (psycopg 3)"
)


def resolve_target(target: object, caller: str) -> Target:
    """The psycopg connection behind a framework object, so that the job joins the
    framework's transaction; a TypeError naming what is accepted otherwise. Called only
    once ``target`` is known not to be a psycopg Connection or Cursor."""
    if isinstance(target, psycopg.AsyncConnection | psycopg.AsyncCursor):
        raise TypeError(
            f"{caller} takes a psycopg Connection or Cursor, not an async one: "
            f"use {caller}_async for a {type(target).__name__}"
        )
    raw = _django_connection(target)
    if raw is not None:
        return _driver_checked(raw, caller, "a Django connection", "Django's psycopg 3 backend")
    raw = _sqlalchemy_connection(target)
    if raw is not None:
        return _driver_checked(
            raw, caller, "a SQLAlchemy connection", "the postgresql+psycopg:// dialect"
        )
    raise TypeError(f"{caller} takes {_ACCEPTED}, not {_type_name(target)}")


def _type_name(value: object) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def _driver_checked(raw: object, caller: str, what: str, needed: str) -> Target:
    if isinstance(raw, psycopg.Connection):
        return raw
    if isinstance(raw, psycopg.AsyncConnection):
        hint = f"an asyncio engine's (use {caller}_async on its psycopg AsyncConnection)"
    else:
        hint = f"{type(raw).__module__.split('.')[0]}'s {type(raw).__name__}"
    raise TypeError(f"{caller} takes {what} only on psycopg 3 ({needed}); this one is {hint}")


def _django_connection(target: object) -> object | None:
    """The DB-API connection of a Django connection wrapper (``django.db.connection``, a
    proxy to the default alias's wrapper, or ``connections[alias]``), else None. Opens it
    if need be: in Django's autocommit mode (outside ``atomic``) the job commits at once."""
    proxy = sys.modules.get("django.utils.connection")
    if proxy is None:  # imported by django.db, which every Django connection comes from
        return None
    if not isinstance(target, proxy.ConnectionProxy):
        base = sys.modules.get("django.db.backends.base.base")
        if base is None or not isinstance(target, base.BaseDatabaseWrapper):
            return None
    wrapper: Any = target
    wrapper.ensure_connection()
    wrapper.validate_no_broken_transaction()  # as Django's own cursors refuse to run then
    raw: object = wrapper.connection
    return raw


def _sqlalchemy_connection(target: object) -> object | None:
    """The driver connection of a SQLAlchemy Session (its transaction for the default
    bind, begun if need be) or Connection (a transaction begun if none is, as SQLAlchemy
    would on its next statement: else its commit() would not commit the job), else None."""
    orm = sys.modules.get("sqlalchemy.orm")
    engine = sys.modules.get("sqlalchemy.engine")
    if engine is None:
        return None
    conn: Any
    if orm is not None and isinstance(target, orm.Session | orm.scoped_session):
        conn = target.connection()
    elif isinstance(target, engine.Connection):
        conn = target
        if not conn.in_transaction():
            conn.begin()
    else:
        return None
    raw: object = conn.connection.driver_connection
    return raw


def _async_cursor(target: AsyncTarget) -> psycopg.AsyncCursor[Any]:
    conn = target if isinstance(target, psycopg.AsyncConnection) else target.connection
    return conn.cursor(row_factory=scalar_row)


def enqueue(
    target: AnyTarget,
    job: Job,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
) -> tuple[uuid.UUID, bool]:
    """Insert ``job`` in the caller's transaction; return (id, created).

    ``target`` is a psycopg Connection or Cursor, a Django connection (in ``atomic()``
    the job commits or rolls back with the model writes; outside it, in Django's
    autocommit mode, it is committed at once) or a SQLAlchemy Session or Connection on
    psycopg 3 (the job joins its transaction).

    ``created`` is False when a job with the same (topic, idempotency_key) already
    exists; the id is then that job's id. Rollback leaves no job; commit makes it
    visible to workers (and wakes them once per transaction).

    ``schema``: brooq's schema (QUEUE_SCHEMA of the masters); None: the ``job`` table the
    connection's search_path finds.
    """
    if not isinstance(target, (psycopg.Connection, psycopg.Cursor)):
        target = resolve_target(target, "brooq.enqueue")
    return insert_checked(target, check_job(job, max_payload_bytes), q=queries(schema))


def insert_checked(
    target: Target, job: Job, handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> tuple[uuid.UUID, bool]:
    """``enqueue`` for a job that check_job has passed."""
    try:
        with _cursor(target) as cur:
            for _ in range(_KEY_ROUNDS):
                inserted = cur.execute(q.job_insert, _params(job, uuid7(), handlers)).fetchone()
                if inserted is not None:
                    return inserted, True
                existing = cur.execute(
                    q.job_get_id_by_key, {"topic": job.topic, "key": job.idempotency_key}
                ).fetchone()
                if existing is not None:
                    return existing, False
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None
    raise BrooqError(
        f"could not enqueue {job.topic!r} with key {job.idempotency_key!r}: the conflicting "
        "job kept disappearing (is the caller's transaction REPEATABLE READ or SERIALIZABLE?)"
    )


async def enqueue_async(
    target: AsyncTarget,
    job: Job,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
) -> tuple[uuid.UUID, bool]:
    """``enqueue`` for a psycopg AsyncConnection or AsyncCursor, in the caller's transaction."""
    return await insert_checked_async(target, check_job(job, max_payload_bytes), q=queries(schema))


async def insert_checked_async(
    target: AsyncTarget, job: Job, handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> tuple[uuid.UUID, bool]:
    """``enqueue_async`` for a job that check_job has passed."""
    try:
        async with _async_cursor(target) as cur:
            for _ in range(_KEY_ROUNDS):
                await cur.execute(q.job_insert, _params(job, uuid7(), handlers))
                inserted = await cur.fetchone()
                if inserted is not None:
                    return inserted, True
                await cur.execute(
                    q.job_get_id_by_key, {"topic": job.topic, "key": job.idempotency_key}
                )
                existing = await cur.fetchone()
                if existing is not None:
                    return existing, False
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None
    raise BrooqError(
        f"could not enqueue {job.topic!r} with key {job.idempotency_key!r}: the conflicting "
        "job kept disappearing"
    )


def enqueue_many(
    target: AnyTarget,
    jobs: Sequence[Job],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
) -> list[tuple[uuid.UUID, bool]]:
    """Insert many jobs in the caller's transaction; [(id, created), ...] in the order given.

    A job whose key already exists (in the table, or earlier in the same batch) comes
    back with the existing id and created=False; those ids cost one more round trip.
    A refused job is named by its index in ``jobs`` ("job 3: ..."); nothing is inserted.
    ``target`` and ``schema`` are what ``enqueue`` takes.
    """
    if not isinstance(target, (psycopg.Connection, psycopg.Cursor)):
        target = resolve_target(target, "brooq.enqueue_many")
    return insert_many_checked(target, check_jobs(jobs, max_payload_bytes), q=queries(schema))


def insert_many_checked(
    target: Target, checked: list[Job], handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> list[tuple[uuid.UUID, bool]]:
    """``enqueue_many`` for jobs that check_job has passed."""
    if not checked:
        return []
    ids = uuid7_many(len(checked))
    try:
        with _cursor(target) as cur:
            if any(job.idempotency_key is not None for job in checked):
                return _insert_many(cur, checked, ids, handlers, q)
            return _copy_many(cur, checked, ids, handlers, q)
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None


async def enqueue_many_async(
    target: AsyncTarget,
    jobs: Sequence[Job],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
) -> list[tuple[uuid.UUID, bool]]:
    """``enqueue_many`` for a psycopg AsyncConnection or AsyncCursor."""
    return await insert_many_checked_async(
        target, check_jobs(jobs, max_payload_bytes), q=queries(schema)
    )


async def insert_many_checked_async(
    target: AsyncTarget, checked: list[Job], handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> list[tuple[uuid.UUID, bool]]:
    """``enqueue_many_async`` for jobs that check_job has passed."""
    if not checked:
        return []
    ids = uuid7_many(len(checked))
    try:
        async with _async_cursor(target) as cur:
            if any(job.idempotency_key is not None for job in checked):
                return await _insert_many_async(cur, checked, ids, handlers, q)
            return await _copy_many_async(cur, checked, ids, handlers, q)
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None


def _copy_rows(
    checked: list[Job], ids: list[uuid.UUID], handlers: Handlers
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The COPY rows of jobs without keys, ready ones and scheduled ones apart, so that
    "ready now" is the server's now(), never the client's clock."""
    ready: list[tuple[Any, ...]] = []
    scheduled: list[tuple[Any, ...]] = []
    for job_id, job in zip(ids, checked, strict=True):
        queue = queue_of(job, handlers)
        if job.available_at is None:
            ready.append((job_id, job.topic, job.payload_json, queue, job.priority))
        else:
            at = job.available_at
            scheduled.append((job_id, job.topic, job.payload_json, at, queue, job.priority))
    return ready, scheduled


def _copy_many(
    cur: psycopg.Cursor[Any],
    checked: list[Job],
    ids: list[uuid.UUID],
    handlers: Handlers,
    q: Queries,
) -> list[tuple[uuid.UUID, bool]]:
    """Jobs without keys cannot conflict: COPY them."""
    ready, scheduled = _copy_rows(checked, ids, handlers)
    for statement, rows in ((q.job_copy_ready, ready), (q.job_copy_scheduled, scheduled)):
        if rows:
            with cur.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)
    return [(job_id, True) for job_id in ids]


async def _copy_many_async(
    cur: psycopg.AsyncCursor[Any],
    checked: list[Job],
    ids: list[uuid.UUID],
    handlers: Handlers,
    q: Queries,
) -> list[tuple[uuid.UUID, bool]]:
    ready, scheduled = _copy_rows(checked, ids, handlers)
    for statement, rows in ((q.job_copy_ready, ready), (q.job_copy_scheduled, scheduled)):
        if rows:
            async with cur.copy(statement) as copy:
                for row in rows:
                    await copy.write_row(row)
    return [(job_id, True) for job_id in ids]


def _many_params(checked: list[Job], ids: list[uuid.UUID], handlers: Handlers) -> dict[str, Any]:
    return {
        "ids": ids,
        "topics": [j.topic for j in checked],
        "payloads": [j.payload_json for j in checked],
        "keys": [j.idempotency_key for j in checked],
        "available_ats": [j.available_at for j in checked],
        "queues": [queue_of(j, handlers) for j in checked],
        "priorities": [j.priority for j in checked],
    }


def _missing(
    checked: list[Job], ids: list[uuid.UUID], inserted: set[uuid.UUID]
) -> tuple[list[tuple[uuid.UUID, bool]], list[int], dict[str, Any]]:
    """After job_insert_many: (id, created) per job, the indexes of the jobs whose key
    was taken, and the job_get_ids_by_keys parameters that find the rows holding them."""
    result = [(job_id, job_id in inserted) for job_id in ids]
    missing = [i for i, (_, created) in enumerate(result) if not created]
    lookup = {
        "topics": [checked[i].topic for i in missing],
        "keys": [checked[i].idempotency_key for i in missing],
    }
    return result, missing, lookup


def _fill_existing(
    result: list[tuple[uuid.UUID, bool]],
    checked: list[Job],
    missing: list[int],
    rows: Iterable[_KeyedId],
) -> list[tuple[uuid.UUID, bool]]:
    existing = {(row.topic, row.key): row.id for row in rows}
    for i in missing:
        job = checked[i]
        found = existing.get((job.topic, job.idempotency_key))
        if found is None:
            raise BrooqError(
                f"job {i} ({job.topic!r}, key {job.idempotency_key!r}) conflicted "
                "with a row that has since disappeared; enqueue it again"
            )
        result[i] = (found, False)
    return result


def _insert_many(
    cur: psycopg.Cursor[Any],
    checked: list[Job],
    ids: list[uuid.UUID],
    handlers: Handlers,
    q: Queries,
) -> list[tuple[uuid.UUID, bool]]:
    cur.execute(q.job_insert_many, _many_params(checked, ids, handlers))
    inserted = set(cur.fetchall())  # the ids (scalar_row)
    result, missing, lookup = _missing(checked, ids, inserted)
    if not missing:
        return result
    with cur.connection.cursor(row_factory=class_row(_KeyedId)) as by_key:
        rows = by_key.execute(q.job_get_ids_by_keys, lookup).fetchall()
    return _fill_existing(result, checked, missing, rows)


async def _insert_many_async(
    cur: psycopg.AsyncCursor[Any],
    checked: list[Job],
    ids: list[uuid.UUID],
    handlers: Handlers,
    q: Queries,
) -> list[tuple[uuid.UUID, bool]]:
    await cur.execute(q.job_insert_many, _many_params(checked, ids, handlers))
    inserted = set(await cur.fetchall())
    result, missing, lookup = _missing(checked, ids, inserted)
    if not missing:
        return result
    async with cur.connection.cursor(row_factory=class_row(_KeyedId)) as by_key:
        await by_key.execute(q.job_get_ids_by_keys, lookup)
        rows = await by_key.fetchall()
    return _fill_existing(result, checked, missing, rows)
