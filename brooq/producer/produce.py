"""The producer side: put jobs into the job table, alone or inside the caller's transaction.

Every function here takes a connection or cursor that the caller owns (brooq.producer.targets says
which); nothing is committed here but a graph's transaction on a connection in autocommit
(brooq.producer.produce_drive). Queue wraps these in a pooled connection and a
transaction. The sync and the async forms share one logic: each insert is a generator
(``_insert_one``, ``_insert_many``) that yields the statements it needs run (a Step of
brooq.producer.produce_steps) and is sent their answers, driven by brooq.producer.produce_drive on a
psycopg Cursor or an AsyncCursor; the drivers only do I/O, and run a graph's steps (jobs
with after) in one transaction. A job with a unique_key, debounce or tags takes
brooq.producer.produce_options' steps; a plain job never does.

Owns: the insert path (job_insert, job_insert_many, job_copy_*, the COPY of tagged jobs),
the idempotency-key lookups after a conflict, and the checks a job passes before any I/O.
Must never: commit, roll back or change the caller's connection, or read a job once
inserted beyond the ids.
"""

from __future__ import annotations

import gc
import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from copy import copy as shallow_copy
from functools import partial
from typing import Any

import psycopg

from brooq.encoding import check_payload_size
from brooq.errors import BrooqError, InvalidJob
from brooq.job import DEFAULT_MAX_PAYLOAD_BYTES, Job
from brooq.producer.ids import uuid7, uuid7_many
from brooq.producer.produce_drive import drive, drive_async, drive_graph, drive_graph_async
from brooq.producer.produce_graph import insert_graph
from brooq.producer.produce_options import insert_with_options, key_holders, many_params
from brooq.producer.produce_steps import (
    KEY_ROUNDS,
    All,
    Copy,
    Handlers,
    One,
    Steps,
    copy_rows,
    queue_of,
)
from brooq.producer.targets import AnyTarget, AsyncTarget, Target, resolve_target
from brooq.sql import Q, Queries, queries
from brooq.tracing import publish, published, tracer


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


_NO_HANDLERS: Handlers = {}


# -- the public functions ------------------------------------------------------------------


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

    A job with ``after`` commits with its edges: on a connection in autocommit outside
    a transaction, in one transaction brooq opens (and runs again after a deadlock with
    the workers ending the jobs named); in the caller's, EnqueueDeadlock then.

    ``schema``: brooq's schema (QUEUE_SCHEMA of the masters); None: the ``job`` table the
    connection's search_path finds.
    """
    if not isinstance(target, (psycopg.Connection, psycopg.Cursor)):
        target = resolve_target(target, "brooq.enqueue")
    return insert_checked(target, check_job(job, max_payload_bytes), q=queries(schema))


async def enqueue_async(
    target: AsyncTarget,
    job: Job,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
) -> tuple[uuid.UUID, bool]:
    """``enqueue`` for a psycopg AsyncConnection or AsyncCursor, in the caller's transaction."""
    return await insert_checked_async(target, check_job(job, max_payload_bytes), q=queries(schema))


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


def insert_checked(
    target: Target, job: Job, handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> tuple[uuid.UUID, bool]:
    """``enqueue`` for a job that check_job has passed; under a producer span when a
    tracer provider is configured (brooq.tracing)."""
    found = tracer()
    if found is None:
        if job.after is None:
            return drive(target, _insert_one(job, handlers, q))
        return drive_graph(target, lambda: _insert_one(job, handlers, q))
    with publish(found, [job.topic], queue_of(job, handlers)) as (span, parent):
        done = drive_graph(target, lambda: _insert_one(job, handlers, q, parent))
        published(span, [done])
        return done


async def insert_checked_async(
    target: AsyncTarget, job: Job, handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> tuple[uuid.UUID, bool]:
    """``enqueue_async`` for a job that check_job has passed."""
    found = tracer()
    if found is None:
        if job.after is None:
            return await drive_async(target, _insert_one(job, handlers, q))
        return await drive_graph_async(target, lambda: _insert_one(job, handlers, q))
    with publish(found, [job.topic], queue_of(job, handlers)) as (span, parent):
        done = await drive_graph_async(target, lambda: _insert_one(job, handlers, q, parent))
        published(span, [done])
        return done


def insert_many_checked(
    target: Target, checked: list[Job], handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> list[tuple[uuid.UUID, bool]]:
    """``enqueue_many`` for jobs that check_job has passed."""
    if not checked:
        return []
    found = tracer()
    with _collector_paused(len(checked)):
        if found is None:
            if not _graph(checked):
                return drive(target, _insert_batch(checked, handlers, q))
            return drive_graph(target, lambda: _insert_many(checked, handlers, q))
        with publish(found, [j.topic for j in checked]) as (span, parent):
            done = drive_graph(target, lambda: _insert_many(checked, handlers, q, parent))
            published(span, done)
            return done


async def insert_many_checked_async(
    target: AsyncTarget, checked: list[Job], handlers: Handlers = _NO_HANDLERS, *, q: Queries = Q
) -> list[tuple[uuid.UUID, bool]]:
    """``enqueue_many_async`` for jobs that check_job has passed."""
    if not checked:
        return []
    found = tracer()
    with _collector_paused(len(checked)):
        if found is None:
            if not _graph(checked):
                return await drive_async(target, _insert_batch(checked, handlers, q))
            return await drive_graph_async(target, lambda: _insert_many(checked, handlers, q))
        with publish(found, [j.topic for j in checked]) as (span, parent):
            done = await drive_graph_async(
                target, lambda: _insert_many(checked, handlers, q, parent)
            )
            published(span, done)
            return done


def _graph(checked: list[Job]) -> bool:
    """Whether a batch holds a job with after: its rows and edges then commit together
    (brooq.producer.produce_drive.drive_graph), in a transaction of brooq's own if need be."""
    return any(job.after is not None for job in checked)


# A batch this big sets off the cyclic collector's full collections (each walks every
# object of the program, the caller's Jobs too), for cycles a batch never makes: 100,000
# jobs met 4, 40 % of the producer's CPU. Paused for the call; only its pauser resumes it.
_PAUSE_COLLECTOR_FROM = 1_000


@contextmanager
def _collector_paused(size: int) -> Iterator[None]:
    if size < _PAUSE_COLLECTOR_FROM or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# -- the inserts, without I/O ----------------------------------------------------------------


def _insert_one(
    job: Job, handlers: Handlers, q: Queries, traceparent: str | None = None
) -> Steps[tuple[uuid.UUID, bool]]:
    """One job: INSERT; on a key conflict, the id of the job holding the key (tried again
    if that job vanished meanwhile). A job with a unique_key, debounce or tags, or a
    ``traceparent`` to store (brooq.tracing), takes brooq.producer.produce_options' steps instead;
    a job with after, brooq.producer.produce_graph's."""
    if job.after is not None:
        return (yield from _insert_many([job], handlers, q, traceparent))[0]
    if job.unique_key is not None or job.tags is not None or traceparent is not None:
        params = _params(job, uuid7(), handlers)
        if traceparent is not None:
            params["traceparent"] = traceparent
        return (yield from insert_with_options(job, params, q))
    for _ in range(KEY_ROUNDS):
        inserted = yield One(q.job_insert, _params(job, uuid7(), handlers))
        if inserted is not None:
            return inserted, True
        existing = yield One(q.job_get_id_by_key, {"topic": job.topic, "key": job.idempotency_key})
        if existing is not None:
            return existing, False
    raise BrooqError(
        f"could not enqueue {job.topic!r} with key {job.idempotency_key!r}: the conflicting "
        "job kept disappearing (is the caller's transaction REPEATABLE READ or SERIALIZABLE?)"
    )


def _insert_many(
    checked: list[Job], handlers: Handlers, q: Queries, traceparent: str | None = None
) -> Steps[list[tuple[uuid.UUID, bool]]]:
    """Jobs without keys cannot conflict: COPY them (with their tags, if any has some).
    With keys, one INSERT, then one lookup of the jobs holding the keys that were taken.
    A batch holding a debounced job goes job by job, in order (brooq.producer.produce_options); a
    batch holding a job with after is inserted so, then its edges (brooq.producer.produce_graph).
    A batch with a ``traceparent`` takes the INSERT of job_insert_many_options_traced."""
    if _graph(checked):
        batch = partial(_insert_batch, handlers=handlers, q=q, traceparent=traceparent)
        return (yield from insert_graph(checked, batch, q))
    return (yield from _insert_batch(checked, handlers, q, traceparent))


def _insert_batch(
    checked: list[Job], handlers: Handlers, q: Queries, traceparent: str | None = None
) -> Steps[list[tuple[uuid.UUID, bool]]]:
    """``_insert_many`` without the edges."""
    if any(job.debounce is not None for job in checked):
        results = []
        for job in checked:
            one = job if job.after is None else _without_after(job)
            results.append((yield from _insert_one(one, handlers, q, traceparent)))
        return results
    ids = uuid7_many(len(checked))
    if traceparent is None and all(
        job.idempotency_key is None and job.unique_key is None for job in checked
    ):
        wide = any(job.tags is not None or job.group is not None for job in checked)
        ready, scheduled = copy_rows(checked, ids, handlers, wide)
        if ready:
            yield Copy(q.job_copy_ready_options if wide else q.job_copy_ready, ready)
        if scheduled:
            yield Copy(q.job_copy_scheduled_options if wide else q.job_copy_scheduled, scheduled)
        return [(job_id, True) for job_id in ids]
    params = _many_params(checked, ids, handlers)
    if traceparent is not None:
        traced = {**many_params(params, checked), "traceparents": [traceparent] * len(ids)}
        inserted = set((yield All(q.job_insert_many_options_traced, traced)))
    elif all(job.unique_key is None and job.tags is None for job in checked):
        inserted = set((yield All(q.job_insert_many, params)))
    else:
        inserted = set((yield All(q.job_insert_many_options, many_params(params, checked))))
    result = [(job_id, job_id in inserted) for job_id in ids]
    missing = [i for i, (_, created) in enumerate(result) if not created]
    if not missing:
        return result
    found = yield from key_holders(checked, missing, q)
    for i in missing:
        job, holder = checked[i], found[i]
        if holder is None:
            key = job.idempotency_key if job.idempotency_key is not None else job.unique_key
            raise BrooqError(
                f"job {i} ({job.topic!r}, key {key!r}) conflicted "
                "with a row that has since disappeared; enqueue it again"
            )
        result[i] = (holder, False)
    return result


def _without_after(job: Job) -> Job:
    """``job`` as _insert_one inserts it inside a graph: its edges come after the batch."""
    plain = shallow_copy(job)
    plain.after = None
    return plain


def _params(job: Job, job_id: uuid.UUID, handlers: Handlers) -> dict[str, Any]:
    return {
        "id": job_id,
        "topic": job.topic,
        "payload": job.payload_json,
        "key": job.idempotency_key,
        "available_at": job.available_at,
        "queue": queue_of(job, handlers),
        "priority": job.priority,
        "group": job.group,
    }


def _many_params(checked: list[Job], ids: list[uuid.UUID], handlers: Handlers) -> dict[str, Any]:
    return {
        "ids": ids,
        "topics": [j.topic for j in checked],
        "payloads": [j.payload_json for j in checked],
        "keys": [j.idempotency_key for j in checked],
        "available_ats": [j.available_at for j in checked],
        "queues": [queue_of(j, handlers) for j in checked],
        "priorities": [j.priority for j in checked],
        "groups": [j.group for j in checked],
    }
