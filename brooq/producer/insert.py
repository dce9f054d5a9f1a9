"""One job's path into the job table, from the public call to the row: enqueue one or
many (COPY), in the caller's transaction or not.

Read top to bottom: the public functions and the checks a job passes before any I/O; the
steps an insert asks its driver to run; one job's insert; a batch's (COPY, or one INSERT
when keys are given); a batch given as an iterator (checked and sent into one COPY a
block at a time); the steps of a job with a unique_key, debounce or tags; the steps of
a batch holding jobs with ``after`` (a graph); last, the drivers that run the steps on a
psycopg cursor, and the transaction a graph needs. ``Queue.enqueue``'s plain job takes
only ``check_job`` and ``queue_of`` from here: brooq.producer.line sends it (and this
path, when the line is busy or the job's key is taken).

The sync and the async forms share one logic: each insert is a generator (``_insert_one``,
``_insert_many``) that yields the statements it needs run (a Step) and is sent their
answers; the drivers (``drive``, ``drive_async``) only do the I/O. Every function takes a
connection or cursor that the caller owns (brooq.producer.targets says which); nothing is
committed here but a graph's transaction on a connection in autocommit.

Owns: the insert path (job_insert, job_insert_many, job_copy_*, the COPY of tagged jobs,
the options' and the graph's statements), the key lookups after a conflict (in
brooq_job_key: a key is its job's while the job lives, finished or not), the checks a
job passes before any I/O, a graph's transaction and its retries, and brooq's errors for
what the graph's statements and the key's trigger raise.
Must never: commit, roll back or change the caller's connection, nor retry a transaction
it did not open; read a job once inserted beyond the ids; write edges for a job that was
not created (an idempotency key's earlier job keeps its own); send a plain job through
the options' steps. The steps do no I/O: the drivers do.
"""

from __future__ import annotations

import gc
import json
import uuid
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from copy import copy as shallow_copy
from datetime import datetime, timezone
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import class_row

from brooq.db import read_only, schema_missing
from brooq.encoding import check_payload_size
from brooq.errors import BrooqError, EnqueueDeadlock, InvalidAfter, InvalidJob
from brooq.job import DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_QUEUE, ON_HOLD, PENDING, Job
from brooq.job_options import check_after
from brooq.producer.ids import uuid7, uuid7_many
from brooq.producer.targets import (
    AnyTarget,
    AsyncTarget,
    Target,
    async_cursor,
    cursor,
    resolve_target,
)
from brooq.sql import Q, Queries, queries
from brooq.tracing import publish, published, tracer

if TYPE_CHECKING:
    from typing_extensions import LiteralString

    from brooq.declare.handlers import Handler
    from brooq.declare.registry import Registry

R = TypeVar("R")

# A Queue's handlers by topic (their queue is where a job naming none goes); empty for
# brooq.enqueue without app=.
Handlers = Mapping[str, "Handler"]
_NO_HANDLERS: Handlers = {}


# -- the public functions ------------------------------------------------------------------


def enqueue(
    target: AnyTarget,
    job: Job,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
    app: Registry | None = None,
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

    ``app``: the application's brooq.Queue, whose handlers this enqueue then knows as
    ``queue.enqueue`` does: its ``include=`` modules imported, a typed topic's payload
    checked, a job naming no queue put in its handler's, and with
    ``strict_topics=True`` a topic no handler declares refused (InvalidTopic). Without
    it, none of these.
    """
    if not isinstance(target, (psycopg.Connection, psycopg.Cursor)):
        target = resolve_target(target, "brooq.enqueue")
    handlers = _known(app)
    checked = check_job(job, max_payload_bytes, handlers)
    _strict(app, [checked])
    return insert_checked(target, checked, handlers, q=queries(schema))


def _known(app: Registry | None) -> Handlers:
    """``app``'s handlers for brooq.enqueue and its kin (its include= imported first),
    or none without an app."""
    if app is None:
        return _NO_HANDLERS
    app.load_includes()
    return app.handlers


def _strict(app: Registry | None, checked: Sequence[Job], batch: bool = False) -> None:
    """With ``app``'s strict_topics: InvalidTopic for a topic none of its handlers declares."""
    if app is not None and app.strict_topics:
        app.require_topics([job.topic for job in checked], batch=batch)


async def enqueue_async(
    target: AsyncTarget,
    job: Job,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
    app: Registry | None = None,
) -> tuple[uuid.UUID, bool]:
    """``enqueue`` for a psycopg AsyncConnection or AsyncCursor, in the caller's transaction."""
    handlers = _known(app)
    checked = check_job(job, max_payload_bytes, handlers)
    _strict(app, [checked])
    return await insert_checked_async(target, checked, handlers, q=queries(schema))


def enqueue_many(
    target: AnyTarget,
    jobs: Iterable[Job],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
    app: Registry | None = None,
) -> list[tuple[uuid.UUID, bool]]:
    """Insert many jobs in the caller's transaction; [(id, created), ...] in the order given.

    A job whose key already exists (in the table, or earlier in the same batch) comes
    back with the existing id and created=False; those ids cost one more round trip.
    A refused job is named by its index in ``jobs`` ("job 3: ..."); nothing is inserted.
    ``jobs`` may be any iterable: here it is read whole and checked before anything is
    sent, so that a refused job leaves your transaction usable (Queue.enqueue_many
    streams an iterator instead, in a transaction of its own). ``target``, ``schema``
    and ``app`` are what ``enqueue`` takes.
    """
    if not isinstance(target, (psycopg.Connection, psycopg.Cursor)):
        target = resolve_target(target, "brooq.enqueue_many")
    handlers = _known(app)
    checked = check_jobs(jobs, max_payload_bytes, handlers)
    _strict(app, checked, batch=True)
    return insert_many_checked(target, checked, handlers, q=queries(schema))


async def enqueue_many_async(
    target: AsyncTarget,
    jobs: Iterable[Job],
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schema: str | None = None,
    app: Registry | None = None,
) -> list[tuple[uuid.UUID, bool]]:
    """``enqueue_many`` for a psycopg AsyncConnection or AsyncCursor."""
    handlers = _known(app)
    checked = check_jobs(jobs, max_payload_bytes, handlers)
    _strict(app, checked, batch=True)
    return await insert_many_checked_async(target, checked, handlers, q=queries(schema))


def check_job(job: object, max_payload_bytes: int, handlers: Handlers | None = None) -> Job:
    """``job`` if it can be enqueued, else the error that says why (before any I/O). With
    ``handlers`` (a Queue's), the payload of a typed topic must fit its handler's type:
    it is checked as the worker will read it (the JSON text), so a dataclass built with
    wrong types is caught too (PayloadMismatch names the field)."""
    if not isinstance(job, Job):
        raise TypeError(f"expected a brooq.Job, not {type(job).__name__}")
    if len(job.payload_json) > max_payload_bytes // 4:  # check_payload_size's first test
        check_payload_size(job.payload_json, max_payload_bytes)
    if handlers:
        handler = handlers.get(job.topic)
        if handler is not None and handler.codec is not None:
            handler.codec.decode(json.loads(job.payload_json))
    return job


def check_jobs(
    jobs: Iterable[object],
    max_payload_bytes: int,
    handlers: Handlers | None = None,
    start: int = 0,
) -> list[Job]:
    """``check_job`` for each job of a batch; the error names the job by its index in the
    batch ("job 3: payload is ..."), keeping its class; ``start``: the index of the
    first (a block of a streamed batch)."""
    checked: list[Job] = []
    for index, job in enumerate(jobs, start):
        try:
            checked.append(check_job(job, max_payload_bytes, handlers))
        except InvalidJob as exc:
            raise type(exc)(f"job {index}: {exc}") from None
        except TypeError as exc:
            raise TypeError(f"job {index}: {exc}") from None
    return checked


# -- what Queue calls: checked jobs, traced or not, to their driver -------------------------


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
    (``drive_graph``), in a transaction of brooq's own if need be."""
    return any(job.after is not None for job in checked)


# A batch this big sets off the cyclic collector's full collections (each walks every
# object of the program, the caller's Jobs too), for cycles a batch never makes. Paused
# for the call; only its pauser resumes it.
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


# -- the steps an insert yields, and the rows they answer ----------------------------------


class One(NamedTuple):
    """Execute; the first row's id, None without a row."""

    statement: LiteralString
    params: dict[str, Any]


class All(NamedTuple):
    """Execute; every row's id."""

    statement: LiteralString
    params: dict[str, Any]


class Keyed(NamedTuple):
    """Execute; every row as a KeyedId."""

    statement: LiteralString
    params: dict[str, Any]


class KeyedId(NamedTuple):
    """A row of job_get_ids_by_keys (or _by_unique_keys): the job holding (topic, key)."""

    topic: str
    key: str | None  # never None here (the lookup joins on it), typed as Job's keys
    id: uuid.UUID


class Copy(NamedTuple):
    """COPY these rows, or these blocks of text already in COPY's text format (each
    written as it is made: the server reads the first while the next is formatted);
    nothing is sent back."""

    statement: LiteralString
    rows: list[tuple[Any, ...]] | Iterable[str]


Step = One | All | Keyed | Copy
Steps = Generator[Step, Any, R]


def queue_of(job: Job, handlers: Handlers) -> str:
    """The queue a job goes to: its own, else its handler's, else "default"."""
    if job.queue:
        return job.queue
    handler = handlers.get(job.topic)
    return handler.queue if handler is not None else DEFAULT_QUEUE


# -- one job --------------------------------------------------------------------------------

# A conflicting row can vanish between our INSERT and our SELECT (retention deleted it,
# or the active job holding a unique_key ended): then the INSERT is tried again. Two
# rounds are plenty; more means something is wrong.
KEY_ROUNDS = 3
# Rows of a bulk enqueue's COPY text made and written at a time (about 40 kB of small
# jobs): the server inserts a block while the next is formatted.
COPY_BLOCK = 1_000


class KeyTaken(Exception):
    """Thrown into an insert's steps by its driver: the statement inserted a key that
    brooq_job_key gave to another job meanwhile (job_key_taken's unique_violation: that
    job was enqueued after the statement began and ended before its row was written), on
    a connection in autocommit, so nothing was written. The steps look the key up (or run
    their statement again) as after a conflict."""


def _insert_one(
    job: Job, handlers: Handlers, q: Queries, traceparent: str | None = None
) -> Steps[tuple[uuid.UUID, bool]]:
    """One job: INSERT; on a key conflict, the id of the job holding the key (tried again
    if that job vanished meanwhile). A job with a unique_key, debounce or tags, or a
    ``traceparent`` to store (brooq.tracing), takes ``_insert_with_options`` instead; a
    job with after, the graph's steps (``_insert_many``)."""
    if job.after is not None:
        return (yield from _insert_many([job], handlers, q, traceparent))[0]
    if (
        job.unique_key is not None
        or job.tags is not None
        or job.held
        or job.ordering_key is not None
        or traceparent is not None
    ):
        params = _params(job, uuid7(), handlers)
        if traceparent is not None:
            params["traceparent"] = traceparent
        return (yield from _insert_with_options(job, params, q))
    for _ in range(KEY_ROUNDS):
        try:
            inserted = yield One(q.job_insert, _params(job, uuid7(), handlers))
        except KeyTaken:
            inserted = None
        if inserted is not None:
            return inserted, True
        existing = yield One(q.job_get_id_by_key, {"topic": job.topic, "key": job.idempotency_key})
        if existing is not None:
            return existing, False
    raise BrooqError(
        f"could not enqueue {job.topic!r} with key {job.idempotency_key!r}: the conflicting "
        "job kept disappearing (is the caller's transaction REPEATABLE READ or SERIALIZABLE?)"
    )


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


# -- a batch --------------------------------------------------------------------------------


def _insert_many(
    checked: list[Job], handlers: Handlers, q: Queries, traceparent: str | None = None
) -> Steps[list[tuple[uuid.UUID, bool]]]:
    """Jobs without keys cannot conflict: COPY them (with their tags, if any has some).
    With keys, one INSERT, then one lookup of the jobs holding the keys that were taken.
    A batch holding a debounced job goes job by job, in order (``_insert_one``); a batch
    holding a job with after is inserted so, then its edges (``_insert_graph``). A batch
    with a ``traceparent`` takes the INSERT of job_insert_many_options_traced."""
    if _graph(checked):
        batch = partial(_insert_batch, handlers=handlers, q=q, traceparent=traceparent)
        return (yield from _insert_graph(checked, batch, q))
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
    if traceparent is None and all(
        job.idempotency_key is None and job.unique_key is None for job in checked
    ):
        wide = any(
            job.tags is not None
            or job.group is not None
            or job.held
            or job.ordering_key is not None
            for job in checked
        )
        made: list[uuid.UUID] = []  # filled by copy_rows, by the time the COPY ends
        ready, scheduled = copy_rows(checked, made, handlers, wide)
        if ready:
            yield Copy(q.job_copy_ready_options if wide else q.job_copy_ready, ready)
        if scheduled:
            yield Copy(q.job_copy_scheduled_options if wide else q.job_copy_scheduled, scheduled)
        return [(job_id, True) for job_id in made]
    ids = uuid7_many(len(checked))
    params = _many_params(checked, ids, handlers)
    if traceparent is not None:
        statement: LiteralString = q.job_insert_many_options_traced
        params = {**_with_options(params, checked), "traceparents": [traceparent] * len(ids)}
    elif all(
        job.unique_key is None and job.tags is None and not job.held and job.ordering_key is None
        for job in checked
    ):
        statement = q.job_insert_many
    else:
        statement = q.job_insert_many_options
        params = _with_options(params, checked)
    for round_ in range(1, KEY_ROUNDS + 1):
        try:
            inserted = set((yield All(statement, params)))
            break
        except KeyTaken:  # nothing written: the statement again sees the key taken
            if round_ == KEY_ROUNDS:
                raise BrooqError(
                    "could not enqueue the batch: the jobs holding its keys kept being "
                    "enqueued and ending while it was written; enqueue it again"
                ) from None
    result = [(job_id, job_id in inserted) for job_id in ids]
    missing = [i for i, (_, created) in enumerate(result) if not created]
    if not missing:
        return result
    found = yield from _key_holders(checked, missing, q)
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


def copy_rows(
    checked: list[Job], ids: list[uuid.UUID], handlers: Handlers, wide: bool = False
) -> tuple[list[tuple[Any, ...]] | Iterator[str], list[tuple[Any, ...]]]:
    """The COPY rows of jobs without keys, ready ones and scheduled ones apart, so that
    "ready now" is the server's now(), never the client's clock; ``wide``: each row ends
    with its tags, its group and its state (the _options statements). ``ids`` (empty) is
    filled with the jobs' new ids, in order. Plain ready rows come as COPY text, made
    block by block with their ids as the COPY sends them (psycopg's write_row per row
    was the producer's largest cost in a bulk enqueue; one text of every row made the
    server wait for the last one before reading the first); the others' ids are made
    here."""
    if not wide and all(job.available_at is None for job in checked):
        return _ready_copy_text(checked, ids, handlers), []
    ids.extend(uuid7_many(len(checked)))
    ready: list[tuple[Any, ...]] = []
    scheduled: list[tuple[Any, ...]] = []
    for job_id, job in zip(ids, checked, strict=True):
        queue = queue_of(job, handlers)
        if job.available_at is None:
            row: tuple[Any, ...] = (job_id, job.topic, job.payload_json, queue, job.priority)
            ready.append((*row, *_wide(job)) if wide else row)
        else:
            at = job.available_at
            row = (job_id, job.topic, job.payload_json, at, queue, job.priority)
            scheduled.append((*row, *_wide(job)) if wide else row)
    return ready, scheduled


def _wide(job: Job) -> tuple[str | None, str | None, str, str | None]:
    """What the _options COPY adds to a row: its tags, its group, its state and its
    ordering key."""
    return tags_literal(job.tags), job.group, ON_HOLD if job.held else PENDING, job.ordering_key


def _ready_copy_text(checked: list[Job], ids: list[uuid.UUID], handlers: Handlers) -> Iterator[str]:
    """job_copy_ready's rows in COPY's text format, COPY_BLOCK rows a block, each made
    with its new ids (appended to ``ids``: increasing from block to block, as one
    uuid7_many's) when the COPY asks for it."""
    for start in range(0, len(checked), COPY_BLOCK):
        yield _copy_block(checked[start : start + COPY_BLOCK], ids, handlers)


def _copy_block(block: Sequence[Job], ids: list[uuid.UUID], handlers: Handlers) -> str:
    """One block of job_copy_ready's rows in COPY's text format: (id, topic, payload,
    queue, priority), with new ids appended to ``ids``. Topics and queues are validated
    names (no character COPY would read as special), and a payload is JSON text from
    brooq.encoding, which writes every control character as an escape: a backslash is
    the one character to double."""
    block_ids = uuid7_many(len(block))
    ids.extend(block_ids)
    lines = []
    for job_id, job in zip(block_ids, block, strict=True):
        payload = job.payload_json
        if "\\" in payload:
            payload = payload.replace("\\", "\\\\")
        queue = queue_of(job, handlers)
        lines.append(f"{job_id.hex}\t{job.topic}\t{payload}\t{queue}\t{job.priority}\n")
    return "".join(lines)


# -- a batch given as an iterator: checked and sent a block at a time -----------------------
# Queue.enqueue_many(_async) of an iterator (not a list or tuple) takes COPY_BLOCK jobs from
# it at a time, checks them and writes them into one COPY while the server inserts the
# block before: making and checking the jobs overlaps the server's work. Only jobs that a
# plain COPY takes as they are stream; the first job that needs more (a key, an option,
# a time, after) stops the COPY (Unstreamable: brooq's own transaction rolls back) and the
# whole batch goes again as a list. A refused job raises as in a list, named by its index;
# the transaction rolls back and nothing is inserted.


class Unstreamable(Exception):
    """A job of a streamed batch that a plain COPY cannot take: the batch goes as a list."""


def streamable(job: Job) -> bool:
    """Whether a plain COPY (job_copy_ready) inserts ``job`` as it is."""
    return (
        job.available_at is None
        and job.idempotency_key is None
        and job.unique_key is None
        and job.debounce is None
        and job.tags is None
        and job.group is None
        and not job.held
        and job.ordering_key is None
        and job.after is None
    )


def checked_blocks(
    jobs: Iterator[object], check: Callable[[list[object], int], list[Job]], taken: list[Job]
) -> Iterator[list[Job]]:
    """The jobs of ``jobs`` COPY_BLOCK at a time, each block passed by ``check`` (its
    jobs and the index of its first) and kept in ``taken``; Unstreamable at the first
    block holding a job a plain COPY cannot take (the rest of ``jobs`` not read)."""
    start = 0
    while True:
        block = list(islice(jobs, COPY_BLOCK))
        if not block:
            return
        checked = check(block, start)
        taken.extend(checked)
        if not all(map(streamable, checked)):
            raise Unstreamable
        start += len(checked)
        yield checked


def stream_many(
    jobs: Iterator[Job],
    check: Callable[[list[object], int], list[Job]],
    transaction: Callable[[], AbstractContextManager[psycopg.Connection[Any]]],
    handlers: Handlers,
    q: Queries,
    as_list: Callable[[list[Job]], list[tuple[uuid.UUID, bool]]],
) -> list[tuple[uuid.UUID, bool]]:
    """Queue.enqueue_many of an iterator: ``check`` each block, a plain COPY fed a block
    at a time in ``transaction()`` (the Queue's own); ``as_list`` of the whole batch when
    a job needs more than that COPY, or under a tracer (a traced batch's span names every
    topic)."""
    taken: list[Job] = []
    blocks = checked_blocks(jobs, check, taken)
    try:
        first = next(blocks, None)
        if first is None:
            return []
        if tracer() is None:
            with transaction() as conn, _collector_paused(COPY_BLOCK):
                return drive(conn, _insert_stream(first, blocks, handlers, q))
    except Unstreamable:
        pass  # rolled back: nothing of it was written
    return as_list([*taken, *jobs])


async def stream_many_async(
    jobs: Iterator[Job],
    check: Callable[[list[object], int], list[Job]],
    transaction: Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]],
    handlers: Handlers,
    q: Queries,
    as_list: Callable[[list[Job]], Awaitable[list[tuple[uuid.UUID, bool]]]],
) -> list[tuple[uuid.UUID, bool]]:
    """``stream_many`` on the async pool."""
    taken: list[Job] = []
    blocks = checked_blocks(jobs, check, taken)
    try:
        first = next(blocks, None)
        if first is None:
            return []
        if tracer() is None:
            async with transaction() as conn:
                with _collector_paused(COPY_BLOCK):
                    return await drive_async(conn, _insert_stream(first, blocks, handlers, q))
    except Unstreamable:
        pass
    return await as_list([*taken, *jobs])


def _insert_stream(
    first: list[Job], blocks: Iterator[list[Job]], handlers: Handlers, q: Queries
) -> Steps[list[tuple[uuid.UUID, bool]]]:
    """A streamed batch's one COPY: ``first``, then every block of ``blocks``."""
    made: list[uuid.UUID] = []

    def text() -> Iterator[str]:
        yield _copy_block(first, made, handlers)
        for block in blocks:
            yield _copy_block(block, made, handlers)

    yield Copy(q.job_copy_ready, text())
    return [(job_id, True) for job_id in made]


def tags_literal(tags: Sequence[str] | None) -> str | None:
    """The tags as a text[] literal, each element quoted (so that a tag "null" stays a
    word): what COPY writes into the tags column and what job_insert_many_options casts.
    brooq.job_options' alphabet holds no quote, backslash or separator to escape."""
    if tags is None:
        return None
    return "{" + ",".join(f'"{tag}"' for tag in tags) + "}"


# -- a job with a unique_key, debounce or tags (brooq.job_options) ---------------------------


def _insert_with_options(
    job: Job, params: dict[str, Any], q: Queries
) -> Steps[tuple[uuid.UUID, bool]]:
    """One job with options; ``params`` are job_insert's (a fresh id among them).

    A unique_key (or tags) without debounce: one INSERT ... ON CONFLICT DO NOTHING (any
    unique index: the idempotency key's or job_unique_key_idx), then, when nothing was
    inserted, the id of the job holding the key; tried again if that job ended meanwhile.
    debounce: one statement, job_debounce, whose id tells what it did: the new id when it
    inserted a job, the existing one's when that job took the payload. It answers nothing
    when a producer racing it inserted first, and is then run again."""
    params = {
        **params,
        "unique_key": job.unique_key,
        "tags": list(job.tags) if job.tags is not None else None,
        "state": ON_HOLD if job.held else PENDING,
        "ordering_key": job.ordering_key,
    }
    if job.debounce is not None:
        params["debounce"] = job.debounce
        for _ in range(KEY_ROUNDS):
            got = yield One(q.job_debounce, params)
            if got is not None:
                return got, got == params["id"]
        raise BrooqError(
            f"could not enqueue {job.topic!r} with unique_key {job.unique_key!r}: other "
            "producers of the key kept winning the race; enqueue it again"
        )
    for _ in range(KEY_ROUNDS):
        statement = (
            q.job_insert_options if "traceparent" not in params else q.job_insert_options_traced
        )
        try:
            inserted = yield One(statement, params)
        except KeyTaken:
            inserted = None
        if inserted is not None:
            return inserted, True
        if job.idempotency_key is not None:
            existing = yield One(
                q.job_get_id_by_key, {"topic": job.topic, "key": job.idempotency_key}
            )
            if existing is not None:
                return existing, False
        if job.unique_key is not None:
            existing = yield One(
                q.job_get_id_by_unique_key, {"topic": job.topic, "key": job.unique_key}
            )
            if existing is not None:
                return existing, False
    key = job.unique_key if job.unique_key is not None else job.idempotency_key
    raise BrooqError(
        f"could not enqueue {job.topic!r} with key {key!r}: the conflicting job kept "
        "ending or disappearing (is the caller's transaction REPEATABLE READ or SERIALIZABLE?)"
    )


def _with_options(params: dict[str, Any], checked: list[Job]) -> dict[str, Any]:
    """job_insert_many's arrays, and the unique keys, tags and states of
    job_insert_many_options."""
    return {
        **params,
        "unique_keys": [j.unique_key for j in checked],
        "tags": [tags_literal(j.tags) for j in checked],
        "states": [ON_HOLD if j.held else PENDING for j in checked],
        "ordering_keys": [j.ordering_key for j in checked],
    }


def _key_holders(
    checked: list[Job], missing: list[int], q: Queries
) -> Steps[dict[int, uuid.UUID | None]]:
    """The job holding the key of each job of ``missing`` (indexes into ``checked``), or
    None when none does any more: by idempotency key first, then by unique key (a waiting
    debounced job before the key's active one)."""
    found: dict[int, uuid.UUID | None] = dict.fromkeys(missing)
    by_idempotency = [i for i in missing if checked[i].idempotency_key is not None]
    if by_idempotency:
        rows: list[KeyedId] = yield Keyed(
            q.job_get_ids_by_keys,
            {
                "topics": [checked[i].topic for i in by_idempotency],
                "keys": [checked[i].idempotency_key for i in by_idempotency],
            },
        )
        existing = {(row.topic, row.key): row.id for row in rows}
        for i in by_idempotency:
            found[i] = existing.get((checked[i].topic, checked[i].idempotency_key))
    by_unique = [i for i in missing if found[i] is None and checked[i].unique_key is not None]
    if by_unique:
        rows = yield Keyed(
            q.job_get_ids_by_unique_keys,
            {
                "topics": [checked[i].topic for i in by_unique],
                "keys": [checked[i].unique_key for i in by_unique],
            },
        )
        active: dict[tuple[str, str | None], uuid.UUID] = {}
        for row in rows:  # the waiting job of a key comes first
            active.setdefault((row.topic, row.key), row.id)
        for i in by_unique:
            found[i] = active.get((checked[i].topic, checked[i].unique_key))
    return found


# -- a graph: a batch holding jobs with ``after`` ---------------------------------------------

Inserted = list[tuple[uuid.UUID, bool]]

# What a job with after is inserted with, for the moment between its INSERT and its
# edges: not ready, so that the insert's trigger (brooq_job_notify) sends no NOTIFY for
# it. job_after_release writes its own available_at in the same transaction.
HELD = datetime(9999, 1, 1, tzinfo=timezone.utc)


def _insert_graph(
    checked: list[Job], insert: Callable[[list[Job]], Steps[Inserted]], q: Queries
) -> Steps[Inserted]:
    """Insert ``checked`` through ``insert`` (the batch's own steps), then its edges.

    The names are checked before any write: ``after`` is checked again as the Job's
    constructor checks it (it may have been assigned since), a Job named in ``after`` must
    be in the same batch and no Job of the batch may wait for itself through others (a
    cycle would wait for ever), an id must be a job's (one read); a job with ``after``
    takes no ``unique_key`` (the key's promise counts pending, failed and processing jobs,
    not waiting ones). Then the batch is inserted as any batch is (every job pending, ids
    made before the insert), the jobs with ``after`` held (HELD), one statement
    (job_after: migration 0013's brooq_job_after) writes the edges and moves the jobs that
    wait to ``waiting``, and a last one (job_after_release) gives them their available_at
    and wakes the children if one of them is ready now. ``drive_graph`` runs it all in
    one transaction."""
    index = {id(job): i for i, job in enumerate(checked)}
    afters: list[tuple[Any, ...] | None] = []
    named: list[uuid.UUID] = []
    for n, job in enumerate(checked):
        if job.after is None:
            afters.append(None)
            continue
        try:
            after = check_after(job.after, job.on_upstream_failure, Job)
        except InvalidAfter as exc:
            raise InvalidAfter(f"job {n}: {exc}") from None
        afters.append(after)
        if job.unique_key is not None:
            raise InvalidAfter(f"job {n}: after cannot be combined with unique_key or debounce")
        for item in after:
            if isinstance(item, uuid.UUID):
                named.append(item)
            elif id(item) not in index:
                raise InvalidAfter(
                    f"job {n}: after names a Job ({item.topic!r}) that is not in this "
                    "enqueue_many call: enqueue it in the same call, or name its id"
                )
    _check_acyclic(afters, index)
    if named:
        present = set((yield All(q.job_ids_present, {"ids": named})))
        for job_id in named:
            if job_id not in present:
                raise InvalidAfter(f"after names job {job_id}, which does not exist")
    results = yield from insert([_held(job) if job.after is not None else job for job in checked])
    jobs: list[uuid.UUID] = []
    policies: list[str] = []
    available_ats: list[datetime | None] = []
    downs: list[uuid.UUID] = []
    ups: list[uuid.UUID] = []
    for (job_id, created), job, names in zip(results, checked, afters, strict=True):
        if names is None or not created:
            continue
        jobs.append(job_id)
        policies.append(job.on_upstream_failure)
        available_ats.append(job.available_at)
        for item in names:  # each named once (check_after)
            downs.append(job_id)
            ups.append(item if isinstance(item, uuid.UUID) else results[index[id(item)]][0])
    if jobs:
        yield One(
            q.job_after,
            {"jobs": jobs, "policies": policies, "downs": downs, "ups": ups},
        )
        yield All(q.job_after_release, {"ids": jobs, "available_ats": available_ats})
    return results


def _held(job: Job) -> Job:
    """``job`` as the batch inserts it: not ready yet, its edges written after."""
    held = _without_after(job)
    held.available_at = HELD
    return held


def _check_acyclic(afters: Sequence[tuple[Any, ...] | None], index: dict[int, int]) -> None:
    """InvalidAfter naming the jobs of a cycle, when a Job of the batch waits for itself
    through the Jobs its ``after`` names (possible only once ``after`` was assigned after
    the Job was built: the constructor takes Jobs built before)."""

    def named(n: int) -> Iterator[int]:
        return (index[id(item)] for item in afters[n] or () if not isinstance(item, uuid.UUID))

    state = [0] * len(afters)  # 0: not seen, 1: on the path being walked, 2: done
    for start in range(len(afters)):
        if state[start] or afters[start] is None:
            continue
        path = [start]
        walks = [named(start)]
        state[start] = 1
        while walks:
            up = next(walks[-1], None)
            if up is None:
                state[path.pop()] = 2
                walks.pop()
            elif state[up] == 1:
                cycle = [*path[path.index(up) :], up]
                chain = " waits for ".join(f"job {n}" for n in cycle)
                raise InvalidAfter(f"after makes a cycle, which would wait for ever: {chain}")
            elif state[up] == 0:
                state[up] = 1
                path.append(up)
                walks.append(named(up))


# -- the drivers: the I/O, and the transaction a graph needs ----------------------------------

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
            taken: KeyTaken | None = None
            while True:
                try:
                    step = steps.send(answer) if taken is None else steps.throw(taken)
                except StopIteration as done:
                    result: R = done.value
                    return result
                taken = None
                try:
                    if isinstance(step, One):  # first: a single enqueue's only kind
                        answer = cur.execute(step.statement, step.params).fetchone()
                    elif isinstance(step, Copy):
                        with cur.copy(step.statement) as copy:
                            if isinstance(step.rows, list):
                                for row in step.rows:
                                    copy.write_row(row)
                            else:
                                for block in step.rows:
                                    copy.write(block)
                        answer = None
                    elif isinstance(step, Keyed):
                        with cur.connection.cursor(row_factory=class_row(KeyedId)) as by_key:
                            answer = by_key.execute(step.statement, step.params).fetchall()
                    else:
                        answer = cur.execute(step.statement, step.params).fetchall()
                except psycopg.errors.UniqueViolation as exc:
                    taken = _key_taken(exc, cur.connection)
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
            taken: KeyTaken | None = None
            while True:
                try:
                    step = steps.send(answer) if taken is None else steps.throw(taken)
                except StopIteration as done:
                    result: R = done.value
                    return result
                taken = None
                try:
                    if isinstance(step, One):
                        await cur.execute(step.statement, step.params)
                        answer = await cur.fetchone()
                    elif isinstance(step, Copy):
                        async with cur.copy(step.statement) as copy:
                            if isinstance(step.rows, list):
                                for row in step.rows:
                                    await copy.write_row(row)
                            else:
                                for block in step.rows:
                                    await copy.write(block)
                        answer = None
                    elif isinstance(step, Keyed):
                        async with cur.connection.cursor(row_factory=class_row(KeyedId)) as by_key:
                            await by_key.execute(step.statement, step.params)
                            answer = await by_key.fetchall()
                    else:
                        await cur.execute(step.statement, step.params)
                        answer = await cur.fetchall()
                except psycopg.errors.UniqueViolation as exc:
                    taken = _key_taken(exc, cur.connection)
    except psycopg.errors.UndefinedTable as exc:
        raise schema_missing(exc) from None
    except psycopg.errors.ReadOnlySqlTransaction:
        conn = target if isinstance(target, psycopg.AsyncConnection) else target.connection
        raise read_only(conn) from None


# The constraint job_key_taken names when a key belongs to another job (migration 0020).
KEY_CONSTRAINT = "brooq_job_key_pkey"


class KeyRace(BrooqError):
    """A key's job was enqueued and ended while an insert of the same key ran in a
    transaction (the caller's, a graph's, or Queue.enqueue_many's): the transaction is
    aborted; run again, the enqueue gives that job's id back."""


def _key_taken(
    exc: psycopg.errors.UniqueViolation,
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
) -> KeyTaken:
    """KeyTaken, to throw into the steps, for job_key_taken's refusal on a connection in
    autocommit outside a transaction (the statement was its own transaction: nothing
    written, the next one sees the key's job); KeyRace when a transaction is aborted by
    it; any other unique violation raised as it is."""
    if exc.diag.constraint_name != KEY_CONSTRAINT:
        raise exc
    if conn.autocommit and conn.info.transaction_status == _IDLE:
        return KeyTaken()
    raise KeyRace(
        f"could not enqueue: {exc.diag.message_primary}, which was enqueued and ended "
        "while this transaction ran (its snapshot did not see it); the transaction is "
        "aborted: roll it back and run it again (the enqueue then returns that job's id)"
    ) from exc


def drive_graph(target: Target, make: Callable[[], Steps[R]]) -> R:
    """The steps ``make()`` returns, in one transaction: brooq's own (retried after a
    deadlock) when the connection is in autocommit outside a transaction, else the
    caller's.

    A graph's rows and edges must commit together: nothing may see a job of the graph
    before its edges, or a child would claim it as the plain pending row it is between
    its INSERT and brooq_job_after. On a connection in autocommit outside a transaction
    (a Queue's pooled one, a caller's, Django's outside ``atomic``) each statement would
    be its own transaction, so brooq opens one around the steps: it owns that
    transaction, and runs it again, whole, when PostgreSQL breaks a deadlock with a child
    writing the outcomes of the jobs named (brooq_job_after locks them in id order, a
    batched done in its own), at most DEADLOCK_ROUNDS times. In the caller's transaction
    nothing is retried: the deadlock is EnqueueDeadlock, for the caller to roll back and
    run again. A key given meanwhile to a job that also ended meanwhile (KeyRace: the
    transaction's statements did not see it) is retried so too. An upstream job deleted
    while the graph was written (brooq_job_after's foreign_key_violation) is InvalidAfter,
    nothing of the graph committed."""
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
        except KeyRace as exc:
            if not owned:
                raise
            if round_ < DEADLOCK_ROUNDS:
                continue  # brooq's own transaction: the next round sees the key's job
            raise _keys_raced() from exc
        except psycopg.errors.ForeignKeyViolation as exc:
            if (gone := _upstream_gone(exc, owned)) is None:
                raise
            raise gone from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _keys_raced() -> KeyRace:
    """Every round of a graph's own transaction met a key enqueued and ended meanwhile."""
    return KeyRace(
        f"could not enqueue the jobs with after: each of {DEADLOCK_ROUNDS} tries met "
        "a key whose job was enqueued and ended meanwhile (nothing was written); "
        "enqueue them again"
    )


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
        except KeyRace as exc:
            if not owned:
                raise
            if round_ < DEADLOCK_ROUNDS:
                continue  # brooq's own transaction: the next round sees the key's job
            raise _keys_raced() from exc
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
