"""Ordered keys (Job(ordering_key=...), migration 0026): the keys whose next job cannot
start, and an operator's unblock of a key a dead job holds.

The order itself is kept by the database (the job_ordered triggers and brooq_order_next):
a key's jobs start one at a time in id order; a job that waits for a retry blocks its key;
a dead one blocks it until it is retried, its key is unblocked here, or (handler option
``ordering_skip_dead=True``) a master's keys duty hands the key on.

Owns: the blocked keys' read (BlockedKey), the unblock (its key's blocks deleted, its next
job made pending, in the caller's transaction).
Must never: change a dead job's state (a terminal state is never written again), or
commit.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row

from brooq.errors import BrooqError
from brooq.job import validate_topic
from brooq.job_options import check_ordering_key
from brooq.sql import Q, Queries

Connection = psycopg.Connection[Any]

# brooq keys lists at most this many by default; the API takes up to BLOCKED_LIMIT_MAX.
BLOCKED_LIMIT = 100
BLOCKED_LIMIT_MAX = 10_000

DEAD = "dead"  # a dead job blocks the key until retried or unblocked
RETRYING = "retrying"  # the key's job failed and waits for its retry


@dataclass(frozen=True)
class BlockedKey:
    """An ordered key whose next job cannot start: ``reason`` "dead" (``job_id`` is
    dead) or "retrying" (``job_id`` failed and runs again at ``retry_at``); ``waiting``:
    its jobs waiting their turn; ``since``: when it died, or its last failure."""

    topic: str
    ordering_key: str
    reason: str
    job_id: uuid.UUID
    queue: str
    since: datetime
    retry_at: datetime | None
    waiting: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "ordering_key": self.ordering_key,
            "reason": self.reason,
            "job_id": str(self.job_id),
            "queue": self.queue,
            "since": self.since.isoformat(),
            "retry_at": None if self.retry_at is None else self.retry_at.isoformat(),
            "waiting": self.waiting,
        }


def check_blocked_limit(limit: int) -> None:
    if not 1 <= limit <= BLOCKED_LIMIT_MAX:
        raise BrooqError(f"limit must be between 1 and {BLOCKED_LIMIT_MAX}, got {limit}")


def blocked(
    conn: Connection, topic: str | None = None, limit: int = BLOCKED_LIMIT, q: Queries = Q
) -> list[BlockedKey]:
    """The blocked keys, oldest first (``topic``'s only, if given); at most ``limit``."""
    if topic is not None:
        validate_topic(topic)
    check_blocked_limit(limit)
    cur = conn.cursor(row_factory=class_row(BlockedKey))
    return cur.execute(q.key_blocked_list, {"topic": topic, "limit": limit}).fetchall()


def blocked_counts(conn: Connection, q: Queries = Q) -> dict[str, tuple[int, int]]:
    """The blocked keys by queue: (blocked by a dead job, waiting for a retry)."""
    rows = conn.execute(q.key_blocked_counts).fetchall()
    return {queue: (dead, retrying) for queue, dead, retrying in rows}


def check_key(topic: str, key: str) -> str:
    """``key`` as Job(ordering_key=...) takes it; InvalidTopic or InvalidOrderingKey."""
    validate_topic(topic)
    checked = check_ordering_key(key, None, None, False)
    if checked is None:
        raise BrooqError("the ordering key must not be empty")
    return checked


def unblock(conn: Connection, topic: str, key: str, q: Queries = Q) -> uuid.UUID | None:
    """Stop the dead jobs of ``key`` from blocking it (they stay dead) and start its next
    waiting job; that job's id, or None when none could start (nothing waits, or another
    job of the key is unfinished). BrooqError when no dead job blocked the key."""
    key = check_key(topic, key)
    if not conn.execute(q.key_unblock, {"topic": topic, "key": key}).fetchall():
        raise BrooqError(f"no dead job blocks key {key!r} of topic {topic!r}")
    return next_job(conn, topic, key, q)


def next_job(conn: Connection, topic: str, key: str, q: Queries = Q) -> uuid.UUID | None:
    """Start the key's first waiting job if nothing of its key is in the way."""
    row = conn.execute(q.key_next, {"topics": [topic], "keys": [key], "wait": True}).fetchone()
    return None if row is None else row[2]
