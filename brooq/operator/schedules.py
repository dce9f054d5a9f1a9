"""Periodic schedules stored in the database (brooq_schedule, migration 0025): added,
changed, paused, resumed, removed and run now through Queue and `brooq periodic`, read by
every master's periodic duty at each pass beside the schedules its application declares.

Owns: each schedule's row (checked as queue.periodic checks a declared one, every problem
at once, before any statement), its Schedule as the duty runs it, and the job of a tick.
Must never: enqueue a tick (the masters' duty claims each tick once), or commit (the
caller's connection holds the change).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from brooq.declare.periodic import Schedule, build_schedule, next_tick
from brooq.durations import Duration
from brooq.encoding import to_json
from brooq.errors import BrooqError
from brooq.job import Job, validate_priority, validate_queue, validate_topic
from brooq.sql import Q, Queries

Connection = psycopg.Connection[Any]


@dataclass(frozen=True)
class StoredSchedule:
    """A periodic schedule stored in the database: when (``cron`` or ``every`` seconds,
    in ``tz``), the job of each tick (``topic``, ``payload``, ``queue``, ``priority``),
    ``backfill`` (missed ticks enqueued after downtime), ``paused``, and the last tick a
    master claimed with its job."""

    name: str
    cron: str | None
    every: int | None
    tz: str
    topic: str
    payload: Any
    queue: str | None
    priority: int
    backfill: int
    paused: bool
    last_tick: datetime | None = None
    last_job: uuid.UUID | None = None
    updated_at: datetime | None = None

    def job(self) -> Job:
        return Job(self.topic, self.payload, queue=self.queue, priority=self.priority)

    def schedule(self) -> Schedule:
        """The Schedule the periodic duty runs (InvalidSettings for a row written by hand
        that queue.periodic would refuse)."""
        return build_schedule(
            self.name,
            cron=self.cron,
            every=self.every,
            tz=self.tz,
            job=self.job(),
            backfill=self.backfill,
        )

    def to_dict(self) -> dict[str, Any]:
        when = self.cron if self.cron is not None else f"every {self.every}s"
        return {
            "name": self.name,
            "schedule": when,
            "tz": self.tz,
            "topic": self.topic,
            "payload": self.payload,
            "queue": self.queue,
            "priority": self.priority,
            "backfill": self.backfill,
            "paused": self.paused,
            "next_tick": None
            if self.paused
            else next_tick(self.schedule(), datetime.now(timezone.utc)).isoformat(),
            "last_tick": None if self.last_tick is None else self.last_tick.isoformat(),
            "last_job": None if self.last_job is None else str(self.last_job),
        }


def checked(stored: StoredSchedule) -> StoredSchedule:
    """``stored`` if queue.periodic would take it; InvalidSettings (every problem of the
    schedule) or the job's own error otherwise. No I/O."""
    validate_topic(stored.topic)
    if stored.queue is not None:
        validate_queue(stored.queue)
    validate_priority(stored.priority)
    stored.job()  # the payload is JSON
    stored.schedule()
    return stored


def make(
    name: str,
    topic: str,
    payload: Any = None,
    *,
    cron: str | None = None,
    every: Duration | None = None,
    tz: str = "UTC",
    queue: str | None = None,
    priority: int = 0,
    backfill: int = 0,
    paused: bool = False,
) -> StoredSchedule:
    """A StoredSchedule from a caller's arguments, checked."""
    every_s = None
    if every is not None:
        every_s = build_schedule(name, every=every, job=Job(topic)).every
    return checked(
        StoredSchedule(name, cron, every_s, tz, topic, payload, queue, priority, backfill, paused)
    )


def _params(s: StoredSchedule) -> dict[str, Any]:
    return {
        "name": s.name,
        "cron": s.cron,
        "every": s.every,
        "tz": s.tz,
        "topic": s.topic,
        "payload": None if s.payload is None else Jsonb(to_json(s.payload)),
        "queue": s.queue,
        "priority": s.priority,
        "backfill": s.backfill,
        "paused": s.paused,
    }


def add(conn: Connection, stored: StoredSchedule, q: Queries = Q) -> None:
    """Store a new schedule; BrooqError when one of that name exists."""
    if conn.execute(q.schedule_add, _params(stored)).fetchone() is None:
        raise BrooqError(
            f"a schedule named {stored.name!r} exists: change it (brooq periodic change) "
            "or remove it first"
        )


def listed(conn: Connection, name: str | None = None, q: Queries = Q) -> list[StoredSchedule]:
    """The stored schedules (only ``name``'s if given), by name."""
    rows = conn.cursor(row_factory=dict_row).execute(q.schedule_list, {"name": name})
    return [
        StoredSchedule(
            name=r["name"],
            cron=r["cron"],
            every=r["every_seconds"],
            tz=r["tz"],
            topic=r["topic"],
            payload=r["payload"],
            queue=r["queue"],
            priority=r["priority"],
            backfill=r["backfill"],
            paused=r["paused"],
            last_tick=r["last_tick"],
            last_job=r["last_job"],
            updated_at=r["updated_at"],
        )
        for r in rows.fetchall()
    ]


def get(conn: Connection, name: str, q: Queries = Q) -> StoredSchedule:
    found = listed(conn, name, q)
    if not found:
        raise BrooqError(f"no stored schedule named {name!r} (brooq periodic lists them)")
    return found[0]


def change(conn: Connection, name: str, q: Queries = Q, **fields: Any) -> StoredSchedule:
    """The schedule ``name`` with ``fields`` changed (cron= and every= replace each
    other), checked, then written whole. BrooqError when there is none."""
    current = get(conn, name, q)
    if "every" in fields and fields["every"] is not None:
        fields["every"] = build_schedule(name, every=fields["every"], job=Job("x")).every
        fields.setdefault("cron", None)
    elif fields.get("cron") is not None:
        fields.setdefault("every", None)
    updated = checked(replace(current, **fields))
    conn.execute(q.schedule_update, _params(updated))
    return updated


def remove(conn: Connection, name: str, q: Queries = Q) -> bool:
    return conn.execute(q.schedule_remove, {"name": name}).fetchone() is not None
