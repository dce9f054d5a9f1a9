"""The operator's reads, each a function of the caller's connection: a job's row and its
kept logs, the newest jobs, the counts per topic and per queue, what the topics' limits
hold back, the jobs in flight and their holders, and the jobs finished lately.

Owns: the limits of the listings (LIST_LIMIT_MAX, IN_FLIGHT_LIMIT_MAX), the checks of
their arguments (``check_*``: run before any statement, by these functions and by
brooq.Queue before it takes a connection), and reading the rows into brooq.job's
JobRecord and brooq.operator.records.
Must never: write, commit, or read a row by position.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row

from brooq.errors import BrooqError, JobNotFound
from brooq.job import (
    STATES,
    JobRecord,
    UpstreamJob,
    parse_job_id,
    validate_queue,
    validate_topic,
)
from brooq.job_options import check_tag
from brooq.operator.records import (
    AttemptLog,
    GroupLimit,
    HolderStats,
    InFlight,
    QueueStats,
    TopicLimits,
    TopicStats,
)
from brooq.sql import Q, Queries

Connection = psycopg.Connection[Any]

LIST_LIMIT_MAX = 1000
IN_FLIGHT_LIMIT_MAX = 1000


def get(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> JobRecord | None:
    """The job's row, or None when no job has this id."""
    jid = parse_job_id(job_id)
    cur = conn.cursor(row_factory=class_row(JobRecord))
    return cur.execute(q.job_get, {"id": jid}).fetchone()


def job_logs(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> list[AttemptLog]:
    """A keep_logs job's log per attempt, oldest first ([] when none were kept);
    JobNotFound when no job has this id."""
    jid = parse_job_id(job_id)
    row = conn.cursor(row_factory=dict_row).execute(q.job_logs, {"id": jid}).fetchone()
    if row is None:
        raise JobNotFound(f"no job {jid}")
    return [
        AttemptLog(int(e["attempt"]), datetime.fromisoformat(e["at"]), str(e["text"]))
        for e in row["logs"]
    ]


def upstream(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> list[UpstreamJob]:
    """The jobs ``job_id`` waits or waited for, in the order named."""
    cur = conn.cursor(row_factory=class_row(UpstreamJob))
    return cur.execute(q.job_upstream, {"id": parse_job_id(job_id)}).fetchall()


def downstream(
    conn: Connection, job_id: uuid.UUID | str, limit: int = 100, q: Queries = Q
) -> list[UpstreamJob]:
    """The jobs that wait or waited for ``job_id`` (at most ``limit``), by id."""
    check_limit(limit)
    cur = conn.cursor(row_factory=class_row(UpstreamJob))
    return cur.execute(q.job_downstream, {"id": parse_job_id(job_id), "limit": limit}).fetchall()


def check_listing(
    *,
    topic: str | None,
    state: str | None,
    limit: int,
    queue: str | None,
    tag: str | None = None,
) -> dict[str, Any]:
    """``list_jobs``'s arguments as job_list's parameters, or the error naming the bad one."""
    if topic is not None:
        validate_topic(topic)
    if queue is not None:
        validate_queue(queue)
    if tag is not None:
        check_tag(tag)
    if state is not None and state not in STATES:
        raise BrooqError(f"state must be one of {', '.join(STATES)}, got {state!r}")
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise BrooqError(f"limit must be between 1 and {LIST_LIMIT_MAX}, got {limit}")
    return {"topic": topic, "state": state, "queue": queue, "limit": limit, "tag": tag}


def list_jobs(
    conn: Connection,
    *,
    topic: str | None = None,
    state: str | None = None,
    limit: int = 100,
    queue: str | None = None,
    tag: str | None = None,
    q: Queries = Q,
) -> list[JobRecord]:
    """Newest first; at most LIST_LIMIT_MAX rows; only ``topic``, ``state``, ``queue``
    and jobs carrying ``tag`` when given."""
    params = check_listing(topic=topic, state=state, limit=limit, queue=queue, tag=tag)
    cur = conn.cursor(row_factory=class_row(JobRecord))
    return cur.execute(q.job_list, params).fetchall()


def stats(conn: Connection, q: Queries = Q) -> list[TopicStats]:
    """Per queue and topic (by queue, then topic): the counts (waiting, scheduled, ready,
    held, retrying, parked, processing, dead: docs/explanation/guarantees.md, "Counts"),
    the state counts kept (pending, failed, busy) and the age of the oldest ready job not
    held back. Topics holding only done or canceled jobs are left out."""
    cur = conn.cursor(row_factory=class_row(TopicStats))
    rows = cur.execute(q.job_stats_by_topic).fetchall()
    held = held_by_topic(conn, q)
    return [
        replace(r, held=held[key][0], oldest_ready_age=held[key][1])
        if (key := (r.queue, r.topic)) in held
        else r
        for r in rows
    ]


def held_by_topic(conn: Connection, q: Queries = Q) -> dict[tuple[str, str], tuple[int, float]]:
    """Per (queue, topic) of a topic with limits and ready jobs: the ready jobs its limits
    hold back now, and the age of the oldest ready job they do not. Empty on a schema
    without the limits (an older brooq's: nothing is marked)."""
    try:
        with conn.transaction():
            rows = conn.cursor(row_factory=dict_row).execute(q.job_held_by_topic).fetchall()
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
        return {}
    return {(r["queue"], r["topic"]): (int(r["held"]), float(r["oldest_unheld_age"])) for r in rows}


def topic_limits(conn: Connection, q: Queries = Q) -> list[TopicLimits]:
    """Every topic a live master publishes limits for, by topic: the limits, and what
    they hold back now. Empty on a schema without them (an older brooq's)."""
    try:
        with conn.transaction():
            rows = conn.cursor(row_factory=dict_row).execute(q.topic_limits_held).fetchall()
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn):
        return []
    return [TopicLimits.from_row(r) for r in rows]


def group_limits(conn: Connection, topic: str | None = None, q: Queries = Q) -> list[GroupLimit]:
    """The groups' own limits set at runtime, by topic and group (all topics by default)."""
    if topic is not None:
        validate_topic(topic)
    cur = conn.cursor(row_factory=class_row(GroupLimit))
    return cur.execute(q.group_limit_list, {"topic": topic}).fetchall()


def check_limit(limit: int) -> None:
    """The limit of ``in_flight`` and ``processing_by_holder``: 1 to IN_FLIGHT_LIMIT_MAX."""
    if not 1 <= limit <= IN_FLIGHT_LIMIT_MAX:
        raise BrooqError(f"limit must be between 1 and {IN_FLIGHT_LIMIT_MAX}, got {limit}")


def in_flight(conn: Connection, limit: int = 100, q: Queries = Q) -> list[InFlight]:
    """Jobs in state processing, longest running first; at most ``limit``."""
    check_limit(limit)
    cur = conn.cursor(row_factory=class_row(InFlight))
    return cur.execute(q.job_list_processing, {"limit": limit}).fetchall()


def processing_by_holder(conn: Connection, limit: int = 100, q: Queries = Q) -> list[HolderStats]:
    """Per holder (``locked_by``), its jobs in state processing, busiest first (then by
    name); at most ``limit`` holders."""
    check_limit(limit)
    cur = conn.cursor(row_factory=class_row(HolderStats))
    return cur.execute(q.job_processing_by_holder, {"limit": limit}).fetchall()


def queues(conn: Connection, q: Queries = Q) -> list[QueueStats]:
    """Every queue holding unfinished or dead jobs, and every queue paused or resumed by
    an operator, by name: paused or not, the counts of ``stats`` summed over the queue's
    topics (held included), and the age of the oldest ready job not held back."""
    held = held_by_topic(conn, q)
    limited = sorted({topic for _, topic in held})
    cur = conn.cursor(row_factory=class_row(QueueStats))
    rows = cur.execute(q.job_queue_stats, {"limited": limited}).fetchall()
    if not held:
        return rows
    found = []
    for r in rows:
        mine = [value for (queue, _), value in held.items() if queue == r.name]
        found.append(
            replace(
                r,
                held=sum(count for count, _ in mine),
                oldest_ready_seconds=max([r.oldest_ready_seconds, *(age for _, age in mine)]),
            )
        )
    return found


def check_seconds(seconds: float) -> None:
    """The window of ``throughput_by_queue``: a positive number of seconds."""
    if not seconds > 0:
        raise BrooqError(f"seconds must be positive, got {seconds!r}")


def throughput_by_queue(
    conn: Connection, seconds: float = 60, q: Queries = Q
) -> dict[tuple[str, str], int]:
    """Per (queue, topic), the jobs that reached done, failed, dead or canceled in the
    last ``seconds``. Pairs with none are left out."""
    check_seconds(seconds)
    rows = conn.cursor(row_factory=dict_row).execute(
        q.job_count_finished_since, {"seconds": float(seconds)}
    )
    return {(row["queue"], row["topic"]): int(row["jobs"]) for row in rows}


def per_topic(by_queue: dict[tuple[str, str], int]) -> dict[str, int]:
    """``throughput_by_queue``'s counts summed over the queues, per topic."""
    totals: dict[str, int] = {}
    for (_, topic), jobs in by_queue.items():
        totals[topic] = totals.get(topic, 0) + jobs
    return totals


def throughput(conn: Connection, seconds: float = 60, q: Queries = Q) -> dict[str, int]:
    """Per topic, the jobs that reached done, failed, dead or canceled in the last
    ``seconds``. Topics with none are left out."""
    return per_topic(throughput_by_queue(conn, seconds, q))


# -- durable handlers (brooq.worker.durable) --------------------------------------------------


def durable(conn: Connection, job_id: uuid.UUID | str, q: Queries = Q) -> dict[str, Any] | None:
    """A job's durable side: ``steps`` ([{name, at, size}], oldest first: size is the
    recorded result's JSON text in bytes), ``parked`` (sleep, event or jobs, while the job
    is pending or waiting; else None), ``until`` (a sleep's wake time, an event wait's
    deadline) and ``event`` (the key it waits for). None when no job has this id."""
    row = conn.cursor(row_factory=dict_row).execute(q.job_durable, {"id": parse_job_id(job_id)})
    found = row.fetchone()
    if found is None:
        return None
    parked = found["parked"] if found["state"] in ("pending", "waiting") else None
    until = None
    if parked == "sleep" or (parked == "event" and found["state"] == "pending"):
        until = found["available_at"]
    return {
        "steps": [
            {"name": name, "at": at, "size": size}
            for name, at, size in zip(found["names"], found["ats"], found["sizes"], strict=True)
        ],
        "parked": parked,
        "until": until,
        "event": found["event_key"] if parked == "event" else None,
    }


def children(
    conn: Connection, job_id: uuid.UUID | str, limit: int = 100, q: Queries = Q
) -> list[UpstreamJob]:
    """The jobs ``job_id`` spawned (``claim.spawn``), in the order spawned, at most
    ``limit`` (their results left out: None)."""
    check_limit(limit)
    rows = conn.execute(q.job_children, {"id": parse_job_id(job_id), "limit": limit})
    return [UpstreamJob(id=r[0], topic=r[1], state=r[2]) for r in rows.fetchall()]


def event_waits(conn: Connection, limit: int = 100, q: Queries = Q) -> list[dict[str, Any]]:
    """The pending event waits, oldest first, at most ``limit``: {job, topic, key, since,
    state, until} (until: the wait's deadline, None without one)."""
    check_limit(limit)
    rows = conn.cursor(row_factory=dict_row).execute(q.event_waits, {"limit": limit})
    return [
        {
            "job": r["job_id"],
            "topic": r["topic"],
            "key": r["key"],
            "since": r["since"],
            "state": r["state"],
            "until": r["until"],
        }
        for r in rows.fetchall()
    ]
