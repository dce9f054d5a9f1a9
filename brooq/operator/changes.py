"""The operator's writes, each a function of the caller's connection: cancel or retry one
job (``transition`` binds the states of brooq.job to job_cancel and job_retry), the bulk
forms and the purge of a queue or topic in batches of their own transactions, pause and
resume a queue, and why a cancel or retry did nothing.

Owns: the statements of each transition and their parameters, the bulk forms' keyset
batches (BULK_BATCH_SIZE) and the checks of their arguments (``check_bulk``, run before
any statement, here and by brooq.Queue before it takes a connection).
Must never: spell which states a transition accepts (brooq.job does), commit a single
change (the caller's transaction holds it: the master's admin endpoint, a Queue's
``transaction()``), or hold the row locks of a bulk change beyond one batch.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from brooq.declare.handlers import MAX_GLOBAL_LIMIT as MAX_LIMIT
from brooq.declare.rates import Rate, parse_rate
from brooq.errors import BrooqError, InvalidGroup, InvalidTransition, JobNotFound
from brooq.job import (
    BULK_FROM_STATES,
    FROM_STATES,
    RETRYABLE_STATES,
    Transition,
    bulk_state_refusal,
    parse_job_id,
    transition_refusal,
    validate_queue,
    validate_topic,
)
from brooq.job_options import check_tag, key_taken, validate_group
from brooq.operator.reads import get
from brooq.operator.records import BulkResult
from brooq.sql import Q, Queries

if TYPE_CHECKING:
    from typing_extensions import LiteralString

Connection = psycopg.Connection[Any]

# The statements' names: each schema has its own set (brooq.sql.queries).
_TRANSITION_QUERIES: dict[Transition, str] = {
    "cancel": "job_cancel",
    "retry": "job_retry",
    "hold": "job_hold",
    "release": "job_hold_release",
}
_BULK_QUERIES: dict[Transition, str] = {
    "cancel": "job_cancel_batch",
    "retry": "job_retry_batch",
    "hold": "job_hold_batch",
    "release": "job_hold_release_batch",
}
# Rows one batch of cancel_many/retry_many locks and writes in its own transaction: big
# enough that a million jobs take a hundred round trips, small enough that no batch holds
# its locks for long.
BULK_BATCH_SIZE = 10_000
# The keyset's start: below every id (brooq.producer.ids makes UUIDv7s, never the nil UUID).
_BEFORE_EVERY_ID = uuid.UUID(int=0)
# A bulk retry's batch that failed because a producer took a unique_key between the
# batch's check and its write is run again (it then sees that job and leaves the row).
_BATCH_TRIES = 3
# Of the jobs a bulk retry left alone because their unique_key is taken, the result names
# this many (with the job holding the key); it counts them all.
TAKEN_SHOWN = 20


def transition_params(action: Transition, job_id: uuid.UUID) -> dict[str, Any]:
    """The parameters of job_cancel (job_retry, job_hold, job_hold_release): the job and
    the states it may leave, brooq.job.FROM_STATES[action]."""
    return {"id": job_id, "from_states": list(FROM_STATES[action])}


def transition_statement(action: Transition, q: Queries = Q) -> LiteralString:
    """The statement of one job's ``action`` in ``q``'s schema (job_cancel, job_retry,
    job_hold, job_hold_release): every door sends the same one."""
    statement: LiteralString = getattr(q, _TRANSITION_QUERIES[action])
    return statement


def transition(conn: Connection, action: Transition, job_id: uuid.UUID, q: Queries = Q) -> bool:
    """Cancel, retry, hold or release ``job_id`` on the caller's connection (nothing
    committed here); True when the job moved, False when it is unknown, its state does
    not allow it, or (retry) another active job holds its unique_key."""
    statement = transition_statement(action, q)
    if action != "retry":  # only a retry can meet job_unique_key_idx (held jobs have no key)
        return conn.execute(statement, transition_params(action, job_id)).fetchone() is not None
    if not conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        # No transaction of the caller's yet: the statement opens it, and the caller
        # commits it (conn.transaction() here would commit it at once). A refusal rolls
        # back only that transaction, which holds nothing else.
        try:
            return conn.execute(statement, transition_params(action, job_id)).fetchone() is not None
        except psycopg.errors.UniqueViolation:
            conn.rollback()
            return False
    try:
        # A savepoint (or a transaction of its own in autocommit): a job whose unique_key
        # another active job holds fails the statement on job_unique_key_idx, and the
        # caller's transaction must survive that refusal.
        with conn.transaction():
            return conn.execute(statement, transition_params(action, job_id)).fetchone() is not None
    except psycopg.errors.UniqueViolation:
        return False


def cancel(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> bool:
    """pending, failed, processing or waiting -> canceled. False when the job is unknown or
    already finished (terminal rows are never touched). A running handler is
    interrupted with brooq.LeaseLost as soon as the cancel commits (job_cancel notifies
    the master holding it)."""
    return transition(conn, "cancel", parse_job_id(job_id), q)


def retry(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> bool:
    """dead or canceled -> pending now, attempts reset, last_error kept. False when
    the job is unknown or not in one of those states."""
    return transition(conn, "retry", parse_job_id(job_id), q)


def hold(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> bool:
    """pending or failed -> on_hold: never claimed until released, its place in line
    kept. False when the job is unknown, taken by a worker, finished, waiting, parked by
    a durable handler or has a unique_key (job_hold says why)."""
    return transition(conn, "hold", parse_job_id(job_id), q)


def release(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> bool:
    """on_hold -> pending, its place in line kept (ready at once when its time has
    passed; the masters are woken). False when the job is unknown or not on hold."""
    return transition(conn, "release", parse_job_id(job_id), q)


def explain_refusal(
    conn: Connection, job_id: uuid.UUID | str, action: Transition, q: Queries = Q
) -> BrooqError:
    """Why cancel, retry, hold or release did nothing, as an error to show an operator: JobNotFound,
    or InvalidTransition naming the job's state."""
    record = get(conn, job_id, q)
    if record is None:
        return JobNotFound(f"no job with id {parse_job_id(job_id)}")
    if action == "retry" and record.state in RETRYABLE_STATES and record.unique_key is not None:
        holder = key_holder(conn, record.id, q)
        if holder is not None:
            return InvalidTransition(key_taken(record.id, record.unique_key, *holder))
    if action == "hold" and record.state in FROM_STATES["hold"]:
        if record.unique_key is not None:
            return InvalidTransition(
                f"cannot hold job {record.id}: it has a unique_key ({record.unique_key!r}), "
                "which a job on hold would give up; cancel it, or let it run"
            )
        if parked(conn, record.id, q):
            return InvalidTransition(
                f"cannot hold job {record.id}: a durable handler parked it (it has started "
                "and sleeps or waits); cancel it to stop it"
            )
    return InvalidTransition(transition_refusal(action, record.state, record.id))


def parked(conn: Connection, job_id: uuid.UUID, q: Queries = Q) -> bool:
    """Whether ``job_id`` is a durable handler's parked job (it sleeps or waits)."""
    return conn.execute(q.job_is_parked, {"id": job_id}).fetchone() is not None


def key_holder(conn: Connection, job_id: uuid.UUID, q: Queries = Q) -> tuple[uuid.UUID, str] | None:
    """(id, state) of the active job holding ``job_id``'s unique_key, other than itself;
    None when its key is free (or it has none)."""
    row = conn.cursor(row_factory=dict_row).execute(q.job_unique_key_holder, {"id": job_id})
    found = row.fetchone()
    return None if found is None else (found["id"], found["state"])


def check_bulk(
    action: Transition,
    *,
    topic: str,
    state: str,
    queue: str | None,
    batch_size: int,
    tag: str | None = None,
) -> dict[str, Any]:
    """The filters of a bulk ``action`` (job_count_matching's parameters), or the error
    naming what is wrong: InvalidTransition for a state the action does not take,
    InvalidTopic, InvalidQueue or InvalidTags for a malformed name, BrooqError for the
    batch size."""
    validate_topic(topic)
    if queue is not None:
        validate_queue(queue)
    if tag is not None:
        check_tag(tag)
    refusal = bulk_state_refusal(action, state)
    if refusal is not None:
        raise InvalidTransition(refusal)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BrooqError(f"batch_size must be a positive integer, got {batch_size!r}")
    return {"topic": topic, "state": state, "queue": queue, "tag": tag}


def change_many(
    conn: Connection,
    action: Transition,
    *,
    topic: str,
    state: str,
    queue: str | None = None,
    dry_run: bool = False,
    batch_size: int = BULK_BATCH_SIZE,
    tag: str | None = None,
    q: Queries = Q,
) -> BulkResult:
    """Cancel (pending, failed or waiting: brooq.job.BULK_FROM_STATES says why not processing) or
    retry (dead or canceled) every job of ``topic`` in ``state``, only in ``queue`` and
    with ``tag`` if given; ``dry_run``: count them, change nothing. The count commits,
    then each batch of ``batch_size`` rows commits on its own on ``conn``
    (job_cancel_batch says why): give it a connection outside any transaction of yours.
    A job written after the count started is left alone. A retried job goes back to
    pending now (attempts reset, last error and history kept) and the masters are woken;
    one whose unique_key another active job holds is left alone, and named in
    ``BulkResult.taken`` with that job."""
    filters = check_bulk(
        action, topic=topic, state=state, queue=queue, batch_size=batch_size, tag=tag
    )
    cur = conn.cursor(row_factory=dict_row)
    count = cur.execute(q.job_count_matching, filters).fetchone()
    assert count is not None  # an aggregate without GROUP BY: always one row
    conn.commit()
    matched = int(count["matched"])
    if dry_run or matched == 0:
        return BulkResult(matched=matched, changed=0)
    params = {
        **filters,
        "as_of": count["as_of"],
        "from_states": list(BULK_FROM_STATES[action]),
        "batch": batch_size,
        "after": _BEFORE_EVERY_ID,
    }
    statement: LiteralString = getattr(q, _BULK_QUERIES[action])
    changed = 0
    taken: list[tuple[uuid.UUID, uuid.UUID]] = []
    taken_count = 0
    while True:
        batch = _batch(conn, cur, statement, params)
        changed += int(batch["changed"])
        if action == "retry":
            taken_count += len(batch["taken"])
            room = TAKEN_SHOWN - len(taken)
            taken.extend(list(zip(batch["taken"], batch["holders"], strict=True))[:room])
        if batch["picked"] < batch_size:  # the keyset reached the end
            return BulkResult(
                matched=matched, changed=changed, key_taken=taken_count, taken=tuple(taken)
            )
        params["after"] = batch["last_id"]


def _batch(
    conn: Connection,
    cur: psycopg.Cursor[dict[str, Any]],
    statement: LiteralString,
    params: dict[str, Any],
) -> dict[str, Any]:
    """One batch, committed on its own: its row locks last one batch, not the run. A
    retry batch that met a unique_key taken meanwhile (job_retry_batch) is run again."""
    for attempt in range(1, _BATCH_TRIES + 1):
        try:
            batch = cur.execute(statement, params).fetchone()
        except psycopg.errors.UniqueViolation:
            conn.rollback()
            if attempt == _BATCH_TRIES:
                raise
            continue
        assert batch is not None
        conn.commit()
        return batch
    raise AssertionError("unreachable")


def check_purge(*, queue: str | None, topic: str | None, batch_size: int) -> dict[str, Any]:
    """A purge's filters (job_purge_count's parameters), or the error naming what is
    wrong: BrooqError when neither a queue nor a topic is given (there is no "every job"
    by omission) or for the batch size, InvalidQueue or InvalidTopic for a malformed
    name."""
    if queue is None and topic is None:
        raise BrooqError("purge needs a queue or a topic (or both): nothing was canceled")
    if queue is not None:
        validate_queue(queue)
    if topic is not None:
        validate_topic(topic)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BrooqError(f"batch_size must be a positive integer, got {batch_size!r}")
    return {"queue": queue, "topic": topic, "from_states": list(BULK_FROM_STATES["cancel"])}


def purge(
    conn: Connection,
    *,
    queue: str | None = None,
    topic: str | None = None,
    dry_run: bool = False,
    batch_size: int = BULK_BATCH_SIZE,
    q: Queries = Q,
) -> int:
    """Cancel every job of ``queue`` and/or ``topic`` that no worker has taken: pending
    (ready or scheduled), failed (retrying) and waiting, not parked (job_purge_count says
    why); how many were canceled (``dry_run``: how many would be, nothing changed). Each
    batch of ``batch_size`` rows commits on its own on ``conn`` (job_purge_batch): give
    it a connection outside any transaction of yours. Jobs created after the first batch
    are left alone."""
    filters = check_purge(queue=queue, topic=topic, batch_size=batch_size)
    cur = conn.cursor(row_factory=dict_row)
    if dry_run:
        count = cur.execute(q.job_purge_count, filters).fetchone()
        assert count is not None  # an aggregate without GROUP BY: always one row
        conn.commit()
        return int(count["matched"])
    params = {**filters, "as_of": None, "batch": batch_size, "after": _BEFORE_EVERY_ID}
    changed = 0
    while True:
        batch = cur.execute(q.job_purge_batch, params).fetchone()
        assert batch is not None
        conn.commit()
        changed += int(batch["changed"])
        if batch["picked"] < batch_size:  # the keyset reached the end
            return changed
        params["after"], params["as_of"] = batch["last_id"], batch["as_of"]


def check_group_limit(topic: object, group: object, limit: object) -> tuple[str, str]:
    """The topic and group of a group's own limit, or the error naming what is wrong:
    InvalidTopic, InvalidGroup, BrooqError for a limit that is not a whole number from 0
    (or None, which clears it) within PostgreSQL's integer."""
    checked_topic = validate_topic(topic)
    checked_group = validate_group(group)
    if checked_group is None:
        raise InvalidGroup("a group's own limit needs a group (1 to 128 characters)")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_LIMIT
    ):
        raise BrooqError(
            f"limit must be a whole number from 0 to {MAX_LIMIT} (0: the group's jobs wait), "
            f"or None to go back to the topic's group_limit; got {limit!r}"
        )
    return checked_topic, checked_group


def set_group_limit(
    conn: Connection, topic: str, group: str, limit: int | None, q: Queries = Q
) -> bool:
    """Give ``group`` of ``topic`` its own group_limit (None: back to the topic's). True
    when something changed (None on a group without one: nothing to clear)."""
    checked_topic, checked_group = check_group_limit(topic, group, limit)
    params = {"topic": checked_topic, "group": checked_group, "limit": limit}
    if limit is None:
        return conn.execute(q.group_limit_clear, params).fetchone() is not None
    conn.execute(q.group_limit_set, params)
    return True


def check_group_rate(topic: object, group: object, rate: object) -> tuple[str, str, Rate | None]:
    """The topic, group and Rate of a group's own rate, or the error naming what is wrong:
    InvalidTopic, InvalidGroup, BrooqError for a rate that is not a Rate or "N/s", "N/m",
    "N/h" (None clears it)."""
    checked_topic, checked_group = check_group_limit(topic, group, None)
    if rate is None:
        return checked_topic, checked_group, None
    try:
        return checked_topic, checked_group, parse_rate(rate, "rate")
    except ValueError as exc:
        raise BrooqError(f"{exc}, or None to go back to the topic's group_rate_limit") from None


def set_group_rate(
    conn: Connection, topic: str, group: str, rate: Rate | str | None, q: Queries = Q
) -> bool:
    """Give ``group`` of ``topic`` its own rate (None: back to the topic's
    group_rate_limit). True when something changed (None on a group without one: nothing
    to clear)."""
    checked_topic, checked_group, checked = check_group_rate(topic, group, rate)
    params: dict[str, Any] = {"topic": checked_topic, "group": checked_group}
    if checked is None:
        return conn.execute(q.group_rate_clear, params).fetchone() is not None
    params.update(rate=checked.limit, period=checked.seconds, window=checked.window)
    conn.execute(q.group_rate_set, params)
    return True


def set_paused(conn: Connection, name: str, *, paused: bool, q: Queries = Q) -> None:
    """Pause (stop the claims of) or resume queue ``name``; a malformed name fails
    before any statement. A queue nobody used yet may be paused: the pause holds when
    its jobs arrive; one never paused gets a row saying it runs."""
    checked = validate_queue(name)
    conn.execute(q.queue_set_paused, {"name": checked, "paused": paused})


def pause(conn: Connection, name: str, q: Queries = Q) -> None:
    """Stop the claims of queue ``name`` (every master sees it within its poll_interval);
    running jobs finish, producers go on enqueueing."""
    set_paused(conn, name, paused=True, q=q)


def resume(conn: Connection, name: str, q: Queries = Q) -> None:
    """Let the masters claim from queue ``name`` again."""
    set_paused(conn, name, paused=False, q=q)
